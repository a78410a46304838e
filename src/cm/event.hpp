// The event room of verbs::cm (docs/design/cm.md): an rdma_cm event copied before it is
// acknowledged, what an unwanted one means, addresses, errors, and the device of an id. Not
// installed.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <rdma/rdma_cma.h>

#include "verbs/cm.hpp"

namespace verbs::cm::internal {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// Throws ConnectError(err, phase) saying `text`.
[[noreturn]] void fail(int err, Phase phase, const std::string& text, SourceLocation where);
/// A ConnectError of an rdma_cm call on an id whose peer has gone (a request whose client gave
/// up: rdma_init_qp_attr, rdma_migrate_id or rdma_accept refuses it), which a blocking accept()
/// skips.
struct IdGone : ConnectError {
  using ConnectError::ConnectError;
};
/// Throws IdGone(err, phase) saying `text`.
[[noreturn]] void fail_id(int err, Phase phase, const std::string& text, SourceLocation where);
/// Throws ConnectError(ETIMEDOUT): nothing came within `budget`.
[[noreturn]] void fail_no_answer(Phase phase, milliseconds budget, SourceLocation where);
/// A timeout for librdmacm's int milliseconds: at least 1, at most 2^30 (12 days).
int clamp_ms(milliseconds timeout);
/// Milliseconds left until `deadline`, for poll(2).
int ms_until(Clock::time_point deadline);

/// The code an error_code form reports for what its throwing form threw: a ConnectError's (any
/// Error's) code, ECONNREFUSED for a Reject (the request was refused on purpose), ENOMEM for
/// bad_alloc, ECONNABORTED for anything else (an exception from before_handshake).
std::error_code code_of(const std::exception_ptr& e) noexcept;

/// The error_code form of a call: what `call` throws, as `ec`, and an empty result.
template <typename Call>
auto or_code(Call&& call, std::error_code& ec) noexcept -> decltype(std::optional(call())) {
  try {
    ec.clear();
    return call();
  } catch (...) {
    ec = code_of(std::current_exception());
  }
  return std::nullopt;
}

/// A Pending*'s step(): an earlier failure again, else `body`; a failure is kept (every later
/// step fails the same way) and `close` lets go of what the step held.
template <typename Body, typename Close>
auto guarded(std::exception_ptr& failed, Body&& body, Close&& close) -> decltype(body()) {
  if (failed) std::rethrow_exception(failed);
  try {
    return body();
  } catch (...) {
    failed = std::current_exception();
    close();
    throw;
  }
}

/// An rdma_cm event, copied before it is acknowledged.
struct Event {
  rdma_cm_event_type type{};
  int status = 0;
  rdma_cm_id* id = nullptr;
  std::vector<std::byte> private_data;
  // Of a connection request, from this side's point of view (the kernel swaps the request's
  // fields): the reads/atomics the peer will have in flight to us, and those it can take from us.
  std::uint8_t responder_resources = 0, initiator_depth = 0;
  // RDMA_PS_UDP's ESTABLISHED (a SIDR answer) and MULTICAST_JOIN: where sends go (rdma_ud_param).
  ibv_ah_attr ah_attr{};
  std::uint32_t ud_qp_num = 0, ud_qkey = 0;
  // MULTICAST_JOIN and MULTICAST_ERROR: the context given to rdma_join_multicast_ex(3).
  const void* context = nullptr;
};

/// A copy of `ev` (not acknowledged). Throws std::bad_alloc.
Event to_event(const rdma_cm_event* ev);
/// `e` when it is `wanted` (or `also`); any other event ends the phase with an error saying which.
Event check_event(Event e, rdma_cm_event_type wanted, Phase phase, SourceLocation where,
                  std::optional<rdma_cm_event_type> also = std::nullopt);

/// `host` (a numeric IPv4 or IPv6 address; empty: the wildcard) and `port`, without asking any
/// resolver: a name is refused (EINVAL, saying to look it up first or call the blocking form).
sockaddr_storage numeric_address(std::string_view host, std::uint16_t port, Phase phase, SourceLocation where);
/// As numeric_address(), but a name is looked up (getaddrinfo(3): the system's resolver, within
/// its own limits); a resolver that cannot answer yet is EAGAIN, a name it does not know
/// EHOSTUNREACH. For the blocking calls only.
sockaddr_storage looked_up_address(std::string_view host, std::uint16_t port, Phase phase, SourceLocation where);
/// Whether `a` is the wildcard address (0.0.0.0 or ::).
bool is_wildcard(const sockaddr_storage& a);
/// rdma_bind_addr(3) of `id` to `a` (`text` names it); ENODEV when no RDMA device has the
/// address (unless `wildcard_ok` and it is the wildcard, which has none).
void bind_to(rdma_cm_id* id, sockaddr_storage a, const std::string& text, bool wildcard_ok, Phase phase,
             SourceLocation where);
/// "a.b.c.d:port" or "[v6]:port"; empty for a null or other address.
std::string address_text(const sockaddr* sa);
/// The rdma_cm options that must come before an id is bound (rdma_set_option(3)):
/// RDMA_OPTION_ID_REUSEADDR when `reuse_address`, RDMA_OPTION_ID_AFONLY when `ipv6_only` is set.
void set_bind_options(rdma_cm_id* id, bool reuse_address, std::optional<bool> ipv6_only, Phase phase,
                      SourceLocation where);

/// A Device over `ctx`, a context librdmacm opened (an id's `verbs`): it keeps the context open
/// by librdmacm's own reference (rdma_get_devices(3)), not by any id, so that what is made from
/// it (a PD, a region in a pool) holds no rdma_cm id, channel or port.
Device device_of(ibv_context* ctx, Phase phase, SourceLocation where);

}  // namespace verbs::cm::internal
