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
  // The joins in progress (PendingJoin), which hold their group until it is joined.
  std::vector<PendingJoin::Impl*> joining;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();

  void drop(Group& g) noexcept {
    if (g.attached) (void)ibv_detach_mcast(qp->native_handle(), &g.mgid, g.mlid);
    (void)rdma_leave_multicast(id.get(), reinterpret_cast<sockaddr*>(&g.addr));  // NOLINT
  }

  std::vector<std::unique_ptr<Group>>::iterator find(const sockaddr_storage& a) {
    return std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return same_address(g->addr, a); });
  }
  [[nodiscard]] bool is_joining(const sockaddr_storage& a) const;
  /// Reads every event on the channel without waiting and hands each to the join in progress it
  /// is for (a DEVICE_REMOVAL to all of them); drops the rest (news of a group joined before).
  void route_events(Phase phase, SourceLocation where);
};

// A join, as a state machine on the Datagram's channel (join() waits between steps).
struct PendingJoin::Impl {
  Datagram::Impl* d = nullptr;                  // null once the Datagram is gone
  std::unique_ptr<Datagram::Impl::Group> g;     // until joined (or left)
  std::vector<Event> inbox;                     // this join's events, read by any step()
  std::string name;
  milliseconds timeout{};
  Clock::time_point deadline;
  SourceLocation where;
  std::exception_ptr failed;
  bool done = false;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() { end(); }

  /// Leaves the group unless it was joined, and lets go of the Datagram.
  void end() noexcept {
    if (d == nullptr) return;
    if (g) d->drop(*g);
    g.reset();
    std::erase(d->joining, this);
    d = nullptr;
  }

  std::optional<DatagramPeer> on_event(Event e) {
    if (e.type == RDMA_CM_EVENT_DEVICE_REMOVAL)
      fail(ENODEV, Phase::connect, "the Datagram's RDMA device was removed (DEVICE_REMOVAL)", where);
    if (e.type == RDMA_CM_EVENT_MULTICAST_ERROR)
      fail(e.status < 0 ? -e.status : EIO, Phase::connect,
           name + ": the join failed (MULTICAST_ERROR, status " + std::to_string(e.status) + ")", where);
    if (e.type != RDMA_CM_EVENT_MULTICAST_JOIN) return std::nullopt;
    g->mgid = e.ah_attr.grh.dgid;
    g->mlid = e.ah_attr.dlid;
    if (ibv_attach_mcast(d->qp->native_handle(), &g->mgid, g->mlid) != 0)
      fail(errno, Phase::connect, name + ": ibv_attach_mcast", where);
    g->attached = true;
    DatagramPeer peer{.ah = AddressHandle::from_attributes(*d->pd, e.ah_attr, where),
                      .qp_num = e.ud_qp_num,
                      .qkey = e.ud_qkey,
                      .private_data = {}};
    d->groups.push_back(std::move(g));
    done = true;
    end();
    return peer;
  }

  std::optional<DatagramPeer> step() {
    if (failed) std::rethrow_exception(failed);
    if (done) fail(ENOTCONN, Phase::connect, "PendingJoin::step: the join of " + name + " is over (its peer was returned)", where);
    try {
      if (d == nullptr)
        fail(ECANCELED, Phase::connect, name + ": the Datagram was destroyed before the join completed", where);
      d->route_events(Phase::connect, where);
      while (!inbox.empty()) {
        Event e = std::move(inbox.front());
        inbox.erase(inbox.begin());
        if (auto peer = on_event(std::move(e))) return peer;
      }
      if (Clock::now() >= deadline)
        fail(ETIMEDOUT, Phase::connect,
             name + ": rdma_cm did not confirm the join within " + std::to_string(timeout.count()) + " ms", where);
      return std::nullopt;
    } catch (...) {
      failed = std::current_exception();
      end();
      throw;
    }
  }
};

Datagram::Impl::~Impl() {
  // Joins in progress are left first, and told that the Datagram is gone.
  while (!joining.empty()) joining.back()->end();
  for (const auto& g : groups) drop(*g);
  // Members go in reverse order: the QP before the CQs and PD, the id (and channel) last.
}

