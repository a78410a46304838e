// verbs::cm::Datagram: a UD queue pair on an rdma_cm id of RDMA_PS_UDP (rdma_cm(7) beyond RC):
// peers found by address (resolve() asks a listening Datagram for its QP number, by SIDR) and
// multicast groups (join(), leave()), with the same deadlines and named failures as cm::connect.
// Built on the core; the core knows nothing of it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <rdma/rdma_cma.h>

#include "verbs/address_handle.hpp"
#include "verbs/cm.hpp"
#include "verbs/completion_queue.hpp"
#include "verbs/device.hpp"
#include "verbs/protection_domain.hpp"
#include "verbs/queue_pair.hpp"

namespace verbs::cm {

/// rdma_cm's Q_Key for RDMA_PS_UDP (RDMA_UDP_QKEY): a Datagram's QP takes it, and the peers
/// and groups rdma_cm resolves give it; rdma-core's udaddy and mckey use it too.
inline constexpr std::uint32_t datagram_qkey = RDMA_UDP_QKEY;
/// The QP number a multicast group is sent to (DatagramPeer::qp_num of a joined group).
inline constexpr std::uint32_t multicast_qp_num = 0xffffff;
/// Private-data limit of a resolve() request (SIDR REQ, after rdma_cm's own header).
inline constexpr std::size_t max_resolve_private_data = 180;
/// Private-data limit of an answer (SIDR REP, Datagram::accept).
inline constexpr std::size_t max_answer_private_data = 136;

/// Where UD sends go for a peer or group rdma_cm resolved (rdma_ud_param): post
/// `SendWr::send(slice).to(peer.ah, peer.qp_num, peer.qkey)` on the Datagram's QP.
struct DatagramPeer {
  AddressHandle ah;              ///< on the Datagram's PD
  std::uint32_t qp_num = 0;      ///< the peer's QP, or multicast_qp_num for a group
  std::uint32_t qkey = 0;        ///< the peer's Q_Key (datagram_qkey)
  /// The listener's answer to resolve() (zero-padded by the transport: encode your own
  /// length); empty for a group.
  std::vector<std::byte> private_data;
};

/// How a Datagram joins a multicast group (rdma_join_multicast_ex(3)'s join flags).
enum class Membership : std::uint8_t {
  full,       ///< sends to the group and receives what is sent to it (RDMA_MC_JOIN_FLAG_FULLMEMBER)
  send_only,  ///< sends only: the QP is not attached, so nothing sent to the group reaches it
              ///< (RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER; on RoCE no IGMP membership either)
};

/// How a Datagram is made.
struct DatagramOptions {
  /// Must be UD (anything else: EINVAL). Its qkey is replaced by datagram_qkey, the one
  /// rdma_cm gives peers.
  QpOptions qp = {.type = QpType::ud};
  int cq_depth = 256;  ///< depth of the CQs the Datagram creates (with a completion channel)
  /// Share a PD of the same device (cm::device_for() the address) instead of making one.
  const ProtectionDomain* pd = nullptr;
  CompletionQueue* send_cq = nullptr;  ///< share a send CQ of the same device instead of creating one
  CompletionQueue* recv_cq = nullptr;  ///< share a receive CQ of the same device instead of creating one
  /// RDMA_OPTION_ID_REUSEADDR before binding (rdma_set_option(3)): the port may be bound again
  /// while other ids that asked for it too hold it, as SO_REUSEADDR does for sockets.
  bool reuse_address = false;
  /// Its events through an EventChannel (`ch.key(k)`) instead of a channel of its own: the
  /// channel's poll_events() names `k` when it has news (requests, joins, dropped groups), and
  /// fd() is -1. Its resolves (start_resolve()) keep channels of their own.
  std::optional<ChannelKey> channel = std::nullopt;
};

/// How Datagram::resolve() reaches a listening Datagram.
struct ResolveOptions {
  std::chrono::milliseconds timeout = 10s;         ///< deadline for the whole resolve
  std::chrono::milliseconds resolve_timeout = 2s;  ///< each of address and route resolution
  /// Raw bytes for the listener (up to max_resolve_private_data; it sees them zero-padded).
  std::span<const std::byte> private_data{};
};

/// A request a listening Datagram answered (accept()).
struct DatagramRequest {
  /// The requester's "address:port": the port is its request's (resolve() asks from a
  /// short-lived id of its own), not its Datagram's.
  std::string peer_address;
  std::vector<std::byte> private_data; ///< what it sent (zero-padded by the transport)
};

/// A resolve() in progress that never blocks, for an event loop (Datagram::start_resolve()
/// sends the address resolution and returns at once): step() does what the events that came
/// since allow (resolve the route, send the SIDR request, take the answer) and returns the
/// DatagramPeer once answered. Call it when fd() is readable, and at deadline() at the latest:
/// each phase keeps resolve()'s limits (ResolveOptions::resolve_timeout for each resolution,
/// ResolveOptions::timeout for the whole), and step() fails when one passes, with resolve()'s
/// ConnectError (resolve() is this, waited on). It has an rdma_cm id and event channel of its
/// own, and keeps the Datagram's PD (the answer's address handle is made on it); the request
/// names the Datagram's QP, so the answer is of use only while that Datagram lives. The
/// options are copied. Move-only; destroying it abandons the request. One thread at a time.
class PendingResolve {
 public:
  /// Moves the request in progress; the source is left empty.
  PendingResolve(PendingResolve&&) noexcept;
  /// Moves the request in progress; the one this held is abandoned.
  PendingResolve& operator=(PendingResolve&&) noexcept;
  PendingResolve(const PendingResolve&) = delete;
  PendingResolve& operator=(const PendingResolve&) = delete;
  ~PendingResolve();

