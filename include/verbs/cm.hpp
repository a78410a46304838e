// verbs::cm: connections through rdma_cm (librdmacm): one call on each side gives a connected RC
// queue pair, its CQs and PD, and (optionally) the peer's exposed buffer. Built on the core; the
// core knows nothing of it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <rdma/rdma_cma.h>

#include "verbs/completion_queue.hpp"
#include "verbs/device.hpp"
#include "verbs/error.hpp"
#include "verbs/memory_region.hpp"
#include "verbs/protection_domain.hpp"
#include "verbs/queue_pair.hpp"

/// @namespace verbs::cm
/// Connections through rdma_cm (librdmacm): Listener, connect() and Connection.
namespace verbs::cm {

using namespace std::chrono_literals;

/// The step of setting up or running a connection that failed.
enum class Phase : std::uint8_t { resolve_address, resolve_route, connect, listen, accept, established };
/// The phase's name, e.g. "route resolution".
std::string_view to_string(Phase p) noexcept;

/// A failure of the connection layer: an Error that also says in which phase it happened, and,
/// as every error of the library, the caller's line (where()). The
/// code is a generic errno: ETIMEDOUT (a deadline of ours passed), ECONNREFUSED (rejected, e.g.
/// no listener), EHOSTUNREACH (unreachable), ENODEV (no RDMA device for that address),
/// ECONNRESET (the peer disconnected), EMSGSIZE (private data over the limit), or the errno of
/// the failing librdmacm call.
class ConnectError : public Error {
 public:
  /// An error `code` in `phase`; `context` says what failed (what() adds phase and location).
  ConnectError(std::error_code code, Phase phase, std::string_view context,
               SourceLocation where = SourceLocation::current());
  /// As above, for a failure an rdma_cm event reported: its `status` and the private data it
  /// carried (a REJECTED event: the rejecting side's reason, see Reject).
  ConnectError(std::error_code code, Phase phase, std::string_view context, int status,
               std::span<const std::byte> private_data, SourceLocation where = SourceLocation::current());
  /// The phase that failed.
  [[nodiscard]] Phase phase() const noexcept { return phase_; }
  /// The status of the rdma_cm event that ended the phase, 0 without one. For REJECTED on
  /// InfiniBand and RoCE, the IB CM reject reason: 28 (consumer defined) when the peer
  /// rejected (e.g. with Reject), 8 (invalid service ID) when nothing listens on the port.
  [[nodiscard]] int status() const noexcept { return status_; }
  /// The private data of that event, empty without one; for REJECTED, the rejecting side's
  /// (zero-padded by the transport to its field: encode your own length).
  [[nodiscard]] std::span<const std::byte> private_data() const noexcept {
    return private_data_ ? std::span<const std::byte>(*private_data_) : std::span<const std::byte>{};
  }

 private:
  Phase phase_;
  int status_ = 0;
  std::shared_ptr<const std::vector<std::byte>> private_data_;  // shared: exceptions copy
};

/// Private-data limit of a connect (RC over the IB CM: InfiniBand and RoCE), after rdma_cm's
/// own header. The receiver always sees the whole field, zero-padded: encode your own length.
inline constexpr std::size_t max_connect_private_data = 56;
/// Private-data limit of an accept, as above.
inline constexpr std::size_t max_accept_private_data = 196;
/// Private-data limit of a reject, as above.
inline constexpr std::size_t max_reject_private_data = 148;

/// Thrown from ConnectionOptions::before_handshake to refuse a connection request with a reason:
/// accept() rejects the request with this private data (rdma_reject(3)), which the client's
/// ConnectError::private_data() then gives (ECONNREFUSED, status() 28), and rethrows the Reject.
class Reject : public std::runtime_error {
 public:
  /// A rejection carrying `private_data` (copied); `why` is what() on the server. Throws
  /// std::length_error for more than max_reject_private_data bytes.
  explicit Reject(std::span<const std::byte> private_data, const std::string& why = "connection request rejected");
  /// The private data the client receives.
  [[nodiscard]] std::span<const std::byte> private_data() const noexcept { return *data_; }

 private:
  std::shared_ptr<const std::vector<std::byte>> data_;
};

namespace internal {
class Router;
struct ChannelAccess;
}  // namespace internal

class EventChannel;

/// An EventChannel and the key its poll_events() names one object by: made by
/// EventChannel::key(), given as the `channel` of ConnectionOptions, ListenOptions or
/// DatagramOptions. Read only while the object is made (it shares the channel's ownership).
class ChannelKey {
 public:
  /// The channel (which may have been moved from since).
  [[nodiscard]] EventChannel& channel() const noexcept { return *channel_; }
  /// What the channel's poll_events() names the object by.
  [[nodiscard]] std::uint64_t value() const noexcept { return key_; }

