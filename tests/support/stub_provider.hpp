// A provider stub: a fake device context whose operations answer without hardware, so that a
// QueuePair and a CompletionQueue can be built, posted on and polled on any host. Used by the
// host tests and by bench/overhead and bench/micro.
//
// ibv_post_send, ibv_post_recv and ibv_poll_cq are inline in <infiniband/verbs.h> and call
// ctx->ops.post_send / post_recv / poll_cq; ibv_query_port goes through the extended context's
// query_port. QueuePair::adopt asks only for the port (an InfiniBand port and no gid_index: no
// GID query) and the device attributes (ibv_query_device_ex), and CompletionQueue::adopt asks
// nothing.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include <infiniband/verbs.h>

#include <verbs/completion_queue.hpp>
#include <verbs/queue_pair.hpp>

namespace verbs_stub {

constexpr std::uint32_t kVerbsQpEx = 1u << 1;  // VERBS_QP_EX

/// One request built through the stub's ibv_wr_* functions.
struct ExWr {
  ibv_wr_opcode opcode{};
  std::uint64_t wr_id = 0;
  unsigned flags = 0;
  std::uint32_t rkey = 0;
  std::uint64_t remote_addr = 0;
  std::uint32_t imm_or_rkey = 0;            // imm_data (network order) or invalidate_rkey
  std::uint64_t compare_add = 0, swap = 0;  // atomics; atomic write: its 8 bytes
  std::vector<ibv_sge> sges;                // set_sge / set_sge_list
  std::vector<unsigned char> inline_bytes;  // set_inline_data
  std::size_t length = 0;                   // flush: its length, placement type (global 1, persistent 2)
  std::uint8_t flush_type = 0, flush_level = 0;  // and selectivity level (range 0, region 1), as ibv_wr_flush names them
  ibv_ah* ah = nullptr;
  std::uint32_t remote_qpn = 0, remote_qkey = 0;
};

/// The fake context, one QP and one CQ on it. Records what was posted; poll returns `ready`
/// copies of `completion` (or `poll_rc` when it is negative). Not movable: the handles point
/// into it.
struct Provider {
  verbs_context vctx{};
  ibv_device device{};
  // As rdma-core's struct verbs_qp (infiniband/driver.h, which is not installed):
  // ibv_qp_to_qp_ex(3) returns &qp_ex when qp_comp_mask has VERBS_QP_EX.
  union {
    ibv_qp qp;
    ibv_qp_ex qp_ex;
  };
  std::uint32_t qp_comp_mask = 0;
  void* qp_xrcd = nullptr;
  ibv_cq cq{};

  int post_rc = 0;                      // what post_send/post_recv return
  int posted_sends = 0, posted_recvs = 0;
  ibv_send_wr last_send{};              // the last request posted (next and sg_list as given)
  std::array<unsigned char, sizeof(ibv_send_wr)> last_send_bytes{};  // and its every byte, padding too
  ibv_sge last_sge{};                   // its first SGE
  ibv_wc completion{};                  // what each polled entry is
  int ready = 0;                        // entries each poll returns, at most what was asked
  int poll_rc = 0;                      // when negative, what poll returns instead
  ibv_atomic_cap atomic_cap = IBV_ATOMIC_HCA;  // what ibv_query_device_ex reports
  int armed = 0;                        // ibv_req_notify_cq calls
  int ready_on_arm = 0;                 // a completion "landing while arming": ready becomes this
  std::uint32_t vendor_id = 0;          // what ibv_query_device_ex reports (0xffffff: rxe)
  std::uint64_t device_cap_flags_ex = 0;
  std::uint32_t odp_general_caps = 0;   // what ibv_query_device_ex reports in odp_caps.general_caps
  int device_queries = 0, port_queries = 0;  // ibv_query_device_ex and ibv_query_port calls