bool Datagram::Impl::is_joining(const sockaddr_storage& a) const {
  return std::any_of(joining.begin(), joining.end(), [&](const PendingJoin::Impl* j) { return same_address(j->g->addr, a); });
}

void Datagram::Impl::route_events(Phase phase, SourceLocation where) {
  for (;;) {
    std::error_code ec;
    std::optional<Event> e = next_event(channel.get(), Clock::time_point{}, ec);  // never waits
    if (ec) fail(ec.value(), phase, "rdma_get_cm_event", where);
    if (!e) return;
    if (e->type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      for (PendingJoin::Impl* j : joining) j->inbox.push_back(*e);
      continue;
    }
    // Another group's news (a later MULTICAST_ERROR of a group joined before is not kept).
    const auto it = std::find_if(joining.begin(), joining.end(), [&](const PendingJoin::Impl* j) { return j->g.get() == e->context; });
    if (it != joining.end()) (*it)->inbox.push_back(std::move(*e));
  }
}

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

// A resolve, as a state machine driven by the events of its own channel (resolve() waits
// between steps).
struct PendingResolve::Impl {
  std::shared_ptr<rdma_event_channel> ch;
  std::shared_ptr<rdma_cm_id> id;
  std::optional<ProtectionDomain> pd;  // the Datagram's, shared: the answer's AH is made on it
  ibv_context* context = nullptr;      // the Datagram's device
  std::string device_name;
  std::uint32_t qp_num = 0;            // the Datagram's QP, named in the request
  ResolveOptions o;                    // private_data pointing at `data`
  std::vector<std::byte> data;
  std::string target;
  Phase phase = Phase::resolve_address;
  Clock::time_point deadline, step_deadline;
  int resolve_ms = 0;
  SourceLocation where;
  std::exception_ptr failed;

  [[nodiscard]] Clock::time_point resolve_deadline() const {
    return std::min(deadline, detail::deadline_after(o.resolve_timeout));
  }

  std::optional<DatagramPeer> on_event(Event e) {
    switch (phase) {
      case Phase::resolve_address:
        (void)check_event(std::move(e), RDMA_CM_EVENT_ADDR_RESOLVED, Phase::resolve_address, where);
        if (id->verbs != context)
          fail(ENODEV, Phase::resolve_address,
               target + " is reached through another RDMA device than the Datagram's (" + device_name +
                   "): bind a Datagram to an address of that device",
               where);
        if (rdma_resolve_route(id.get(), resolve_ms) != 0)
          fail(errno, Phase::resolve_route, target + ": rdma_resolve_route", where);
        phase = Phase::resolve_route;
        step_deadline = resolve_deadline();
        return std::nullopt;
      case Phase::resolve_route: {
        (void)check_event(std::move(e), RDMA_CM_EVENT_ROUTE_RESOLVED, Phase::resolve_route, where);
        rdma_conn_param p{};
        p.qp_num = qp_num;
        p.private_data = data.empty() ? nullptr : data.data();
        p.private_data_len = static_cast<std::uint8_t>(data.size());
        phase = Phase::connect;
        step_deadline = deadline;
        if (rdma_connect(id.get(), &p) != 0) fail(errno, Phase::connect, target + ": rdma_connect (SIDR request)", where);
        return std::nullopt;
      }
      default: break;
    }
    if (e.type == RDMA_CM_EVENT_UNREACHABLE) {
      // The status is the SIDR reply's (IB spec 16.7): 1 no service at that port, 2 refused by
      // it; or the kernel's -ETIMEDOUT when no reply came.
      const std::string what = " (UNREACHABLE, status " + std::to_string(e.status) + ")";
      if (e.status == 1)
        throw ConnectError(std::error_code(ECONNREFUSED, std::generic_category()), Phase::connect,
                           target + ": no listening Datagram on that port" + what, e.status, e.private_data, where);
      if (e.status == 2)
        throw ConnectError(std::error_code(ECONNREFUSED, std::generic_category()), Phase::connect,
                           target + ": refused (the listener rejected it, or nothing listens at that address on that "
                                    "device)" + what,
                           e.status, e.private_data, where);
      if (e.status == -ETIMEDOUT) fail(ETIMEDOUT, Phase::connect, target + ": no answer to the SIDR request" + what, where);
      fail(EHOSTUNREACH, Phase::connect, target + ": unreachable" + what, where);
    }
    const Event got = check_event(std::move(e), RDMA_CM_EVENT_ESTABLISHED, Phase::connect, where);
    DatagramPeer peer{.ah = AddressHandle::from_attributes(*pd, got.ah_attr, where),
                      .qp_num = got.ud_qp_num,
                      .qkey = got.ud_qkey,
                      .private_data = got.private_data};
    id.reset();
    ch.reset();
    return peer;
  }

