// The active side of verbs::cm (docs/design/cm.md): a connect as a state machine driven by the
// events of its Router, one step per event and never a wait (connect() waits between steps; an
// event loop calls step() itself); and device_to().
#include "cm/connection_impl.hpp"

#include <cstring>

#include "cm_private_data.hpp"

namespace verbs::cm {

using namespace internal;

struct PendingConnect::Impl {
  std::unique_ptr<Connection::Impl> c;
  ClientOptions o;                   // the caller's, with private_data pointing at `user_data`
  std::vector<std::byte> user_data;  // a copy of the caller's private data
  std::vector<std::byte> data;       // framed (expose, then user_data)
  rdma_conn_param param{};
  std::string target;
  Phase phase = Phase::resolve_address;
  Clock::time_point deadline, step_deadline;
  int resolve_ms = 0;
  SourceLocation where;
  std::exception_ptr failed;

  [[nodiscard]] Clock::time_point resolve_deadline() const {
    return std::min(deadline, detail::deadline_after(o.resolve_timeout));
  }
  /// The phase's limit, for the "no answer" error.
  [[nodiscard]] milliseconds budget() const { return phase == Phase::connect ? o.timeout : o.resolve_timeout; }

  /// Sends the address resolution for `dst` (the caller parsed or looked it up).
  void start(const sockaddr_storage& dst, std::string_view host, std::uint16_t port) {
    deadline = detail::deadline_after(o.timeout);
    target = std::string(host) + ":" + std::to_string(port);
    data = frame(o.connection, max_connect_private_data, Phase::connect, where);
    check_options(o.connection, Phase::connect, where);
    sockaddr_storage src{};
    if (!o.source_address.empty()) src = numeric_address(o.source_address, 0, Phase::resolve_address, where);
    c = std::make_unique<Connection::Impl>();
    c->router = ChannelAccess::router_or_own(o.connection.channel, Phase::resolve_address, "ConnectionOptions::channel", where);
    c->id = c->router->make_id(RDMA_PS_TCP, Phase::resolve_address, where);
    c->join(ChannelAccess::key_of(o.connection.channel));
    o.connection.channel.reset();  // read here only: the caller's may go
    resolve_ms = std::max(1, std::min(ms_until(deadline), clamp_ms(o.resolve_timeout)));
    step_deadline = resolve_deadline();
    sockaddr_storage to = dst;
    if (const int err = c->router->command([&] {
          return rdma_resolve_addr(c->id.get(), o.source_address.empty() ? nullptr : reinterpret_cast<sockaddr*>(&src),  // NOLINT
                                   reinterpret_cast<sockaddr*>(&to), resolve_ms);                                        // NOLINT
        }))
      fail(err, Phase::resolve_address,
           target + (err == ENODEV ? ": no RDMA device can reach this address" : ": rdma_resolve_addr failed"), where);
  }

  /// A connect to `dst` (the caller parsed or looked it up), its address resolution sent.
  static PendingConnect begin(const sockaddr_storage& dst, std::string_view host, std::uint16_t port,
                              const ClientOptions& o, SourceLocation where) {
    auto p = std::make_unique<Impl>();
    p->o = o;
    p->user_data.assign(o.connection.private_data.begin(), o.connection.private_data.end());
    p->o.connection.private_data = p->user_data;
    p->where = where;
    p->start(dst, host, port);
    return PendingConnect(std::move(p));
  }

  [[noreturn]] void timed_out() {
    try {
      fail_no_answer(phase, budget(), where);
    } catch (const ConnectError& e) {
      if (phase != Phase::resolve_address) throw;
      fail(e.code().value(), phase, target + ": " + e.context().substr(e.context().find(": ") + 2), where);
    }
  }

  /// Route resolved: build the QP, let before_handshake post receives (and expose memory it
  /// registers), and send the request.
  void send_request(Event e) {
    (void)check_event(std::move(e), RDMA_CM_EVENT_ROUTE_RESOLVED, Phase::resolve_route, where);
    c->build(o.connection, Phase::connect, where);
    if (o.connection.before_handshake) {
      const std::optional<RemoteSlice> before = o.connection.expose;
      o.connection.before_handshake(
          {.qp = *c->qp, .pd = *c->pd, .peer_private_data = {}, .expose = o.connection.expose});
      if (o.connection.expose != before) {  // it exposed what it registered: framed again
        check_options(o.connection, Phase::connect, where);
        data = frame(o.connection, max_connect_private_data, Phase::connect, where);
      }
    }
    // The request carries the route's MTU, this side's active one; taking less, say so.
    std::vector<std::byte> tagged;
    if (c->id->route.num_paths > 0 && c->id->route.path_rec != nullptr) {
      const auto route = static_cast<ibv_mtu>(c->id->route.path_rec[0].mtu);
      if (const ibv_mtu mine = c->mtu_limit(route); mine < route)
        tagged = frame_with_mtu(o.connection, max_connect_private_data, static_cast<Mtu>(mine), static_cast<Mtu>(route),
                                Phase::connect, where);
    }
    if (!tagged.empty()) data = std::move(tagged);
    param = conn_param(o.connection, data, *c->device, *c->qp);
    phase = Phase::connect;
    step_deadline = deadline;
    if (const int err = c->router->command([&] { return rdma_connect(c->id.get(), &param); }))
      fail(err, Phase::connect, target + ": rdma_connect", where);
  }

