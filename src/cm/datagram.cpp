// The datagram room of verbs::cm (docs/design/cm.md): a UD QP on an rdma_cm id of RDMA_PS_UDP,
// SIDR resolves and answers, multicast joins, and what rdma_cm says of them afterwards.
#include "verbs/cm_datagram.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "cm/connection_impl.hpp"

namespace verbs::cm {

using namespace internal;

namespace {

/// The IP address of `a`: 4 or 16 bytes, none for another family.
std::span<const std::byte> ip_of(const sockaddr_storage& a) {
  const auto* in = reinterpret_cast<const sockaddr_in*>(&a);    // NOLINT
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);  // NOLINT
  if (a.ss_family == AF_INET) return std::as_bytes(std::span(&in->sin_addr, 1));
  if (a.ss_family == AF_INET6) return std::as_bytes(std::span(&in6->sin6_addr, 1));
  return {};
}
/// IPv4 224.0.0.0/4, IPv6 ff00::/8.
bool is_multicast(const sockaddr_storage& a) {
  const auto ip = ip_of(a);
  return ip.size() == 4 ? (ip[0] & std::byte{0xf0}) == std::byte{0xe0} : ip.size() == 16 && ip[0] == std::byte{0xff};
}
bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) {
  return a.ss_family == b.ss_family && std::ranges::equal(ip_of(a), ip_of(b));
}

}  // namespace

struct Datagram::Impl : Endpoint {
  // A joined group; its address is the join's context (stable: held by unique_ptr).
  struct Group {
    std::string name;
    sockaddr_storage addr{};
    ibv_gid mgid{};
    std::uint16_t mlid = 0;
    bool attached = false;
    bool send_only = false;  // Membership::send_only: never attached
  };

  ibv_qp* qp_handle = nullptr;  // what the groups are attached to: teardown never reads `qp`
  std::uint16_t port = 0;
  bool listening = false;
  bool on_router = false;
  std::vector<std::unique_ptr<Group>> groups;
  std::vector<std::string> lost;  // groups rdma_cm dropped (MULTICAST_ERROR after the join)
  // Under the Router's mutex (deliver() runs there): the joins in progress (PendingJoin), which
  // hold their group until it is joined; the requests of a listening Datagram; the groups
  // rdma_cm dropped, not yet taken by poll_events().
  std::vector<PendingJoin::Impl*> joining;
  Inbox requests;
  std::vector<const void*> dropped;
  std::atomic<bool> device_removed{false}, address_changed{false};

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();

  /// Detaches the QP from `g` and leaves it; the first failure of the two (errno 0: none).
  struct Dropped {
    int err = 0;
    const char* call = "";
  };
  Dropped drop(Group& g) noexcept {
    const int detached = g.attached && ibv_detach_mcast(qp_handle, &g.mgid, g.mlid) != 0 ? errno : 0;
    const int left = router->command([&] { return rdma_leave_multicast(id.get(), reinterpret_cast<sockaddr*>(&g.addr)); });  // NOLINT
    if (detached != 0) return {detached, "ibv_detach_mcast"};
    return {left, "rdma_leave_multicast"};
  }
  std::vector<std::unique_ptr<Group>>::iterator find(const sockaddr_storage& a) {
    return std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return same_address(g->addr, a); });
  }
  [[nodiscard]] bool is_joining(const sockaddr_storage& a);
  /// The Router's route: a request, a join's news, a group dropped, the device or address.
  static bool deliver(void* self, Event&& e) noexcept;
  /// Reads the channel, then leave_dropped().
  void pump(Phase phase, SourceLocation where);
  /// Leaves the groups rdma_cm dropped (they go to `lost`).
  void leave_dropped() noexcept;
};

// A join, as a state machine on the Datagram's channel (join() waits between steps).
struct PendingJoin::Impl {
  Datagram::Impl* d = nullptr;               // null once the Datagram is gone
  std::unique_ptr<Datagram::Impl::Group> g;  // until joined (or left)
  Inbox inbox;                               // this join's events, read by any step()
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