 private:
  friend class EventChannel;
  ChannelKey(EventChannel& c, std::uint64_t k) noexcept : channel_(&c), key_(k) {}
  EventChannel* channel_;
  std::uint64_t key_;
};

/// One rdma_cm event channel (rdma_create_event_channel(3)) for many connections, as rdma-core's
/// cmtime and UCX use one per worker. By default each connection has a channel of its own: an
/// open() of the rdma_cm device (and a descriptor) per connection, which for hundreds of
/// connections at once costs more than the rest of setting one up. Given as
/// ConnectionOptions::channel (`ch.key(k)`) to connect() or accept(), the connection's events come through
/// this one instead, and it has no fd of its own (fd() is -1): the loop watches this one's. A
/// Listener on it (ListenOptions::channel) takes
/// its connection requests from it too, and accepts onto it: a server's loop watches one fd.
///
/// Whoever reads the channel hands each event to the connection (or handshake in progress) it is
/// for: poll_events() here, and every call of a connection on it that reads events (wait(),
/// poll_events(), PendingConnect::step() ...), so threads waiting on different connections of one
/// channel (wait(), a blocking connect() or accept()) work as with channels of their own. For an
/// event loop: watch fd(), call poll_events() when it is readable, and step() the handshakes whose
/// keys it returns (the key each object was given, `.channel = ch.key(k)`; a listener's: call
/// start_accept() until empty; a Datagram's or an established connection's: its poll_events()).
/// fd() stays readable while keys wait for poll_events(), also those that another thread's read
/// of the channel listed: a loop that does not call poll_events() spins.
///
/// Connections and listeners keep the channel alive: it may be destroyed before them. Move-only.
/// The asio helpers, which watch one object's fd(), refuse an object on an EventChannel.
class EventChannel {
 public:
  /// A new channel, non-blocking. Throws ConnectError (EMFILE, ENODEV without rdma_cm).
  explicit EventChannel(SourceLocation where = SourceLocation::current());
  EventChannel(EventChannel&&) noexcept;             ///< leaves the other empty
  EventChannel& operator=(EventChannel&&) noexcept;  ///< leaves the other empty
  EventChannel(const EventChannel&) = delete;
  EventChannel& operator=(const EventChannel&) = delete;
  ~EventChannel();

  /// An fd for an event loop (an epoll set over the channel's): readable when events wait to be
  /// read, or keys wait for poll_events(). Made by the first call (the channel alone costs one
  /// descriptor until then); -1 when it cannot be made (EMFILE) or the channel is empty.
  [[nodiscard]] int fd() const noexcept;
  /// What an object's options name this channel by (`.channel = ch.key(k)`): poll_events()
  /// returns `k` when that object has news.
  [[nodiscard]] ChannelKey key(std::uint64_t k) noexcept { return ChannelKey(*this, k); }
  /// Reads every pending event without blocking and hands each to its object; returns the key
  /// of each object that got one since the last poll_events() (here or in an object's own
  /// calls), once each, in the order they got it. A key may be of an object that has since been
  /// destroyed. The span is valid until the next poll_events(); call it from one thread at a time.
  std::span<const std::uint64_t> poll_events(std::error_code& ec) noexcept;
  /// As above; throws ConnectError.
  std::span<const std::uint64_t> poll_events(SourceLocation where = SourceLocation::current());
  /// The rdma_event_channel (its events are for poll_events(), not to be read around it).
  [[nodiscard]] rdma_event_channel* native_handle() const noexcept;

