// The active side of verbs::cm (docs/design/cm.md): a connect as a state machine driven by the
// events of its Router, one step per event and never a wait (connect() waits between steps; an
// event loop calls step() itself); and device_to().
#include "cm/connection_impl.hpp"

#include <cstring>

#include "cm_private_data.hpp"

namespace verbs::cm {

using namespace internal;

void Resolution::start(Router& r, rdma_cm_id* id, const sockaddr_storage* src, sockaddr_storage dst,
                       SourceLocation where) {
  deadline = detail::deadline_after(whole);
  step_deadline = std::min(deadline, detail::deadline_after(each));
  sockaddr_storage from = src != nullptr ? *src : sockaddr_storage{};
  if (const int err = r.command([&] {
        return rdma_resolve_addr(id, src != nullptr ? reinterpret_cast<sockaddr*>(&from) : nullptr,  // NOLINT
                                 reinterpret_cast<sockaddr*>(&dst), each_ms());                      // NOLINT
      }))
    fail(err, err == ENODEV ? "no RDMA device can reach this address" : "rdma_resolve_addr failed", where);
}

Phase Resolution::check(Event e, SourceLocation where) {
  const Phase ended = phase;
  try {
    const bool address = ended == Phase::resolve_address;
    (void)check_event(std::move(e), address ? RDMA_CM_EVENT_ADDR_RESOLVED : RDMA_CM_EVENT_ROUTE_RESOLVED, ended, where);
  } catch (const ConnectError& x) {
    fail(x.code().value(), x.context().substr(x.context().find(": ") + 2), where);
  }
  if (ended == Phase::resolve_route) {
    phase = Phase::connect;
    step_deadline = deadline;
  }
  return ended;
}

void Resolution::resolve_route(Router& r, rdma_cm_id* id, SourceLocation where) {
  phase = Phase::resolve_route;
  if (const int err = r.command([&] { return rdma_resolve_route(id, each_ms()); })) fail(err, "rdma_resolve_route", where);
  step_deadline = std::min(deadline, detail::deadline_after(each));
}

void Resolution::timed_out(SourceLocation where) const {
  const milliseconds budget = phase == Phase::connect ? whole : each;
  fail(ETIMEDOUT, "no answer within " + std::to_string(budget.count()) + " ms (is the peer reachable?)", where);
}

void Resolution::fail(int err, const std::string& text, SourceLocation where) const {
  internal::fail(err, phase, target + ": " + text, where);
}

struct PendingConnect::Impl {
  std::unique_ptr<Connection::Impl> c;
  ClientOptions o;                   // the caller's, with private_data pointing at `user_data`
  std::vector<std::byte> user_data;  // a copy of the caller's private data
  std::vector<std::byte> data;       // framed (expose, then user_data)
  rdma_conn_param param{};
  Resolution res;
  SourceLocation where;
  std::exception_ptr failed;

  /// A connect to `dst` (the caller parsed or looked it up), its address resolution sent. One
  /// that `sleeps` (connect()) makes the eventfd it sleeps on first: a connect that lacks a
  /// descriptor fails before it sends anything, never after its request went out.
  static PendingConnect begin(const sockaddr_storage& dst, std::string_view host, std::uint16_t port,
                              const ClientOptions& options, bool sleeps, SourceLocation where) {
    auto p = std::make_unique<Impl>();
    ClientOptions& o = p->o = options;
    p->user_data.assign(o.connection.private_data.begin(), o.connection.private_data.end());
    o.connection.private_data = p->user_data;
    p->where = where;
    p->data = frame(o.connection, max_connect_private_data, Phase::connect, where);
    check_options(o.connection, Phase::connect, where);
    std::optional<sockaddr_storage> src;
    if (!o.source_address.empty()) src = numeric_address(o.source_address, 0, Phase::resolve_address, where);
    Connection::Impl& c = *(p->c = std::make_unique<Connection::Impl>());
    c.router = ChannelAccess::router_or_own(o.connection.channel, Phase::resolve_address, "ConnectionOptions::channel", where);
    if (sleeps) (void)c.inbox.arm(*c.router, Phase::resolve_address, where);
    c.id = c.router->make_id(RDMA_PS_TCP, Phase::resolve_address, where);
    c.join(ChannelAccess::key_of(o.connection.channel));
    o.connection.channel.reset();  // read here only: the caller's may go
    p->res = {.target = std::string(host) + ":" + std::to_string(port), .whole = o.timeout, .each = o.resolve_timeout};
    p->res.start(*c.router, c.id.get(), src ? &*src : nullptr, dst, where);
    return PendingConnect(std::move(p));
  }

  /// Route resolved: build the QP, let before_handshake post receives (and expose memory it
  /// registers), and send the request.
  void send_request() {
    data = c->prepare(o.connection.before_handshake, o.connection, max_connect_private_data, Phase::connect, where);
    // The request carries the route's MTU, this side's active one; taking less, say so.
    if (c->id->route.num_paths > 0 && c->id->route.path_rec != nullptr) {
      const auto route = static_cast<ibv_mtu>(c->id->route.path_rec[0].mtu);
      if (const ibv_mtu mine = c->mtu_limit(route); mine < route)
        data = frame_with_mtu(o.connection, max_connect_private_data, static_cast<Mtu>(mine), static_cast<Mtu>(route),
                              Phase::connect, where);
    }
    param = conn_param(o.connection, data, *c->device, *c->qp);
    if (const int err = c->router->command([&] { return rdma_connect(c->id.get(), &param); }))
      res.fail(err, "rdma_connect", where);
  }