  std::optional<DatagramPeer> step() {
    if (failed) std::rethrow_exception(failed);
    if (!id) fail(ENOTCONN, phase, "PendingResolve::step: the resolve of " + target + " is over (its peer was returned)", where);
    try {
      for (;;) {
        std::error_code ec;
        std::optional<Event> e = next_event(ch.get(), Clock::time_point{}, ec);  // never waits
        if (ec) fail(ec.value(), phase, "rdma_get_cm_event", where);
        if (!e) {
          if (Clock::now() >= step_deadline) fail_no_answer(phase, phase == Phase::connect ? o.timeout : o.resolve_timeout, where);
          return std::nullopt;
        }
        if (auto peer = on_event(std::move(*e))) return peer;
      }
    } catch (...) {
      failed = std::current_exception();
      id.reset();
      ch.reset();
      throw;
    }
  }
};

PendingResolve Datagram::start_resolve(std::string_view host, std::uint16_t port, const ResolveOptions& o,
                                       SourceLocation where) {
  auto r = std::make_unique<PendingResolve::Impl>();
  r->target = std::string(host) + ":" + std::to_string(port);
  r->where = where;
  if (o.private_data.size() > max_resolve_private_data)
    fail(EMSGSIZE, Phase::connect,
         r->target + ": private data of " + std::to_string(o.private_data.size()) + " bytes exceeds the limit of " +
             std::to_string(max_resolve_private_data) + " bytes; nothing was sent",
         where);
  r->o = o;
  r->data.assign(o.private_data.begin(), o.private_data.end());
  r->o.private_data = r->data;
  r->pd.emplace(ProtectionDomain::adopt(impl_->pd->shared_handle(), where));
  r->context = impl_->id->verbs;
  r->device_name = impl_->device->name();
  r->qp_num = impl_->qp->qp_num();
  r->deadline = detail::deadline_after(o.timeout);
  r->step_deadline = r->resolve_deadline();
  r->resolve_ms = std::max(1, std::min(detail::poll_ms_until(r->deadline), clamp_ms(o.resolve_timeout)));
  // A short-lived id of its own per request: an id resolves one destination, and its events
  // must not mix with the Datagram's (requests, joins).
  r->ch = make_channel(Phase::resolve_address, where);
  r->id = make_id(r->ch, Phase::resolve_address, where, RDMA_PS_UDP);
  sockaddr_storage dst = to_sockaddr(host, port, Phase::resolve_address, where);
  sockaddr_storage src{};
  const sockaddr* mine = rdma_get_local_addr(impl_->id.get());
  std::memcpy(&src, mine, mine->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  if (src.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&src)->sin_port = 0;  // NOLINT
  else reinterpret_cast<sockaddr_in6*>(&src)->sin6_port = 0;                          // NOLINT
  if (rdma_resolve_addr(r->id.get(), reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),  // NOLINT
                        r->resolve_ms) != 0)
    fail(errno, Phase::resolve_address, r->target + ": rdma_resolve_addr", where);
  return PendingResolve(std::move(r));
}

DatagramPeer Datagram::resolve(std::string_view host, std::uint16_t port, const ResolveOptions& o, SourceLocation where) {
  PendingResolve pending = start_resolve(host, port, o, where);
  for (;;) {
    if (auto peer = pending.step()) return std::move(*peer);
    wait_readable(pending.fd(), pending.deadline(), pending.phase(), where);
  }
}