 private:
  friend struct internal::ChannelAccess;
  std::shared_ptr<internal::Router> hub_;
};

/// What ConnectionOptions::before_handshake is given.
struct Handshake {
  const QueuePair& qp;           ///< in INIT: receives may be posted, sends not yet
  const ProtectionDomain& pd;    ///< the connection's PD (its own, or ConnectionOptions::pd)
  /// On the server, the request's private data as Connection::peer_private_data() will give it
  /// (without an exposed slice); on the client, empty (the peer has not answered yet).
  std::span<const std::byte> peer_private_data;
  /// The buffer this side hands the peer in the handshake (ConnectionOptions::expose, as given):
  /// set it here to expose memory registered on `pd` now, e.g. a region made for this
  /// connection. It must stay registered as long as the peer may use it, and the QP must grant
  /// the peer a right to it (the same checks as for ConnectionOptions::expose, then).
  std::optional<RemoteSlice>& expose;
};

/// What each side sets up for a connection.
struct ConnectionOptions {
  /// RC; .access restricts what the peer may do (none by default); an .srq must be on the
  /// connection's PD (ConnectionOptions::pd), else EINVAL.
  QpOptions qp = {};
  /// How this side's QP talks to the peer (its RTR and RTS attributes), with the core's names
  /// and defaults and their budgets (TransportOptions). Applied to this side's QP, whose
  /// transitions the library makes itself, and offered in the handshake (initiator_depth,
  /// responder_resources, retry_count, rnr_retry_count; a peer whose QP librdmacm manages takes
  /// the retries for its own). The depths are capped by the device and, on accept, by the
  /// request (rdma_accept(3): the server answers within what the client offers); the client's
  /// QP takes the server's answer. Empty optionals take what rdma_cm resolved: path MTU,
  /// service level, hop limit, and the traffic class, which on the client is set with
  /// RDMA_OPTION_ID_TOS before route resolution (so rdma_cm's own packets and the service
  /// level it derives follow it). Out of range (retries over 7, ack_timeout or min_rnr_timer
  /// over 31): EINVAL before anything is sent.
  TransportOptions transport = {};
  int cq_depth = 256;                        ///< depth of the CQs the connection creates
  /// Share a PD (made from Listener::device(), device_for() or device_to()). Read only during
  /// connect() or accept(): the connection then shares the PD's ownership, so the caller's
  /// object may be moved or destroyed while the connection lives.
  const ProtectionDomain* pd = nullptr;
  CompletionQueue* send_cq = nullptr;        ///< share a send CQ instead of creating one (same device; ownership shared as for pd)
  CompletionQueue* recv_cq = nullptr;        ///< share a receive CQ instead of creating one (same device; ownership shared as for pd)
  /// Raw bytes for the peer (limits above, less 24 with `expose`). A side whose path MTU is
  /// below what the peer would use (a smaller MTU on its host, or transport.path_mtu) puts a
  /// 4-byte tag ("VM", 1, the ibv_mtu) in front, which a verbs peer reads and strips, and needs
  /// the room for it (EMSGSIZE otherwise). Without `expose`, bytes that begin with a slice's
  /// wire form or with such a tag are refused (EINVAL): the peer would misread them. The peer
  /// sees the field zero-padded, so this counts the padding too ("VR", 1 alone is refused).
  std::span<const std::byte> private_data{};
  /// A buffer the peer learns in the handshake. The QP must grant the peer a right to it
  /// (.qp.access), else connect() and accept() refuse with EINVAL before anything is sent.
  /// Lifetime: its MemoryRegion must stay registered as long as the peer may use it (until the
  /// connection ends): the slice is only an address and a key, and a region destroyed
  /// earlier, e.g. when the function that accepted returns, makes the peer's next read or write
  /// fail with REM_ACCESS_ERR. Keep the region beside the Connection.
  std::optional<RemoteSlice> expose = std::nullopt;
  /// Called once the QP exists, before this side starts or answers the handshake (before
  /// rdma_connect(3) or rdma_accept(3)). Post the first receives here: a peer may send as soon
  /// as it is connected, before connect() or accept() has returned on this side, and a send
  /// that finds no receive meets RNR (retried after the receiver's RNR timer, the sender's
  /// transport.rnr_retry_count times, then RNR_RETRY_EXC_ERR). Memory it registers on the PD must outlive the receives.
  /// It may also expose a buffer it registers on the connection's PD (Handshake::expose).
  /// An exception from it ends the connect or accept (the server rejects the request) and
  /// propagates; throw Reject to give the client a reason.
  std::function<void(const Handshake&)> before_handshake{};
  /// The rdma_cm event channel the connection's events come through, and its key there
  /// (`ch.key(k)`, see EventChannel): one shared by many connections instead of one of its own.
  std::optional<ChannelKey> channel = std::nullopt;
};

/// How cm::connect() connects (the client's side; ListenOptions is the server's).
struct ClientOptions {
  std::chrono::milliseconds timeout = 10s;         ///< deadline for the whole connect
  std::chrono::milliseconds resolve_timeout = 2s;  ///< each of address and route resolution
  std::string source_address{};                    ///< local address to connect from (default: routed)
  ConnectionOptions connection{};                  ///< what the connection sets up
};

/// How a Listener listens.
struct ListenOptions {
  int backlog = 64;  ///< connection requests the kernel queues before accept() takes them
  /// Once a request is answered: how long its client may take to confirm (ESTABLISHED),
  /// ConnectionOptions::before_handshake included; past it, a PendingAccept fails and a
  /// connection accept() returned takes the client for gone (ECONNABORTED).
  std::chrono::milliseconds handshake_timeout = 10s;
  /// RDMA_OPTION_ID_AFONLY before binding: for an IPv6 address ("::"), true listens for IPv6
  /// only, false for IPv4 too (its IPv4-mapped form); empty keeps the system's default
  /// (net.ipv6.bindv6only).
  std::optional<bool> ipv6_only = std::nullopt;
  /// Listen on an EventChannel (`ch.key(k)`) instead of an event channel of the listener's own:
  /// the channel's poll_events() names `k` when requests wait (then start_accept() until empty), fd() is the channel's, and the connections accepted are on that channel too
  /// (ConnectionOptions::channel empty or the same; another one: EINVAL), their requests' ids
  /// already there (no rdma_migrate_id(3)). Whoever reads the channel takes the requests off it
  /// for the listener, which keeps up to `backlog` of them and rejects the rest, as a full
  /// backlog does. Read only by the constructor; the listener shares the channel's ownership.
  /// The asio helpers (async_accept) need a listener with a channel of its own.
  std::optional<ChannelKey> channel = std::nullopt;
};

/// One established RC connection: its cm id, device, PD, CQs and QP. Move-only. Destroying it
/// disconnects (if still connected) and releases everything in the right order.
///
/// rdma_cm events are read from the connection's own event channel (fd()), without a thread:
/// wait() watches both the CQ and that channel, so a peer that disconnects or dies turns the
/// wait into ConnectError(ECONNRESET) instead of a hang.
///
/// Async events (ibv_get_async_event(3)) are the device context's, shared by every connection
/// on it: wait(), spin() and poll_events() read them through the context's one
/// reader (see Device::poll_async_events), which routes each by its ibv_qp and QP number. A
/// QP_FATAL, QP_REQ_ERR or QP_ACCESS_ERR of this connection's QP ends it with
/// ConnectError(EIO), and DEVICE_FATAL every connection on the device with ConnectError(ENODEV),
/// the message naming the event, as a disconnect does (this side then disconnects, so the peer
/// hears). Other events, and these too, are kept for Device::poll_async_events() on device() (or
/// any Device on the context): reading them here takes none from the user. For an event loop,
/// watch the device's native async fd (device().native_handle()->async_fd: readable while the
/// kernel has events) as well as fd() and the CQs' fds, and call poll_events() when one is
/// readable. Not device().async_fd(): it stays readable while kept events wait for
/// Device::poll_async_events(), which poll_events() does not call (a loop would spin).
///
/// Threads (as libibverbs states it per verb):
/// - wait(), wait_one(), spin(), spin_one(), wait_disconnected(), poll_events(), connected(),
///   address_changed() and disconnect() may be called from several threads at once: e.g. a
///   sender waiting on send_cq() and a receiver on recv_cq(). The connection's state is
///   atomic, and whichever thread reads the event that ends the connection wakes the others,
///   so each of them fails (ECONNRESET, ENODEV, ENOTCONN) within milliseconds. Two threads
///   waiting on the same CQ are free of races too, but each completion (and each channel
///   event) goes to one of them, and the other may sleep until its timeout: keep one waiter
///   per CQ.
/// - Posting on qp() follows QueuePair's rules (the core's), and polling a CQ CompletionQueue's.
/// - The library never posts on the connection's QP nor polls its CQs for itself: every
///   completion in them is the caller's.
/// - The accessors (device(), pd(), send_cq(), recv_cq(), qp(), peer_*(), fd(), ...) read
///   what is fixed at establishment: safe from any thread.
/// - Moving, assigning and destroying the Connection: not while any other call runs.
class Connection {
 public:
  /// Moves the connection; the source is left empty (only destruction is allowed).
  Connection(Connection&&) noexcept;
  /// Moves the connection; the one this held is closed first.
  Connection& operator=(Connection&&) noexcept;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  /// Disconnects if still connected, then destroys QP, CQs, PD and cm id in that order.
  ~Connection();