  // The extended QP (QpOptions::extended): what its ibv_wr_* functions saw.
  int wr_starts = 0, wr_completes = 0, wr_aborts = 0;
  int complete_rc = 0;                  // what wr_complete returns (nothing is posted then)
  bool wr_open = false;                 // between wr_start and wr_complete/wr_abort
  std::vector<ExWr> pending;            // built since wr_start
  std::vector<ExWr> ex_posted;          // posted by wr_complete
  std::vector<std::uint64_t> order;     // wr_ids in the order posted, through either path

  // The extended CQ (extended_cq()): its start/next/end_poll take entries from `ex_ready`.
  ibv_cq_ex cq_ex{};
  std::deque<ibv_wc> ex_ready;          // what the next passes read, in order
  ibv_wc ex_current{};                  // what the read_* functions answer
  int ex_starts = 0, ex_nexts = 0, ex_ends = 0;
  int ex_start_rc = 0;                  // when not 0, what start_poll returns (nothing is read)
  int ex_fail_next = 0;                 // when not 0, the n-th next_poll of a pass returns ex_next_rc
  int ex_next_rc = 0;
  int ex_pass_nexts = 0;                // next_poll calls in the current pass
  bool ex_in_pass = false;              // between a start_poll that returned 0 and end_poll
  int ex_misuse = 0;                    // next_poll or end_poll outside a pass, start_poll inside one

  Provider() {
    std::memset(&qp_ex, 0, sizeof qp_ex);
    make_extended_cq();
    vctx.sz = sizeof(verbs_context);
    vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
    vctx.context.device = &device;
    vctx.context.async_fd = -1;  // a test that waits for async events sets one
    std::strcpy(device.name, "stub0");
    vctx.query_port = &query_port;
    vctx.query_device_ex = &query_device_ex;
    vctx.context.ops.post_send = &post_send;
    vctx.context.ops.post_recv = &post_recv;
    vctx.context.ops.poll_cq = &poll_cq;
    vctx.context.ops.req_notify_cq = &req_notify_cq;
    qp.context = &vctx.context;
    qp.qp_context = this;
    qp.qp_num = 0x123;
    qp.qp_type = IBV_QPT_RC;
    qp.state = IBV_QPS_RTS;
    cq.context = &vctx.context;
    cq.cq_context = this;
    cq.cqe = 256;
  }
  Provider(const Provider&) = delete;
  Provider& operator=(const Provider&) = delete;

  /// The stub QP as a verbs::QueuePair in `state` (the QpOptions' type is what the checks use).
  verbs::QueuePair queue_pair(const verbs::QpOptions& o = {}, verbs::QpState state = verbs::QpState::rts,
                              ibv_qp_cap granted = {.max_send_wr = 128, .max_recv_wr = 128, .max_send_sge = 1,
                                                    .max_recv_sge = 1, .max_inline_data = 0}) {
    qp.qp_type = static_cast<ibv_qp_type>(o.type);
    qp.state = static_cast<ibv_qp_state>(state);
    std::uint64_t ops = 0;
    if (o.extended) {
      make_extended();
      // What a provider would be asked for: every operation, atomics and atomic write as the
      // stub's device reports them.
      ops = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
            IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW |
            IBV_QP_EX_WITH_SEND_WITH_INV;
      if (atomic_cap != IBV_ATOMIC_NONE) ops |= IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
      if ((device_cap_flags_ex & (1ULL << 40)) != 0) ops |= IBV_QP_EX_WITH_ATOMIC_WRITE;
      // Flush (IB_UVERBS_DEVICE_FLUSH_GLOBAL), as a provider built with the same headers would.
      if (verbs::built_with_flush && (device_cap_flags_ex & (1ULL << 38)) != 0) ops |= verbs::detail::qp_ex_with_flush;
      if (o.type == verbs::QpType::ud) ops &= IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    }
    return verbs::QueuePair::adopt(std::shared_ptr<ibv_qp>(&qp, [](ibv_qp*) {}), o, granted, state, ops);
  }
  /// The stub context as a verbs::Device (it asks for the device attributes only).
  verbs::Device device_handle() {
    return verbs::Device::adopt(std::shared_ptr<ibv_context>(&vctx.context, [](ibv_context*) {}));
  }
  /// The stub CQ as a verbs::CompletionQueue.
  verbs::CompletionQueue completion_queue() {
    return verbs::CompletionQueue::adopt(std::shared_ptr<ibv_cq>(&cq, [](ibv_cq*) {}));
  }

