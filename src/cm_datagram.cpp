#include "verbs/cm_datagram.hpp"

#include "cm_internal.hpp"
#include "detail.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace verbs::cm {

using namespace internal;
using std::chrono::milliseconds;

namespace {

bool is_wildcard(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr == htonl(INADDR_ANY);  // NOLINT
  if (a.ss_family == AF_INET6) return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr);  // NOLINT
  return false;
}

bool is_multicast(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return IN_MULTICAST(ntohl(reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr));  // NOLINT
  if (a.ss_family == AF_INET6) return IN6_IS_ADDR_MULTICAST(&reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr);  // NOLINT
  return false;
}

bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr ==  // NOLINT
           reinterpret_cast<const sockaddr_in*>(&b)->sin_addr.s_addr;    // NOLINT
  return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr,  // NOLINT
                     &reinterpret_cast<const sockaddr_in6*>(&b)->sin6_addr, sizeof(in6_addr)) == 0;  // NOLINT
}

}  // namespace

struct Datagram::Impl {
  // A joined group; its address is the join's context (stable: held by unique_ptr).
  struct Group {
    std::string name;
    sockaddr_storage addr{};
    ibv_gid mgid{};
    std::uint16_t mlid = 0;
    bool attached = false;
  };

  std::shared_ptr<rdma_event_channel> channel;
  std::shared_ptr<rdma_cm_id> id;
  std::optional<Device> device;
  std::optional<ProtectionDomain> pd;
  std::optional<CompletionQueue> send_cq, recv_cq;
  std::optional<QueuePair> qp;
  std::uint16_t port = 0;
  bool listening = false;
  std::vector<std::unique_ptr<Group>> groups;

  ~Impl() {
    for (const auto& g : groups) drop(*g);
    // Members go in reverse order: the QP before the CQs and PD, the id (and channel) last.
  }

  void drop(Group& g) noexcept {
    if (g.attached) (void)ibv_detach_mcast(qp->native_handle(), &g.mgid, g.mlid);
    (void)rdma_leave_multicast(id.get(), reinterpret_cast<sockaddr*>(&g.addr));  // NOLINT
  }

  std::vector<std::unique_ptr<Group>>::iterator find(const sockaddr_storage& a) {
    return std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return same_address(g->addr, a); });
  }
};

Datagram::Datagram(std::string_view address, std::uint16_t port, const DatagramOptions& o, SourceLocation where)
    : impl_(std::make_unique<Impl>()) {
  const std::string bound = std::string(address) + ":" + std::to_string(port);
  if (o.qp.type != QpType::ud)
    fail(EINVAL, Phase::listen,
         "DatagramOptions::qp.type is " + std::string(to_string(o.qp.type)) + ": a Datagram is a UD QP; nothing was made",
         where);
  sockaddr_storage a = to_sockaddr(address, port, Phase::listen, where);
  if (is_wildcard(a))
    fail(EINVAL, Phase::listen,
         "a Datagram needs the address of one RDMA device, not the wildcard '" + std::string(address) +
             "' (its QP lives on one device); nothing was made",
         where);
  Impl& d = *impl_;
  d.channel = make_channel(Phase::listen, where);
  d.id = make_id(d.channel, Phase::listen, where, RDMA_PS_UDP);
  set_bind_options(d.id.get(), o.reuse_address, std::nullopt, Phase::listen, where);
  if (rdma_bind_addr(d.id.get(), reinterpret_cast<sockaddr*>(&a)) != 0)  // NOLINT
    fail(errno, Phase::listen, "rdma_bind_addr(" + bound + ")", where);
  if (d.id->verbs == nullptr) fail(ENODEV, Phase::listen, "no RDMA device has the address " + std::string(address), where);
  d.port = ntohs(rdma_get_src_port(d.id.get()));
  // The Device keeps an id of its own alive (device_for's), not this one: whatever outlives
  // the Datagram (an AddressHandle of a DatagramPeer, a region on its PD) must not keep its
  // port bound, or its listener listening with nobody to answer.
  d.device.emplace(device_for(address, where));
  if (d.device->native_handle() != d.id->verbs)
    fail(ENODEV, Phase::listen, "rdma_cm gave " + std::string(address) + " two device contexts", where);
  const std::string owner = "the Datagram's (" + d.device->name() + ")";
  const std::string remedy = "make it from cm::device_for(\"" + std::string(address) + "\")";
  make_pd_and_cqs(*d.device, o.pd, o.send_cq, o.recv_cq, o.cq_depth, "DatagramOptions::", owner, remedy,
                  Phase::listen, where, d.pd, d.send_cq, d.recv_cq);
  if (o.qp.srq != nullptr) check_same_context(o.qp.srq, d.id->verbs, "QpOptions::srq", owner, remedy, Phase::listen, where);
  QpOptions q = o.qp;
  q.qkey = datagram_qkey;
  q.port = d.id->port_num;
  // The core's QP, not rdma_create_qp(3): librdmacm sees none on the id, and the answers to
  // resolve() requests name it by number.
  d.qp.emplace(*d.pd, *d.send_cq, *d.recv_cq, q, where);
  d.qp->activate(where);
}