  /// The device rdma_cm chose for the address (librdmacm's context).
  [[nodiscard]] Device& device() noexcept;
  /// The protection domain: the connection's own, or one that shares the ibv_pd of
  /// ConnectionOptions::pd (the same native_handle(), another object).
  [[nodiscard]] const ProtectionDomain& pd() const noexcept;
  /// The send completion queue (with a completion channel when the connection made it); with
  /// ConnectionOptions::send_cq, an object sharing that CQ, as pd() does.
  [[nodiscard]] const CompletionQueue& send_cq() const noexcept;
  /// The receive completion queue, as send_cq().
  [[nodiscard]] const CompletionQueue& recv_cq() const noexcept;
  /// The connected RC queue pair, in RTS, to post on (posting is const: the QP stays the
  /// connection's, and cannot be moved out). The library makes its transitions itself (librdmacm
  /// does not manage it), so it never grants a right the options did not ask for. Once the
  /// connection ends (either side's disconnect, the peer's departure) the connection moves it
  /// to ERR, flushing what is posted, and its state() says ERR (the posts allowed are the same
  /// as in RTS: the move is made while other threads may be posting).
  [[nodiscard]] const QueuePair& qp() const noexcept;

  /// The private data the peer attached (without the exposed slice), zero-padded to the field.
  [[nodiscard]] std::span<const std::byte> peer_private_data() const noexcept;
  /// The buffer the peer exposed in the handshake, if it did.
  [[nodiscard]] const std::optional<RemoteSlice>& peer_remote() const noexcept;
  /// As peer_remote(); throws ConnectError (EPROTO) when the peer exposed nothing.
  [[nodiscard]] RemoteSlice remote(SourceLocation where = SourceLocation::current()) const;
  /// The peer's address and port, e.g. "192.0.2.1:7471".
  [[nodiscard]] std::string peer_address() const;
  /// This side's address and port.
  [[nodiscard]] std::string local_address() const;