  /// Out of the Datagram's joins in progress, which deliver() reads under the Router's mutex.
  void unlist() noexcept {
    const std::lock_guard lock(d->router->mutex());
    std::erase(d->joining, this);
  }
  /// Leaves the group unless it was joined, and lets go of the Datagram.
  void end() noexcept {
    if (d == nullptr) return;
    {
      const std::lock_guard lock(d->router->mutex());
      std::erase(d->joining, this);
      if (g) std::erase(d->dropped, g.get());  // its address may be a new group's
    }
    if (g) (void)d->drop(*g);
    g.reset();
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
    if (!g->send_only) {
      if (ibv_attach_mcast(d->qp_handle, &g->mgid, g->mlid) != 0) fail(errno, Phase::connect, name + ": ibv_attach_mcast", where);
      g->attached = true;
    }
    DatagramPeer peer{.ah = AddressHandle::from_attributes(*d->pd, e.ah_attr, where),
                      .qp_num = e.ud_qp_num,
                      .qkey = e.ud_qkey,
                      .private_data = {}};
    std::erase(d->lost, name);
    unlist();  // before `g` moves: another thread's read of an EventChannel looks at it
    d->groups.push_back(std::move(g));
    done = true;
    end();
    return peer;
  }

  std::optional<DatagramPeer> step() {
    return guarded(
        failed,
        [&]() -> std::optional<DatagramPeer> {
          if (done)
            fail(ENOTCONN, Phase::connect, "PendingJoin::step: the join of " + name + " is over (its peer was returned)", where);
          if (d == nullptr)
            fail(ECANCELED, Phase::connect, name + ": the Datagram was destroyed before the join completed", where);
          d->leave_dropped();  // what an earlier step read for the Datagram (a group it dropped)
          while (std::optional<Event> e = inbox.next(*d->router, Phase::connect, where))
            if (auto peer = on_event(std::move(*e))) return peer;
          if (Clock::now() >= deadline)
            fail(ETIMEDOUT, Phase::connect,
                 name + ": rdma_cm did not confirm the join within " + std::to_string(timeout.count()) + " ms", where);
          return std::nullopt;
        },
        [&] { end(); });
  }
};

Datagram::Impl::~Impl() {
  if (on_router) {
    router->remove(id.get());
    for (const Event& e : requests.events)  // resolve() requests never answered: refused
      if (e.type == RDMA_CM_EVENT_CONNECT_REQUEST) router->refuse_request(e.id);
  }
  // Joins in progress are left first, and told that the Datagram is gone.
  while (!joining.empty()) joining.back()->end();
  for (const auto& g : groups) (void)drop(*g);
}

bool Datagram::Impl::is_joining(const sockaddr_storage& a) {
  const std::lock_guard lock(router->mutex());
  return std::any_of(joining.begin(), joining.end(), [&](const PendingJoin::Impl* j) { return same_address(j->g->addr, a); });
}

bool Datagram::Impl::deliver(void* self, Event&& e) noexcept {
  auto& d = *static_cast<Impl*>(self);
  switch (e.type) {
    case RDMA_CM_EVENT_CONNECT_REQUEST: return d.requests.keep(std::move(e));
    case RDMA_CM_EVENT_ADDR_CHANGE: d.address_changed = true; return true;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      d.device_removed = true;
      for (PendingJoin::Impl* j : d.joining) (void)j->inbox.keep(Event(e));
      (void)d.requests.keep(std::move(e));  // a blocking accept() hears of it
      return true;
    case RDMA_CM_EVENT_MULTICAST_JOIN:
    case RDMA_CM_EVENT_MULTICAST_ERROR: {
      const auto it = std::find_if(d.joining.begin(), d.joining.end(),
                                   [&](const PendingJoin::Impl* j) { return j->g.get() == e.context; });
      if (it != d.joining.end()) return (*it)->inbox.keep(std::move(e));
      // A group joined before: rdma_get_cm_event(3) says it "is no longer accessible and should
      // be rejoined".
      if (e.type == RDMA_CM_EVENT_MULTICAST_ERROR) try {
          d.dropped.push_back(e.context);
        } catch (const std::bad_alloc&) {
        }
      return true;
    }
    default: return true;
  }
}

void Datagram::Impl::pump(Phase phase, SourceLocation where) {
  std::error_code ec;
  router->pump(ec);
  if (ec) fail(ec.value(), phase, "rdma_get_cm_event", where);
  leave_dropped();
}

void Datagram::Impl::leave_dropped() noexcept {
  std::vector<const void*> gone;
  {
    const std::lock_guard lock(router->mutex());
    gone.swap(dropped);
  }
  for (const void* context : gone) {
    const auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.get() == context; });
    if (it == groups.end()) continue;
    try {
      lost.push_back((*it)->name);
    } catch (const std::bad_alloc&) {
      // Left all the same; only the name is not listed.
    }
    (void)drop(**it);
    groups.erase(it);
  }
}

