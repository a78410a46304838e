// QueuePair: ibv_create_qp(3), ibv_modify_qp(3), ibv_post_send(3), ibv_post_recv(3).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>

#include <infiniband/verbs.h>

#include "verbs/completion_queue.hpp"
#include "verbs/device.hpp"
#include "verbs/error.hpp"
#include "verbs/memory_region.hpp"
#include "verbs/protection_domain.hpp"
#include "verbs/shared_receive_queue.hpp"
#include "verbs/work_request.hpp"

namespace verbs {

/// Queue pair transport: reliable connected, unreliable connected, unreliable datagram.
enum class QpType : std::uint8_t { rc = IBV_QPT_RC, uc = IBV_QPT_UC, ud = IBV_QPT_UD };
/// "RC", "UC" or "UD".
std::string_view to_string(QpType t) noexcept;

/// Mirrors enum ibv_qp_state.
enum class QpState : std::uint8_t {
  reset = IBV_QPS_RESET, init = IBV_QPS_INIT, rtr = IBV_QPS_RTR, rts = IBV_QPS_RTS,
  sqd = IBV_QPS_SQD, sqe = IBV_QPS_SQE, err = IBV_QPS_ERR, unknown = IBV_QPS_UNKNOWN,
};
/// The state's name, e.g. "RTS".
std::string_view to_string(QpState s) noexcept;

/// How to create a QueuePair (ibv_qp_init_attr and the INIT attributes).
struct QpOptions {
  QpType type = QpType::rc;               ///< RC, UC or UD
  std::uint32_t max_send_wr = 128;        ///< outstanding send-queue requests (devices round up)
  std::uint32_t max_recv_wr = 128;        ///< outstanding receives (ignored with an SRQ)
  std::uint32_t max_send_sge = 1;         ///< scatter/gather entries per send request
  std::uint32_t max_recv_sge = 1;         ///< scatter/gather entries per receive
  std::uint32_t max_inline_data = 0;      ///< inline bytes per send; the device limit is not queryable (verbs-info probes it)
  bool signal_all = false;                    ///< every send completes, whatever PostOptions::signaled says
  const SharedReceiveQueue* srq = nullptr;    ///< receives come from this SRQ (kept alive by the QP)
  AccessFlags access = {};                    ///< remote operations the peer may perform (RC/UC); none by default
  std::uint8_t port = 1;                      ///< local port
  std::uint16_t pkey_index = 0;               ///< partition key index
  std::uint32_t qkey = 0x11111111;            ///< UD only
  std::optional<std::uint32_t> gid_index = std::nullopt;     ///< default: Device::choose_gid's pick
  void* context = nullptr;  ///< qp_context: AsyncEvent::context() of the events this QP raises
  /// Create with ibv_create_qp_ex(3) and the send operations of its type (IBV_QP_INIT_ATTR_SEND_OPS_FLAGS),
  /// so that QueuePair::batch() can post through the extended API (ibv_wr_post(3)); post() works too.
  bool extended = false;
  /// The PSN of this QP's first request (24 bits), which the peer's RTR must expect: endpoint()
  /// carries it, so a peer that connects from this QP's Endpoint needs nothing else. Default: a
  /// random one per QP (as rdma-core's tools draw theirs). Set it to speak a protocol that fixes
  /// or sends its own (ibv_rc_pingpong exchanges "LID QPN PSN GID"). Over 24 bits: Error
  /// (Errc::bad_argument). Not for a cm::Connection, whose PSNs rdma_cm chooses (refused, EINVAL).
  std::optional<std::uint32_t> psn = std::nullopt;
};

/// What a peer needs to connect to a QP: {qp_num, psn, gid or lid, mtu, qkey}, with a fixed
/// little-endian wire encoding for exchanging it out of band.
struct Endpoint {
  std::uint32_t qp_num = 0;  ///< the QP number
  std::uint32_t psn = 0;     ///< 24 bits
  std::uint32_t qkey = 0;    ///< UD
  Gid gid{};                   ///< zero on InfiniBand without a GRH
  std::uint16_t lid = 0;     ///< InfiniBand; 0 on RoCE
  Mtu mtu = Mtu::mtu1024;    ///< the port's active MTU