  /// Waits up to `timeout` for completions on `cq`, while watching the connection. Returns what
  /// was polled, empty on timeout; once the CQ is empty and the peer has disconnected (or died),
  /// fails with ECONNRESET (phase established), ENODEV when the RDMA device was removed (or
  /// raised DEVICE_FATAL), EIO when the QP got a fatal async event (QP_FATAL, QP_REQ_ERR,
  /// QP_ACCESS_ERR), or ENOTCONN after a local disconnect(). Never blocks past `timeout`. It
  /// sleeps on the CQ's completion channel; a CQ without one is busy-polled (as spin()), and a
  /// CQ whose channel is shared with other CQs (CqOptions::channel) is refused with
  /// Errc::bad_argument, as CompletionQueue::wait() refuses it: sleeping there would take the
  /// other CQs' events from whoever watches that channel. Wait on the channel, or spin().
  std::span<Completion> wait(const CompletionQueue& cq, std::span<Completion> out, std::chrono::milliseconds timeout,
                             std::error_code& ec) noexcept;
  /// As above; throws ConnectError instead of setting an error_code (recording `where`).
  std::span<Completion> wait(const CompletionQueue& cq, std::span<Completion> out, std::chrono::milliseconds timeout,
                             SourceLocation where = SourceLocation::current());
  /// One completion from `cq`, empty on timeout; throws ConnectError as wait() does.
  std::optional<Completion> wait_one(const CompletionQueue& cq, std::chrono::milliseconds timeout,
                                     SourceLocation where = SourceLocation::current()) {
    Completion c;
    if (wait(cq, std::span(&c, 1), timeout, where).empty()) return std::nullopt;
    return c;
  }

  /// As wait(), but busy-polls `cq` (even one with a completion channel, which it does not
  /// arm), and looks at the connection every 1024 empty polls (a system call each time): for a
  /// latency-bound loop that must still notice a vanished peer at once (ECONNRESET within
  /// milliseconds of rdma_cm's DISCONNECTED), not when a request is flushed or times out.
  /// Uses the CPU until a completion comes or `timeout` passes.
  std::span<Completion> spin(const CompletionQueue& cq, std::span<Completion> out, std::chrono::milliseconds timeout,
                             std::error_code& ec) noexcept;
  /// As above; throws ConnectError instead of setting an error_code (recording `where`).
  std::span<Completion> spin(const CompletionQueue& cq, std::span<Completion> out, std::chrono::milliseconds timeout,
                             SourceLocation where = SourceLocation::current());
  /// One completion from `cq` by spin(), empty on timeout; throws ConnectError as spin() does.
  std::optional<Completion> spin_one(const CompletionQueue& cq, std::chrono::milliseconds timeout,
                                     SourceLocation where = SourceLocation::current()) {
    Completion c;
    if (spin(cq, std::span(&c, 1), timeout, where).empty()) return std::nullopt;
    return c;
  }

