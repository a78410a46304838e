// Cold helpers shared by the library's sources (not installed).
#pragma once

#include <cstddef>
#include <cstdint>
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

PortInfo query_port(ibv_context* ctx, std::uint8_t port_num, SourceLocation where = SourceLocation::current());
std::vector<GidEntry> query_gid_table(ibv_context* ctx, std::uint8_t port_num);
GidChoice choose_gid(ibv_context* ctx, std::uint8_t port_num, SourceLocation where = SourceLocation::current());

}  // namespace verbs::detail