  /// Magic "VE", version 1, a zero byte, qp_num, psn, qkey (u32 each), lid u16, mtu u8, a zero
  /// byte, gid (16 bytes).
  static constexpr std::size_t wire_size = 36;
  /// The encoded form.
  using Wire = std::array<std::byte, wire_size>;
  /// The wire form, to send to the peer.
  [[nodiscard]] Wire encode() const noexcept;
  ///@{
  /// Parses encode()'s output. Throws Error(Errc::bad_encoding) saying what is wrong; the
  /// error_code form returns empty instead.
  [[nodiscard]] static Endpoint decode(std::span<const std::byte> wire, SourceLocation where = SourceLocation::current());
  [[nodiscard]] static std::optional<Endpoint> decode(std::span<const std::byte> wire, std::error_code& ec) noexcept;
  ///@}
  /// Equal when every field is.
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

/// How a connected QP talks to its peer: the attributes of RTR and RTS, named as rdma_cm names
/// them (rdma_conn_param, rdma_set_option), so the core and cm::ConnectionOptions::transport
/// share one vocabulary. The defaults never wait forever: on rxe a retry count of 7 retries
/// without end, and an RNR retry count of 7 is infinite by the specification. An empty optional
/// takes the default given; through rdma_cm (cm::ConnectionOptions::transport), what rdma_cm
/// negotiated or resolved for the connection instead.
///
/// Budgets of the defaults, as failure_bound() computes them (the RNR timer is the responder's):
/// - a peer that stops answering: 7 tries of at most 4 x 67 ms (the specification lets the
///   ACK timer fire between 1 and 4 times 4.096 us x 2^ack_timeout), so a request fails with
///   RETRY_EXC_ERR within 1.88 s (rxe waits one 67 ms period a try: about 0.5 s there);
/// - a receiver without a posted receive (RNR): 6 retries 491.52 ms apart, so the receiver has
///   2.95 s to post one before the send fails with RNR_RETRY_EXC_ERR. A send that meets
///   RNR waits at least 491.52 ms, so post receives ahead; lower min_rnr_timer (e.g. 12,
///   0.64 ms) to retry sooner with a correspondingly shorter budget.
struct TransportOptions {
  /// Default: the smaller of both ports' active MTU. cm: the smaller of the route's (the
  /// client's active MTU) and this port's; a side that takes less than the peer would use
  /// tells it in the handshake (a 4-byte tag before the private data), and both use the
  /// smaller. A peer that is not verbs does not read the tag: set the same MTU on both hosts
  /// (`verbs-info --check --peer HOST` compares them).
  std::optional<Mtu> path_mtu = std::nullopt;
  /// Reads/atomics this side may have in flight (max_rd_atomic); default min(16, device)
  /// (cm: also within what the peer offers).
  std::optional<std::uint8_t> initiator_depth = std::nullopt;
  /// Reads/atomics the peer may have in flight to this side (max_dest_rd_atomic); default
  /// min(16, device) (cm: also within what the peer offers).
  std::optional<std::uint8_t> responder_resources = std::nullopt;
  std::uint8_t min_rnr_timer = 31;    ///< RNR NAK timer (IB spec table): 31 = 491.52 ms, 12 = 0.64 ms, 0 = 655.36 ms
  std::uint8_t ack_timeout = 14;      ///< 4.096 µs * 2^14 = 67 ms per try (0..31)
  std::uint8_t retry_count = 6;       ///< transport retries, 0..7 (7 is infinite on rxe)
  std::uint8_t rnr_retry_count = 6;   ///< receiver-not-ready retries, 0..7 (7 is infinite)
  std::optional<std::uint8_t> service_level = std::nullopt;  ///< SL; default 0 (cm: the route's)
  std::optional<std::uint8_t> traffic_class = std::nullopt;  ///< GRH traffic class (DSCP and ECN on RoCE v2); default 0 (cm: the route's)
  /// GRH hop limit (IP TTL on RoCE v2); default 64 (cm: the route's). On RoCE, Linux replaces it
  /// with the route's hop limit when RTR is set (ib_resolve_eth_dmac), whatever was asked:
  /// QueuePair::query() shows what the QP uses.
  std::optional<std::uint8_t> hop_limit = std::nullopt;
};

/// The local ACK timeout period Tr that an ack_timeout code stands for: 4.096 us x 2^code, so
/// 14 is 67.108864 ms. Empty for 0, which disables the timer (a request to a silent peer then
/// waits forever). Throws Error(Errc::bad_argument) over 31.
[[nodiscard]] constexpr std::optional<std::chrono::nanoseconds> ack_timeout_duration(
    std::uint8_t ack_timeout, SourceLocation where = SourceLocation::current()) {
  if (ack_timeout > 31)
    detail::throw_error(make_error_code(Errc::bad_argument), "ack_timeout_duration: ack_timeout is 0..31", where);
  if (ack_timeout == 0) return std::nullopt;
  return std::chrono::nanoseconds(std::int64_t{4096} << ack_timeout);
}

/// The RNR NAK timer value that a min_rnr_timer code stands for, from the InfiniBand
/// specification's table: 0 = 655.36 ms, 1 = 0.01 ms, 2 = 0.02 ms, ... 12 = 0.64 ms, ...
/// 31 = 491.52 ms. Throws Error(Errc::bad_argument) over 31.
[[nodiscard]] constexpr std::chrono::microseconds rnr_timer_duration(std::uint8_t min_rnr_timer,
                                                                    SourceLocation where = SourceLocation::current()) {
  // In units of 10 us, as the specification lists them (in ms, to two decimals).
  constexpr std::array<std::uint32_t, 32> table{65536, 1,   2,    3,    4,    6,    8,    12,   16,   24,   32,
                                                48,    64,  96,   128,  192,  256,  384,  512,  768,  1024, 1536,
                                                2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
  if (min_rnr_timer > 31)
    detail::throw_error(make_error_code(Errc::bad_argument), "rnr_timer_duration: min_rnr_timer is 0..31", where);
  return std::chrono::microseconds(std::int64_t{10} * table[min_rnr_timer]);
}

/// How long a request on an RC QP can take at most before its completion fails (failure_bound()),
/// each figure rounded up to a whole millisecond. Empty means never: the QP retries forever.
/// Counted from the last progress, since each acknowledgement resets both retry counters. The
/// figures are the specification's; round trips come on top, and software timers fire late:
/// rxe's by up to an eighth of each wait (kernel timer wheel), and never sooner than a jiffy
/// (1-10 ms), so allow some slack. The defaults' 6 RNR waits took 3.06 s on rxe, where `rnr`
/// says 2.95 s and `total` 4.829 s.
struct FailureBound {
  /// A peer that stops answering: retry_count + 1 local ACK timeouts, each at most 4 Tr (the
  /// specification lets the timer fire between Tr and 4 Tr), then RETRY_EXC_ERR. Empty for
  /// ack_timeout 0 (no timer) and retry_count 7 (rxe retries forever then; in the
  /// specification only an rnr_retry_count of 7 is infinite).
  std::optional<std::chrono::milliseconds> transport;
  /// A receiver that posts no receive: rnr_retry_count waits of the peer's RNR NAK timer, then
  /// RNR_RETRY_EXC_ERR. Empty for rnr_retry_count 7 (infinite). On rxe, an RNR wait longer than
  /// the ACK timeout also uses up a transport retry, so the request can fail sooner there,
  /// with RETRY_EXC_ERR.
  std::optional<std::chrono::milliseconds> rnr;
  /// What to wait at most for any request: one may meet both, so the sum; empty if either is.
  std::optional<std::chrono::milliseconds> total;
  /// Equal when every figure is.
  friend bool operator==(const FailureBound&, const FailureBound&) = default;
};

///@{
/// The longest a request can take to fail with these TransportOptions (ack_timeout,
/// retry_count, rnr_retry_count) towards a peer whose min_rnr_timer is `peer_min_rnr_timer`:
/// the RNR timer that delays a request is the responder's. Without it, the peer uses the same
/// options (options.min_rnr_timer). Throws Error(Errc::bad_argument) for options out of range
/// (retries over 7, ack_timeout or min_rnr_timer over 31) and a peer_min_rnr_timer over 31.
[[nodiscard]] constexpr FailureBound failure_bound(const TransportOptions& options, std::uint8_t peer_min_rnr_timer,
                                                   SourceLocation where = SourceLocation::current()) {
  using std::chrono::ceil;
  using std::chrono::milliseconds;
  using std::chrono::nanoseconds;
  if (options.retry_count > 7 || options.rnr_retry_count > 7 || options.ack_timeout > 31 || options.min_rnr_timer > 31 ||
      peer_min_rnr_timer > 31)
    detail::throw_error(make_error_code(Errc::bad_argument),
                        "failure_bound: retry_count and rnr_retry_count are 0..7, ack_timeout and min_rnr_timer 0..31",
                        where);
  FailureBound b;
  std::optional<nanoseconds> transport, rnr;
  if (const auto tr = ack_timeout_duration(options.ack_timeout, where); tr && options.retry_count != 7)
    transport = *tr * 4 * (options.retry_count + 1);
  if (options.rnr_retry_count != 7) rnr = rnr_timer_duration(peer_min_rnr_timer, where) * options.rnr_retry_count;
  if (transport) b.transport = ceil<milliseconds>(*transport);
  if (rnr) b.rnr = ceil<milliseconds>(*rnr);
  if (transport && rnr) b.total = ceil<milliseconds>(*transport + *rnr);
  return b;
}
[[nodiscard]] constexpr FailureBound failure_bound(const TransportOptions& options,
                                                   SourceLocation where = SourceLocation::current()) {
  return failure_bound(options, options.min_rnr_timer, where);
}
///@}

/// Where a connected QP sends (ibv_ah_attr as ibv_query_qp(3) reports it): the peer's address
/// and how packets to it are marked.
struct AddressVector {
  Gid dgid{};                      ///< the peer's GID (RoCE, or InfiniBand with a GRH)
  std::uint16_t dlid = 0;          ///< the peer's LID (InfiniBand; 0 on RoCE)
  std::uint32_t sgid_index = 0;    ///< the local GID index packets leave from
  std::uint32_t flow_label = 0;    ///< GRH flow label (20 bits)
  std::uint8_t hop_limit = 0;      ///< GRH hop limit (IP TTL on RoCE v2)
  std::uint8_t traffic_class = 0;  ///< GRH traffic class (DSCP and ECN on RoCE v2)
  std::uint8_t service_level = 0;  ///< service level
  std::uint8_t port = 0;           ///< local port
  bool global = false;             ///< a GRH is sent (is_global): always on RoCE
  /// Equal when every field is.
  friend bool operator==(const AddressVector&, const AddressVector&) = default;
};

/// What ibv_query_qp(3) reports of a QP (QueuePair::query()), typed and named as
/// TransportOptions and QpOptions name them: what the device uses, which can differ from what
/// was asked (measured on rxe 6.1: responder_resources rounded up to a power of two, 3 reads
/// 4; on RoCE the hop limit is the route's; the queues' real size, 127 for 64 asked).
/// Attributes of a state the QP has not reached read as the device leaves them (zero before
/// RTR). Alternate paths (APM) are not reported.
struct QpAttributes {
  QpState state = QpState::reset;  ///< the device's view of the state
  bool sq_draining = false;        ///< SQD: the send queue is still draining
  Mtu path_mtu = Mtu::mtu256;      ///< RTR: the MTU of the path to the peer
  std::uint32_t dest_qp_num = 0;   ///< RTR: the peer's QP number (RC, UC)
  std::uint32_t rq_psn = 0;        ///< RTR: the PSN expected next from the peer (24 bits)
  std::uint32_t sq_psn = 0;        ///< RTS: the PSN of the next request sent (24 bits)
  std::uint32_t qkey = 0;          ///< UD: the Q_Key
  AccessFlags access = {};         ///< what the peer may do on this QP (RC, UC)
  std::uint16_t pkey_index = 0;    ///< partition key index
  std::uint8_t port = 0;           ///< local port (as set at INIT)
  std::uint8_t initiator_depth = 0;      ///< RTS: reads/atomics this side may have in flight (max_rd_atomic)
  std::uint8_t responder_resources = 0;  ///< RTR: the peer's reads/atomics in flight to this side (max_dest_rd_atomic)
  std::uint8_t min_rnr_timer = 0;        ///< RTR: the RNR NAK timer this side asks of a sender
  std::uint8_t ack_timeout = 0;          ///< RTS: local ACK timeout code (ack_timeout_duration())
  std::uint8_t retry_count = 0;          ///< RTS: transport retries
  std::uint8_t rnr_retry_count = 0;      ///< RTS: RNR retries
  AddressVector address{};               ///< RTR: where packets go (RC, UC)
  std::uint32_t max_send_wr = 0;         ///< capacities, as the device reports them now
  std::uint32_t max_recv_wr = 0;         ///< (with an SRQ: 0)
  std::uint32_t max_send_sge = 0;        ///< scatter/gather entries per send request
  std::uint32_t max_recv_sge = 0;        ///< scatter/gather entries per receive
  std::uint32_t max_inline_data = 0;     ///< inline bytes per send
  /// The transport attributes as TransportOptions, every optional set: to compare with what
  /// was asked, or to connect another QP alike. Meaningful for an RC QP in RTR or later (before
  /// RTR, and on UC or UD, the fields the state or type lacks read 0; an ack_timeout of 0
  /// would disable the retry timer).
  [[nodiscard]] TransportOptions transport() const noexcept {
    return {.path_mtu = path_mtu, .initiator_depth = initiator_depth, .responder_resources = responder_resources,
            .min_rnr_timer = min_rnr_timer, .ack_timeout = ack_timeout, .retry_count = retry_count,
            .rnr_retry_count = rnr_retry_count, .service_level = address.service_level,
            .traffic_class = address.traffic_class, .hop_limit = address.hop_limit};
  }
};

class QueuePair;
class SendBatch;

/// What a flush makes of the writes before it at the responder (IBA 1.5's FLUSH; rdma-core
/// 45): visible to every agent there (global), or persistent as well.
enum class FlushLevel : std::uint8_t {
  global = 1,      ///< IBV_FLUSH_GLOBAL: the target region needs Access::flush_global
  persistent = 2,  ///< IBV_FLUSH_PERSISTENT: the target region needs Access::flush_persistent
};

namespace detail {
// Flush by value: rdma-core 44's headers do not name it (45's IBV_WR_FLUSH, IBV_QP_EX_WITH_FLUSH,
// IBV_FLUSH_RANGE and IBV_FLUSH_MR).
inline constexpr unsigned wr_flush_op = 14;
inline constexpr std::uint64_t qp_ex_with_flush = std::uint64_t{1} << 11;
inline constexpr std::uint8_t flush_range = 0, flush_mr = 1;  // ibv_selectivity_level
/// The extended QP has ibv_wr_flush's entry (rdma-core 45 on): checked on the type, so that
/// the code compiles against older headers too.
template <class Q>
concept has_wr_flush = requires(Q* q) { q->wr_flush; };
/// ibv_wr_flush(3): `placement` is the FlushLevel (ibv_placement_type, its `type`), `selectivity`
/// flush_range or flush_mr (ibv_selectivity_level, its `level`).
template <class Q>
[[gnu::always_inline]] inline void wr_flush(Q* q, std::uint32_t rkey, std::uint64_t addr, std::size_t length,
                                            std::uint8_t placement, std::uint8_t selectivity) noexcept {
  if constexpr (has_wr_flush<Q>) q->wr_flush(q, rkey, addr, length, placement, selectivity);
}
/// Moves `qp` to ERR (flushing what is posted) while other threads may be posting on it, and
/// makes state() say so: for the rdma_cm connection, which ends its QP so. Errors are ignored
/// (the QP is being given up).
void flush_to_error(QueuePair& qp) noexcept;
/// A QP for an rdma_cm connection, whose source GID rdma_cm chose (`source_gid`, the id's):
/// made without choose_gid's queries; its index is taken from the address vector of its RTR
/// (rdma_init_qp_attr(3)), and gid_index() is 0 until then.
QueuePair rdma_cm_queue_pair(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                             const CompletionQueue& recv_cq, const QpOptions& options, const Gid& source_gid,
                             SourceLocation where);
}  // namespace detail

/// The rdma-core headers this code was compiled against have ibv_wr_flush (45 or newer): else
/// SendBatch::flush is refused (Errc::flush_unsupported), whatever the device reports.
inline constexpr bool built_with_flush = detail::has_wr_flush<ibv_qp_ex>;

/// A queue pair. Move-only; keeps its protection domain, CQs and SRQ alive.
///
/// Posting never allocates, locks or throws: a post returns a PostResult, and a request that
/// fails a check (slice bounds, atomic alignment and length, inline size, SGE count, QP type,
/// QP state) is rejected with nothing posted. Buffers must stay valid, and regions registered,
/// until the request's completion is polled (or, unsignaled, a later signaled one).
///
/// Threads: posts (send and receive) may run on several threads at once, and alongside
/// query_state(); the state transitions and refresh_state() change what posts read, so they
/// must not overlap a post on this QP.
class QueuePair {
 public:
  /// ibv_create_qp(3). Throws Error (EINVAL for capacities over the device's limits, e.g. an
  /// inline size over max_inline_data; ENOMEM).
  ///@{
  QueuePair(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
            const QpOptions& options = {}, SourceLocation where = SourceLocation::current())
      : QueuePair(pd, send_cq, recv_cq, options, nullptr, where) {}
  QueuePair(const ProtectionDomain& pd, const CompletionQueue& cq, const QpOptions& options = {},
            SourceLocation where = SourceLocation::current())
      : QueuePair(pd, cq, cq, options, where) {}
  ///@}

  /// The attributes the constructor passes to ibv_create_qp, for code that creates the QP
  /// elsewhere (e.g. rdma_create_qp(3)) and then adopts it.
  [[nodiscard]] static ibv_qp_init_attr init_attr(const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                                                  const QpOptions& options) noexcept;
  /// Wraps a QP created elsewhere. `qp`'s deleter destroys it and must keep alive whatever the QP
  /// uses (PD, CQs, SRQ, a cm id); `granted` is the capacity its creation wrote back, `state`
  /// the state it is in (query_state() reads the device's view). With QpOptions::extended the
  /// QP must be an extended one (ibv_create_qp_ex), and `send_ops` the send_ops_flags it was
  /// made with: a batch() refuses what they lack (the provider has no function for it). Only
  /// ibv_query_port, ibv_query_device_ex and, on RoCE, the GID choice are asked of the device.
  [[nodiscard]] static QueuePair adopt(std::shared_ptr<ibv_qp> qp, const QpOptions& options,
                                       const ibv_qp_cap& granted, QpState state, std::uint64_t send_ops = 0);

  ///@{
  /// Move-only: the moved-from QP is empty, and refuses every post (Errc::empty_object) and
  /// transition (Error(Errc::empty_object)) instead of handing a null QP to the device.
  QueuePair(QueuePair&& o) noexcept : QueuePair() { swap(o); }
  QueuePair& operator=(QueuePair&& o) noexcept {
    QueuePair(std::move(o)).swap(*this);
    return *this;
  }
  ///@}
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;
  ~QueuePair() = default;
  /// Exchanges two QueuePairs.
  void swap(QueuePair& o) noexcept {
    // Every member: a moved-from QP must end up as a default-constructed (empty) one.
    qp_.swap(o.qp_);
    std::swap(local_, o.local_);
    std::swap(allowed_, o.allowed_);
    std::swap(type_ops_, o.type_ops_);
    std::swap(max_send_sge_, o.max_send_sge_);
    std::swap(max_recv_sge_, o.max_recv_sge_);
    std::swap(max_inline_, o.max_inline_);
    std::swap(max_send_wr_, o.max_send_wr_);
    std::swap(max_recv_wr_, o.max_recv_wr_);
    std::swap(gid_index_, o.gid_index_);
    std::swap(access_, o.access_);
    std::swap(pkey_index_, o.pkey_index_);
    std::swap(port_, o.port_);
    o.state_.store(state_.exchange(o.state_.load(std::memory_order_relaxed), std::memory_order_relaxed),
                   std::memory_order_relaxed);
    std::swap(type_, o.type_);
    std::swap(has_srq_, o.has_srq_);
    std::swap(ethernet_, o.ethernet_);
    std::swap(gid_at_rtr_, o.gid_at_rtr_);
    std::swap(atomics_, o.atomics_);
    std::swap(max_init_rd_atom_, o.max_init_rd_atom_);
    std::swap(max_rd_atom_, o.max_rd_atom_);
    std::swap(ud_max_, o.ud_max_);
    std::swap(min_recv_bytes_, o.min_recv_bytes_);
    std::swap(qpx_, o.qpx_);
    std::swap(ext_ops_, o.ext_ops_);
    std::swap(batch_allowed_, o.batch_allowed_);
    std::swap(split_sge_, o.split_sge_);
  }
  /// False for a moved-from (empty) QP.
  [[nodiscard]] explicit operator bool() const noexcept { return qp_ != nullptr; }

  // ---- state transitions (ibv_modify_qp(3)); each throws Error with the errno ----
  /// RESET -> INIT, with the access rights and port of the options. Receives may be posted
  /// from INIT on (not in RESET): call it before connect() to have them ready for the peer.
  void to_init(SourceLocation where = SourceLocation::current());
  /// INIT -> RTR towards `remote` (RC/UC); UD needs no remote.
  void to_rtr(const Endpoint& remote, const TransportOptions& options = {},
              SourceLocation where = SourceLocation::current());
  /// RTR -> RTS.
  void to_rts(const TransportOptions& options = {}, SourceLocation where = SourceLocation::current());
  /// (RESET ->) INIT -> RTR -> RTS towards `remote`, from RESET or from INIT. The peer may send
  /// as soon as its own side is connected, and a send that finds no receive meets RNR: post the
  /// first receives in INIT (to_init(), post_recv(), then connect()), and they are kept.
  void connect(const Endpoint& remote, const TransportOptions& options = {},
               SourceLocation where = SourceLocation::current());
  /// UD: (RESET ->) INIT -> RTR -> RTS.
  void activate(SourceLocation where = SourceLocation::current());
  /// ibv_modify_qp(3) with attributes made elsewhere, e.g. by rdma_init_qp_attr(3) for a QP that
  /// librdmacm does not manage. With IBV_QP_STATE in `mask`, state() and the posts allowed
  /// follow `attr.qp_state`, as after the transitions above (and with the same threading rule).
  void modify(ibv_qp_attr& attr, int mask, SourceLocation where = SourceLocation::current());
  /// Any state -> RESET; outstanding requests are discarded. The QP can then connect again.
  void reset(SourceLocation where = SourceLocation::current());
  /// Any state -> ERR; outstanding requests complete with WR_FLUSH_ERR.
  void to_error(SourceLocation where = SourceLocation::current());
  /// ibv_query_qp(3): the device's view, which can differ from state() after an error (the
  /// device moves a QP to ERR on a failed request). Changes nothing in this object, so it may be
  /// called while another thread posts.
  [[nodiscard]] QpState query_state(SourceLocation where = SourceLocation::current()) const;
  /// ibv_query_qp(3), every attribute: state, path MTU, PSNs, timeouts and retry counts, the
  /// read/atomic depths, access, the address vector and the capacities. Changes nothing in
  /// this object, so it may be called while another thread posts. Throws Error with the errno,
  /// Error(Errc::empty_object) for a moved-from QP.
  [[nodiscard]] QpAttributes query(SourceLocation where = SourceLocation::current()) const;
  /// ibv_query_qp_data_in_order(3): whether the data of one request of opcode `op` arriving at
  /// this QP (IBV_WR_RDMA_WRITE, IBV_WR_SEND: the peer's, written here; IBV_WR_RDMA_READ: this
  /// QP's reads) is written in order, so that a CPU reader may poll the last byte instead of
  /// the completion. With `flags` 0: 1 if the whole message is written in order, else 0. With
  /// IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS (1; rdma-core 46 on) the set of
  /// IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG (1) and _ALIGNED_128_BYTES (2). Never an error from
  /// the device: a provider without the query (rxe) and a CPU other than x86 give 0, and so
  /// does rdma-core 46 on for flags it does not know. Not for a target region registered with
  /// Access::relaxed_ordering. Throws Error(Errc::empty_object) for a moved-from QP.
  [[nodiscard]] int data_in_order(ibv_wr_opcode op, std::uint32_t flags = 0,
                                  SourceLocation where = SourceLocation::current()) const;
  /// As query_state(), and makes the device's view this object's state(): for a QP whose
  /// state something else changed (rdma_cm, or ibv_modify_qp on native_handle()). Like the
  /// transitions, not while another thread posts on this QP.
  QpState refresh_state(SourceLocation where = SourceLocation::current());
  /// The state of the last transition this object made (no system call).
  [[nodiscard]] QpState state() const noexcept { return static_cast<QpState>(state_now_()); }

  /// What the peer needs to connect to this QP: its number, its first PSN (QpOptions::psn, or
  /// drawn at random when the QP was made), its GID or LID, MTU and Q_Key.
  [[nodiscard]] Endpoint endpoint() const noexcept { return local_; }
  /// The QP number.
  [[nodiscard]] std::uint32_t qp_num() const noexcept { return local_.qp_num; }
  /// RC, UC or UD.
  [[nodiscard]] QpType type() const noexcept { return type_; }
  ///@{
  /// Capacities the device granted (at least what was asked).
  [[nodiscard]] std::uint32_t max_send_sge() const noexcept { return max_send_sge_; }
  [[nodiscard]] std::uint32_t max_recv_sge() const noexcept { return max_recv_sge_; }
  [[nodiscard]] std::uint32_t max_inline_data() const noexcept { return max_inline_; }
  [[nodiscard]] std::uint32_t max_send_wr() const noexcept { return max_send_wr_; }
  [[nodiscard]] std::uint32_t max_recv_wr() const noexcept { return max_recv_wr_; }
  ///@}
  /// The local GID index the QP uses (RoCE, or IB with a GRH): QpOptions::gid_index, or
  /// choose_gid's pick, until a modify() with an address vector names another (as the rdma_cm
  /// connection's RTR does: over IPv6 or a VLAN, rdma_cm's source GID); endpoint().gid follows.
  /// A cm::Connection's QP on RoCE has rdma_cm's source GID from the start, and its index from
  /// its RTR on (0 before, as Handshake::qp shows it).
  [[nodiscard]] std::uint32_t gid_index() const noexcept { return gid_index_; }
  /// The local port.
  [[nodiscard]] std::uint8_t port() const noexcept { return port_; }
  /// Made with QpOptions::extended: batch() posts through ibv_wr_*.
  [[nodiscard]] bool extended() const noexcept { return qpx_ != nullptr; }
  /// The extended QP's send operations (IBV_QP_EX_WITH_* of ibv_qp_init_attr_ex::send_ops_flags);
  /// 0 when not extended.
  [[nodiscard]] std::uint64_t send_ops() const noexcept { return ext_ops_; }

  // ---- posting ----
  // The one-request posts are always inlined (whatever the optimiser's size heuristics say), so
  // that a request built from constants folds: what remains is what a hand-written ibv_send_wr
  // costs, plus a bit test and the checks that depend on run-time values (bench/overhead).

  // Not by value: the 208-byte request would be copied even when inlined.
  ///@{
  /// Posts one send-queue request. A temporary is posted in place; an lvalue is copied first,
  /// since posting sets the request's sg_list and next.
  [[gnu::always_inline]] PostResult post(SendWr&& wr) const noexcept { return post_(wr); }
  [[gnu::always_inline]] PostResult post(const SendWr& wr) const noexcept {
    SendWr w = wr;
    return post_(w);
  }
  ///@}
  /// Posts a chain in one ibv_post_send call (one doorbell). Every request is checked first,
  /// and none is posted if one fails a check. The span is relinked in place.
  PostResult post(std::span<SendWr> wrs) const noexcept {
    if (wrs.empty()) return {};
    for (std::size_t i = 0; i < wrs.size(); ++i) {
      SendWr& w = wrs[i];
      if (!passes_(w)) [[unlikely]] return rejected_(w, static_cast<std::uint32_t>(i));
      w.wr_.sg_list = w.sge_;
      w.wr_.next = i + 1 < wrs.size() ? &wrs[i + 1].wr_ : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(qp_.get(), &wrs[0].wr_, &bad);
    if (rc != 0) [[unlikely]] {
      std::uint32_t at = 0;
      while (at < wrs.size() && &wrs[at].wr_ != bad) ++at;
      return PostResult::device_error(detail::rc_to_errno(rc), at);
    }
    return {};
  }

  // The span forms of post_write, post_read, post_send and post_recv read the caller's slices
  // during the call, so they take any number of them (up to the QP's max_send_sge or
  // max_recv_sge), where a SendWr or RecvWr holds at most max_wr_slices.
  ///@{
  /// RDMA write (SendWr::write).
  [[gnu::always_inline]] PostResult post_write(LocalSlice src, RemoteSlice dst, const PostOptions& o = {}) const noexcept {
    SendWr w = SendWr::write(src, dst, o);
    return post_(w);
  }
  [[gnu::always_inline]] PostResult post_write(std::span<const LocalSlice> src, RemoteSlice dst,
                                               const PostOptions& o = {}) const noexcept {
    SendWr w = SendWr::borrowing_write_(src, dst, o);
    return post_borrowing_(w);
  }
  ///@}
  /// RDMA write with immediate (host byte order).
  [[gnu::always_inline]] PostResult post_write_imm(LocalSlice src, RemoteSlice dst, std::uint32_t imm,
                                                   const PostOptions& o = {}) const noexcept {
    SendWr w = SendWr::write_imm(src, dst, imm, o);
    return post_(w);
  }
  ///@{
  /// RDMA read of the front of `src` into `dst`.
  [[gnu::always_inline]] PostResult post_read(LocalSlice dst, RemoteSlice src, const PostOptions& o = {}) const noexcept {
    SendWr w = SendWr::read(dst, src, o);
    return post_(w);
  }
  [[gnu::always_inline]] PostResult post_read(std::span<const LocalSlice> dst, RemoteSlice src,
                                              const PostOptions& o = {}) const noexcept {
    SendWr w = SendWr::borrowing_read_(dst, src, o);
    return post_borrowing_(w);
  }
  ///@}
  ///@{
  /// Send (RC/UC; UD needs SendWr::send(...).to(ah, qpn, qkey)).
  [[gnu::always_inline]] PostResult post_send(LocalSlice src, const PostOptions& o = {}) const noexcept {
    SendWr w = SendWr::send(src, o);
    return post_(w);
  }
  [[gnu::always_inline]] PostResult post_send(std::span<const LocalSlice> src, const PostOptions& o = {}) const noexcept {
    SendWr w = SendWr::borrowing_send_(src, o);
    return post_borrowing_(w);
  }
  ///@}
  /// Send with immediate (`imm` in host byte order).
  [[gnu::always_inline]] PostResult post_send_imm(LocalSlice src, std::uint32_t imm, const PostOptions& o = {}) const noexcept {
    SendWr w = SendWr::send_imm(src, imm, o);
    return post_(w);
  }
  /// Atomic fetch-and-add on an 8-byte, 8-aligned remote target; the old value lands in `result`.
  [[gnu::always_inline]] PostResult post_fetch_add(LocalSlice result, RemoteSlice target, std::uint64_t add,
                                                   const PostOptions& o = {}) const noexcept {
    SendWr w = SendWr::fetch_add(result, target, add, o);
    return post_(w);
  }
  /// Atomic compare-and-swap on an 8-byte, 8-aligned remote target.
  [[gnu::always_inline]] PostResult post_compare_swap(LocalSlice result, RemoteSlice target, std::uint64_t compare,
                                                      std::uint64_t swap, const PostOptions& o = {}) const noexcept {
    SendWr w = SendWr::compare_swap(result, target, compare, swap, o);
    return post_(w);
  }

  ///@{
  /// Posts receives (ibv_post_recv(3)). Rejected with Errc::qp_has_srq on a QP that uses an
  /// SRQ, Errc::bad_qp_state in RESET, Errc::too_many_slices for a RecvWr built from more than
  /// max_wr_slices, Errc::too_many_sge over max_recv_sge. The span of slices is read during
  /// the call: any number up to max_recv_sge.
  PostResult post_recv(std::span<RecvWr> wrs) const noexcept { return post_recv_<true>(wrs); }
  PostResult post_recv(LocalSlice dst, std::uint64_t wr_id = 0) const noexcept {
    RecvWr wr(dst, wr_id);
    return post_recv_<true>(std::span(&wr, 1));
  }
  PostResult post_recv(std::span<const LocalSlice> dst, std::uint64_t wr_id = 0) const noexcept {
    RecvWr wr = RecvWr::borrowing_(dst, wr_id);
    return post_recv_<false>(std::span(&wr, 1));
  }

  ///@}

  /// Opens a batch of requests posted through the extended API (ibv_wr_start(3)); see SendBatch.
  /// On a QP made without QpOptions::extended every request of it is refused (Errc::qp_not_extended).
  [[nodiscard]] SendBatch batch() const noexcept;

  /// The C handle.
  [[nodiscard]] ibv_qp* native_handle() const noexcept { return qp_.get(); }
  /// The extended QP (ibv_qp_to_qp_ex(3)); null when not extended.
  [[nodiscard]] ibv_qp_ex* native_ex_handle() const noexcept { return qpx_; }
  /// Shares ownership of the C handle: the ibv_qp, and what it keeps alive, lives until the last
  /// owner is gone (e.g. a thread that still queries it).
  [[nodiscard]] std::shared_ptr<ibv_qp> shared_handle() const noexcept { return qp_; }

 private:
  // The failure paths are out of line, so that what is inlined into every post is the checks,
  // two stores and the provider's call.
  // A request the user holds (or built in the call from one slice): sg_list points at its own
  // copies of its slices, wherever the object is now.
  [[gnu::always_inline]] PostResult post_(SendWr& wr) const noexcept {
    wr.wr_.sg_list = wr.sge_;
    return post_borrowing_(wr);
  }
  // A request whose sg_list is set: a borrowing one (SendWr::borrowing_*), or post_()'s.
  [[gnu::always_inline]] PostResult post_borrowing_(SendWr& wr) const noexcept {
    if (!passes_(wr)) [[unlikely]] return rejected_(wr, 0);
    wr.wr_.next = nullptr;
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(qp_.get(), &wr.wr_, &bad);
    if (rc != 0) [[unlikely]] return device_error_(rc);
    return {};
  }
  // Every check a request must pass before posting. One bit of allowed_ covers the QP state, the
  // QP type and, for a request with its one SGE inside, the SGE count. For a request built inline
  // the build-time error is a known constant on each path, and with constant options the inline
  // test folds too: what is left is the bit test (and the remote-size compare made when building).
  [[nodiscard]] bool passes_(const SendWr& w) const noexcept {
    return passes_(allowed_, w.key_, w.err_, w.wr_.num_sge, (w.wr_.send_flags & IBV_SEND_INLINE) != 0, w.total_);
  }
  // The same for a request given as its parts: what SendBatch checks, against its own mask.
  [[gnu::always_inline]] [[nodiscard]] bool passes_(std::uint64_t allowed, unsigned key, unsigned err, int num_sge,
                                                    bool inline_data, std::uint64_t total) const noexcept {
    return err == 0 && ((allowed >> key) & 1u) != 0 &&
           ((key & SendWr::one_sge_bit) != 0 || static_cast<std::uint32_t>(num_sge) <= max_send_sge_) &&
           (!inline_data || total <= max_inline_) && ((key & SendWr::ud_bit) == 0 || total <= ud_max_);
  }
  // Request `index` failed passes_(): which check, in the order they are documented.
  [[nodiscard, gnu::cold, gnu::noinline]] PostResult rejected_(const SendWr& w, std::uint32_t index) const noexcept {
    return rejected_(false, w.key_, w.err_, w.wr_.num_sge, (w.wr_.send_flags & IBV_SEND_INLINE) != 0, w.total_, index,
                     false);
  }
  [[nodiscard, gnu::cold, gnu::noinline]] PostResult rejected_(bool batch, unsigned key, unsigned err, int num_sge,
                                                               bool inline_data, std::uint64_t total,
                                                               std::uint32_t index, bool before_posted) const noexcept {
    Errc e = Errc::bad_argument;  // not reached: passes_() would have held
    const unsigned op = key & (SendWr::one_sge_bit - 1);  // with ud_bit, as type_ops_ has it
    const bool atomic = op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
    if (!qp_) e = Errc::empty_object;
    else if (batch && qpx_ == nullptr) e = Errc::qp_not_extended;
    else if (state_now_() < IBV_QPS_RTS) e = Errc::bad_qp_state;
    else if (err != 0) e = static_cast<Errc>(err);
    else if (atomic && type_ == QpType::rc && !atomics_) e = Errc::atomics_unsupported;
    else if (op == IBV_WR_ATOMIC_WRITE && (type_ != QpType::rc || (ext_ops_ & IBV_QP_EX_WITH_ATOMIC_WRITE) == 0))
      e = Errc::atomic_write_unsupported;
    else if (op == detail::wr_flush_op && (type_ != QpType::rc || (ext_ops_ & detail::qp_ex_with_flush) == 0))
      e = Errc::flush_unsupported;
    else if (type_ == QpType::ud && (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM) && (key & SendWr::ud_bit) == 0)
      e = Errc::ud_needs_address;
    else if (((type_ops_ >> op) & 1u) == 0) e = Errc::wrong_qp_type;
    else if (batch && ((batch_allowed_ >> (key & ~unsigned{SendWr::one_sge_bit})) & 1u) == 0) e = Errc::qp_not_extended;
    else if (static_cast<std::uint32_t>(num_sge) > max_send_sge_) e = Errc::too_many_sge;
    else if (inline_data && total > max_inline_) e = Errc::inline_too_large;
    else if ((key & SendWr::ud_bit) != 0 && total > ud_max_) e = Errc::ud_message_too_large;
    return PostResult::rejected(e, index, before_posted);
  }
  [[nodiscard, gnu::cold, gnu::noinline]] static PostResult device_error_(int rc) noexcept {
    return PostResult::device_error(detail::rc_to_errno(rc), 0);
  }
  // Receives: RecvWrs a user built (owned), or QueuePair::post_recv's borrowing one.
  template <bool owned>
  PostResult post_recv_(std::span<RecvWr> wrs) const noexcept {
    if (has_srq_) [[unlikely]] return PostResult::rejected(Errc::qp_has_srq, 0);
    if (state_now_() == IBV_QPS_RESET) [[unlikely]]  // a moved-from QP is in RESET too
      return PostResult::rejected(qp_ ? Errc::bad_qp_state : Errc::empty_object, 0);
    return RecvWr::post_chain<owned>(wrs, max_recv_sge_, min_recv_bytes_, [this](ibv_recv_wr* wr, ibv_recv_wr** bad) {
      return ibv_post_recv(qp_.get(), wr, bad);
    });
  }
  QueuePair() = default;
  QueuePair(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
            const QpOptions& options, const Gid* source_gid, SourceLocation where);
  void setup_(const QpOptions& o, const ibv_qp_cap& granted, SourceLocation where, std::uint64_t ext_ops,
              const Gid* source_gid = nullptr);
  void modify_(ibv_qp_attr& attr, int mask, ibv_qp_state to, const char* verb, SourceLocation where);
  void set_state_(std::uint8_t state) noexcept;
  void check_not_empty_(const char* what, SourceLocation where) const;
  [[nodiscard]] std::uint8_t state_now_() const noexcept { return state_.load(std::memory_order_relaxed); }
  friend void detail::flush_to_error(QueuePair& qp) noexcept;
  friend QueuePair detail::rdma_cm_queue_pair(const ProtectionDomain&, const CompletionQueue&, const CompletionQueue&,
                                              const QpOptions&, const Gid&, SourceLocation);
  friend class SendBatch;

  std::shared_ptr<ibv_qp> qp_;   // deleter holds the PD, CQs and SRQ
  Endpoint local_;
  std::uint64_t allowed_ = 0;    // bit SendWr::key_ set when the QP takes such a request now (set_state_)
  std::uint32_t type_ops_ = 0;   // bit (opcode [+16 for UD-addressed]) set when the QP type allows it
  std::uint32_t max_send_sge_ = 0, max_recv_sge_ = 0, max_inline_ = 0, max_send_wr_ = 0, max_recv_wr_ = 0;
  std::uint32_t gid_index_ = 0;
  AccessFlags access_;
  std::uint16_t pkey_index_ = 0;
  std::uint8_t port_ = 1;
  // Atomic (relaxed: a plain load and store on the machines we know) because a connection moves
  // its QP to ERR while other threads may post (detail::flush_to_error); allowed_ stays as it
  // was, since what may be posted in RTS may be posted in ERR.
  std::atomic<std::uint8_t> state_{IBV_QPS_RESET};
  QpType type_ = QpType::rc;
  bool has_srq_ = false;
  bool ethernet_ = false;
  bool gid_at_rtr_ = false;          // local_.gid is rdma_cm's; its index comes with the RTR's address vector
  bool atomics_ = false;             // the device's atomic_cap is not NONE
  std::uint8_t max_init_rd_atom_ = 0, max_rd_atom_ = 0;  // the device's max_qp_init_rd_atom, max_qp_rd_atom
  // Largest UD message: the port's active MTU when the QP was made (a later change of the
  // netdev's MTU is not seen: a larger send then fails in its completion, not before posting).
  std::uint32_t ud_max_ = 0;
  std::uint32_t min_recv_bytes_ = 0;  // 40 (the GRH) on UD, else 0
  ibv_qp_ex* qpx_ = nullptr;          // the extended QP (QpOptions::extended), else null
  std::uint64_t ext_ops_ = 0;         // its send_ops_flags (IBV_QP_EX_WITH_*)
  std::uint64_t batch_allowed_ = 0;   // allowed_ for a SendBatch: the keys of ext_ops_ (set_state_)
  bool split_sge_ = false;            // rxe: multi-SGE requests of unequal lengths go through ibv_post_send
};

/// Requests posted together through the extended QP API (ibv_wr_post(3)): QueuePair::batch()
/// opens one (ibv_wr_start), each call adds a request, checked as QueuePair::post checks it
/// (the same errors), and complete() posts them with one doorbell (ibv_wr_complete) and returns
/// the same PostResult. A request that fails a check rejects the batch: what follows is ignored,
/// complete() aborts it (ibv_wr_abort) and names the request and the check, and nothing is
/// posted. A batch not completed is aborted when it goes out of scope.
///
///     qp.batch().write(a, peer_a).write(b, peer_b, {.wr_id = 2}).complete().check();
///
/// Rules: only on a QP made with QpOptions::extended; the batch must not outlive its QP, nor
/// the QP be moved meanwhile. Between batch() and complete() the provider holds the send queue's
/// lock: post nothing else on the QP from the same thread meanwhile (on rxe that deadlocks),
/// and keep it short; other threads' posts wait. Never allocates, locks (beyond the provider)
/// or throws.
///
/// Multi-SGE requests use ibv_wr_set_sge_list, except on rxe (vendor 0xffffff), whose provider
/// before rdma-core 64 takes num_sge times the first SGE's length: there a request with unequal
/// SGE lengths goes through ibv_post_send, after the requests before it are posted
/// (ibv_wr_complete), so order holds, and the batch goes on after it. A request inline from
/// several slices takes that path on every device. If a request after such a split fails a
/// check, complete() posts the requests before it (not only those before the split), and
/// PostResult::posted() says so; a batch abandoned after a split (never completed) has posted
/// what came up to the split, and aborts the rest.
class SendBatch {
 public:
  SendBatch(const SendBatch&) = delete;
  SendBatch& operator=(const SendBatch&) = delete;
  /// Aborts the batch (ibv_wr_abort) if it was not completed.
  [[gnu::always_inline]] ~SendBatch() {
    if (open_) ibv_wr_abort(qpx_);
  }

  /// RDMA write (as SendWr::write).
  [[gnu::always_inline]] SendBatch& write(LocalSlice src, RemoteSlice dst, const PostOptions& o = {}) noexcept {
    if (admit_(IBV_WR_RDMA_WRITE, src.length() > dst.length ? Errc::remote_too_small : Errc{}, src.length(), o))
      [[likely]] {
      ibv_wr_rdma_write(qpx_, dst.rkey, dst.addr);
      data_(src, o);
    }
    return *this;
  }
  /// RDMA write with immediate (host byte order).
  [[gnu::always_inline]] SendBatch& write_imm(LocalSlice src, RemoteSlice dst, std::uint32_t imm, const PostOptions& o = {}) noexcept {
    if (admit_(IBV_WR_RDMA_WRITE_WITH_IMM, src.length() > dst.length ? Errc::remote_too_small : Errc{}, src.length(),
               o)) [[likely]] {
      ibv_wr_rdma_write_imm(qpx_, dst.rkey, dst.addr, htonl(imm));
      data_(src, o);
    }
    return *this;
  }
  /// RDMA read of the front of `src` into `dst`.
  [[gnu::always_inline]] SendBatch& read(LocalSlice dst, RemoteSlice src, const PostOptions& o = {}) noexcept {
    const Errc e = dst.length() > src.length ? Errc::remote_too_small
                   : o.inline_data          ? Errc::inline_not_allowed
                                            : Errc{};
    if (admit_(IBV_WR_RDMA_READ, e, dst.length(), o)) [[likely]] {
      ibv_wr_rdma_read(qpx_, src.rkey, src.addr);
      data_(dst, o);
    }
    return *this;
  }
  /// Send (RC/UC; on UD, add(SendWr::send(...).to(ah, qpn, qkey))).
  [[gnu::always_inline]] SendBatch& send(LocalSlice src, const PostOptions& o = {}) noexcept {
    if (admit_(IBV_WR_SEND, Errc{}, src.length(), o)) [[likely]] {
      ibv_wr_send(qpx_);
      data_(src, o);
    }
    return *this;
  }
  /// Send with immediate (host byte order).
  [[gnu::always_inline]] SendBatch& send_imm(LocalSlice src, std::uint32_t imm, const PostOptions& o = {}) noexcept {
    if (admit_(IBV_WR_SEND_WITH_IMM, Errc{}, src.length(), o)) [[likely]] {
      ibv_wr_send_imm(qpx_, htonl(imm));
      data_(src, o);
    }
    return *this;
  }
  /// Send that invalidates the peer's memory window `rkey` (as SendWr::send_inv).
  [[gnu::always_inline]] SendBatch& send_inv(LocalSlice src, std::uint32_t rkey, const PostOptions& o = {}) noexcept {
    if (admit_(IBV_WR_SEND_WITH_INV, Errc{}, src.length(), o)) [[likely]] {
      ibv_wr_send_inv(qpx_, rkey);
      data_(src, o);
    }
    return *this;
  }
  /// Invalidates this side's memory window `rkey` (as SendWr::local_inv).
  [[gnu::always_inline]] SendBatch& local_inv(std::uint32_t rkey, const PostOptions& o = {}) noexcept {
    if (admit_(IBV_WR_LOCAL_INV, o.inline_data ? Errc::inline_not_allowed : Errc{}, 0, o, false)) [[likely]]
      ibv_wr_local_inv(qpx_, rkey);
    return *this;
  }
  /// Atomic fetch-and-add (as SendWr::fetch_add).
  [[gnu::always_inline]] SendBatch& fetch_add(LocalSlice result, RemoteSlice target, std::uint64_t add, const PostOptions& o = {}) noexcept {
    if (admit_(IBV_WR_ATOMIC_FETCH_AND_ADD, atomic_error_(result.length(), target, o), 8, o)) [[likely]] {
      ibv_wr_atomic_fetch_add(qpx_, target.rkey, target.addr, add);
      data_(result, o);
    }
    return *this;
  }
  /// Atomic compare-and-swap (as SendWr::compare_swap).
  [[gnu::always_inline]] SendBatch& compare_swap(LocalSlice result, RemoteSlice target, std::uint64_t compare, std::uint64_t swap,
                          const PostOptions& o = {}) noexcept {
    if (admit_(IBV_WR_ATOMIC_CMP_AND_SWP, atomic_error_(result.length(), target, o), 8, o)) [[likely]] {
      ibv_wr_atomic_cmp_swp(qpx_, target.rkey, target.addr, compare, swap);
      data_(result, o);
    }
    return *this;
  }
  /// Atomic write (IBA 1.5; RC): the 8 bytes of `value`, as they lie in memory, to the 8-byte,
  /// 8-aligned `target`, in one piece. Only where the device reports it
  /// (Errc::atomic_write_unsupported otherwise; rxe from Linux 6.2).
  [[gnu::always_inline]] SendBatch& atomic_write(RemoteSlice target, std::uint64_t value, const PostOptions& o = {}) noexcept {
    if (admit_(IBV_WR_ATOMIC_WRITE, atomic_error_(8, target, o), 8, o, false)) [[likely]]
      ibv_wr_atomic_write(qpx_, target.rkey, target.addr, &value);
    return *this;
  }
  /// Flush (IBA 1.5; RC): completes once the writes this QP made to `target`'s bytes before it
  /// are placed at the responder as `level` says (global: visible there; persistent: durable
  /// too). The target region needs Access::flush_global or Access::flush_persistent (else the
  /// flush completes with REM_ACCESS_ERR and the QP goes to ERR), the responder's QP the same
  /// right in its access. Only where the device reports flush (rxe from Linux 6.2) and in a
  /// build against rdma-core 45 or newer (built_with_flush): Errc::flush_unsupported otherwise.
  [[gnu::always_inline]] SendBatch& flush(RemoteSlice target, FlushLevel level = FlushLevel::global,
                                          const PostOptions& o = {}) noexcept {
    if (admit_(static_cast<ibv_wr_opcode>(detail::wr_flush_op), o.inline_data ? Errc::inline_not_allowed : Errc{}, 0,
               o, false)) [[likely]]
      detail::wr_flush(qpx_, target.rkey, target.addr, target.length, static_cast<std::uint8_t>(level),
                       detail::flush_range);
    return *this;
  }
  /// Flush of the whole region that `rkey` opens (IBV_FLUSH_MR), as flush().
  [[gnu::always_inline]] SendBatch& flush_region(std::uint32_t rkey, FlushLevel level = FlushLevel::global,
                                                 const PostOptions& o = {}) noexcept {
    if (admit_(static_cast<ibv_wr_opcode>(detail::wr_flush_op), o.inline_data ? Errc::inline_not_allowed : Errc{}, 0,
               o, false)) [[likely]]
      detail::wr_flush(qpx_, rkey, 0, 0, static_cast<std::uint8_t>(level), detail::flush_mr);
    return *this;
  }
  ///@{
  /// Requests that scatter or gather several slices (as the SendWr builders). The slices are
  /// read during the call (the provider copies them into the WQE), so any number of them, up
  /// to the QP's max_send_sge, where a SendWr holds at most max_wr_slices.
  [[gnu::always_inline]] SendBatch& write(std::span<const LocalSlice> src, RemoteSlice dst, const PostOptions& o = {}) noexcept {
    const SendWr w = SendWr::borrowing_write_(src, dst, o);
    return add_(w, w.wr_.sg_list);
  }
  [[gnu::always_inline]] SendBatch& read(std::span<const LocalSlice> dst, RemoteSlice src, const PostOptions& o = {}) noexcept {
    const SendWr w = SendWr::borrowing_read_(dst, src, o);
    return add_(w, w.wr_.sg_list);
  }
  [[gnu::always_inline]] SendBatch& send(std::span<const LocalSlice> src, const PostOptions& o = {}) noexcept {
    const SendWr w = SendWr::borrowing_send_(src, o);
    return add_(w, w.wr_.sg_list);
  }
  ///@}
  /// Adds a request built with SendWr (any of its kinds, UD-addressed ones too), checked as
  /// QueuePair::post checks it.
  [[gnu::always_inline]] SendBatch& add(const SendWr& w) noexcept { return add_(w, w.sge_); }

  /// Posts the batch (ibv_wr_complete(3)): success, the check a request failed (nothing
  /// posted: aborted), or the provider's errno (Errc-less, generic category; none of the requests
  /// since the batch opened, or since its last split, was posted). A second call gives
  /// Errc::batch_closed.
  [[gnu::always_inline]] PostResult complete() noexcept {
    if (!open_) [[unlikely]] return closed_();
    open_ = false;
    if (!failed_.ok()) [[unlikely]] {
      // Split before: what came before the refused request is posted, as failed_ says.
      if (failed_.posted() > first_) {
        if (const int rc = ibv_wr_complete(qpx_); rc != 0) {
          failed_ = PostResult::rejected(Errc::batch_closed, count_);
          return PostResult::device_error(detail::rc_to_errno(rc), first_);
        }
      } else {
        ibv_wr_abort(qpx_);
      }
      return closed_();
    }
    failed_ = PostResult::rejected(Errc::batch_closed, count_);
    if (const int rc = ibv_wr_complete(qpx_); rc != 0) [[unlikely]]
      return PostResult::device_error(detail::rc_to_errno(rc), first_);
    return {};
  }

  /// Requests added so far (those refused included).
  [[nodiscard]] std::uint32_t size() const noexcept { return count_; }

 private:
  friend class QueuePair;
  friend class MemoryWindow;  // binds a type 2 window through ibv_wr_bind_mw (bind_mw_)
  [[gnu::always_inline]] explicit SendBatch(const QueuePair& qp) noexcept : qp_(&qp), qpx_(qp.qpx_) {
    if (qpx_ == nullptr) [[unlikely]]
      failed_ = PostResult::rejected(qp.qp_ ? Errc::qp_not_extended : Errc::empty_object, 0);
    else {
      ibv_wr_start(qpx_);
      open_ = true;
    }
  }
  // A type 2 window's bind (ibv_wr_bind_mw(3)), checked as the post of IBV_WR_BIND_MW is.
  void bind_mw_(ibv_mw* mw, std::uint32_t rkey, const ibv_mw_bind_info& info, const PostOptions& o) noexcept {
    if (admit_(IBV_WR_BIND_MW, o.inline_data ? Errc::inline_not_allowed : Errc{}, 0, o, false))
      ibv_wr_bind_mw(qpx_, mw, rkey, &info);
  }
  [[gnu::always_inline]] static Errc atomic_error_(std::uint64_t result_length, const RemoteSlice& t,
                                                   const PostOptions& o) noexcept {
    return result_length != 8 || t.length != 8 ? Errc::atomic_length
           : t.addr % 8 != 0                   ? Errc::atomic_misaligned
           : o.inline_data                     ? Errc::inline_not_allowed
                                               : Errc{};
  }
  // Checks a request of one SGE (or none: sge false) and sets wr_id and flags for the builder.
  [[gnu::always_inline]] bool admit_(ibv_wr_opcode op, Errc e, std::uint64_t total, const PostOptions& o,
                                     bool sge = true) noexcept {
    const std::uint32_t index = count_++;
    if (!failed_.ok()) [[unlikely]] return false;
    const unsigned key = static_cast<unsigned>(op) | (sge ? unsigned{SendWr::one_sge_bit} : 0u);
    if (!qp_->passes_(qp_->batch_allowed_, key, static_cast<unsigned>(e), sge ? 1 : 0, o.inline_data, total))
      [[unlikely]] {
      failed_ = reject_(*qp_, key, static_cast<unsigned>(e), sge ? 1 : 0, o.inline_data, total, index, first_);
      return false;
    }
    qpx_->wr_id = o.wr_id;
    qpx_->wr_flags = (o.signaled ? unsigned{IBV_SEND_SIGNALED} : 0u) | (o.inline_data ? unsigned{IBV_SEND_INLINE} : 0u) |
                     (o.fence ? unsigned{IBV_SEND_FENCE} : 0u) | (o.solicited ? unsigned{IBV_SEND_SOLICITED} : 0u);
    return true;
  }
  [[gnu::always_inline]] void data_(const LocalSlice& s, const PostOptions& o) noexcept {
    const ibv_sge g = s.native();
    if (o.inline_data) ibv_wr_set_inline_data(qpx_, reinterpret_cast<void*>(g.addr), g.length);  // NOLINT
    else ibv_wr_set_sge(qpx_, g.lkey, g.addr, g.length);
  }
  static bool equal_lengths_(const ibv_sge* sg, int n) noexcept {
    for (int i = 1; i < n; ++i)
      if (sg[i].length != sg[0].length) return false;
    return true;
  }
  // Static, and the result stored by the caller: the batch's address never escapes on the
  // common path, so its members stay in registers across the provider's calls.
  [[gnu::cold, gnu::noinline]] static PostResult reject_(const QueuePair& qp, unsigned key, unsigned err, int num_sge,
                                                         bool inline_data, std::uint64_t total, std::uint32_t index,
                                                         std::uint32_t first) noexcept {
    return qp.rejected_(true, key, err, num_sge, inline_data, total, index, first > 0);
  }
  // Posts `w`, its SGEs at `sg`, through ibv_post_send between two parts of the batch
  // (SendBatch, multi-SGE).
  [[gnu::cold, gnu::noinline]] void post_alone_(const SendWr& w, const ibv_sge* sg, std::uint32_t index) noexcept;
  // add() with the request's SGEs at `sg`: its own (SendWr::sge_), or a borrowing request's
  // caller's slices (its sg_list).
  [[gnu::always_inline]] SendBatch& add_(const SendWr& w, const ibv_sge* sg) noexcept {
    const std::uint32_t index = count_++;
    if (!failed_.ok()) [[unlikely]] return *this;
    const ibv_send_wr& r = w.wr_;
    const bool inl = (r.send_flags & IBV_SEND_INLINE) != 0;
    if (!qp_->passes_(qp_->batch_allowed_, w.key_, w.err_, r.num_sge, inl, w.total_)) [[unlikely]] {
      failed_ = reject_(*qp_, w.key_, w.err_, r.num_sge, inl, w.total_, index, first_);
      return *this;
    }
    if (r.num_sge > 1 && (inl || (qp_->split_sge_ && !equal_lengths_(sg, r.num_sge)))) [[unlikely]] {
      post_alone_(w, sg, index);
      return *this;
    }
    qpx_->wr_id = r.wr_id;
    qpx_->wr_flags = r.send_flags;
    switch (r.opcode) {
      case IBV_WR_RDMA_WRITE: ibv_wr_rdma_write(qpx_, r.wr.rdma.rkey, r.wr.rdma.remote_addr); break;
      case IBV_WR_RDMA_WRITE_WITH_IMM:
        ibv_wr_rdma_write_imm(qpx_, r.wr.rdma.rkey, r.wr.rdma.remote_addr, r.imm_data);
        break;
      case IBV_WR_RDMA_READ: ibv_wr_rdma_read(qpx_, r.wr.rdma.rkey, r.wr.rdma.remote_addr); break;
      case IBV_WR_SEND: ibv_wr_send(qpx_); break;
      case IBV_WR_SEND_WITH_IMM: ibv_wr_send_imm(qpx_, r.imm_data); break;
      case IBV_WR_SEND_WITH_INV: ibv_wr_send_inv(qpx_, r.invalidate_rkey); break;
      case IBV_WR_ATOMIC_FETCH_AND_ADD:
        ibv_wr_atomic_fetch_add(qpx_, r.wr.atomic.rkey, r.wr.atomic.remote_addr, r.wr.atomic.compare_add);
        break;
      case IBV_WR_ATOMIC_CMP_AND_SWP:
        ibv_wr_atomic_cmp_swp(qpx_, r.wr.atomic.rkey, r.wr.atomic.remote_addr, r.wr.atomic.compare_add,
                              r.wr.atomic.swap);
        break;
      case IBV_WR_LOCAL_INV: ibv_wr_local_inv(qpx_, r.invalidate_rkey); return *this;
      default:
        failed_ = reject_(*qp_, w.key_, static_cast<unsigned>(Errc::bad_argument), r.num_sge, inl, w.total_, index,
                          first_);
        return *this;
    }
    if ((w.key_ & SendWr::ud_bit) != 0) ibv_wr_set_ud_addr(qpx_, r.wr.ud.ah, r.wr.ud.remote_qpn, r.wr.ud.remote_qkey);
    if (r.num_sge == 1) {
      if (inl) ibv_wr_set_inline_data(qpx_, reinterpret_cast<void*>(sg->addr), sg->length);  // NOLINT
      else ibv_wr_set_sge(qpx_, sg->lkey, sg->addr, sg->length);
    } else {
      ibv_wr_set_sge_list(qpx_, static_cast<std::size_t>(r.num_sge), sg);
    }
    return *this;
  }

  [[gnu::always_inline]] [[nodiscard]] PostResult closed_() noexcept {
    PostResult r = failed_;
    failed_ = PostResult::rejected(Errc::batch_closed, count_);
    return r;
  }

  const QueuePair* qp_;
  ibv_qp_ex* qpx_;
  PostResult failed_{};       // set once a request fails (or the batch is closed): complete() returns it
  std::uint32_t count_ = 0;   // requests added
  std::uint32_t first_ = 0;   // the first request since the batch (re)opened: those before it were posted
  bool open_ = false;         // between ibv_wr_start and ibv_wr_complete/abort
};

[[gnu::always_inline]] inline SendBatch QueuePair::batch() const noexcept { return SendBatch(*this); }

/// Exchanges two QueuePairs.
inline void swap(QueuePair& a, QueuePair& b) noexcept { a.swap(b); }

}  // namespace verbs