  /// Handles pending rdma_cm events and the device's pending async events without blocking;
  /// false once the connection is over (the peer disconnected, the RDMA device was removed, or
  /// a fatal async event came for the QP or the device).
  bool poll_events(SourceLocation where = SourceLocation::current());
  /// True from establishment until either side disconnects or the device goes (as far as
  /// events have told).
  [[nodiscard]] bool connected() const noexcept;
  /// True once rdma_cm reported ADDR_CHANGE: the netdev of the connection's address changed its
  /// hardware address (e.g. a bonding failover). The connection may still work; rdma_cm
  /// suggests reconnecting so that RDMA follows the network stack.
  [[nodiscard]] bool address_changed() const noexcept;
  /// Waits up to `timeout` for the connection to end, without throwing for a normal goodbye:
  /// true once rdma_cm's DISCONNECTED has arrived (the peer disconnected, or answered this
  /// side's disconnect()), the device was removed, or (a connection accept() handed out
  /// unconfirmed) the client never confirmed; false on timeout. The CQs are not read:
  /// completions stay for wait() or poll() (the QP is moved to ERR, so posted requests flush).
  /// Sets `ec` only when rdma_cm itself fails. Never blocks past `timeout`.
  bool wait_disconnected(std::chrono::milliseconds timeout, std::error_code& ec) noexcept;
  /// As above; throws ConnectError only when rdma_cm itself fails.
  bool wait_disconnected(std::chrono::milliseconds timeout, SourceLocation where = SourceLocation::current());
  /// Graceful close (rdma_disconnect(3)): the QP goes to ERR and its outstanding requests
  /// flush; the peer sees DISCONNECTED. Idempotent.
  void disconnect(SourceLocation where = SourceLocation::current());

  /// The connection's rdma_cm event channel fd (non-blocking), for an event loop: when it is
  /// readable, call poll_events(). -1 on an EventChannel (ConnectionOptions::channel): watch
  /// that channel's fd, call its poll_events() and then poll_events() of the connections it names.
  [[nodiscard]] int fd() const noexcept;
  /// The rdma_cm id (for librdmacm calls the wrapper does not cover).
  [[nodiscard]] rdma_cm_id* native_handle() const noexcept;

  /// The connection's state (private to the implementation).
  struct Impl;

 private:
  friend class Listener;
  friend class PendingConnect;
  friend class PendingAccept;
  explicit Connection(std::unique_ptr<Impl> impl) noexcept;
  /// wait() and spin().
  std::span<Completion> wait_cq(const CompletionQueue& cq, std::span<Completion> out, std::chrono::milliseconds timeout,
                                std::error_code& ec, bool busy = false) noexcept;
  /// The throwing form of wait() and spin().
  std::span<Completion> wait_or_throw(const CompletionQueue& cq, std::span<Completion> out, std::chrono::milliseconds timeout,
                                      bool busy, SourceLocation where);
  std::unique_ptr<Impl> impl_;
};

/// Resolves `host`:`port`, connects an RC QP and returns the connection. Throws ConnectError
/// saying which phase failed and why (no listener: ECONNREFUSED; silent or unreachable
/// address: ETIMEDOUT or EHOSTUNREACH within `timeout`; no RDMA device: ENODEV; private data
/// too large: EMSGSIZE, before anything is sent). Errors record `where`, the caller's line.
[[nodiscard]] Connection connect(std::string_view host, std::uint16_t port, const ClientOptions& options = {},
                                 SourceLocation where = SourceLocation::current());
/// As above, reporting failure through `ec` (and returning empty).
[[nodiscard]] std::optional<Connection> connect(std::string_view host, std::uint16_t port,
                                                const ClientOptions& options, std::error_code& ec);

/// A connect in progress that never blocks, for an event loop: start_connect() sends the first
/// request and returns at once; step() does what the events that came since allow (resolve the
/// route, create the QP and send the connection request, complete the handshake) and returns
/// the Connection once established. Call it when fd() is readable, and at deadline() at the
/// latest: every phase keeps its limit (ClientOptions::resolve_timeout for each resolution,
/// ClientOptions::timeout for the whole), and step() fails when it passes. Failures are
/// ConnectError naming the phase, as connect()'s (connect() itself is this, waited on).
/// ClientOptions are copied (the private data too), but what their pointers name
/// (ConnectionOptions::pd, send_cq, recv_cq, srq) must live until step() has returned the
/// Connection or failed, and ConnectionOptions::before_handshake runs inside step(). Move-only;
/// destroying it abandons the connect. One thread at a time.
class PendingConnect {
 public:
  /// Moves the connect in progress; the source is left empty.
  PendingConnect(PendingConnect&&) noexcept;
  /// Moves the connect in progress; the one this held is abandoned.
  PendingConnect& operator=(PendingConnect&&) noexcept;
  PendingConnect(const PendingConnect&) = delete;
  PendingConnect& operator=(const PendingConnect&) = delete;
  ~PendingConnect();