  /// One event of the phase in progress; the Connection once established.
  std::optional<Connection> on_event(Event e) {
    if (res.phase != Phase::connect) {
      if (res.check(std::move(e), where) == Phase::resolve_route) {
        send_request();
      } else {
        if (const auto tc = o.connection.transport.traffic_class) {
          std::uint8_t tos = *tc;
          if (rdma_set_option(c->id.get(), RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos) != 0)
            fail(errno, Phase::resolve_route, res.target + ": rdma_set_option(TOS)", where);
        }
        res.resolve_route(*c->router, c->id.get(), where);
      }
      return std::nullopt;
    }
    // With no QP on the id, librdmacm hands the reply over as it is: the QP reaches RTS with
    // this side's attributes only, and then rdma_establish(3) sends the RTU.
    Event r = check_event(std::move(e), RDMA_CM_EVENT_CONNECT_RESPONSE, Phase::connect, where);
    c->take_private_data(std::move(r.private_data));  // before RTR: it may carry the server's MTU
    c->to_rts(param, Phase::connect, where);
    if (rdma_establish(c->id.get()) != 0) res.fail(errno, "rdma_establish", where);
    c->on_established();
    return Connection(std::move(c));
  }

  std::optional<Connection> step() {
    return guarded(
        failed,
        [&]() -> std::optional<Connection> {
          if (!c)
            fail(ENOTCONN, res.phase, "PendingConnect::step: the connect is over (its Connection was returned)", where);
          while (std::optional<Event> e = c->inbox.next(*c->router, res.phase, where))  // never waits
            if (auto done = on_event(std::move(*e))) return done;
          if (Clock::now() >= res.step_deadline) res.timed_out(where);
          return std::nullopt;
        },
        [&] { c.reset(); });
  }
};

PendingConnect::PendingConnect(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
PendingConnect::PendingConnect(PendingConnect&&) noexcept = default;
PendingConnect& PendingConnect::operator=(PendingConnect&&) noexcept = default;
PendingConnect::~PendingConnect() = default;

std::optional<Connection> PendingConnect::step() {
  detail::require_not_empty(impl_ != nullptr, "PendingConnect::step: the PendingConnect", SourceLocation::current());
  return impl_->step();
}
std::optional<Connection> PendingConnect::step(std::error_code& ec) noexcept {
  return or_code([this] { return step(); }, ec);
}
int PendingConnect::fd() const noexcept { return impl_ && impl_->c ? impl_->c->router->object_fd() : -1; }
std::chrono::steady_clock::time_point PendingConnect::deadline() const noexcept {
  return impl_ ? impl_->res.step_deadline : Clock::time_point{};
}
Phase PendingConnect::phase() const noexcept { return impl_ ? impl_->res.phase : Phase::connect; }

PendingConnect start_connect(std::string_view host, std::uint16_t port, const ClientOptions& o, SourceLocation where) {
  return PendingConnect::Impl::begin(numeric_address(host, port, Phase::resolve_address, where), host, port, o, false,
                                     where);
}

Connection connect(std::string_view host, std::uint16_t port, const ClientOptions& o, SourceLocation where) {
  PendingConnect pending =
      PendingConnect::Impl::begin(looked_up_address(host, port, Phase::resolve_address, where), host, port, o, true,
                                  where);
  for (;;) {
    if (auto c = pending.step()) return std::move(*c);
    pending.impl_->c->inbox.sleep(*pending.impl_->c->router, pending.deadline(), pending.phase(), where);
  }
}

std::optional<Connection> connect(std::string_view host, std::uint16_t port, const ClientOptions& options,
                                  std::error_code& ec) {
  return or_code([&] { return connect(host, port, options); }, ec);
}

Device device_to(std::string_view host, milliseconds timeout, SourceLocation where) {
  Resolution res{.target = std::string(host), .whole = timeout, .each = timeout};
  Inbox inbox;  // outlives the id, whose deleter removes its route
  const auto router = Router::make(false, Phase::resolve_address, where);
  const auto id = router->make_id(RDMA_PS_TCP, Phase::resolve_address, where);
  router->add(id.get(), {&inbox, [](void* self, Event&& e) noexcept { return static_cast<Inbox*>(self)->keep(std::move(e)); }});
  res.start(*router, id.get(), nullptr, looked_up_address(host, 0, Phase::resolve_address, where), where);
  for (;;) {
    if (std::optional<Event> e = inbox.next(*router, Phase::resolve_address, where)) {
      (void)res.check(std::move(*e), where);
      return device_of(id->verbs, Phase::resolve_address, where);
    }
    if (Clock::now() >= res.step_deadline) res.timed_out(where);
    inbox.sleep(*router, res.step_deadline, Phase::resolve_address, where);
  }
}

}  // namespace verbs::cm
