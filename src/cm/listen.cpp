// The passive side of verbs::cm (docs/design/cm.md): a Listener, its handshakes in progress,
// PendingAccept, accept(), and device_for().
#include "cm/connection_impl.hpp"

#include <arpa/inet.h>
#include <poll.h>

#include <algorithm>

namespace verbs::cm {

using namespace internal;

// The handshake of an accepted request, from the answer (rdma_accept) to ESTABLISHED.
struct PendingAccept::Impl {
  std::unique_ptr<Connection::Impl> c;
  Clock::time_point deadline;
  milliseconds budget{};
  SourceLocation where;
  std::exception_ptr failed;

  std::optional<Connection> step() {
    return guarded(
        failed,
        [&]() -> std::optional<Connection> {
          if (!c)
            fail(ENOTCONN, Phase::accept, "PendingAccept::step: the accept is over (its Connection was returned)", where);
          std::optional<Event> e = c->inbox.next(*c->router, Phase::accept, where);  // never waits
          if (!e) {
            if (Clock::now() >= deadline) fail_no_answer(Phase::accept, budget, where);
            return std::nullopt;
          }
          // DISCONNECTED instead of ESTABLISHED: the client connected and already left, and its
          // RTU was lost (connection management messages are datagrams; a busy rxe drops some),
          // so its DREQ came first. It was connected (only a connected side sends a DREQ): hand
          // out the connection, closed by the peer, as when the DREQ comes after ESTABLISHED.
          const Event got =
              check_event(std::move(*e), RDMA_CM_EVENT_ESTABLISHED, Phase::accept, where, RDMA_CM_EVENT_DISCONNECTED);
          c->on_established();
          if (got.type == RDMA_CM_EVENT_DISCONNECTED) c->peer_gone = true;
          return Connection(std::move(c));
        },
        [&] { c.reset(); });
  }