  ///@{
  /// Handles what has come without blocking: the Connection once established, else empty.
  /// Throws ConnectError (the ec form sets `ec`) when the phase failed or its limit passed;
  /// after a failure every call fails the same way.
  [[nodiscard]] std::optional<Connection> step();
  [[nodiscard]] std::optional<Connection> step(std::error_code& ec) noexcept;
  ///@}
  /// The rdma_cm event channel's fd (non-blocking): readable when step() has something to do.
  /// -1 on an EventChannel: watch the channel's fd (its poll_events() says whose news it has).
  [[nodiscard]] int fd() const noexcept;
  /// When the current phase's limit passes: call step() then, if fd() stayed silent.
  [[nodiscard]] std::chrono::steady_clock::time_point deadline() const noexcept;
  /// The phase in progress.
  [[nodiscard]] Phase phase() const noexcept;

 private:
  friend PendingConnect start_connect(std::string_view, std::uint16_t, const ClientOptions&, SourceLocation);
  friend Connection connect(std::string_view, std::uint16_t, const ClientOptions&, SourceLocation);
  struct Impl;
  explicit PendingConnect(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

/// Starts connecting to `host`:`port` without blocking (rdma_resolve_addr(3) is sent); see
/// PendingConnect. Throws ConnectError for what fails at once: bad options or private data
/// (EINVAL, EMSGSIZE), an address that does not parse, no device for the source address.
[[nodiscard]] PendingConnect start_connect(std::string_view host, std::uint16_t port, const ClientOptions& options = {},
                                           SourceLocation where = SourceLocation::current());

/// An accepted request whose handshake is in progress, for an event loop: the server has
/// answered (its QP in RTS); step() returns the Connection once the client confirms
/// (ESTABLISHED), and fails at deadline() (ListenOptions::handshake_timeout). Move-only;
/// destroying it abandons the connection. One thread at a time.
class PendingAccept {
 public:
  /// Moves the handshake in progress; the source is left empty.
  PendingAccept(PendingAccept&&) noexcept;
  /// Moves the handshake in progress; the one this held is abandoned.
  PendingAccept& operator=(PendingAccept&&) noexcept;
  PendingAccept(const PendingAccept&) = delete;
  PendingAccept& operator=(const PendingAccept&) = delete;
  ~PendingAccept();

  ///@{
  /// The Connection once the client confirmed, else empty, without blocking. Throws
  /// ConnectError (phase accept) when the handshake failed or its limit passed.
  [[nodiscard]] std::optional<Connection> step();
  [[nodiscard]] std::optional<Connection> step(std::error_code& ec) noexcept;
  ///@}
  /// The connection's own event channel fd (non-blocking): readable when step() has news; -1 on
  /// an EventChannel (as PendingConnect::fd()).
  [[nodiscard]] int fd() const noexcept;
  /// When the handshake's limit passes.
  [[nodiscard]] std::chrono::steady_clock::time_point deadline() const noexcept;

 private:
  friend class Listener;
  struct Impl;
  explicit PendingAccept(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

/// The device that owns a local IP address, as librdmacm sees it: a PD, CQ or SRQ made from it
/// can be shared by connections on that address (ConnectionOptions::pd and the CQ pointers).
/// Throws ConnectError (ENODEV) when no RDMA device has the address.
[[nodiscard]] Device device_for(std::string_view local_address, SourceLocation where = SourceLocation::current());

/// The device a connection to `host` would use (rdma_resolve_addr(3) without connecting), so
/// that a client can register memory, and expose it in the handshake, before it connects:
/// `ProtectionDomain pd{cm::device_to(host)}` then ConnectionOptions{.pd = &pd, .expose = ...}.
/// Throws ConnectError (phase resolve_address): ETIMEDOUT, EHOSTUNREACH, ENODEV.
[[nodiscard]] Device device_to(std::string_view host, std::chrono::milliseconds timeout = 2s,
                               SourceLocation where = SourceLocation::current());

/// A listening rdma_cm id. Each accepted Connection is independent of the listener and of
/// each other (its own event channel, or an EventChannel: ConnectionOptions::channel, or the
/// listener's, ListenOptions::channel); the listener may be destroyed while they live, and the
/// requests it took off an EventChannel but no accept took are then rejected.
/// Threads: accept() from one thread at a time per Listener (they read one event channel);
/// different Listeners, connect() and the Connections may be used from any threads at once.
class Listener {
 public:
  /// Binds to `address` ("0.0.0.0" or "::" for every device) and `port` (0: any free port,
  /// see port()) and listens. Throws ConnectError (phase listen): EADDRINUSE, ENODEV when no
  /// RDMA device has that address.
  Listener(std::string_view address, std::uint16_t port, const ListenOptions& options = {},
           SourceLocation where = SourceLocation::current());
  /// Moves the listener; the source is left empty.
  Listener(Listener&&) noexcept;
  /// Moves the listener; the one this held stops listening.
  Listener& operator=(Listener&&) noexcept;
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  /// Stops listening; connections accepted from it live on.
  ~Listener();

  /// Waits up to `timeout` for a connection request, answers it with `options` (one request
  /// per call: what the options hold is this connection's) and returns the connection once the
  /// client has confirmed it (ESTABLISHED), or earlier, its QP in RTS, when another request
  /// waits or `timeout` has passed: a client that stalls its handshake holds up no other
  /// request, and accept() never blocks past `timeout` (accept(0ms) when fd() is readable suits
  /// an event loop). A connection handed out unconfirmed sees the confirmation as an event; if
  /// none comes within ListenOptions::handshake_timeout, or the client's handshake fails, the
  /// client is taken to have gone: wait() and spin() fail with ECONNABORTED, wait_disconnected()
  /// returns true, connected() is false, and poll_events() returns false once called after that
  /// limit (an event loop calls it then: no fd turns readable for it); what it sent before the
  /// client's QP was ready waits for a transport retry. A request whose client has gone, or whose
  /// handshake failed already, is dropped, and the call goes on to the next request. Other
  /// events on the listener are skipped, but DEVICE_REMOVAL fails with ENODEV. Throws
  /// ConnectError (phase accept): ETIMEDOUT when no request came, EMSGSIZE for private data
  /// over the limit (checked before waiting; nothing is sent); what before_handshake throws
  /// propagates (the request is rejected). start_accept() waits for the confirmation instead.
  /// A client that connected and disconnected
  /// before this side saw the connection established gives a Connection already closed by
  /// the peer (connected() false; wait() fails with ECONNRESET once the CQ is empty).
  [[nodiscard]] Connection accept(std::chrono::milliseconds timeout, const ConnectionOptions& options = {},
                                  SourceLocation where = SourceLocation::current());
  /// As above, reporting failure through `ec` (and returning empty).
  [[nodiscard]] std::optional<Connection> accept(std::chrono::milliseconds timeout, const ConnectionOptions& options,
                                                 std::error_code& ec);
  /// accept() without blocking, for an event loop: takes a pending connection request, if any,
  /// answers it (ConnectionOptions::before_handshake runs here) and returns the handshake in
  /// progress; empty when no request is pending. Call it when fd() is readable, until empty.
  /// Throws ConnectError as accept() does (the request is then rejected, and the next one may
  /// be taken).
  [[nodiscard]] std::optional<PendingAccept> start_accept(const ConnectionOptions& options = {},
                                                          SourceLocation where = SourceLocation::current());

  /// The port listened on (the one the system chose when constructed with port 0).
  [[nodiscard]] std::uint16_t port() const noexcept;
  /// The device the listener is bound to; throws ConnectError (ENODEV) for a wildcard address.
  [[nodiscard]] Device device(SourceLocation where = SourceLocation::current()) const;
  /// The listener's event channel fd: readable when a connection request is waiting. -1 on an
  /// EventChannel (ListenOptions::channel): watch the channel's fd.
  [[nodiscard]] int fd() const noexcept;
  /// The listening rdma_cm id.
  [[nodiscard]] rdma_cm_id* native_handle() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace verbs::cm