Datagram::Datagram(Datagram&&) noexcept = default;
Datagram& Datagram::operator=(Datagram&&) noexcept = default;
Datagram::~Datagram() = default;

Device& Datagram::device() noexcept { return *impl_->device; }
const ProtectionDomain& Datagram::pd() const noexcept { return *impl_->pd; }
CompletionQueue& Datagram::send_cq() noexcept { return *impl_->send_cq; }
CompletionQueue& Datagram::recv_cq() noexcept { return *impl_->recv_cq; }
QueuePair& Datagram::qp() noexcept { return *impl_->qp; }
std::uint16_t Datagram::port() const noexcept { return impl_->port; }
std::string Datagram::local_address() const { return address_text(rdma_get_local_addr(impl_->id.get())); }
int Datagram::fd() const noexcept { return impl_->channel->fd; }
rdma_cm_id* Datagram::native_handle() const noexcept { return impl_->id.get(); }

DatagramPeer Datagram::resolve(std::string_view host, std::uint16_t port, const ResolveOptions& o, SourceLocation where) {
  const std::string target = std::string(host) + ":" + std::to_string(port);
  if (o.private_data.size() > max_resolve_private_data)
    fail(EMSGSIZE, Phase::connect,
         target + ": private data of " + std::to_string(o.private_data.size()) + " bytes exceeds the limit of " +
             std::to_string(max_resolve_private_data) + " bytes; nothing was sent",
         where);
  const auto deadline = detail::deadline_after(o.timeout);
  const auto phase_deadline = [&] { return std::min(deadline, detail::deadline_after(o.resolve_timeout)); };
  const int resolve_ms = std::max(1, std::min(detail::poll_ms_until(deadline), clamp_ms(o.resolve_timeout)));
  // A short-lived id of its own per request: an id resolves one destination, and its events
  // must not mix with the Datagram's (requests, joins).
  auto ch = make_channel(Phase::resolve_address, where);
  auto id = make_id(ch, Phase::resolve_address, where, RDMA_PS_UDP);
  sockaddr_storage dst = to_sockaddr(host, port, Phase::resolve_address, where);
  sockaddr_storage src{};
  const sockaddr* mine = rdma_get_local_addr(impl_->id.get());
  std::memcpy(&src, mine, mine->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  if (src.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&src)->sin_port = 0;  // NOLINT
  else reinterpret_cast<sockaddr_in6*>(&src)->sin6_port = 0;                          // NOLINT
  if (rdma_resolve_addr(id.get(), reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst), resolve_ms) != 0)  // NOLINT
    fail(errno, Phase::resolve_address, target + ": rdma_resolve_addr", where);
  (void)expect_event(ch.get(), RDMA_CM_EVENT_ADDR_RESOLVED, phase_deadline(), Phase::resolve_address, o.resolve_timeout,
                     where);
  if (id->verbs != impl_->id->verbs)
    fail(ENODEV, Phase::resolve_address,
         target + " is reached through another RDMA device than the Datagram's (" + impl_->device->name() +
             "): bind a Datagram to an address of that device",
         where);
  if (rdma_resolve_route(id.get(), resolve_ms) != 0) fail(errno, Phase::resolve_route, target + ": rdma_resolve_route", where);
  (void)expect_event(ch.get(), RDMA_CM_EVENT_ROUTE_RESOLVED, phase_deadline(), Phase::resolve_route, o.resolve_timeout,
                     where);
  rdma_conn_param p{};
  p.qp_num = impl_->qp->qp_num();
  p.private_data = o.private_data.empty() ? nullptr : o.private_data.data();
  p.private_data_len = static_cast<std::uint8_t>(o.private_data.size());
  if (rdma_connect(id.get(), &p) != 0) fail(errno, Phase::connect, target + ": rdma_connect (SIDR request)", where);
  std::error_code ec;
  std::optional<Event> e = next_event(ch.get(), deadline, ec);  // any but ESTABLISHED ends it, named
  if (ec) fail(ec.value(), Phase::connect, target + ": rdma_get_cm_event", where);
  if (!e) fail_no_answer(Phase::connect, o.timeout, where);
  if (e->type == RDMA_CM_EVENT_UNREACHABLE) {
    // The status is the SIDR reply's (IB spec 16.7): 1 no service at that port, 2 refused by
    // it; or the kernel's -ETIMEDOUT when no reply came.
    const std::string what = " (UNREACHABLE, status " + std::to_string(e->status) + ")";
    if (e->status == 1)
      throw ConnectError(std::error_code(ECONNREFUSED, std::generic_category()), Phase::connect,
                         target + ": no listening Datagram on that port" + what, e->status, e->private_data, where);
    if (e->status == 2)
      throw ConnectError(std::error_code(ECONNREFUSED, std::generic_category()), Phase::connect,
                         target + ": refused (the listener rejected it, or nothing listens at that address on that "
                                  "device)" + what,
                         e->status, e->private_data, where);
    if (e->status == -ETIMEDOUT) fail(ETIMEDOUT, Phase::connect, target + ": no answer to the SIDR request" + what, where);
    fail(EHOSTUNREACH, Phase::connect, target + ": unreachable" + what, where);
  }
  const Event got = check_event(std::move(*e), RDMA_CM_EVENT_ESTABLISHED, Phase::connect, where);
  return DatagramPeer{.ah = AddressHandle::from_attributes(*impl_->pd, got.ah_attr, where),
                      .qp_num = got.ud_qp_num,
                      .qkey = got.ud_qkey,
                      .private_data = got.private_data};
}