  /// One event of the phase in progress; the Connection once established.
  std::optional<Connection> on_event(Event e) {
    switch (phase) {
      case Phase::resolve_address: {
        try {
          (void)check_event(std::move(e), RDMA_CM_EVENT_ADDR_RESOLVED, Phase::resolve_address, where);
        } catch (const ConnectError& x) {
          fail(x.code().value(), Phase::resolve_address, target + ": " + x.context().substr(x.context().find(": ") + 2),
               where);
        }
        if (const auto tc = o.connection.transport.traffic_class) {
          std::uint8_t tos = *tc;
          if (rdma_set_option(c->id.get(), RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos) != 0)
            fail(errno, Phase::resolve_route, target + ": rdma_set_option(TOS)", where);
        }
        if (const int err = c->router->command([&] { return rdma_resolve_route(c->id.get(), resolve_ms); }))
          fail(err, Phase::resolve_route, target + ": rdma_resolve_route", where);
        phase = Phase::resolve_route;
        step_deadline = resolve_deadline();
        return std::nullopt;
      }
      case Phase::resolve_route: send_request(std::move(e)); return std::nullopt;
      default: {
        // With no QP on the id, librdmacm hands the reply over as it is: the QP reaches RTS with
        // this side's attributes only, and then rdma_establish(3) sends the RTU.
        Event r = check_event(std::move(e), RDMA_CM_EVENT_CONNECT_RESPONSE, Phase::connect, where);
        c->take_private_data(std::move(r.private_data));  // before RTR: it may carry the server's MTU
        c->to_rts(param, Phase::connect, where);
        if (rdma_establish(c->id.get()) != 0) fail(errno, Phase::connect, target + ": rdma_establish", where);
        c->on_established();
        return Connection(std::move(c));
      }
    }
  }

  std::optional<Connection> step() {
    if (failed) std::rethrow_exception(failed);
    if (!c) fail(ENOTCONN, phase, "PendingConnect::step: the connect is over (its Connection was returned)", where);
    try {
      for (;;) {
        std::optional<Event> e = c->inbox.next(*c->router, phase, where);  // never waits
        if (!e) {
          if (Clock::now() >= step_deadline) timed_out();
          return std::nullopt;
        }
        if (auto done = on_event(std::move(*e))) return done;
      }
    } catch (...) {
      failed = std::current_exception();
      c.reset();
      throw;
    }
  }
};

PendingConnect::PendingConnect(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
PendingConnect::PendingConnect(PendingConnect&&) noexcept = default;
PendingConnect& PendingConnect::operator=(PendingConnect&&) noexcept = default;
PendingConnect::~PendingConnect() = default;

std::optional<Connection> PendingConnect::step() {
  if (!impl_)
    detail::throw_error(make_error_code(Errc::empty_object), "PendingConnect::step: the PendingConnect is empty (moved from)",
                        SourceLocation::current());
  return impl_->step();
}

std::optional<Connection> PendingConnect::step(std::error_code& ec) noexcept {
  return or_code([this] { return step(); }, ec);
}

int PendingConnect::fd() const noexcept { return impl_ && impl_->c ? impl_->c->router->object_fd() : -1; }
std::chrono::steady_clock::time_point PendingConnect::deadline() const noexcept {
  return impl_ ? impl_->step_deadline : Clock::time_point{};
}
Phase PendingConnect::phase() const noexcept { return impl_ ? impl_->phase : Phase::connect; }

PendingConnect start_connect(std::string_view host, std::uint16_t port, const ClientOptions& o, SourceLocation where) {
  return PendingConnect::Impl::begin(numeric_address(host, port, Phase::resolve_address, where), host, port, o, where);
}

Connection connect(std::string_view host, std::uint16_t port, const ClientOptions& o, SourceLocation where) {
  PendingConnect pending =
      PendingConnect::Impl::begin(looked_up_address(host, port, Phase::resolve_address, where), host, port, o, where);
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
  const sockaddr_storage dst = looked_up_address(host, 0, Phase::resolve_address, where);
  Inbox inbox;  // outlives the id, whose deleter removes its route
  const auto router = Router::make(false, Phase::resolve_address, where);
  const auto id = router->make_id(RDMA_PS_TCP, Phase::resolve_address, where);
  router->add(id.get(), {&inbox, [](void* self, Event&& e) noexcept { return static_cast<Inbox*>(self)->keep(std::move(e)); }});
  sockaddr_storage to = dst;
  if (rdma_resolve_addr(id.get(), nullptr, reinterpret_cast<sockaddr*>(&to), clamp_ms(timeout)) != 0)  // NOLINT
    fail(errno, Phase::resolve_address, std::string(host) + ": rdma_resolve_addr", where);
  const auto deadline = detail::deadline_after(timeout);
  for (;;) {
    if (std::optional<Event> e = inbox.next(*router, Phase::resolve_address, where)) {
      (void)check_event(std::move(*e), RDMA_CM_EVENT_ADDR_RESOLVED, Phase::resolve_address, where);
      return device_of(id->verbs, Phase::resolve_address, where);
    }
    if (Clock::now() >= deadline) fail_no_answer(Phase::resolve_address, timeout, where);
    inbox.sleep(*router, deadline, Phase::resolve_address, where);
  }
}

}  // namespace verbs::cm
