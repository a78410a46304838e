// Cold helpers shared by the library's sources (not installed).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <infiniband/verbs.h>

#include "verbs/device.hpp"

namespace verbs::detail {

inline void put_le(std::byte* p, std::uint64_t v, int n) noexcept {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline std::uint64_t get_le(const std::byte* p, int n) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

/// now + timeout without overflow: milliseconds::max() (and anything past the clock's range)
/// means "no deadline", a negative timeout means "now".
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) noexcept {
  using clock = std::chrono::steady_clock;
  const auto now = clock::now();
  if (timeout <= std::chrono::milliseconds::zero()) return now;
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(clock::time_point::max() - now);
  if (timeout >= room) return clock::time_point::max();
  return now + timeout;
}

/// Milliseconds from now until `deadline`, for poll(2): 0 when passed, at most 2^30 (a caller
/// waiting for longer loops, re-reading the clock).
inline int poll_ms_until(std::chrono::steady_clock::time_point deadline) noexcept {
  const auto now = std::chrono::steady_clock::now();
  if (deadline <= now) return 0;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<std::int64_t>(left, 1 << 30));
}

PortInfo query_port(ibv_context* ctx, std::uint8_t port_num, SourceLocation where = SourceLocation::current());
std::vector<GidEntry> query_gid_table(ibv_context* ctx, std::uint8_t port_num);
GidChoice choose_gid(ibv_context* ctx, std::uint8_t port_num, SourceLocation where = SourceLocation::current());
/// The choice choose_gid makes from a RoCE port's table (the valid entries, any order); empty
/// when none will do. Preference: RoCE v2 before v1; a routable address before link-local
/// fe80:: only; the port's own netdev (that of the GID at index 0, derived from its MAC)
/// before a VLAN or macvlan on it; IPv4-mapped before global IPv6.
std::optional<GidChoice> choose_roce_gid(const std::vector<GidEntry>& table);

}  // namespace verbs::detail