Datagram::Datagram(std::string_view address, std::uint16_t port, const DatagramOptions& o, SourceLocation where)
    : impl_(std::make_unique<Impl>()) {
  const std::string bound = std::string(address) + ":" + std::to_string(port);
  if (o.qp.type != QpType::ud)
    fail(EINVAL, Phase::listen,
         "DatagramOptions::qp.type is " + std::string(to_string(o.qp.type)) + ": a Datagram is a UD QP; nothing was made",
         where);
  const sockaddr_storage a = looked_up_address(address, port, Phase::listen, where);
  if (is_wildcard(a))
    fail(EINVAL, Phase::listen,
         "a Datagram needs the address of one RDMA device, not the wildcard '" + std::string(address) +
             "' (its QP lives on one device); nothing was made",
         where);
  Impl& d = *impl_;
  d.router = ChannelAccess::router_or_own(o.channel, Phase::listen, "DatagramOptions::channel", where);
  d.id = d.router->make_id(RDMA_PS_UDP, Phase::listen, where);
  d.router->add(d.id.get(), {&d, &Impl::deliver, ChannelAccess::key_of(o.channel)});
  d.on_router = true;
  set_bind_options(d.id.get(), o.reuse_address, std::nullopt, Phase::listen, where);
  bind_to(d.id.get(), a, bound, false, Phase::listen, where);
  d.port = ntohs(rdma_get_src_port(d.id.get()));
  d.open(o, "DatagramOptions::", "the Datagram", "make it from cm::device_for(\"" + std::string(address) + "\")",
         Phase::listen, where);
  QpOptions q = o.qp;
  q.qkey = datagram_qkey;
  q.port = d.id->port_num;
  // The core's QP, not rdma_create_qp(3): librdmacm sees none on the id, and the answers to
  // resolve() requests name it by number.
  d.qp.emplace(*d.pd, *d.send_cq, *d.recv_cq, q, where);
  d.qp_handle = d.qp->native_handle();
  d.qp->activate(where);
}

Datagram::Datagram(Datagram&&) noexcept = default;
Datagram& Datagram::operator=(Datagram&&) noexcept = default;
Datagram::~Datagram() = default;

Device& Datagram::device() noexcept { return *impl_->device; }
const ProtectionDomain& Datagram::pd() const noexcept { return *impl_->pd; }
const CompletionQueue& Datagram::send_cq() const noexcept { return *impl_->send_cq; }
const CompletionQueue& Datagram::recv_cq() const noexcept { return *impl_->recv_cq; }
const QueuePair& Datagram::qp() const noexcept { return *impl_->qp; }
std::uint16_t Datagram::port() const noexcept { return impl_->port; }
std::string Datagram::local_address() const { return address_text(rdma_get_local_addr(impl_->id.get())); }
int Datagram::fd() const noexcept { return impl_->router->object_fd(); }
rdma_cm_id* Datagram::native_handle() const noexcept { return impl_->id.get(); }

bool Datagram::poll_events(SourceLocation where) {
  impl_->pump(Phase::established, where);
  return !impl_->device_removed;
}
std::vector<std::string> Datagram::lost_groups() const { return impl_->lost; }
bool Datagram::address_changed() const noexcept { return impl_->address_changed; }

// A resolve, as a state machine driven by the events of its own Router (resolve() waits
// between steps). A short-lived id of its own per request: an id resolves one destination.
struct PendingResolve::Impl {
  std::optional<ProtectionDomain> pd;  // the Datagram's, shared: the answer's AH is made on it
  ibv_context* context = nullptr;      // the Datagram's device
  std::string device_name;
  std::uint32_t qp_num = 0;            // the Datagram's QP, named in the request
  std::vector<std::byte> data;         // the request's private data
  Resolution res;
  SourceLocation where;
  std::exception_ptr failed;
  Inbox inbox;
  std::shared_ptr<Router> router;
  std::shared_ptr<rdma_cm_id> id;  // last: its deleter leaves the Router before `inbox` goes

  void close() noexcept {
    id.reset();
    router.reset();
  }

