// What the rooms of an RC connection share (docs/design/cm.md): Connection::Impl, built by the
// qp room (connection_qp.cpp), run by the connection room (connection.cpp), made by the active
// side (connect.cpp) and the passive side (listen.cpp). Not installed.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cm/router.hpp"
#include "detail.hpp"

namespace verbs::cm {
namespace internal {

/// What an RC connection and a Datagram hold alike. Members go in reverse order: the QP before
/// the CQs and PD, the id and its Router last.
struct Endpoint {
  std::shared_ptr<Router> router;  // its own channel's, or an EventChannel's: the id's deleter leaves it
  std::shared_ptr<rdma_cm_id> id;
  std::optional<Device> device;
  // Its own, or sharing the ownership of the caller's (the options' pd, send_cq, recv_cq): the
  // caller's objects may be moved or destroyed while it lives.
  std::optional<ProtectionDomain> pd;
  std::optional<CompletionQueue> send_cq, recv_cq;
  std::optional<QueuePair> qp;

  /// `device` (the id's), and the PD and CQs of `o` (ConnectionOptions or DatagramOptions): those
  /// it shares, else new ones (CQs with a completion channel). A shared one, or an SRQ, that is
  /// empty or on another device fails (EINVAL) naming `prefix` and its field, `owner`, `remedy`.
  template <typename Options>
  void open(const Options& o, std::string_view prefix, std::string_view owner, std::string_view remedy, Phase phase,
            SourceLocation where) {
    device.emplace(device_of(id->verbs, phase, where));
    const auto shared = [&](const auto* given, std::string_view field) {
      const std::string what = std::string(prefix) + std::string(field);
      if (given != nullptr && given->native_handle() == nullptr)
        fail(EINVAL, phase, what + " is empty (a moved-from object)", where);
      if (given != nullptr && given->native_handle()->context != id->verbs)
        fail(EINVAL, phase,
             what + " is on another device context than " + std::string(owner) + " (" + device->name() +
                 "): " + std::string(remedy), where);
      return given != nullptr;
    };
    (void)shared(o.qp.srq, "qp.srq");
    const CqOptions cqo{.depth = o.cq_depth, .with_channel = true};
    if (shared(o.pd, "pd")) pd.emplace(ProtectionDomain::adopt(o.pd->shared_handle(), where));
    else pd.emplace(*device, where);
    if (shared(o.send_cq, "send_cq")) send_cq.emplace(CompletionQueue::adopt(o.send_cq->shared_handle()));
    else send_cq.emplace(*device, cqo, where);
    if (shared(o.recv_cq, "recv_cq")) recv_cq.emplace(CompletionQueue::adopt(o.recv_cq->shared_handle()));
    else recv_cq.emplace(*device, cqo, where);
  }
};

/// Checks of the options that need no device, made before anything is sent or waited for.
void check_options(const ConnectionOptions& o, Phase phase, SourceLocation where);
/// The private data of `o` as sent (the exposed slice, then the caller's bytes), within `limit`
/// (EMSGSIZE) and not to be misread by the peer (EINVAL).
std::vector<std::byte> frame(const ConnectionOptions& o, std::size_t limit, Phase phase, SourceLocation where);
/// As frame(), with the path MTU tag `tag` in front: this side takes a smaller path MTU than the
/// peer would use (`assumed`) without it.
std::vector<std::byte> frame_with_mtu(const ConnectionOptions& o, std::size_t limit, Mtu tag, Mtu assumed, Phase phase,
                                      SourceLocation where);
/// The [initiator, responder] depths of a connect, or (with the request) of an accept: those of
/// the options, capped by the device and by what the request offers (rdma_accept(3)).
rdma_conn_param conn_param(const ConnectionOptions& o, const std::vector<std::byte>& data, const Device& dev,
                           const QueuePair& qp, const Event* request = nullptr);

/// Address and route resolution of an id toward `target` (the active side's, a Datagram's
/// resolve, device_to()), one event at a time: each resolution within `each`, the whole (to
/// establishment) within `whole`.
struct Resolution {
  std::string target;  // "host:port", named in its errors
  milliseconds whole{}, each{};
  Phase phase = Phase::resolve_address;
  Clock::time_point deadline{}, step_deadline{};  // the whole's, and the phase's

