// Cold helpers shared by the library's sources (not installed).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include <infiniband/verbs.h>

#include "verbs/device.hpp"

namespace verbs::detail {

// The kernel's IB_UVERBS_DEVICE_FLUSH_GLOBAL and _PERSISTENT (device_cap_flags_ex), which
// rdma-core 44's headers do not name yet.
inline constexpr std::uint64_t device_flush_global = 1ULL << 38, device_flush_persistent = 1ULL << 39;

/// True for SoftRoCE (rxe's vendor_id, RXE_VENDOR_ID in the kernel), whose provider in rdma-core
/// 44 gets ibv_wr_set_sge_list and ibv_next_poll/ibv_end_poll wrong (SendBatch, start_poll).
inline bool is_rxe(const ibv_device_attr_ex& dev) noexcept { return dev.orig_attr.vendor_id == 0xffffff; }

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

/// A GID table entry as the library gives it (netdev named from its ifindex).
GidEntry gid_entry(const ibv_gid_entry& e);
PortInfo query_port(ibv_context* ctx, std::uint8_t port_num, SourceLocation where = SourceLocation::current());
std::vector<GidEntry> query_gid_table(ibv_context* ctx, std::uint8_t port_num);
GidChoice choose_gid(ibv_context* ctx, std::uint8_t port_num, SourceLocation where = SourceLocation::current());
/// As above, with the port's attributes the caller has just queried (`port`).
GidChoice choose_gid(ibv_context* ctx, std::uint8_t port_num, const PortInfo& port, SourceLocation where);
/// The choice choose_gid makes from a RoCE port's table (the valid entries, any order); empty
/// when none will do. Preference: RoCE v2 before v1; a routable address before link-local
/// fe80:: only; the port's own netdev (that of the GID at index 0, derived from its MAC)
/// before a VLAN or macvlan on it; IPv4-mapped before global IPv6.
std::optional<GidChoice> choose_roce_gid(const std::vector<GidEntry>& table);

/// Who wants to hear of the async events of one QP (the cm connection owning it): `fn(self,
/// event)` is called, under the hub's lock, for each event of that QP and for DEVICE_FATAL. It
/// must not block nor call into the hub (it sets flags and writes an eventfd).
struct AsyncRoute {
  void (*fn)(void* self, const AsyncEvent& event) noexcept = nullptr;
  void* self = nullptr;
};

/// The one reader of a device context's async events in the process (Device's async calls).
/// It reads and acknowledges them, calls the route of the QP an event concerns, and keeps every
/// event for Device::poll_async_events (at most `max_kept`, dropping the oldest). fd() is an
/// epoll descriptor over the context's async fd and an eventfd readable while events are kept.
class AsyncHub {
 public:
  static constexpr std::size_t max_kept = 1024;
  explicit AsyncHub(std::shared_ptr<ibv_context> ctx);  // throws Error (epoll_create1, eventfd)
  AsyncHub(const AsyncHub&) = delete;
  AsyncHub& operator=(const AsyncHub&) = delete;
  ~AsyncHub();

  [[nodiscard]] int fd() const noexcept { return epoll_fd_; }
  /// The context's own async fd (non-blocking), -1 without one (the host tests' stub).
  [[nodiscard]] int native_fd() const noexcept { return ctx_->async_fd; }
  /// Reads every event pending in the context's fd, and delivers each. Sets `ec` on failure.
  void pump(std::error_code& ec) noexcept;
  /// pump(), then moves up to out.size() kept events into `out`; returns how many.
  std::size_t take(std::span<AsyncEvent> out, std::error_code& ec) noexcept;
  /// What pump() does with each event read (after its acknowledgement): route it, keep it. The
  /// test seam for events a device cannot be made to raise.
  void deliver(const AsyncEvent& event) noexcept;
  /// Routes the events of `qp` (QP number `qp_num`) to `route`; throws std::bad_alloc.
  void add_route(const ibv_qp* qp, std::uint32_t qp_num, AsyncRoute route);
  /// Stops routing to `qp`: once it returns, its route is not called any more.
  void remove_route(const ibv_qp* qp) noexcept;
  /// Events kept for Device::poll_async_events (for tests).
  [[nodiscard]] std::size_t kept() const noexcept;
  /// QPs whose events are routed (for tests: a route left behind outlives its receiver).
  [[nodiscard]] std::size_t routes() const noexcept;
  /// The context's device attributes (ibv_query_device_ex(3)), queried by the first caller and
  /// kept: they do not change while the context is open. Throws Error if the query fails.
  [[nodiscard]] ibv_device_attr_ex device_attributes(SourceLocation where);

 private:
  void deliver_locked(const AsyncEvent& event) noexcept;
  // Not owned: every holder of the hub (a Device, a connection) holds the context too, and
  // releases the hub first. Owning it would keep the first holder's deleter alive, which for a
  // cm connection's Device holds that connection's rdma_cm id (and its event channel) until the
  // last connection on the device went.
  ibv_context* const ctx_;
  int epoll_fd_ = -1;
  int kept_fd_ = -1;  // eventfd: readable while `kept_` is not empty
  mutable std::mutex mutex_;
  std::deque<AsyncEvent> kept_;
  struct Target {
    std::uint32_t qp_num;
    AsyncRoute route;
  };
  std::unordered_map<const ibv_qp*, Target> routes_;
  std::optional<ibv_device_attr_ex> attributes_;  // under mutex_
};

/// The hub of `ctx`, shared by every Device (and connection) on that context while one lives.
std::shared_ptr<AsyncHub> async_hub(const std::shared_ptr<ibv_context>& ctx);
/// The device attributes of `ctx`: kept by its hub while a Device (or connection) on it lives,
/// else queried. One query per connection and per QP was a system call each on every setup.
ibv_device_attr_ex device_attributes(ibv_context* ctx, SourceLocation where);
/// The event type's enumerator without IBV_EVENT_ ("QP_FATAL"), "UNKNOWN" for another value.
std::string_view async_event_type_name(ibv_event_type type) noexcept;

}  // namespace verbs::detail