  std::optional<DatagramPeer> on_event(Event e) {
    if (res.phase != Phase::connect) {
      if (res.check(std::move(e), where) == Phase::resolve_address) {
        if (id->verbs != context)
          res.fail(ENODEV, "reached through another RDMA device than the Datagram's (" + device_name +
                               "): bind a Datagram to an address of that device", where);
        res.resolve_route(*router, id.get(), where);
        return std::nullopt;
      }
      rdma_conn_param p{};
      p.qp_num = qp_num;
      p.private_data = data.empty() ? nullptr : data.data();
      p.private_data_len = static_cast<std::uint8_t>(data.size());
      if (rdma_connect(id.get(), &p) != 0) res.fail(errno, "rdma_connect (SIDR request)", where);
      return std::nullopt;
    }
    if (e.type == RDMA_CM_EVENT_UNREACHABLE) {
      // The status is the SIDR reply's (IB spec 16.7): 1 no service at that port, 2 refused by
      // it; or the kernel's -ETIMEDOUT when no reply came.
      const std::string what = " (UNREACHABLE, status " + std::to_string(e.status) + ")";
      if (e.status == 1 || e.status == 2)
        throw ConnectError(std::error_code(ECONNREFUSED, std::generic_category()), Phase::connect,
                           res.target + (e.status == 1 ? ": no listening Datagram on that port"
                                                       : ": refused (the listener rejected it, or nothing listens at "
                                                         "that address on that device)") + what,
                           e.status, e.private_data, where);
      res.fail(e.status == -ETIMEDOUT ? ETIMEDOUT : EHOSTUNREACH,
               (e.status == -ETIMEDOUT ? "no answer to the SIDR request" : "unreachable") + what, where);
    }
    const Event got = check_event(std::move(e), RDMA_CM_EVENT_ESTABLISHED, Phase::connect, where);
    DatagramPeer peer{.ah = AddressHandle::from_attributes(*pd, got.ah_attr, where),
                      .qp_num = got.ud_qp_num,
                      .qkey = got.ud_qkey,
                      .private_data = got.private_data};
    close();
    return peer;
  }

  std::optional<DatagramPeer> step() {
    return guarded(
        failed,
        [&]() -> std::optional<DatagramPeer> {
          if (!id)
            res.fail(ENOTCONN, "PendingResolve::step: the resolve is over (its peer was returned)", where);
          while (std::optional<Event> e = inbox.next(*router, res.phase, where))  // never waits
            if (auto peer = on_event(std::move(*e))) return peer;
          if (Clock::now() >= res.step_deadline) res.timed_out(where);
          return std::nullopt;
        },
        [&] { close(); });
  }
};

PendingResolve Datagram::start_resolve(std::string_view host, std::uint16_t port, const ResolveOptions& o,
                                       SourceLocation where) {
  return start_resolve_at(numeric_address(host, port, Phase::resolve_address, where), host, port, o, where);
}

