#include "verbs/queue_pair.hpp"

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>

#include "detail.hpp"

namespace verbs {
namespace {

using detail::get_le;
using detail::put_le;

constexpr std::uint32_t bit(int key) { return 1u << key; }

std::uint32_t allowed_ops(QpType t, bool atomics) {
  switch (t) {
    case QpType::rc:
      return bit(IBV_WR_RDMA_WRITE) | bit(IBV_WR_RDMA_WRITE_WITH_IMM) | bit(IBV_WR_SEND) |
             bit(IBV_WR_SEND_WITH_IMM) | bit(IBV_WR_RDMA_READ) | bit(IBV_WR_SEND_WITH_INV) | bit(IBV_WR_LOCAL_INV) |
             bit(IBV_WR_BIND_MW) | (atomics ? bit(IBV_WR_ATOMIC_CMP_AND_SWP) | bit(IBV_WR_ATOMIC_FETCH_AND_ADD) : 0u);
    case QpType::uc:
      // Not LOCAL_INV: rxe takes it on RC only (and fails it on UC, moving the QP to ERR).
      return bit(IBV_WR_RDMA_WRITE) | bit(IBV_WR_RDMA_WRITE_WITH_IMM) | bit(IBV_WR_SEND) | bit(IBV_WR_SEND_WITH_IMM) |
             bit(IBV_WR_BIND_MW);
    case QpType::ud:
      return bit(IBV_WR_SEND + 16) | bit(IBV_WR_SEND_WITH_IMM + 16);
  }
  return 0;
}

// The kernel's IB_UVERBS_DEVICE_ATOMIC_WRITE (device_cap_flags_ex), which rdma-core 44's
// headers do not name yet.
constexpr std::uint64_t kDeviceAtomicWrite = 1ULL << 40;

/// The send operations an extended QP of type `t` is made with: those posts allow on the type
/// (allowed_ops), and atomic write and flush where the device reports them (flush only in a
/// build whose headers have it: built_with_flush).
std::uint64_t send_ops_for(QpType t, const ibv_device_attr_ex& dev, bool with_mw) {
  const bool atomics = dev.orig_attr.atomic_cap != IBV_ATOMIC_NONE;
  std::uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  if (t == QpType::ud) return ops;
  ops |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  if (t == QpType::uc) return ops | (with_mw ? std::uint64_t{IBV_QP_EX_WITH_BIND_MW} : 0);
  ops |= IBV_QP_EX_WITH_RDMA_READ;
  if (atomics) ops |= IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
  if (with_mw) ops |= IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV;
  if ((dev.device_cap_flags_ex & kDeviceAtomicWrite) != 0) ops |= IBV_QP_EX_WITH_ATOMIC_WRITE;
  if (built_with_flush && (dev.device_cap_flags_ex & (detail::device_flush_global | detail::device_flush_persistent)) != 0) ops |= detail::qp_ex_with_flush;
  return ops;
}

/// The opcodes (as bits of QueuePair::type_ops_, so with 16 added on UD) of send_ops `ops`.
std::uint32_t opcodes_of(std::uint64_t ops, QpType t) {
  std::uint32_t r = 0;
  for (int op = IBV_WR_RDMA_WRITE; op <= IBV_WR_SEND_WITH_INV; ++op)
    if ((ops & (std::uint64_t{1} << op)) != 0) r |= bit(t == QpType::ud ? op + 16 : op);  // IBV_QP_EX_WITH_x = 1 << IBV_WR_x
  if ((ops & IBV_QP_EX_WITH_ATOMIC_WRITE) != 0) r |= bit(IBV_WR_ATOMIC_WRITE);
  if ((ops & detail::qp_ex_with_flush) != 0) r |= bit(static_cast<int>(detail::wr_flush_op));
  return r;
}

std::string hex(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

std::uint32_t random_psn() {
  static thread_local std::mt19937 gen{std::random_device{}()};
  return gen() & 0xffffffu;
}

constexpr std::byte kEndpointMagic0{'V'}, kEndpointMagic1{'E'}, kEndpointVersion{1};

/// Why ibv_create_qp said EINVAL: the capacity over the device's limit, by name. The inline
/// size is no device attribute, so it is probed (by creating QPs with less) only on this path.
std::string explain_einval(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                           const QpOptions& o) {
  std::string why = "ibv_create_qp";
  ibv_device_attr_ex dev{};
  if (ibv_query_device_ex(pd.native_handle()->context, nullptr, &dev) != 0) return why;
  const ibv_device_attr& a = dev.orig_attr;
  const auto over = [&](const char* field, std::uint32_t asked, const char* limit, int max) {
    if (max < 0 || asked <= static_cast<std::uint32_t>(max)) return false;
    why += std::string(": QpOptions::") + field + " " + std::to_string(asked) + " exceeds the device's " + limit +
           " " + std::to_string(max);
    return true;
  };
  const bool srq = o.srq != nullptr;
  if (over("max_send_wr", o.max_send_wr, "max_qp_wr", a.max_qp_wr) ||
      (!srq && over("max_recv_wr", o.max_recv_wr, "max_qp_wr", a.max_qp_wr)) ||
      over("max_send_sge", o.max_send_sge, "max_sge", a.max_sge) ||
      (!srq && over("max_recv_sge", o.max_recv_sge, "max_sge", a.max_sge)))
    return why;
  if (o.max_inline_data == 0) return why + " (invalid argument; the capacities are within the device's limits)";
  // Bisect the largest inline size the device takes with these options.
  const auto creates = [&](std::uint32_t inline_size) {
    QpOptions t = o;
    t.max_inline_data = inline_size;
    ibv_qp_init_attr init = QueuePair::init_attr(send_cq, recv_cq, t);
    ibv_qp* qp = ibv_create_qp(pd.native_handle(), &init);
    if (qp != nullptr) ibv_destroy_qp(qp);
    return qp != nullptr;
  };
  if (!creates(0)) return why;
  std::uint32_t lo = 0, hi = o.max_inline_data;  // creates(lo), !creates(hi)
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    (creates(mid) ? lo : hi) = mid;
  }
  return why + ": QpOptions::max_inline_data " + std::to_string(o.max_inline_data) +
         " is over the device's inline limit: at most " + std::to_string(lo) +
         " here (no device attribute says so; probed, as verbs-info does)";
}

[[noreturn]] void bad_option(const std::string& what, SourceLocation where) {
  detail::throw_error(make_error_code(Errc::bad_argument), what, where);
}

}  // namespace

std::string_view to_string(QpType t) noexcept {
  switch (t) {
    case QpType::rc: return "RC";
    case QpType::uc: return "UC";
    case QpType::ud: return "UD";
  }
  return "unknown";
}

std::string_view to_string(QpState s) noexcept {
  switch (s) {
    case QpState::reset: return "RESET";
    case QpState::init: return "INIT";
    case QpState::rtr: return "RTR";
    case QpState::rts: return "RTS";
    case QpState::sqd: return "SQD";
    case QpState::sqe: return "SQE";
    case QpState::err: return "ERR";
    case QpState::unknown: return "UNKNOWN";
  }
  return "unknown";
}

ibv_qp_init_attr QueuePair::init_attr(const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                                      const QpOptions& o) noexcept {
  ibv_qp_init_attr init{};
  init.send_cq = send_cq.native_handle();
  init.recv_cq = recv_cq.native_handle();
  init.srq = o.srq != nullptr ? o.srq->native_handle() : nullptr;
  init.cap.max_send_wr = o.max_send_wr;
  init.cap.max_recv_wr = o.srq != nullptr ? 0 : o.max_recv_wr;
  init.cap.max_send_sge = o.max_send_sge;
  init.cap.max_recv_sge = o.srq != nullptr ? 0 : o.max_recv_sge;
  init.cap.max_inline_data = o.max_inline_data;
  init.qp_type = static_cast<ibv_qp_type>(o.type);
  init.sq_sig_all = o.signal_all ? 1 : 0;
  init.qp_context = o.context;
  return init;
}

QueuePair::QueuePair(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                     const QpOptions& o, const Gid* source_gid, SourceLocation where) {
  detail::require_not_empty(pd.native_handle() != nullptr, "QueuePair: the ProtectionDomain", where);
  detail::require_not_empty(send_cq.native_handle() != nullptr, "QueuePair: the send CompletionQueue", where);
  detail::require_not_empty(recv_cq.native_handle() != nullptr, "QueuePair: the receive CompletionQueue", where);
  detail::require_not_empty(o.srq == nullptr || o.srq->native_handle() != nullptr, "QueuePair: QpOptions::srq", where);
  ibv_qp_init_attr init = init_attr(send_cq, recv_cq, o);
  ibv_qp* qp = nullptr;
  std::uint64_t ops = 0;
  if (o.extended) {
    // ibv_create_qp_ex(3) with the send operations of the type. A device that refuses the
    // memory-window ones (EINVAL or EOPNOTSUPP) gets the QP without them.
    const ibv_device_attr_ex dev = detail::device_attributes(pd.native_handle()->context, where);
    for (const bool with_mw : {true, false}) {
      ibv_qp_init_attr_ex ex{};
      ex.qp_context = init.qp_context;
      ex.send_cq = init.send_cq;
      ex.recv_cq = init.recv_cq;
      ex.srq = init.srq;
      ex.cap = init.cap;
      ex.qp_type = init.qp_type;
      ex.sq_sig_all = init.sq_sig_all;
      ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
      ex.pd = pd.native_handle();
      ops = send_ops_for(o.type, dev, with_mw);
      ex.send_ops_flags = ops;
      errno = 0;
      qp = ibv_create_qp_ex(pd.native_handle()->context, &ex);
      init.cap = ex.cap;
      if (qp != nullptr || (errno != EINVAL && errno != EOPNOTSUPP) || o.type == QpType::ud) break;
    }
    if (qp == nullptr) {
      const int err = errno != 0 ? errno : EIO;
      detail::throw_errno(err,
                          err == EINVAL ? explain_einval(pd, send_cq, recv_cq, o) + " (ibv_create_qp_ex, send_ops_flags " +
                                              hex(ops) + ")"
                                        : "ibv_create_qp_ex (send_ops_flags " + hex(ops) + ")",
                          where);
    }
  } else {
    qp = ibv_create_qp(pd.native_handle(), &init);
    if (qp == nullptr) {
      const int err = errno != 0 ? errno : EIO;
      detail::throw_errno(err, err == EINVAL ? explain_einval(pd, send_cq, recv_cq, o) : "ibv_create_qp", where);
    }
  }
  std::shared_ptr<ibv_srq> srq = o.srq != nullptr ? o.srq->shared_handle() : nullptr;
  // Created here so that a failing setup_ below still destroys the QP.
  qp_ = std::shared_ptr<ibv_qp>(
      qp, [pd = pd.shared_handle(), s = send_cq.shared_handle(), r = recv_cq.shared_handle(), srq](ibv_qp* q) {
        ibv_destroy_qp(q);
      });
  // ibv_create_qp writes back what the device granted (at least what was asked).
  setup_(o, init.cap, where, ops, source_gid);
}

namespace detail {
QueuePair rdma_cm_queue_pair(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                             const CompletionQueue& recv_cq, const QpOptions& options, const Gid& source_gid,
                             SourceLocation where) {
  return QueuePair(pd, send_cq, recv_cq, options, &source_gid, where);
}
}  // namespace detail

QueuePair QueuePair::adopt(std::shared_ptr<ibv_qp> qp, const QpOptions& options, const ibv_qp_cap& granted,
                           QpState state, std::uint64_t send_ops) {
  QueuePair q;
  q.qp_ = std::move(qp);
  q.setup_(options, granted, SourceLocation::current(), send_ops);
  q.set_state_(static_cast<std::uint8_t>(state));
  return q;
}

void QueuePair::setup_(const QpOptions& o, const ibv_qp_cap& granted, SourceLocation where, std::uint64_t ops,
                       const Gid* source_gid) {
  ibv_context* ctx = qp_->context;
  access_ = o.access;
  pkey_index_ = o.pkey_index;
  port_ = o.port;
  type_ = o.type;
  has_srq_ = o.srq != nullptr;
  const PortInfo port = detail::query_port(ctx, o.port, where);
  ethernet_ = port.is_ethernet();
  // Once, not per transition: the read/atomic limits RTR and RTS cap with, and atomic support.
  const ibv_device_attr_ex dev = detail::device_attributes(ctx, where);
  atomics_ = dev.orig_attr.atomic_cap != IBV_ATOMIC_NONE;
  max_init_rd_atom_ = static_cast<std::uint8_t>(std::clamp(dev.orig_attr.max_qp_init_rd_atom, 0, 255));
  max_rd_atom_ = static_cast<std::uint8_t>(std::clamp(dev.orig_attr.max_qp_rd_atom, 0, 255));
  if (o.gid_index) {
    gid_index_ = *o.gid_index;
    ibv_gid g{};
    detail::check_rc(ibv_query_gid(ctx, o.port, static_cast<int>(gid_index_), &g), "ibv_query_gid", where);
    local_.gid = Gid::from_native(g);
  } else if (source_gid != nullptr && ethernet_ && !source_gid->is_zero()) {
    // rdma_cm's: no table to search (choose_gid's queries, a first one's netdev names).
    local_.gid = *source_gid;
    gid_at_rtr_ = true;
  } else if (ethernet_) {
    const GidChoice c = detail::choose_gid(ctx, o.port, port, where);
    gid_index_ = c.entry.index;
    local_.gid = c.entry.gid;
  }

  max_send_sge_ = granted.max_send_sge;
  max_recv_sge_ = granted.max_recv_sge;
  max_inline_ = granted.max_inline_data;
  max_send_wr_ = granted.max_send_wr;
  max_recv_wr_ = granted.max_recv_wr;
  type_ops_ = allowed_ops(o.type, atomics_);
  if (o.extended) {
    qpx_ = ibv_qp_to_qp_ex(qp_.get());
    if (qpx_ == nullptr)
      detail::throw_error(make_error_code(Errc::qp_not_extended),
                          "QueuePair: QpOptions::extended, but the QP is no extended one (ibv_qp_to_qp_ex)", where);
    ext_ops_ = ops;  // what the QP was made with (adopted: what its creator says)
    split_sge_ = detail::is_rxe(dev);
  }
  set_state_(state_);

  local_.qp_num = qp_->qp_num;
  if (o.psn && *o.psn > 0xffffffu)
    bad_option("QueuePair: QpOptions::psn " + hex(*o.psn) + " is over 24 bits (a PSN is 0..0xffffff)", where);
  local_.psn = o.psn ? *o.psn : random_psn();
  local_.qkey = o.type == QpType::ud ? o.qkey : 0;
  local_.lid = port.lid;
  local_.mtu = port.active_mtu;
  ud_max_ = mtu_bytes(port.active_mtu);
  min_recv_bytes_ = o.type == QpType::ud ? 40u : 0u;
}

void QueuePair::check_not_empty_(const char* what, SourceLocation where) const {
  if (!qp_)
    detail::throw_error(make_error_code(Errc::empty_object),
                        std::string("QueuePair::") + what + ": the QueuePair is empty (moved from)", where);
}

void QueuePair::modify_(ibv_qp_attr& attr, int mask, ibv_qp_state to, const char* verb, SourceLocation where) {
  check_not_empty_(verb, where);
  attr.qp_state = to;
  detail::check_rc(ibv_modify_qp(qp_.get(), &attr, mask | IBV_QP_STATE), verb, where);
  set_state_(static_cast<std::uint8_t>(to));
}

void QueuePair::set_state_(std::uint8_t state) noexcept {
  state_.store(state, std::memory_order_relaxed);
  // Sends are posted from RTS on (in SQD, SQE and ERR too: the device flushes or holds them).
  const std::uint64_t ops = state >= IBV_QPS_RTS ? type_ops_ : 0;
  allowed_ = ops | (max_send_sge_ >= 1 ? ops << SendWr::one_sge_bit : 0);
  const std::uint64_t ext = state >= IBV_QPS_RTS ? (type_ops_ | bit(IBV_WR_ATOMIC_WRITE) | bit(static_cast<int>(detail::wr_flush_op))) & opcodes_of(ext_ops_, type_) : 0;
  batch_allowed_ = ext | (max_send_sge_ >= 1 ? ext << SendWr::one_sge_bit : 0);
}

void SendBatch::post_alone_(const SendWr& w, const ibv_sge* sg, std::uint32_t index) noexcept {
  // The requests before this one go first (or, none pending, the batch is given up).
  if (index > first_) {
    open_ = false;
    if (const int rc = ibv_wr_complete(qpx_); rc != 0) {
      failed_ = PostResult::device_error(detail::rc_to_errno(rc), first_);
      return;
    }
  } else {
    open_ = false;
    ibv_wr_abort(qpx_);
  }
  SendWr copy = w;
  copy.wr_.sg_list = const_cast<ibv_sge*>(sg);  // NOLINT: ibv_post_send only reads it
  copy.wr_.next = nullptr;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp_->native_handle(), &copy.wr_, &bad); rc != 0) {
    failed_ = PostResult::device_error(detail::rc_to_errno(rc), index);
    return;
  }
  first_ = index + 1;
  ibv_wr_start(qpx_);
  open_ = true;
}