  ///@{
  /// Handles what has come without blocking: the peer once answered, else empty. Throws
  /// ConnectError (the ec form sets `ec`) when the phase failed or its limit passed; after a
  /// failure, or once the peer was returned, every call fails (ENOTCONN after success).
  [[nodiscard]] std::optional<DatagramPeer> step();
  [[nodiscard]] std::optional<DatagramPeer> step(std::error_code& ec) noexcept;
  ///@}
  /// Its rdma_cm event channel's fd (non-blocking): readable when step() has something to do;
  /// -1 once it is over.
  [[nodiscard]] int fd() const noexcept;
  /// When the current phase's limit passes: call step() then, if fd() stayed silent.
  [[nodiscard]] std::chrono::steady_clock::time_point deadline() const noexcept;
  /// The phase in progress: resolve_address, resolve_route, then connect (the SIDR request).
  [[nodiscard]] Phase phase() const noexcept;

 private:
  friend class Datagram;
  struct Impl;
  explicit PendingResolve(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

/// A join() in progress that never blocks (Datagram::start_join() asks rdma_cm and returns at
/// once): step() reads the Datagram's event channel (Datagram::fd()) and returns the group's
/// DatagramPeer once rdma_cm confirmed and the QP is attached; it fails with join()'s
/// ConnectError, at deadline() at the latest. Several joins may be in progress on one
/// Datagram: a step() hands the events of the others to them, which then have them even though
/// fd() is no longer readable, so step every join in progress when it is. The group counts as
/// joined (groups(), leave(), the Datagram's destructor leaves it) only once step() returned
/// its peer; a join that failed or was abandoned (destroyed before that) is left at once. The
/// Datagram may be moved meanwhile; if it is destroyed first, the join is left and step() fails
/// with ECANCELED. Move-only; one thread at a time, together with the Datagram's own rdma_cm
/// calls (accept(), join(), leave()).
class PendingJoin {
 public:
  /// Moves the join in progress; the source is left empty.
  PendingJoin(PendingJoin&&) noexcept;
  /// Moves the join in progress; the one this held is abandoned (and left).
  PendingJoin& operator=(PendingJoin&&) noexcept;
  PendingJoin(const PendingJoin&) = delete;
  PendingJoin& operator=(const PendingJoin&) = delete;
  ~PendingJoin();

  ///@{
  /// Handles what has come without blocking: the group's peer once joined, else empty. Throws
  /// ConnectError (phase connect; the ec form sets `ec`) when the join failed or its limit
  /// passed; after a failure, or once the peer was returned, every call fails.
  [[nodiscard]] std::optional<DatagramPeer> step();
  [[nodiscard]] std::optional<DatagramPeer> step(std::error_code& ec) noexcept;
  ///@}
  /// The Datagram's rdma_cm event channel fd (non-blocking); -1 once it is over, and on an
  /// EventChannel (DatagramOptions::channel: watch the channel's).
  [[nodiscard]] int fd() const noexcept;
  /// When the join's limit passes: call step() then, if fd() stayed silent.
  [[nodiscard]] std::chrono::steady_clock::time_point deadline() const noexcept;
  /// The group, as given to start_join().
  [[nodiscard]] const std::string& group() const noexcept;

 private:
  friend class Datagram;
  struct Impl;
  explicit PendingJoin(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

/// A UD queue pair on an rdma_cm id of RDMA_PS_UDP, bound to a local address: its device, PD,
/// CQs and QP (in RTS, Q_Key datagram_qkey). One QP talks to every peer: resolve() gives a
/// DatagramPeer for a listening Datagram elsewhere, join() one for a multicast group, and a
/// receive's sender is answered with AddressHandle::reply_to(). Receives need 40 bytes more
/// than the message (the GRH), as on any UD QP. Move-only; destroying it leaves its groups and
/// releases QP, CQs, PD and id in that order, so that its port is free and nothing listens
/// there any more even while what was made from it (a region on its PD, a DatagramPeer's
/// address handle) lives on: those keep the device context through an id of their own.
///
/// Threads: one thread at a time for resolve(), accept(), join(), start_join(), leave() and its
/// PendingJoins (their steps, moves and destruction: they change the Datagram's joins; on an
/// EventChannel, other threads' reads of the channel hand the Datagram its events under the
/// channel's lock); posting and polling follow the core's QueuePair and CompletionQueue rules.
class Datagram {
 public:
  /// Binds to `address` (an address of the RDMA device; "0.0.0.0" or "::" is refused, since a
  /// QP needs one device) and `port` (0: any free port, see port()), and makes the QP. Throws
  /// ConnectError (phase listen): EINVAL for a QP type other than UD or a wildcard address,
  /// EADDRINUSE, ENODEV when no RDMA device has the address.
  Datagram(std::string_view address, std::uint16_t port = 0, const DatagramOptions& options = {},
           SourceLocation where = SourceLocation::current());
  /// Moves the Datagram; the source is left empty (only destruction is allowed).
  Datagram(Datagram&&) noexcept;
  /// Moves the Datagram; the one this held is released first.
  Datagram& operator=(Datagram&&) noexcept;
  Datagram(const Datagram&) = delete;
  Datagram& operator=(const Datagram&) = delete;
  /// Leaves its groups, then destroys QP, CQs, PD and id in that order.
  ~Datagram();

  /// The device of the bound address (librdmacm's context).
  [[nodiscard]] Device& device() noexcept;
  /// The protection domain (its own, or sharing DatagramOptions::pd's).
  [[nodiscard]] const ProtectionDomain& pd() const noexcept;
  /// The send completion queue.
  [[nodiscard]] const CompletionQueue& send_cq() const noexcept;
  /// The receive completion queue.
  [[nodiscard]] const CompletionQueue& recv_cq() const noexcept;
  /// The UD queue pair, in RTS, to post on (posting is const: the QP stays the Datagram's).
  [[nodiscard]] const QueuePair& qp() const noexcept;
  /// The port bound (the one the system chose for port 0).
  [[nodiscard]] std::uint16_t port() const noexcept;
  /// The bound "address:port".
  [[nodiscard]] std::string local_address() const;
  /// The rdma_cm event channel's fd (non-blocking): readable when a listening Datagram has a
  /// request for poll_accept(), or poll_events() has news; -1 on an EventChannel.
  [[nodiscard]] int fd() const noexcept;
  /// The rdma_cm id.
  [[nodiscard]] rdma_cm_id* native_handle() const noexcept;

  /// Asks the listening Datagram at `host`:`port` for its QP (rdma_connect(3) on RDMA_PS_UDP:
  /// a SIDR request from a short-lived id of its own) and returns where to send to it. Throws
  /// ConnectError naming the phase: ECONNREFUSED (nothing listens there, or the listener
  /// refused), ETIMEDOUT (no answer within the options' limits), EHOSTUNREACH, ENODEV (the
  /// route leaves by another device than this Datagram's), EMSGSIZE (private data over
  /// max_resolve_private_data, before anything is sent).
  [[nodiscard]] DatagramPeer resolve(std::string_view host, std::uint16_t port, const ResolveOptions& options = {},
                                     SourceLocation where = SourceLocation::current());
  /// resolve() without blocking, for an event loop: sends the address resolution and returns;
  /// see PendingResolve. Throws ConnectError for what fails at once (EMSGSIZE, an address that
  /// does not parse, rdma_resolve_addr(3) refusing).
  [[nodiscard]] PendingResolve start_resolve(std::string_view host, std::uint16_t port,
                                             const ResolveOptions& options = {},
                                             SourceLocation where = SourceLocation::current());

  /// Listens for resolve() requests (rdma_listen(3)); accept() answers them. Throws
  /// ConnectError (phase listen), EINVAL once the Datagram has joined a group or is joining one.
  void listen(int backlog = 64, SourceLocation where = SourceLocation::current());
  /// Waits up to `timeout` for a resolve() request and answers it with this QP's number and
  /// `private_data` (up to max_answer_private_data, checked before waiting). Post receives
  /// first: the requester may send as soon as it has the answer. Throws ConnectError (phase
  /// accept): ETIMEDOUT when no request came, EINVAL before listen(), EMSGSIZE, ENODEV when
  /// the device was removed.
  DatagramRequest accept(std::chrono::milliseconds timeout, std::span<const std::byte> private_data = {},
                         SourceLocation where = SourceLocation::current());
  /// accept() without waiting, for an event loop (call it when fd() is readable): empty when
  /// no request is pending. (poll_* never waits, as poll_events() and CompletionQueue::poll.)
  std::optional<DatagramRequest> poll_accept(std::span<const std::byte> private_data = {},
                                            SourceLocation where = SourceLocation::current());

  /// Joins the multicast group `group` (rdma_join_multicast_ex(3); IPv4 224.0.0.0/4 or IPv6
  /// ff00::/8) as `membership` says, waits up to `timeout` for rdma_cm to confirm, attaches the
  /// QP (ibv_attach_mcast(3); not for Membership::send_only) and returns where to send to the
  /// group. Throws ConnectError (phase connect): EINVAL for an address that is not multicast,
  /// for a group already joined, or on a listening Datagram; ETIMEDOUT; the status of
  /// MULTICAST_ERROR.
  [[nodiscard]] DatagramPeer join(std::string_view group, std::chrono::milliseconds timeout = 2s,
                                  SourceLocation where = SourceLocation::current()) {
    return join(group, Membership::full, timeout, where);
  }
  /// join() as `membership` says (join(group) is Membership::full).
  [[nodiscard]] DatagramPeer join(std::string_view group, Membership membership, std::chrono::milliseconds timeout = 2s,
                                  SourceLocation where = SourceLocation::current());
  /// join() without blocking, for an event loop: asks rdma_cm to join and returns; see
  /// PendingJoin. Throws ConnectError for what fails at once (join()'s EINVAL cases, a group
  /// being joined already, rdma_join_multicast_ex(3) refusing).
  [[nodiscard]] PendingJoin start_join(std::string_view group, std::chrono::milliseconds timeout = 2s,
                                       SourceLocation where = SourceLocation::current()) {
    return start_join(group, Membership::full, timeout, where);
  }
  /// start_join() as `membership` says.
  [[nodiscard]] PendingJoin start_join(std::string_view group, Membership membership,
                                       std::chrono::milliseconds timeout = 2s,
                                       SourceLocation where = SourceLocation::current());
  /// Leaves `group` (ibv_detach_mcast(3), then rdma_leave_multicast(3)): the QP receives no
  /// more of its messages. Throws ConnectError (EINVAL) for a group not joined.
  void leave(std::string_view group, SourceLocation where = SourceLocation::current());
  /// The groups joined, as given to join().
  [[nodiscard]] std::vector<std::string> groups() const;

  /// Handles what rdma_cm said of the Datagram since, without blocking: a group it dropped
  /// (MULTICAST_ERROR after the join: "no longer accessible and should be rejoined",
  /// rdma_get_cm_event(3)) is left and listed by lost_groups(); an ADDR_CHANGE sets
  /// address_changed(). False once the RDMA device was removed (DEVICE_REMOVAL). Call it when
  /// fd() is readable: afterwards fd() is not readable for what it read.
  bool poll_events(SourceLocation where = SourceLocation::current());
  /// The groups rdma_cm dropped (poll_events()), until joined again.
  [[nodiscard]] std::vector<std::string> lost_groups() const;
  /// True once rdma_cm reported ADDR_CHANGE for the bound address (poll_events()).
  [[nodiscard]] bool address_changed() const noexcept;

 private:
  friend class PendingJoin;
  /// start_resolve() of an address already parsed (or looked up, by resolve()).
  PendingResolve start_resolve_at(const sockaddr_storage& dst, std::string_view host, std::uint16_t port,
                                  const ResolveOptions& options, SourceLocation where);

 public:
  struct Impl;  ///< (private to the implementation)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace verbs::cm