  /// The stub's extended CQ as a verbs::CompletionQueue carrying `fields`.
  verbs::CompletionQueue extended_cq(verbs::WcFields fields) {
    return verbs::CompletionQueue::adopt(std::shared_ptr<ibv_cq>(ibv_cq_ex_to_cq(&cq_ex), [](ibv_cq*) {}), &cq_ex, fields);
  }

  void make_extended_cq() {
    ibv_cq_ex& x = cq_ex;
    x.context = &vctx.context;
    x.cqe = 256;
    x.start_poll = [](ibv_cq_ex* c, ibv_poll_cq_attr*) {
      Provider& p = of(c->context);
      ++p.ex_starts;
      if (p.ex_in_pass) ++p.ex_misuse;
      if (p.ex_start_rc != 0) return p.ex_start_rc;
      if (p.ex_ready.empty()) return ENOENT;
      p.ex_in_pass = true;
      p.ex_pass_nexts = 0;
      return p.take_ex(c);
    };
    x.next_poll = [](ibv_cq_ex* c) {
      Provider& p = of(c->context);
      ++p.ex_nexts;
      if (!p.ex_in_pass) ++p.ex_misuse;
      if (++p.ex_pass_nexts == p.ex_fail_next) return p.ex_next_rc;
      if (p.ex_ready.empty()) return ENOENT;
      return p.take_ex(c);
    };
    x.end_poll = [](ibv_cq_ex* c) {
      Provider& p = of(c->context);
      ++p.ex_ends;
      if (!p.ex_in_pass) ++p.ex_misuse;
      p.ex_in_pass = false;
    };
    x.read_opcode = [](ibv_cq_ex* c) { return of(c->context).ex_current.opcode; };
    x.read_vendor_err = [](ibv_cq_ex* c) { return of(c->context).ex_current.vendor_err; };
    x.read_byte_len = [](ibv_cq_ex* c) { return of(c->context).ex_current.byte_len; };
    x.read_imm_data = [](ibv_cq_ex* c) { return of(c->context).ex_current.imm_data; };
    x.read_qp_num = [](ibv_cq_ex* c) { return of(c->context).ex_current.qp_num; };
    x.read_src_qp = [](ibv_cq_ex* c) { return of(c->context).ex_current.src_qp; };
    x.read_wc_flags = [](ibv_cq_ex* c) { return of(c->context).ex_current.wc_flags; };
    x.read_slid = [](ibv_cq_ex* c) { return static_cast<std::uint32_t>(of(c->context).ex_current.slid); };
    x.read_sl = [](ibv_cq_ex* c) { return of(c->context).ex_current.sl; };
    x.read_dlid_path_bits = [](ibv_cq_ex* c) { return of(c->context).ex_current.dlid_path_bits; };
    x.read_completion_ts = [](ibv_cq_ex*) { return std::uint64_t{0}; };
    x.read_completion_wallclock_ns = [](ibv_cq_ex*) { return std::uint64_t{0}; };
  }
  int take_ex(ibv_cq_ex* c) {
    ex_current = ex_ready.front();
    ex_ready.pop_front();
    c->wr_id = ex_current.wr_id;
    c->status = ex_current.status;
    return 0;
  }