void QueuePair::to_init(SourceLocation where) {
  ibv_qp_attr a{};
  a.pkey_index = pkey_index_;
  a.port_num = port_;
  int mask = IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (type_ == QpType::ud) {
    a.qkey = local_.qkey;
    mask |= IBV_QP_QKEY;
  } else {
    a.qp_access_flags = static_cast<unsigned>(access_.value());
    mask |= IBV_QP_ACCESS_FLAGS;
  }
  modify_(a, mask, IBV_QPS_INIT, "ibv_modify_qp(INIT)", where);
}

void QueuePair::to_rtr(const Endpoint& remote, const TransportOptions& o, SourceLocation where) {
  ibv_qp_attr a{};
  int mask = 0;
  if (type_ != QpType::ud) {
    a.path_mtu = static_cast<ibv_mtu>(o.path_mtu.value_or(std::min(local_.mtu, remote.mtu)));
    a.dest_qp_num = remote.qp_num;
    a.rq_psn = remote.psn & 0xffffffu;
    a.ah_attr.dlid = remote.lid;
    a.ah_attr.sl = o.service_level.value_or(0);
    a.ah_attr.port_num = port_;
    // RoCE always needs a GRH; InfiniBand only when the peer gave a GID (another subnet).
    if (ethernet_ || !remote.gid.is_zero()) {
      if (remote.gid.is_zero())
        detail::throw_error(make_error_code(Errc::bad_argument),
                            "QueuePair::to_rtr: the remote endpoint has no GID, which a RoCE port needs", where);
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.dgid = remote.gid.native();
      a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(gid_index_);
      a.ah_attr.grh.hop_limit = o.hop_limit.value_or(64);
      a.ah_attr.grh.traffic_class = o.traffic_class.value_or(0);
    }
    mask = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (type_ == QpType::rc) {
      a.max_dest_rd_atomic = std::min<std::uint8_t>(o.responder_resources.value_or(16), max_rd_atom_);
      a.min_rnr_timer = o.min_rnr_timer;
      mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
  }
  modify_(a, mask, IBV_QPS_RTR, "ibv_modify_qp(RTR)", where);
}

void QueuePair::to_rts(const TransportOptions& o, SourceLocation where) {
  if (o.retry_count > 7 || o.rnr_retry_count > 7 || o.ack_timeout > 31)
    bad_option("QueuePair::to_rts: TransportOptions::retry_count and rnr_retry_count are 0..7, ack_timeout 0..31", where);
  ibv_qp_attr a{};
  a.sq_psn = local_.psn;
  int mask = IBV_QP_SQ_PSN;
  if (type_ == QpType::rc) {
    a.timeout = o.ack_timeout;
    a.retry_cnt = o.retry_count;
    a.rnr_retry = o.rnr_retry_count;
    a.max_rd_atomic = std::min<std::uint8_t>(o.initiator_depth.value_or(16), max_init_rd_atom_);
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  modify_(a, mask, IBV_QPS_RTS, "ibv_modify_qp(RTS)", where);
}

void QueuePair::connect(const Endpoint& remote, const TransportOptions& o, SourceLocation where) {
  check_not_empty_("connect", where);
  if (type_ == QpType::ud) bad_option("QueuePair::connect: a UD QP is not connected; use activate()", where);
  if (o.retry_count > 7 || o.rnr_retry_count > 7 || o.ack_timeout > 31)
    bad_option("QueuePair::connect: TransportOptions::retry_count and rnr_retry_count are 0..7, ack_timeout 0..31", where);
  if (state_now_() != IBV_QPS_RESET && state_now_() != IBV_QPS_INIT) reset(where);
  if (state_now_() == IBV_QPS_RESET) to_init(where);
  to_rtr(remote, o, where);
  to_rts(o, where);
}

void QueuePair::activate(SourceLocation where) {
  check_not_empty_("activate", where);
  if (type_ != QpType::ud) bad_option("QueuePair::activate: only for UD; connect RC and UC QPs to a peer", where);
  if (state_now_() != IBV_QPS_RESET && state_now_() != IBV_QPS_INIT) reset(where);
  if (state_now_() == IBV_QPS_RESET) to_init(where);
  to_rtr(Endpoint{}, {}, where);
  to_rts({}, where);
}

void QueuePair::modify(ibv_qp_attr& attr, int mask, SourceLocation where) {
  check_not_empty_("modify", where);
  detail::check_rc(ibv_modify_qp(qp_.get(), &attr, mask), "ibv_modify_qp", where);
  if ((mask & IBV_QP_STATE) != 0) set_state_(static_cast<std::uint8_t>(attr.qp_state));
  // An address vector with a GRH names the source GID the QP now uses (rdma_cm's, for a
  // connection: over IPv6 or a VLAN it is not choose_gid's pick).
  const bool names_gid = (mask & IBV_QP_AV) != 0 && attr.ah_attr.is_global != 0;
  if (names_gid && gid_at_rtr_) {
    gid_index_ = attr.ah_attr.grh.sgid_index;  // the index of the GID rdma_cm gave at creation
    gid_at_rtr_ = false;
  } else if (names_gid && attr.ah_attr.grh.sgid_index != gid_index_) {
    ibv_gid g{};
    const std::uint8_t port = (mask & IBV_QP_PORT) != 0 ? attr.port_num : port_;
    if (ibv_query_gid(qp_->context, port, attr.ah_attr.grh.sgid_index, &g) == 0) {
      gid_index_ = attr.ah_attr.grh.sgid_index;
      local_.gid = Gid::from_native(g);
    }
  }
}

void QueuePair::reset(SourceLocation where) {
  ibv_qp_attr a{};
  modify_(a, 0, IBV_QPS_RESET, "ibv_modify_qp(RESET)", where);
}

void QueuePair::to_error(SourceLocation where) {
  ibv_qp_attr a{};
  modify_(a, 0, IBV_QPS_ERR, "ibv_modify_qp(ERR)", where);
}

void detail::flush_to_error(QueuePair& qp) noexcept {
  if (!qp.qp_) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (ibv_modify_qp(qp.qp_.get(), &a, IBV_QP_STATE) == 0) qp.state_.store(IBV_QPS_ERR, std::memory_order_relaxed);
}

QpState QueuePair::query_state(SourceLocation where) const {
  check_not_empty_("query_state", where);
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  detail::check_rc(ibv_query_qp(qp_.get(), &a, IBV_QP_STATE, &init), "ibv_query_qp", where);
  return static_cast<QpState>(a.qp_state);
}

QpAttributes QueuePair::query(SourceLocation where) const {
  check_not_empty_("query", where);
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  constexpr int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY | IBV_QP_AV | IBV_QP_PATH_MTU |
                       IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_RQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC |
                       IBV_QP_MIN_RNR_TIMER | IBV_QP_SQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_DEST_QPN |
                       IBV_QP_ACCESS_FLAGS | IBV_QP_CAP;
  detail::check_rc(ibv_query_qp(qp_.get(), &a, mask, &init), "ibv_query_qp", where);
  QpAttributes q;
  q.state = static_cast<QpState>(a.qp_state);
  q.sq_draining = a.sq_draining != 0;
  q.path_mtu = static_cast<Mtu>(a.path_mtu);
  q.dest_qp_num = a.dest_qp_num;
  q.rq_psn = a.rq_psn;
  q.sq_psn = a.sq_psn;
  q.qkey = a.qkey;
  q.access = AccessFlags(static_cast<unsigned>(a.qp_access_flags));
  q.pkey_index = a.pkey_index;
  q.port = a.port_num;
  q.initiator_depth = a.max_rd_atomic;
  q.responder_resources = a.max_dest_rd_atomic;
  q.min_rnr_timer = a.min_rnr_timer;
  q.ack_timeout = a.timeout;
  q.retry_count = a.retry_cnt;
  q.rnr_retry_count = a.rnr_retry;
  q.address.global = a.ah_attr.is_global != 0;
  if (q.address.global) {  // the GRH fields mean nothing without one
    q.address.dgid = Gid::from_native(a.ah_attr.grh.dgid);
    q.address.sgid_index = a.ah_attr.grh.sgid_index;
    q.address.flow_label = a.ah_attr.grh.flow_label;
    q.address.hop_limit = a.ah_attr.grh.hop_limit;
    q.address.traffic_class = a.ah_attr.grh.traffic_class;
  }
  q.address.dlid = a.ah_attr.dlid;
  q.address.service_level = a.ah_attr.sl;
  q.address.port = a.ah_attr.port_num;
  const ibv_qp_cap& cap = a.cap;  // what the QP was created with (init.cap holds the same)
  q.max_send_wr = cap.max_send_wr;
  q.max_recv_wr = cap.max_recv_wr;
  q.max_send_sge = cap.max_send_sge;
  q.max_recv_sge = cap.max_recv_sge;
  q.max_inline_data = cap.max_inline_data;
  return q;
}

int QueuePair::data_in_order(ibv_wr_opcode op, std::uint32_t flags, SourceLocation where) const {
  check_not_empty_("data_in_order", where);
  return ibv_query_qp_data_in_order(qp_.get(), op, flags);
}

QpState QueuePair::refresh_state(SourceLocation where) {
  const QpState s = query_state(where);
  set_state_(static_cast<std::uint8_t>(s));
  return s;
}

Endpoint::Wire Endpoint::encode() const noexcept {
  Wire w{};
  w[0] = kEndpointMagic0;
  w[1] = kEndpointMagic1;
  w[2] = kEndpointVersion;
  // Both are 24-bit fields on the wire protocol; decode() rejects anything wider.
  put_le(&w[4], qp_num & 0xffffffu, 4);
  put_le(&w[8], psn & 0xffffffu, 4);
  put_le(&w[12], qkey, 4);
  put_le(&w[16], lid, 2);
  w[18] = static_cast<std::byte>(mtu);
  for (std::size_t i = 0; i < 16; ++i) w[20 + i] = static_cast<std::byte>(gid.raw[i]);
  return w;
}

namespace {
const char* endpoint_problem(std::span<const std::byte> w) noexcept {
  if (w.size() != Endpoint::wire_size) return "wrong size";
  if (w[0] != kEndpointMagic0 || w[1] != kEndpointMagic1) return "bad magic (not a verbs endpoint)";
  if (w[2] != kEndpointVersion) return "unsupported version";
  if (w[3] != std::byte{0} || w[19] != std::byte{0}) return "reserved byte not zero";
  if (mtu_bytes(static_cast<Mtu>(w[18])) == 0) return "MTU out of range";
  if (get_le(&w[8], 4) > 0xffffffu) return "PSN wider than 24 bits";
  if (get_le(&w[4], 4) > 0xffffffu) return "QP number wider than 24 bits";
  return nullptr;
}
}  // namespace

std::optional<Endpoint> Endpoint::decode(std::span<const std::byte> w, std::error_code& ec) noexcept {
  if (endpoint_problem(w) != nullptr) {
    ec = make_error_code(Errc::bad_encoding);
    return std::nullopt;
  }
  ec.clear();
  Endpoint e;
  e.qp_num = static_cast<std::uint32_t>(get_le(&w[4], 4));
  e.psn = static_cast<std::uint32_t>(get_le(&w[8], 4));
  e.qkey = static_cast<std::uint32_t>(get_le(&w[12], 4));
  e.lid = static_cast<std::uint16_t>(get_le(&w[16], 2));
  e.mtu = static_cast<Mtu>(w[18]);
  for (std::size_t i = 0; i < 16; ++i) e.gid.raw[i] = static_cast<std::uint8_t>(w[20 + i]);
  return e;
}

Endpoint Endpoint::decode(std::span<const std::byte> w, SourceLocation where) {
  std::error_code ec;
  if (auto e = decode(w, ec)) return *e;
  detail::throw_error(ec, std::string("Endpoint::decode: ") + endpoint_problem(w), where);
}

}  // namespace verbs