  /// Sends rdma_resolve_addr(3) for `id` from `src` (null: as routed) to `dst`.
  void start(Router& r, rdma_cm_id* id, const sockaddr_storage* src, sockaddr_storage dst, SourceLocation where);
  /// Checks `e` against the phase: ADDR_RESOLVED (the caller then calls resolve_route()), or
  /// ROUTE_RESOLVED (the phase is then connect, until `deadline`). Returns the phase it ended.
  Phase check(Event e, SourceLocation where);
  /// Sends rdma_resolve_route(3).
  void resolve_route(Router& r, rdma_cm_id* id, SourceLocation where);
  /// ETIMEDOUT: nothing came by step_deadline.
  [[noreturn]] void timed_out(SourceLocation where) const;
  /// ConnectError(err) in the phase, saying "target: text".
  [[noreturn]] void fail(int err, const std::string& text, SourceLocation where) const;
  /// A librdmacm timeout: `each`, within what is left of the whole.
  [[nodiscard]] int each_ms() const { return std::max(1, std::min(ms_until(deadline), clamp_ms(each))); }
};

}  // namespace internal

struct Connection::Impl : internal::Endpoint {
  using Event = internal::Event;
  std::vector<std::byte> peer_private;
  std::optional<RemoteSlice> peer_remote;
  AccessFlags access;
  // Set while connecting or accepting, before the Connection is handed out; read-only after.
  bool established = false;
  TransportOptions transport;
  std::uint8_t responder = 0, initiator = 0;  // read/atomic depths of the handshake
  // Path MTUs: the peer's tag (the most it takes, when below what it expects of us); after RTR,
  // the QP's, and the one the peer would use without a tag from us (see mtu_limit()).
  std::optional<Mtu> peer_mtu;
  ibv_mtu rtr_mtu = IBV_MTU_4096, peer_assumes = IBV_MTU_4096;
  // What the events have told, written by whichever thread reads them (waits may run in several
  // threads at once, e.g. one per CQ): atomics.
  std::atomic<bool> disconnected{false};  // rdma_disconnect called (or being called)
  std::atomic<bool> peer_gone{false};
  // A connection accept() hands out as soon as it has answered: its client's ESTABLISHED
  // confirms it (note()); none by `confirm_by` (handshake_timeout), or the client's failure,
  // and the client is taken to have gone (never_confirmed, with peer_gone).
  std::atomic<bool> confirmed{true};
  std::atomic<bool> never_confirmed{false};
  internal::Clock::time_point confirm_by{};
  std::atomic<bool> device_removed{false};   // DEVICE_REMOVAL: over, but not the peer's doing
  std::atomic<bool> address_changed{false};  // ADDR_CHANGE seen
  // Eventfds made readable (and left so) once the connection is over (over_fd), and once the
  // peer or the device ended it (gone_fd): every thread asleep in a wait polls one, so the
  // thread that read the ending event (or disconnect()ed) wakes the others. Made by the first
  // thread about to sleep (wake_fd()): a connection driven from an event loop holds one
  // descriptor, its channel. A waiter makes the fd before it reads the flags, and wake_all()
  // reads it after they are set (both seq_cst): the waiter sees the end, or is woken.
  std::atomic<int> over_fd{-1};
  std::atomic<int> gone_fd{-1};
  // The device context's async event reader, and the first fatal event it routed to this QP
  // (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, or DEVICE_FATAL; -1: none).
  std::shared_ptr<detail::AsyncHub> hub;
  const ibv_qp* routed_qp = nullptr;  // the QP its async route names: teardown never reads `qp`
  std::atomic<int> fatal_event{-1};
  // Under the Router's mutex: while the handshake runs, the events for it wait in `inbox` for
  // step(); once established, deliver() notes them at once.
  bool on_router = false;
  bool handshaking = true;
  internal::Inbox inbox;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();

  // ---- the qp room (connection_qp.cpp) ----
  /// Creates PD (unless shared), CQs (unless shared) and the QP on the id's device, in INIT.
  void build(const ConnectionOptions& o, Phase phase, SourceLocation where);
  /// build(), then `before` (the caller's before_handshake, which may expose a buffer in `o`),
  /// and the private data to send, checked and framed within `limit`.
  std::vector<std::byte> prepare(const std::function<void(const Handshake&)>& before, ConnectionOptions& o,
                                 std::size_t limit, Phase phase, SourceLocation where);
  /// Moves the QP to `state` with what rdma_cm knows and what is this side's to choose.
  void transition(ibv_qp_state state, Phase phase, SourceLocation where);
  /// The largest path MTU this side takes, given the route's.
  [[nodiscard]] ibv_mtu mtu_limit(ibv_mtu route) const noexcept;
  /// INIT -> RTR -> RTS, with the depths of the handshake (`p`, as this side sends or sent it).
  void to_rts(const rdma_conn_param& p, Phase phase, SourceLocation where);
  /// Moves the QP to ERR, flushing what is posted (see connection_qp.cpp).
  void to_error() noexcept;
  /// The peer's private data: its MTU tag and exposed slice, then the rest.
  void take_private_data(std::vector<std::byte> data);

  // ---- the connection room (connection.cpp) ----
  /// Joins the routes of `router` (the id is made or moved there by the caller), with what came
  /// for it meanwhile (`earlier`).
  void join(std::uint64_t key, std::vector<Event> earlier = {});
  /// Once this side is connected: events from now on are noted as they come.
  void on_established();
  /// What an event of the established connection changes: a disconnect, a device removal.
  void note(const Event& e) noexcept;
  /// The Router's route (Router::Deliver).
  static bool deliver(void* self, Event&& e) noexcept;
  /// The async event reader's route (detail::AsyncRoute).
  static void on_async_event(void* self, const AsyncEvent& e) noexcept;
  /// The eventfd in `slot`, made now if no thread made it yet; -1 with errno set on failure.
  static int wake_fd(std::atomic<int>& slot) noexcept;
  /// Makes over_fd readable (and gone_fd once the peer or the device ended the connection).
  void wake_all() noexcept;
  [[nodiscard]] bool failed() const noexcept { return fatal_event.load() >= 0; }
  [[nodiscard]] bool over() const noexcept { return peer_gone || device_removed || disconnected || failed(); }
  /// The errno a wait fails with once the connection is over, and what ended it in words.
  [[nodiscard]] int over_errno() const noexcept;
  [[nodiscard]] std::string over_text() const;
  /// After the peer left (or the device went, or a fatal event): disconnect our side too.
  void settle() noexcept;
  /// Reads the channel and the device's async events without blocking.
  void pump(std::error_code& ec) noexcept;
  /// Reads the router (not the async fd), then expire().
  void pump_cm(std::error_code& ec) noexcept {
    router->pump(ec);
    expire();
  }
  /// An unconfirmed connection past confirm_by: its client is taken to have gone.
  void expire() noexcept;
  /// When a wait must look again: `deadline`, or confirm_by if sooner and still unconfirmed.
  [[nodiscard]] internal::Clock::time_point wake_by(internal::Clock::time_point deadline) const noexcept {
    return confirmed ? deadline : std::min(deadline, confirm_by);
  }
};

}  // namespace verbs::cm