  /// Makes the QP an extended one, whose ibv_wr_* functions record into `pending`.
  void make_extended() {
    qp_comp_mask = kVerbsQpEx;
    ibv_qp_ex& x = qp_ex;
    x.wr_start = [](ibv_qp_ex* q) {
      Provider& p = of(q->qp_base.context);
      ++p.wr_starts;
      p.wr_open = true;
      p.pending.clear();
    };
    x.wr_complete = [](ibv_qp_ex* q) {
      Provider& p = of(q->qp_base.context);
      ++p.wr_completes;
      p.wr_open = false;
      if (p.complete_rc != 0) {
        p.pending.clear();
        return p.complete_rc;
      }
      for (ExWr& w : p.pending) {
        p.order.push_back(w.wr_id);
        p.ex_posted.push_back(std::move(w));
      }
      p.pending.clear();
      return 0;
    };
    x.wr_abort = [](ibv_qp_ex* q) {
      Provider& p = of(q->qp_base.context);
      ++p.wr_aborts;
      p.wr_open = false;
      p.pending.clear();
    };
    x.wr_rdma_write = [](ibv_qp_ex* q, std::uint32_t rkey, std::uint64_t addr) {
      begin(q, IBV_WR_RDMA_WRITE, rkey, addr);
    };
    x.wr_rdma_write_imm = [](ibv_qp_ex* q, std::uint32_t rkey, std::uint64_t addr, __be32 imm) {
      begin(q, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr).imm_or_rkey = imm;
    };
    x.wr_rdma_read = [](ibv_qp_ex* q, std::uint32_t rkey, std::uint64_t addr) { begin(q, IBV_WR_RDMA_READ, rkey, addr); };
    x.wr_send = [](ibv_qp_ex* q) { begin(q, IBV_WR_SEND, 0, 0); };
    x.wr_send_imm = [](ibv_qp_ex* q, __be32 imm) { begin(q, IBV_WR_SEND_WITH_IMM, 0, 0).imm_or_rkey = imm; };
    x.wr_send_inv = [](ibv_qp_ex* q, std::uint32_t rkey) { begin(q, IBV_WR_SEND_WITH_INV, 0, 0).imm_or_rkey = rkey; };
    x.wr_local_inv = [](ibv_qp_ex* q, std::uint32_t rkey) { begin(q, IBV_WR_LOCAL_INV, 0, 0).imm_or_rkey = rkey; };
    x.wr_atomic_fetch_add = [](ibv_qp_ex* q, std::uint32_t rkey, std::uint64_t addr, std::uint64_t add) {
      begin(q, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, addr).compare_add = add;
    };
    x.wr_atomic_cmp_swp = [](ibv_qp_ex* q, std::uint32_t rkey, std::uint64_t addr, std::uint64_t cmp,
                             std::uint64_t swp) {
      ExWr& w = begin(q, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, addr);
      w.compare_add = cmp;
      w.swap = swp;
    };
    x.wr_atomic_write = [](ibv_qp_ex* q, std::uint32_t rkey, std::uint64_t addr, const void* v) {
      std::memcpy(&begin(q, IBV_WR_ATOMIC_WRITE, rkey, addr).compare_add, v, 8);
    };
    set_wr_flush(x);
    x.wr_set_sge = [](ibv_qp_ex* q, std::uint32_t lkey, std::uint64_t addr, std::uint32_t len) {
      of(q->qp_base.context).pending.back().sges.push_back({.addr = addr, .length = len, .lkey = lkey});
    };
    x.wr_set_sge_list = [](ibv_qp_ex* q, std::size_t n, const ibv_sge* list) {
      of(q->qp_base.context).pending.back().sges.assign(list, list + n);
    };
    x.wr_set_inline_data = [](ibv_qp_ex* q, void* addr, std::size_t len) {
      const auto* b = static_cast<const unsigned char*>(addr);
      of(q->qp_base.context).pending.back().inline_bytes.assign(b, b + len);
    };
    x.wr_set_ud_addr = [](ibv_qp_ex* q, ibv_ah* ah, std::uint32_t qpn, std::uint32_t qkey) {
      ExWr& w = of(q->qp_base.context).pending.back();
      w.ah = ah;
      w.remote_qpn = qpn;
      w.remote_qkey = qkey;
    };
  }
  // ibv_wr_flush's entry, where the headers have it (rdma-core 45 on).
  template <class Q>
  static void set_wr_flush(Q& x) {
    if constexpr (verbs::detail::has_wr_flush<Q>)
      x.wr_flush = [](Q* q, std::uint32_t rkey, std::uint64_t addr, std::size_t len, std::uint8_t type,
                      std::uint8_t level) {
        ExWr& w = begin(q, static_cast<ibv_wr_opcode>(verbs::detail::wr_flush_op), rkey, addr);
        w.length = len;
        w.flush_type = type;
        w.flush_level = level;
      };
  }
  static ExWr& begin(ibv_qp_ex* q, ibv_wr_opcode op, std::uint32_t rkey, std::uint64_t addr) {
    Provider& p = of(q->qp_base.context);
    ExWr& w = p.pending.emplace_back();
    w.opcode = op;
    w.wr_id = q->wr_id;
    w.flags = q->wr_flags;
    w.rkey = rkey;
    w.remote_addr = addr;
    return w;
  }

