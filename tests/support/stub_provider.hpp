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
#include <memory>

#include <infiniband/verbs.h>

#include <verbs/completion_queue.hpp>
#include <verbs/queue_pair.hpp>

namespace verbs_stub {

/// The fake context, one QP and one CQ on it. Records what was posted; poll returns `ready`
/// copies of `completion` (or `poll_rc` when it is negative). Not movable: the handles point
/// into it.
struct Provider {
  verbs_context vctx{};
  ibv_device device{};
  ibv_qp qp{};
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

  Provider() {
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
    return verbs::QueuePair::adopt(std::shared_ptr<ibv_qp>(&qp, [](ibv_qp*) {}), o, granted, state);
  }
  /// The stub context as a verbs::Device (it asks for the device attributes only).
  verbs::Device device_handle() {
    return verbs::Device::adopt(std::shared_ptr<ibv_context>(&vctx.context, [](ibv_context*) {}));
  }
  /// The stub CQ as a verbs::CompletionQueue.
  verbs::CompletionQueue completion_queue() {
    return verbs::CompletionQueue::adopt(std::shared_ptr<ibv_cq>(&cq, [](ibv_cq*) {}));
  }

  static Provider& of(ibv_context* ctx) {
    // The context is the verbs_context's last member; the Provider starts with the verbs_context.
    return *reinterpret_cast<Provider*>(reinterpret_cast<char*>(ctx) - offsetof(verbs_context, context));  // NOLINT
  }
  static int query_device_ex(ibv_context* ctx, const ibv_query_device_ex_input*, ibv_device_attr_ex* attr,
                             std::size_t) {
    *attr = ibv_device_attr_ex{};
    attr->orig_attr.atomic_cap = of(ctx).atomic_cap;
    attr->orig_attr.max_qp_rd_atom = 16;
    attr->orig_attr.max_qp_init_rd_atom = 16;
    attr->orig_attr.phys_port_cnt = 1;
    return 0;
  }
  static int query_port(ibv_context*, std::uint8_t, ibv_port_attr* attr, std::size_t) {
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