PendingResolve::PendingResolve(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
PendingResolve::PendingResolve(PendingResolve&&) noexcept = default;
PendingResolve& PendingResolve::operator=(PendingResolve&&) noexcept = default;
PendingResolve::~PendingResolve() = default;

std::optional<DatagramPeer> PendingResolve::step() {
  if (!impl_)
    detail::throw_error(make_error_code(Errc::empty_object),
                        "PendingResolve::step: the PendingResolve is empty (moved from)", SourceLocation::current());
  return impl_->step();
}

std::optional<DatagramPeer> PendingResolve::step(std::error_code& ec) noexcept {
  return step_or_code([this] { return step(); }, ec);
}
int PendingResolve::fd() const noexcept { return impl_ && impl_->ch ? impl_->ch->fd : -1; }
std::chrono::steady_clock::time_point PendingResolve::deadline() const noexcept {
  return impl_ ? impl_->step_deadline : Clock::time_point{};
}
Phase PendingResolve::phase() const noexcept { return impl_ ? impl_->phase : Phase::connect; }

void Datagram::listen(int backlog, SourceLocation where) {
  if (!impl_->groups.empty() || !impl_->joining.empty())
    fail(EINVAL, Phase::listen, "this Datagram has joined (or is joining) a multicast group: listen on another one", where);
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

PendingJoin Datagram::start_join(std::string_view group, milliseconds timeout, SourceLocation where) {
  Impl& d = *impl_;
  const std::string name(group);
  if (d.listening) fail(EINVAL, Phase::connect, "a listening Datagram cannot join " + name + ": join on another one", where);
  auto j = std::make_unique<PendingJoin::Impl>();
  j->g = std::make_unique<Impl::Group>();
  j->g->name = name;
  j->g->addr = to_sockaddr(group, 0, Phase::connect, where);
  if (!is_multicast(j->g->addr))
    fail(EINVAL, Phase::connect, name + " is not a multicast address (IPv4 224.0.0.0/4, IPv6 ff00::/8)", where);
  if (d.find(j->g->addr) != d.groups.end()) fail(EINVAL, Phase::connect, name + " is joined already", where);
  if (d.is_joining(j->g->addr)) fail(EINVAL, Phase::connect, name + " is being joined already", where);
  j->name = name;
  j->timeout = timeout;
  j->deadline = detail::deadline_after(timeout);
  j->where = where;
  d.joining.reserve(d.joining.size() + 1);  // so that nothing can throw once rdma_cm has the join
  if (rdma_join_multicast(d.id.get(), reinterpret_cast<sockaddr*>(&j->g->addr), j->g.get()) != 0)  // NOLINT
    fail(errno, Phase::connect, "rdma_join_multicast(" + name + ")", where);
  // From here the join is rdma_cm's: the PendingJoin leaves it unless it completes.
  d.joining.push_back(j.get());
  j->d = &d;
  return PendingJoin(std::move(j));
}

DatagramPeer Datagram::join(std::string_view group, milliseconds timeout, SourceLocation where) {
  PendingJoin pending = start_join(group, timeout, where);
  for (;;) {
    if (auto peer = pending.step()) return std::move(*peer);
    wait_readable(impl_->channel->fd, pending.deadline(), Phase::connect, where);
  }
}

PendingJoin::PendingJoin(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
PendingJoin::PendingJoin(PendingJoin&&) noexcept = default;
PendingJoin& PendingJoin::operator=(PendingJoin&&) noexcept = default;
PendingJoin::~PendingJoin() = default;

std::optional<DatagramPeer> PendingJoin::step() {
  if (!impl_)
    detail::throw_error(make_error_code(Errc::empty_object), "PendingJoin::step: the PendingJoin is empty (moved from)",
                        SourceLocation::current());
  return impl_->step();
}

std::optional<DatagramPeer> PendingJoin::step(std::error_code& ec) noexcept { return step_or_code([this] { return step(); }, ec); }
int PendingJoin::fd() const noexcept { return impl_ && impl_->d != nullptr ? impl_->d->channel->fd : -1; }
std::chrono::steady_clock::time_point PendingJoin::deadline() const noexcept {
  return impl_ ? impl_->deadline : Clock::time_point{};
}
const std::string& PendingJoin::group() const noexcept {
  static const std::string none;
  return impl_ ? impl_->name : none;
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