  static Provider& of(ibv_context* ctx) {
    // The context is the verbs_context's last member; the Provider starts with the verbs_context.
    return *reinterpret_cast<Provider*>(reinterpret_cast<char*>(ctx) - offsetof(verbs_context, context));  // NOLINT
  }
  static int query_device_ex(ibv_context* ctx, const ibv_query_device_ex_input*, ibv_device_attr_ex* attr,
                             std::size_t) {
    ++of(ctx).device_queries;
    *attr = ibv_device_attr_ex{};
    attr->orig_attr.atomic_cap = of(ctx).atomic_cap;
    attr->orig_attr.max_qp_rd_atom = 16;
    attr->orig_attr.max_qp_init_rd_atom = 16;
    attr->orig_attr.phys_port_cnt = 1;
    attr->orig_attr.vendor_id = of(ctx).vendor_id;
    attr->device_cap_flags_ex = of(ctx).device_cap_flags_ex;
    attr->odp_caps.general_caps = of(ctx).odp_general_caps;
    return 0;
  }
  static int query_port(ibv_context* ctx, std::uint8_t, ibv_port_attr* attr, std::size_t) {
    ++of(ctx).port_queries;
    *attr = ibv_port_attr{};
    attr->state = IBV_PORT_ACTIVE;
    attr->link_layer = IBV_LINK_LAYER_INFINIBAND;
    attr->max_mtu = IBV_MTU_4096;
    attr->active_mtu = IBV_MTU_1024;
    attr->lid = 1;
    attr->gid_tbl_len = 1;
    return 0;
  }
  static int post_send(ibv_qp* q, ibv_send_wr* wr, ibv_send_wr** bad) {
    Provider& p = of(q->context);
    if (p.post_rc != 0) {
      *bad = wr;
      return p.post_rc;
    }
    for (; wr != nullptr; wr = wr->next) {
      p.order.push_back(wr->wr_id);
      p.last_send = *wr;
      std::memcpy(p.last_send_bytes.data(), wr, sizeof *wr);
      p.last_sge = wr->num_sge > 0 ? wr->sg_list[0] : ibv_sge{};
      ++p.posted_sends;
    }
    return 0;
  }
  static int post_recv(ibv_qp* q, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    Provider& p = of(q->context);
    if (p.post_rc != 0) {
      *bad = wr;
      return p.post_rc;
    }
    for (; wr != nullptr; wr = wr->next) ++p.posted_recvs;
    return 0;
  }
  static int req_notify_cq(ibv_cq* c, int) {
    Provider& p = of(c->context);
    ++p.armed;
    if (p.ready_on_arm != 0) p.ready = p.ready_on_arm;
    return 0;
  }
  static int poll_cq(ibv_cq* c, int n, ibv_wc* wc) {
    Provider& p = of(c->context);
    if (p.poll_rc < 0) return p.poll_rc;
    const int k = std::min(n, p.ready);
    for (int i = 0; i < k; ++i) wc[i] = p.completion;
    return k;
  }
};
static_assert(offsetof(Provider, vctx) == 0);

}  // namespace verbs_stub
