// The qp room of verbs::cm (docs/design/cm.md): what a connection builds and negotiates.
#include "cm/connection_impl.hpp"

#include <algorithm>

#include "cm_private_data.hpp"

namespace verbs::cm {
namespace internal {

void check_options(const ConnectionOptions& o, Phase phase, SourceLocation where) {
  const TransportOptions& t = o.transport;
  if (t.retry_count > 7 || t.rnr_retry_count > 7 || t.ack_timeout > 31 || t.min_rnr_timer > 31)
    fail(EINVAL, phase,
         "ConnectionOptions::transport: retry_count and rnr_retry_count are 0..7, ack_timeout and min_rnr_timer "
         "0..31; nothing was sent", where);
  constexpr AccessFlags remote = Access::remote_read | Access::remote_write | Access::remote_atomic;
  if (o.expose && (o.qp.access & remote).value() == 0)
    fail(EINVAL, phase,
         "ConnectionOptions::expose hands the peer a buffer, but the QP grants it no remote right "
         "(QpOptions::access is empty): set .qp.access to what the peer may do with it, e.g. Access::remote_read; "
         "nothing was sent", where);
}

std::vector<std::byte> frame(const ConnectionOptions& o, std::size_t limit, Phase phase, SourceLocation where) {
  const std::size_t extra = o.expose ? RemoteSlice::wire_size : 0;
  if (o.private_data.size() + extra > limit)
    fail(EMSGSIZE, phase,
         "private data of " + std::to_string(o.private_data.size()) + " bytes" +
             (extra != 0 ? " plus the 24-byte exposed slice" : "") + " exceeds the limit of " + std::to_string(limit) +
             " bytes; nothing was sent", where);
  if (detail::cm_private_data_ambiguous(o.expose, o.private_data))
    fail(EINVAL, phase,
         detail::decode_mtu_tag(o.private_data)
             ? "the private data begins with the path MTU tag verbs sends (\"VM\", 1, an MTU), which the peer would "
               "take for one: start the data differently; nothing was sent"
             : "the private data begins with the wire form of a RemoteSlice, which the peer would take for an exposed "
               "slice (ConnectionOptions::expose): use .expose for a slice, or start the data differently; nothing "
               "was sent",
         where);
  return detail::frame_cm_private_data(o.expose, o.private_data);
}

std::vector<std::byte> frame_with_mtu(const ConnectionOptions& o, std::size_t limit, Mtu tag, Mtu assumed, Phase phase,
                                      SourceLocation where) {
  const std::size_t n = o.private_data.size() + (o.expose ? RemoteSlice::wire_size : 0);
  if (n + detail::mtu_tag_size > limit)
    fail(EMSGSIZE, phase,
         "this side takes a path MTU of " + std::to_string(mtu_bytes(tag)) + " bytes, below the peer's " +
             std::to_string(mtu_bytes(assumed)) + " (a smaller MTU here, or TransportOptions::path_mtu), and needs " +
             std::to_string(detail::mtu_tag_size) + " bytes of the private data to tell it; " + std::to_string(n) +
             " of the " + std::to_string(limit) + " are taken (set the same MTU on both hosts, or send less)",
         where);
  return detail::frame_cm_private_data(o.expose, o.private_data, tag);
}

// Never more reads in flight than the peer can take, nor more resources than it will use:
// without that, a peer whose device has a smaller max_qp_rd_atom fails RTR.
rdma_conn_param conn_param(const ConnectionOptions& o, const std::vector<std::byte>& data, const Device& dev,
                           const QueuePair& qp, const Event* request) {
  rdma_conn_param p{};
  // The QP is not on the id (see Connection::Impl::build): the handshake names it.
  p.qp_num = qp.qp_num();
  p.srq = o.qp.srq != nullptr ? 1 : 0;
  p.private_data = data.empty() ? nullptr : data.data();
  p.private_data_len = static_cast<std::uint8_t>(data.size());
  const ibv_device_attr& a = dev.attributes().orig_attr;
  int responder = std::min<int>(o.transport.responder_resources.value_or(16), a.max_qp_rd_atom);
  int initiator = std::min<int>(o.transport.initiator_depth.value_or(16), a.max_qp_init_rd_atom);
  if (request != nullptr) {
    responder = std::min<int>(responder, request->responder_resources);
    initiator = std::min<int>(initiator, request->initiator_depth);
  }
  p.responder_resources = static_cast<std::uint8_t>(responder);
  p.initiator_depth = static_cast<std::uint8_t>(initiator);
  p.retry_count = o.transport.retry_count;
  p.rnr_retry_count = o.transport.rnr_retry_count;
  return p;
}

}  // namespace internal

using namespace internal;

void Connection::Impl::build(const ConnectionOptions& o, Phase phase, SourceLocation where) {
  if (o.qp.type != QpType::rc) fail(EINVAL, phase, "rdma_cm connections are RC (QpOptions::type)", where);
  if (o.qp.psn)
    fail(EINVAL, phase, "ConnectionOptions::qp.psn: rdma_cm chooses a connection's PSNs (leave it empty)", where);
  open(o, "ConnectionOptions::", "the connection", "make it from cm::device_for() or Listener::device()", phase, where);
  if (o.qp.srq != nullptr && o.qp.srq->native_handle()->pd != pd->native_handle())
    fail(EINVAL, phase,
         "ConnectionOptions::qp.srq is on another protection domain than the connection's (receives would fail at "
         "the first message): make the SRQ on the PD given as ConnectionOptions::pd", where);
  QpOptions q = o.qp;
  q.port = id->port_num;
  // Created by the core, not rdma_create_qp(3): librdmacm then sees no QP on the id (id->qp
  // stays null) and never modifies it. Left to librdmacm, rdma_accept and the client's
  // CONNECT_RESPONSE handling re-apply its INIT attributes (remote read and write) and send the
  // reply or RTU before the caller could take them back: a peer writing at once went through
  // rights never granted. This side makes every transition itself (transition()). With rdma_cm's
  // source GID (librdmacm queried it with the address): QueuePair need not look for one.
  qp.emplace(detail::rdma_cm_queue_pair(*pd, *send_cq, *recv_cq, q, Gid::from_native(id->route.addr.addr.ibaddr.sgid),
                                        where));
  // Async events of this QP (and DEVICE_FATAL) end the connection as a disconnect does.
  hub = detail::async_hub(device->shared_handle());
  hub->add_route(qp->native_handle(), qp->qp_num(), {&Impl::on_async_event, this});
  routed_qp = qp->native_handle();
  access = o.qp.access;
  transport = o.transport;
  transition(IBV_QPS_INIT, phase, where);
}

std::vector<std::byte> Connection::Impl::prepare(const std::function<void(const Handshake&)>& before,
                                                 ConnectionOptions& o, std::size_t limit, Phase phase,
                                                 SourceLocation where) {
  build(o, phase, where);
  if (before) {
    before({.qp = *qp, .pd = *pd, .peer_private_data = peer_private, .expose = o.expose});
    check_options(o, phase, where);  // again: it may have exposed a buffer
  }
  return frame(o, limit, phase, where);
}

void Connection::Impl::transition(ibv_qp_state state, Phase phase, SourceLocation where) {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = state;
  if (rdma_init_qp_attr(id.get(), &a, &mask) != 0)
    fail_id(errno, phase, std::string("rdma_init_qp_attr(") + std::string(to_string(static_cast<QpState>(state))) + ")",
            where);
  const TransportOptions& t = transport;
  switch (state) {
    case IBV_QPS_INIT:
      a.qp_access_flags = static_cast<unsigned>(access.value());
      mask |= IBV_QP_ACCESS_FLAGS;
      break;
    case IBV_QPS_RTR:
      // rdma_cm would leave min_rnr_timer at 0, which the specification makes 655 ms.
      a.min_rnr_timer = t.min_rnr_timer;
      a.max_dest_rd_atomic =
          (mask & IBV_QP_MAX_DEST_RD_ATOMIC) != 0 ? std::min(a.max_dest_rd_atomic, responder) : responder;
      mask |= IBV_QP_MIN_RNR_TIMER | IBV_QP_MAX_DEST_RD_ATOMIC;
      if ((mask & IBV_QP_PATH_MTU) != 0) {
        const ibv_mtu route = a.path_mtu;
        a.path_mtu = mtu_limit(route);
        if (peer_mtu) a.path_mtu = std::min(a.path_mtu, static_cast<ibv_mtu>(*peer_mtu));
        rtr_mtu = a.path_mtu;
        peer_assumes = peer_mtu ? std::min(route, static_cast<ibv_mtu>(*peer_mtu)) : route;
      }
      if (t.service_level) a.ah_attr.sl = *t.service_level;
      if (t.traffic_class) a.ah_attr.grh.traffic_class = *t.traffic_class;
      if (t.hop_limit) a.ah_attr.grh.hop_limit = *t.hop_limit;
      break;
    case IBV_QPS_RTS:
      a.timeout = t.ack_timeout;
      a.retry_cnt = t.retry_count;
      a.rnr_retry = t.rnr_retry_count;
      a.max_rd_atomic = (mask & IBV_QP_MAX_QP_RD_ATOMIC) != 0 ? std::min(a.max_rd_atomic, initiator) : initiator;
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      break;
    default: break;
  }
  qp->modify(a, mask | IBV_QP_STATE, where);
}

// TransportOptions::path_mtu, or the smaller of the route's and this port's active MTU. The
// route's is the client's (rdma_cm puts the client's in the request, and the server takes it): a
// server whose netdev carries less would send packets it cannot transmit, and the client's would
// be refused by its responder (measured between a 9000-byte and a 1500-byte host: a 4 KiB read
// ended in RNR_RETRY_EXC after 3 s; once the server alone was capped, a 4 KiB write in
// REM_INV_REQ). So a side that takes less says so with a tag (cm_private_data.hpp).
ibv_mtu Connection::Impl::mtu_limit(ibv_mtu route) const noexcept {
  if (transport.path_mtu) return static_cast<ibv_mtu>(*transport.path_mtu);
  return std::min(route, static_cast<ibv_mtu>(qp->endpoint().mtu));
}

void Connection::Impl::to_rts(const rdma_conn_param& p, Phase phase, SourceLocation where) {
  responder = p.responder_resources;
  initiator = p.initiator_depth;
  transition(IBV_QPS_RTR, phase, where);
  transition(IBV_QPS_RTS, phase, where);
}

// librdmacm moves only a QP it manages to ERR, and rxe leaves the QP in RTS otherwise, where a
// posted receive would wait forever. Not by a QueuePair transition, which another thread's
// posting forbids: posts allowed in RTS are allowed in ERR too (they flush).
void Connection::Impl::to_error() noexcept {
  if (qp) detail::flush_to_error(*qp);
}

void Connection::Impl::take_private_data(std::vector<std::byte> data) {
  detail::CmPeerPrivateData p = detail::parse_cm_private_data(std::move(data));
  peer_mtu = p.path_mtu;
  if (p.remote) peer_remote = p.remote;
  peer_private = std::move(p.rest);
}

}  // namespace verbs::cm