void Datagram::listen(int backlog, SourceLocation where) {
  if (!impl_->groups.empty())
    fail(EINVAL, Phase::listen, "this Datagram has joined a multicast group: listen on another one", where);
  if (rdma_listen(impl_->id.get(), backlog) != 0) fail(errno, Phase::listen, "rdma_listen(" + local_address() + ")", where);
  impl_->listening = true;
}

std::optional<DatagramRequest> Datagram::try_accept(std::span<const std::byte> private_data, SourceLocation where) {
  if (private_data.size() > max_answer_private_data)
    fail(EMSGSIZE, Phase::accept,
         "private data of " + std::to_string(private_data.size()) + " bytes exceeds the answer's limit of " +
             std::to_string(max_answer_private_data) + " bytes; nothing was sent",
         where);
  if (!impl_->listening) fail(EINVAL, Phase::accept, "Datagram::accept: call listen() first", where);
  for (;;) {
    std::error_code ec;
    std::optional<Event> req = next_event(impl_->channel.get(), Clock::time_point{}, ec);  // never waits
    if (ec) fail(ec.value(), Phase::accept, "rdma_get_cm_event", where);
    if (!req) return std::nullopt;
    if (req->type == RDMA_CM_EVENT_DEVICE_REMOVAL)
      fail(ENODEV, Phase::accept, "the Datagram's RDMA device was removed (DEVICE_REMOVAL)", where);
    if (req->type != RDMA_CM_EVENT_CONNECT_REQUEST) continue;
    // The request's id only carries the answer: the Datagram's QP is the one named.
    const std::shared_ptr<rdma_cm_id> rid(req->id, [](rdma_cm_id* i) { rdma_destroy_id(i); });
    DatagramRequest r{.peer_address = address_text(rdma_get_peer_addr(rid.get())), .private_data = std::move(req->private_data)};
    rdma_conn_param p{};
    p.qp_num = impl_->qp->qp_num();
    p.private_data = private_data.empty() ? nullptr : private_data.data();
    p.private_data_len = static_cast<std::uint8_t>(private_data.size());
    if (rdma_accept(rid.get(), &p) != 0) {
      const int err = errno;
      rdma_reject(rid.get(), nullptr, 0);
      fail(err, Phase::accept, "rdma_accept (SIDR reply to " + r.peer_address + ")", where);
    }
    return r;
  }
}

DatagramRequest Datagram::accept(milliseconds timeout, std::span<const std::byte> private_data, SourceLocation where) {
  const auto deadline = detail::deadline_after(timeout);
  for (;;) {
    if (auto r = try_accept(private_data, where)) return std::move(*r);
    if (Clock::now() >= deadline)
      fail(ETIMEDOUT, Phase::accept, "no resolve request within " + std::to_string(timeout.count()) + " ms", where);
    wait_readable(impl_->channel->fd, deadline, Phase::accept, where);
  }
}