PendingResolve Datagram::start_resolve_at(const sockaddr_storage& dst, std::string_view host, std::uint16_t port,
                                          const ResolveOptions& o, SourceLocation where) {
  auto r = std::make_unique<PendingResolve::Impl>();
  r->res = {.target = std::string(host) + ":" + std::to_string(port), .whole = o.timeout, .each = o.resolve_timeout};
  r->where = where;
  if (o.private_data.size() > max_resolve_private_data)
    r->res.fail(EMSGSIZE, "private data of " + std::to_string(o.private_data.size()) + " bytes exceeds the limit of " +
                              std::to_string(max_resolve_private_data) + " bytes; nothing was sent", where);
  r->data.assign(o.private_data.begin(), o.private_data.end());
  r->pd.emplace(ProtectionDomain::adopt(impl_->pd->shared_handle(), where));
  r->context = impl_->id->verbs;
  r->device_name = impl_->device->name();
  r->qp_num = impl_->qp->qp_num();
  r->router = Router::make(false, Phase::resolve_address, where);
  r->id = r->router->make_id(RDMA_PS_UDP, Phase::resolve_address, where);
  r->router->add(r->id.get(), {&r->inbox, [](void* self, Event&& e) noexcept { return static_cast<Inbox*>(self)->keep(std::move(e)); }});
  // From the Datagram's address, its port left to the system.
  sockaddr_storage src{};
  const sockaddr* mine = rdma_get_local_addr(impl_->id.get());
  std::memcpy(&src, mine, mine->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  if (src.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&src)->sin_port = 0;  // NOLINT
  else reinterpret_cast<sockaddr_in6*>(&src)->sin6_port = 0;                          // NOLINT
  r->res.start(*r->router, r->id.get(), &src, dst, where);
  return PendingResolve(std::move(r));
}

DatagramPeer Datagram::resolve(std::string_view host, std::uint16_t port, const ResolveOptions& o, SourceLocation where) {
  PendingResolve pending =
      start_resolve_at(looked_up_address(host, port, Phase::resolve_address, where), host, port, o, where);
  for (;;) {
    if (auto peer = pending.step()) return std::move(*peer);
    pending.impl_->inbox.sleep(*pending.impl_->router, pending.deadline(), pending.phase(), where);
  }
}

PendingResolve::PendingResolve(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
PendingResolve::PendingResolve(PendingResolve&&) noexcept = default;
PendingResolve& PendingResolve::operator=(PendingResolve&&) noexcept = default;
PendingResolve::~PendingResolve() = default;

std::optional<DatagramPeer> PendingResolve::step() {
  detail::require_not_empty(impl_ != nullptr, "PendingResolve::step: the PendingResolve", SourceLocation::current());
  return impl_->step();
}
std::optional<DatagramPeer> PendingResolve::step(std::error_code& ec) noexcept {
  return or_code([this] { return step(); }, ec);
}
int PendingResolve::fd() const noexcept { return impl_ && impl_->router ? impl_->router->object_fd() : -1; }
std::chrono::steady_clock::time_point PendingResolve::deadline() const noexcept {
  return impl_ ? impl_->res.step_deadline : Clock::time_point{};
}
Phase PendingResolve::phase() const noexcept { return impl_ ? impl_->res.phase : Phase::connect; }

void Datagram::listen(int backlog, SourceLocation where) {
  if (!impl_->groups.empty() || !impl_->joining.empty())
    fail(EINVAL, Phase::listen, "this Datagram has joined (or is joining) a multicast group: listen on another one", where);
  if (rdma_listen(impl_->id.get(), backlog) != 0) fail(errno, Phase::listen, "rdma_listen(" + local_address() + ")", where);
  impl_->listening = true;
}

std::optional<DatagramRequest> Datagram::poll_accept(std::span<const std::byte> private_data, SourceLocation where) {
  if (private_data.size() > max_answer_private_data)
    fail(EMSGSIZE, Phase::accept,
         "private data of " + std::to_string(private_data.size()) + " bytes exceeds the answer's limit of " +
             std::to_string(max_answer_private_data) + " bytes; nothing was sent",
         where);
  if (!impl_->listening) fail(EINVAL, Phase::accept, "Datagram::accept: call listen() first", where);
  impl_->leave_dropped();
  for (;;) {
    std::optional<Event> req = impl_->requests.next(*impl_->router, Phase::accept, where);  // never waits
    if (!req) return std::nullopt;
    if (req->type == RDMA_CM_EVENT_DEVICE_REMOVAL)
      fail(ENODEV, Phase::accept, "the Datagram's RDMA device was removed (DEVICE_REMOVAL)", where);
    // The request's id only carries the answer: the Datagram's QP is the one named.
    const std::shared_ptr<rdma_cm_id> rid = impl_->router->own(req->id);
    DatagramRequest r{.peer_address = address_text(rdma_get_peer_addr(rid.get())), .private_data = std::move(req->private_data)};
    rdma_conn_param p{};
    p.qp_num = impl_->qp->qp_num();
    p.private_data = private_data.empty() ? nullptr : private_data.data();
    p.private_data_len = static_cast<std::uint8_t>(private_data.size());
    if (const int err = impl_->router->command([&] { return rdma_accept(rid.get(), &p); })) {
      rdma_reject(rid.get(), nullptr, 0);
      fail(err, Phase::accept, "rdma_accept (SIDR reply to " + r.peer_address + ")", where);
    }
    return r;
  }
}

DatagramRequest Datagram::accept(milliseconds timeout, std::span<const std::byte> private_data, SourceLocation where) {
  const auto deadline = detail::deadline_after(timeout);
  for (;;) {
    if (auto r = poll_accept(private_data, where)) return std::move(*r);
    if (Clock::now() >= deadline)
      fail(ETIMEDOUT, Phase::accept, "no resolve request within " + std::to_string(timeout.count()) + " ms", where);
    impl_->requests.sleep(*impl_->router, deadline, Phase::accept, where);
  }
}

PendingJoin Datagram::start_join(std::string_view group, Membership membership, milliseconds timeout,
                                 SourceLocation where) {
  Impl& d = *impl_;
  const std::string name(group);
  if (d.listening) fail(EINVAL, Phase::connect, "a listening Datagram cannot join " + name + ": join on another one", where);
  auto j = std::make_unique<PendingJoin::Impl>();
  j->g = std::make_unique<Impl::Group>();
  j->g->name = name;
  j->g->send_only = membership == Membership::send_only;
  j->g->addr = numeric_address(group, 0, Phase::connect, where);
  if (!is_multicast(j->g->addr))
    fail(EINVAL, Phase::connect, name + " is not a multicast address (IPv4 224.0.0.0/4, IPv6 ff00::/8)", where);
  if (d.find(j->g->addr) != d.groups.end()) fail(EINVAL, Phase::connect, name + " is joined already", where);
  if (d.is_joining(j->g->addr)) fail(EINVAL, Phase::connect, name + " is being joined already", where);
  j->name = name;
  j->timeout = timeout;
  j->deadline = detail::deadline_after(timeout);
  j->where = where;
  {
    // Listed before rdma_cm has the join: its answer finds it, whoever reads the channel.
    const std::lock_guard lock(d.router->mutex());
    d.joining.push_back(j.get());
  }
  j->d = &d;
  if (const int err = d.router->command([&] {
        rdma_cm_join_mc_attr_ex attr{};
        attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
        attr.join_flags = j->g->send_only ? RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER : RDMA_MC_JOIN_FLAG_FULLMEMBER;
        attr.addr = reinterpret_cast<sockaddr*>(&j->g->addr);  // NOLINT
        return rdma_join_multicast_ex(d.id.get(), &attr, j->g.get());
      })) {
    j->unlist();  // before `g` goes: another thread's read of an EventChannel looks at it
    j->g.reset();  // nothing to leave
    j->end();
    fail(err, Phase::connect, "rdma_join_multicast_ex(" + name + ")", where);
  }
  return PendingJoin(std::move(j));
}

DatagramPeer Datagram::join(std::string_view group, Membership membership, milliseconds timeout, SourceLocation where) {
  PendingJoin pending = start_join(group, membership, timeout, where);
  for (;;) {
    if (auto peer = pending.step()) return std::move(*peer);
    pending.impl_->inbox.sleep(*impl_->router, pending.deadline(), Phase::connect, where);
  }
}

PendingJoin::PendingJoin(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
PendingJoin::PendingJoin(PendingJoin&&) noexcept = default;
PendingJoin& PendingJoin::operator=(PendingJoin&&) noexcept = default;
PendingJoin::~PendingJoin() = default;

std::optional<DatagramPeer> PendingJoin::step() {
  detail::require_not_empty(impl_ != nullptr, "PendingJoin::step: the PendingJoin", SourceLocation::current());
  return impl_->step();
}
std::optional<DatagramPeer> PendingJoin::step(std::error_code& ec) noexcept {
  return or_code([this] { return step(); }, ec);
}
int PendingJoin::fd() const noexcept { return impl_ && impl_->d != nullptr ? impl_->d->router->object_fd() : -1; }
std::chrono::steady_clock::time_point PendingJoin::deadline() const noexcept {
  return impl_ ? impl_->deadline : Clock::time_point{};
}
const std::string& PendingJoin::group() const noexcept {
  static const std::string none;
  return impl_ ? impl_->name : none;
}

void Datagram::leave(std::string_view group, SourceLocation where) {
  Impl& d = *impl_;
  const sockaddr_storage a = numeric_address(group, 0, Phase::connect, where);
  const auto it = d.find(a);
  if (it == d.groups.end()) fail(EINVAL, Phase::connect, std::string(group) + " is not joined", where);
  const std::unique_ptr<Impl::Group> g = std::move(*it);
  d.groups.erase(it);
  {
    const std::lock_guard lock(d.router->mutex());
    std::erase(d.dropped, g.get());  // its address may be a new group's
  }
  if (const auto [err, call] = d.drop(*g); err != 0) fail(err, Phase::connect, std::string(group) + ": " + call, where);
}

std::vector<std::string> Datagram::groups() const {
  std::vector<std::string> out;
  out.reserve(impl_->groups.size());
  for (const auto& g : impl_->groups) out.push_back(g->name);
  return out;
}

}  // namespace verbs::cm
