// What src/cm.cpp (RC connections) and src/cm_datagram.cpp (UD and multicast) share: rdma_cm
// channels, ids, addresses and events. Not installed.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <rdma/rdma_cma.h>

#include "verbs/cm.hpp"

namespace verbs::cm::internal {

using Clock = std::chrono::steady_clock;

/// The error_code form of a Pending*::step() (connect, accept, resolve, join): what it throws,
/// as `ec`, and an empty result.
template <typename Step>
auto step_or_code(Step&& step, std::error_code& ec) noexcept -> decltype(step()) {
  try {
    ec.clear();
    return step();
  } catch (const Error& e) {
    ec = e.code();
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
  } catch (...) {
    ec = std::make_error_code(std::errc::io_error);  // e.g. a before_handshake that threw something else
  }
  return std::nullopt;
}

/// Throws ConnectError(err, phase) saying `text`.
[[noreturn]] void fail(int err, Phase phase, const std::string& text, SourceLocation where);
/// A timeout for librdmacm's int milliseconds: at least 1, at most 2^30 (12 days).
int clamp_ms(std::chrono::milliseconds timeout);
/// A non-blocking rdma_cm event channel.
std::shared_ptr<rdma_event_channel> make_channel(Phase phase, SourceLocation where);
/// An id on `ch`; destroying it keeps the channel alive until then.
std::shared_ptr<rdma_cm_id> own_id(rdma_cm_id* id, std::shared_ptr<rdma_event_channel> ch);
/// A new id on `ch` in port space `ps`.
std::shared_ptr<rdma_cm_id> make_id(const std::shared_ptr<rdma_event_channel>& ch, Phase phase, SourceLocation where,
                                    rdma_port_space ps = RDMA_PS_TCP);
/// `host` (numeric or a name) and `port`; an empty host is the wildcard.
sockaddr_storage to_sockaddr(std::string_view host, std::uint16_t port, Phase phase, SourceLocation where);
/// "a.b.c.d:port" or "[v6]:port"; empty for a null or other address.
std::string address_text(const sockaddr* sa);

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
  // MULTICAST_JOIN and MULTICAST_ERROR: the context given to rdma_join_multicast(3).
  const void* context = nullptr;
};

/// The next event on `ch`, acknowledged; empty when `deadline` passes first (ec clear) or on
/// failure (ec set).
std::optional<Event> next_event(rdma_event_channel* ch, Clock::time_point deadline, std::error_code& ec);
/// `e` when it is `wanted` (or `also`); any other event ends the phase with an error saying which.
Event check_event(Event e, rdma_cm_event_type wanted, Phase phase, SourceLocation where,
                  std::optional<rdma_cm_event_type> also = std::nullopt);
/// Waits for `wanted` (or `also`) on `ch`; any other event ends the phase with an error saying which.
Event expect_event(rdma_event_channel* ch, rdma_cm_event_type wanted, Clock::time_point deadline, Phase phase,
                   std::chrono::milliseconds budget, SourceLocation where,
                   std::optional<rdma_cm_event_type> also = std::nullopt);
/// Throws ConnectError(ETIMEDOUT): nothing came within `budget`.
[[noreturn]] void fail_no_answer(Phase phase, std::chrono::milliseconds budget, SourceLocation where);
/// Sleeps until `fd` is readable or `deadline` passes (poll(2); EINTR is a wakeup).
void wait_readable(int fd, Clock::time_point deadline, Phase phase, SourceLocation where);
/// A Device over the context librdmacm opened for `id`, keeping `id` alive while it lives.
Device device_of(const std::shared_ptr<rdma_cm_id>& id);
/// The rdma_cm options that must come before an id is bound (rdma_set_option(3)):
/// RDMA_OPTION_ID_REUSEADDR when `reuse_address`, RDMA_OPTION_ID_AFONLY when `ipv6_only` is set.
void set_bind_options(rdma_cm_id* id, bool reuse_address, std::optional<bool> ipv6_only, Phase phase,
                      SourceLocation where);

/// Fails (EINVAL) unless `given` is non-empty and on the device context `ctx`: `what` names the
/// option, `owner` what it is for ("the connection", "the Datagram"), `remedy` how to make a
/// right one.
template <typename T>
void check_same_context(const T* given, ibv_context* ctx, std::string_view what, std::string_view owner,
                        std::string_view remedy, Phase phase, SourceLocation where) {
  if (given->native_handle() == nullptr)
    fail(EINVAL, phase, std::string(what) + " is empty (a moved-from object)", where);
  if (given->native_handle()->context != ctx)
    fail(EINVAL, phase,
         std::string(what) + " is on another device context than " + std::string(owner) + ": " + std::string(remedy),
         where);
}

/// The PD and CQs of a connection or a Datagram on `dev`: those the caller shares (`pd`,
/// `send_cq`, `recv_cq`, each checked with check_same_context, `prefix` naming its options),
/// else new ones (CQs of `cq_depth` entries with a completion channel).
void make_pd_and_cqs(const Device& dev, const ProtectionDomain* pd, const CompletionQueue* send_cq,
                     const CompletionQueue* recv_cq, int cq_depth, std::string_view prefix, std::string_view owner,
                     std::string_view remedy, Phase phase, SourceLocation where,
                     std::optional<ProtectionDomain>& pd_out, std::optional<CompletionQueue>& send_out,
                     std::optional<CompletionQueue>& recv_out);

}  // namespace verbs::cm::internal