  /// The connection before its client confirmed (accept()'s): ESTABLISHED, or the client's
  /// failure, comes to it as an event, and it takes the client for gone at `deadline`.
  Connection unconfirmed() {
    c->confirmed = false;
    c->confirm_by = deadline;
    c->on_established();  // what came meanwhile is noted
    return Connection(std::move(c));
  }
};

PendingAccept::PendingAccept(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
PendingAccept::PendingAccept(PendingAccept&&) noexcept = default;
PendingAccept& PendingAccept::operator=(PendingAccept&&) noexcept = default;
PendingAccept::~PendingAccept() = default;

std::optional<Connection> PendingAccept::step() {
  detail::require_not_empty(impl_ != nullptr, "PendingAccept::step: the PendingAccept", SourceLocation::current());
  return impl_->step();
}
std::optional<Connection> PendingAccept::step(std::error_code& ec) noexcept {
  return or_code([this] { return step(); }, ec);
}
int PendingAccept::fd() const noexcept { return impl_ && impl_->c ? impl_->c->router->object_fd() : -1; }
std::chrono::steady_clock::time_point PendingAccept::deadline() const noexcept {
  return impl_ ? impl_->deadline : Clock::time_point{};
}

struct Listener::Impl {
  std::shared_ptr<Router> router;  // its own channel's, or an EventChannel's
  std::shared_ptr<rdma_cm_id> id;
  std::string address;
  std::uint16_t port = 0;
  milliseconds handshake_timeout{};
  std::size_t backlog = 0;  // ListenOptions::backlog: the requests `inbox` keeps at most
  // Under the Router's mutex: the requests (and a DEVICE_REMOVAL) its readers handed over.
  bool on_router = false;
  Inbox inbox;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (!on_router) return;
    // Requests handed over and not taken: refused, so that their clients hear at once (the
    // kernel does the same with those still in the channel when the id goes).
    for (const Event& e : router->remove_taking(id.get(), inbox))
      if (e.type == RDMA_CM_EVENT_CONNECT_REQUEST) router->refuse_request(e.id);
  }

  /// The listener's route (Router::Deliver): the kernel's backlog ends where the channel is
  /// read, so this one holds what it would have.
  static bool deliver(void* self, Event&& e) noexcept {
    auto& l = *static_cast<Impl*>(self);
    const auto is_request = [](const Event& x) { return x.type == RDMA_CM_EVENT_CONNECT_REQUEST; };
    if (is_request(e) &&
        static_cast<std::size_t>(std::count_if(l.inbox.events.begin(), l.inbox.events.end(), is_request)) >= l.backlog)
      return false;  // refused by the Router, as a full backlog would
    if (l.inbox.keep(std::move(e))) return true;
    l.inbox.lost = false;  // a request is refused by the Router; anything else concerns no listener
    return false;
  }

  /// Answers `req` (build, before_handshake, RTS, rdma_accept) and returns its handshake. A
  /// failure rejects the request and throws (IdGone when the request's client has gone). A
  /// handshake that `sleeps` (accept()) has the eventfds it sleeps on made first: an accept that
  /// lacks a descriptor rejects, never after its answer went out.
  PendingAccept answer(Event& req, const ConnectionOptions& options, bool sleeps, SourceLocation where);
  /// start_accept(), for a caller that `sleeps` or not.
  std::optional<PendingAccept> start(const ConnectionOptions& o, bool sleeps, SourceLocation where);
  /// A listener on an EventChannel accepts onto that channel only (its requests' ids are on it).
  void check_channel(const ConnectionOptions& o, SourceLocation where) const;
  /// Whether a request (or another event) waits for the listener.
  [[nodiscard]] bool has_request();
};

bool Listener::Impl::has_request() {
  {
    const std::lock_guard lock(router->mutex());
    if (!inbox.events.empty()) return true;
  }
  // A channel of its own holds only the listener's events (a handshake's are on a channel of its
  // own once answered); an EventChannel's are everyone's, and the handshake's step() has just
  // handed the listener what it read.
  if (router->object_fd() < 0) return false;
  pollfd p{router->channel()->fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

void Listener::Impl::check_channel(const ConnectionOptions& o, SourceLocation where) const {
  (void)ChannelAccess::router_of(o.channel, Phase::accept, "ConnectionOptions::channel", where);  // moved from?
  if (router->may_accept_onto(o.channel ? ChannelAccess::hub(o.channel->channel()).get() : nullptr)) return;
  fail(EINVAL, Phase::accept,
       "ConnectionOptions::channel names another EventChannel than the listener's (ListenOptions::channel): a "
       "listener on an EventChannel accepts onto it; leave it empty or name the same one; nothing was taken",
       where);
}

PendingAccept Listener::Impl::answer(Event& req, const ConnectionOptions& options, bool sleeps, SourceLocation where) {
  std::optional<ConnectionOptions> o;  // as given, but for what before_handshake exposes
  std::unique_ptr<PendingAccept::Impl> pending;
  std::unique_ptr<Connection::Impl> c;
  // Until the request's id is the connection's, a failure (no descriptor left for a channel of
  // its own, say, or no memory) rejects the request, so that its client hears at once.
  try {
    o.emplace(options);
    o->before_handshake = nullptr;  // the caller's own is called: its state carries across accepts
    pending = std::make_unique<PendingAccept::Impl>();
    c = std::make_unique<Connection::Impl>();
    pending->budget = handshake_timeout;
    pending->deadline = detail::deadline_after(pending->budget);
    pending->where = where;
    c->router = router->onto(ChannelAccess::router_of(o->channel, Phase::accept, "ConnectionOptions::channel", where),
                             Phase::accept, where);
    if (sleeps) {  // on the listener's inbox and the handshake's
      (void)inbox.arm(*router, Phase::accept, where);
      (void)c->inbox.arm(*c->router, Phase::accept, where);
    }
  } catch (...) {
    router->refuse_request(req.id);
    throw;
  }
  c->id = c->router->own(req.id);  // (should it fail to allocate, its deleter destroys the id)
  try {
    // Routed before it moves: what came for the id since its request goes with it.
    if (c->router == router) {
      c->join(ChannelAccess::key_of(o->channel));
    } else {
      c->join(ChannelAccess::key_of(o->channel), router->take_parked(req.id));
      if (const int err = c->router->command([&] { return rdma_migrate_id(req.id, c->router->channel()); }))
        fail_id(err, Phase::accept, "rdma_migrate_id", where);
    }
    c->take_private_data(std::move(req.private_data));
    std::vector<std::byte> data = c->prepare(options.before_handshake, *o, max_accept_private_data, Phase::accept, where);
    rdma_conn_param p = conn_param(*o, data, *c->device, *c->qp, &req);
    // In RTS before the reply goes: the client may send (or write) as soon as it has it.
    c->to_rts(p, Phase::accept, where);
    // The client uses the request's MTU (its own) unless told: taking less, say so.
    if (c->rtr_mtu < c->peer_assumes) {
      data = frame_with_mtu(*o, max_accept_private_data, static_cast<Mtu>(c->rtr_mtu), static_cast<Mtu>(c->peer_assumes),
                            Phase::accept, where);
      p.private_data = data.data();
      p.private_data_len = static_cast<std::uint8_t>(data.size());
    }
    if (const int err = c->router->command([&] { return rdma_accept(c->id.get(), &p); }))
      fail_id(err, Phase::accept, "rdma_accept (did the client give up?)", where);
  } catch (const Reject& r) {
    const auto d = r.private_data();
    rdma_reject(c->id.get(), d.empty() ? nullptr : d.data(), static_cast<std::uint8_t>(d.size()));
    throw;
  } catch (...) {
    rdma_reject(c->id.get(), nullptr, 0);
    throw;
  }
  pending->c = std::move(c);
  return PendingAccept(std::move(pending));
}

Listener::Listener(std::string_view address, std::uint16_t port, const ListenOptions& options, SourceLocation where)
    : impl_(std::make_unique<Impl>()) {
  Impl& l = *impl_;
  const sockaddr_storage a = looked_up_address(address, port, Phase::listen, where);
  l.router = ChannelAccess::router_or_own(options.channel, Phase::listen, "ListenOptions::channel", where);
  l.id = l.router->make_id(RDMA_PS_TCP, Phase::listen, where);
  l.backlog = static_cast<std::size_t>(std::max(1, options.backlog));
  l.router->add(l.id.get(), {&l, &Impl::deliver, ChannelAccess::key_of(options.channel)});  // routed before it listens
  l.on_router = true;
  l.address = address;
  l.handshake_timeout = options.handshake_timeout;
  const std::string bound = std::string(address) + ":" + std::to_string(port);
  set_bind_options(l.id.get(), false, options.ipv6_only, Phase::listen, where);
  bind_to(l.id.get(), a, bound, true, Phase::listen, where);
  if (rdma_listen(l.id.get(), options.backlog) != 0) fail(errno, Phase::listen, "rdma_listen(" + bound + ")", where);
  l.port = ntohs(rdma_get_src_port(l.id.get()));
}

Listener::Listener(Listener&&) noexcept = default;
Listener& Listener::operator=(Listener&&) noexcept = default;
Listener::~Listener() = default;

std::uint16_t Listener::port() const noexcept { return impl_->port; }
int Listener::fd() const noexcept { return impl_->router->object_fd(); }
rdma_cm_id* Listener::native_handle() const noexcept { return impl_->id.get(); }

Device Listener::device(SourceLocation where) const {
  if (impl_->id->verbs == nullptr)
    fail(ENODEV, Phase::listen, "a listener on a wildcard address has no single device: use cm::device_for(address)", where);
  return device_of(impl_->id->verbs, Phase::listen, where);
}

std::optional<PendingAccept> Listener::Impl::start(const ConnectionOptions& o, bool sleeps, SourceLocation where) {
  (void)frame(o, max_accept_private_data, Phase::accept, where);
  check_options(o, Phase::accept, where);
  check_channel(o, where);
  for (;;) {
    std::optional<Event> req = inbox.next(*router, Phase::accept, where);  // never waits
    if (!req) return std::nullopt;
    if (req->type == RDMA_CM_EVENT_DEVICE_REMOVAL)
      fail(ENODEV, Phase::accept, "the listener's RDMA device was removed (DEVICE_REMOVAL): listen again", where);
    if (req->type == RDMA_CM_EVENT_CONNECT_REQUEST) return answer(*req, o, sleeps, where);
  }
}

std::optional<PendingAccept> Listener::start_accept(const ConnectionOptions& o, SourceLocation where) {
  return impl_->start(o, false, where);
}

// One request per call, answered with this call's options (what they hold, e.g. buffers the
// caller made for this connection, is this connection's). The call waits for the client to
// confirm while nobody else waits and its timeout allows; otherwise it hands the connection out
// unconfirmed, and the connection sees the confirmation (or takes the client for gone at
// handshake_timeout). So a client that stalls its handshake holds up no other request, and
// the call never blocks past its timeout. A request whose client has gone, or whose handshake
// failed, is dropped, and the call goes on to the next request.
Connection Listener::accept(milliseconds timeout, const ConnectionOptions& o, SourceLocation where) {
  Impl& l = *impl_;
  const auto deadline = detail::deadline_after(timeout);
  for (;;) {
    std::optional<PendingAccept> pending;
    try {
      pending = l.start(o, true, where);
    } catch (const IdGone&) {
      continue;  // its client gave up: the next request
    }
    while (pending) {
      try {
        if (std::optional<Connection> c = pending->step()) return std::move(*c);
      } catch (const ConnectError& e) {
        if (e.phase() != Phase::accept) throw;
        break;  // its client left, or never confirmed: the next request
      }
      if (Clock::now() >= deadline || l.has_request()) return pending->impl_->unconfirmed();
      Connection::Impl& c = *pending->impl_->c;
      Inbox::sleep_on({{l.router.get(), &l.inbox}, {c.router.get(), &c.inbox}}, std::min(deadline, pending->deadline()),
                      Phase::accept, where);
    }
    if (pending) continue;
    if (Clock::now() >= deadline)
      fail(ETIMEDOUT, Phase::accept, "no connection request within " + std::to_string(timeout.count()) + " ms", where);
    l.inbox.sleep(*l.router, deadline, Phase::accept, where);
  }
}

std::optional<Connection> Listener::accept(milliseconds timeout, const ConnectionOptions& options,
                                           std::error_code& ec) {
  return or_code([&] { return accept(timeout, options); }, ec);
}

Device device_for(std::string_view local_address, SourceLocation where) {
  const sockaddr_storage a = looked_up_address(local_address, 0, Phase::listen, where);
  const auto router = Router::make(false, Phase::listen, where);
  const auto id = router->make_id(RDMA_PS_TCP, Phase::listen, where);
  bind_to(id.get(), a, std::string(local_address), false, Phase::listen, where);
  return device_of(id->verbs, Phase::listen, where);
}

}  // namespace verbs::cm