DatagramPeer Datagram::join(std::string_view group, milliseconds timeout, SourceLocation where) {
  Impl& d = *impl_;
  const std::string name(group);
  if (d.listening) fail(EINVAL, Phase::connect, "a listening Datagram cannot join " + name + ": join on another one", where);
  auto g = std::make_unique<Impl::Group>();
  g->name = name;
  g->addr = to_sockaddr(group, 0, Phase::connect, where);
  if (!is_multicast(g->addr))
    fail(EINVAL, Phase::connect, name + " is not a multicast address (IPv4 224.0.0.0/4, IPv6 ff00::/8)", where);
  if (d.find(g->addr) != d.groups.end()) fail(EINVAL, Phase::connect, name + " is joined already", where);
  const auto deadline = detail::deadline_after(timeout);
  if (rdma_join_multicast(d.id.get(), reinterpret_cast<sockaddr*>(&g->addr), g.get()) != 0)  // NOLINT
    fail(errno, Phase::connect, "rdma_join_multicast(" + name + ")", where);
  // From here the join is rdma_cm's: leave it on every failure.
  Event e;
  try {
    for (;;) {
      std::error_code ec;
      std::optional<Event> got = next_event(d.channel.get(), deadline, ec);
      if (ec) fail(ec.value(), Phase::connect, "rdma_get_cm_event", where);
      if (!got) fail(ETIMEDOUT, Phase::connect, name + ": rdma_cm did not confirm the join within " +
                                                  std::to_string(timeout.count()) + " ms", where);
      if (got->type == RDMA_CM_EVENT_DEVICE_REMOVAL)
        fail(ENODEV, Phase::connect, "the Datagram's RDMA device was removed (DEVICE_REMOVAL)", where);
      // Another group's news: a later MULTICAST_ERROR of a group joined before (not kept: see
      // the note), or nothing this join waits for.
      if (got->context != g.get()) continue;
      if (got->type == RDMA_CM_EVENT_MULTICAST_ERROR)
        fail(got->status < 0 ? -got->status : EIO, Phase::connect,
             name + ": the join failed (MULTICAST_ERROR, status " + std::to_string(got->status) + ")", where);
      if (got->type == RDMA_CM_EVENT_MULTICAST_JOIN) {
        e = std::move(*got);
        break;
      }
    }
    g->mgid = e.ah_attr.grh.dgid;
    g->mlid = e.ah_attr.dlid;
    if (ibv_attach_mcast(d.qp->native_handle(), &g->mgid, g->mlid) != 0)
      fail(errno, Phase::connect, name + ": ibv_attach_mcast", where);
    g->attached = true;
    DatagramPeer peer{.ah = AddressHandle::from_attributes(*d.pd, e.ah_attr, where),
                      .qp_num = e.ud_qp_num,
                      .qkey = e.ud_qkey,
                      .private_data = {}};
    d.groups.push_back(std::move(g));
    return peer;
  } catch (...) {
    d.drop(*g);
    throw;
  }
}

void Datagram::leave(std::string_view group, SourceLocation where) {
  Impl& d = *impl_;
  const sockaddr_storage a = to_sockaddr(group, 0, Phase::connect, where);
  const auto it = d.find(a);
  if (it == d.groups.end()) fail(EINVAL, Phase::connect, std::string(group) + " is not joined", where);
  const std::unique_ptr<Impl::Group> g = std::move(*it);
  d.groups.erase(it);
  if (ibv_detach_mcast(d.qp->native_handle(), &g->mgid, g->mlid) != 0) {
    const int err = errno;
    (void)rdma_leave_multicast(d.id.get(), reinterpret_cast<sockaddr*>(&g->addr));  // NOLINT
    fail(err, Phase::connect, std::string(group) + ": ibv_detach_mcast", where);
  }
  if (rdma_leave_multicast(d.id.get(), reinterpret_cast<sockaddr*>(&g->addr)) != 0)  // NOLINT
    fail(errno, Phase::connect, std::string(group) + ": rdma_leave_multicast", where);
}

std::vector<std::string> Datagram::groups() const {
  std::vector<std::string> out;
  out.reserve(impl_->groups.size());
  for (const auto& g : impl_->groups) out.push_back(g->name);
  return out;
}

}  // namespace verbs::cm
