#include "verbs/cm.hpp"

#include "cm_private_data.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace verbs::cm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

[[noreturn]] void fail(int err, Phase phase, const std::string& text, SourceLocation where = SourceLocation::current()) {
  throw ConnectError(std::error_code(err, std::generic_category()), phase, text, where);
}

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(left, 0, 1 << 30));
}

std::shared_ptr<rdma_event_channel> make_channel(Phase phase) {
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr) fail(errno, phase, "rdma_create_event_channel");
  std::shared_ptr<rdma_event_channel> owned(ch, [](rdma_event_channel* c) { rdma_destroy_event_channel(c); });
  const int fl = ::fcntl(ch->fd, F_GETFL);
  if (fl < 0 || ::fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) fail(errno, phase, "fcntl(O_NONBLOCK) on the rdma_cm channel");
  return owned;
}

/// An id on `ch`; destroying it keeps the channel alive until then.
std::shared_ptr<rdma_cm_id> own_id(rdma_cm_id* id, std::shared_ptr<rdma_event_channel> ch) {
  return {id, [ch = std::move(ch)](rdma_cm_id* i) { rdma_destroy_id(i); }};
}

std::shared_ptr<rdma_cm_id> make_id(const std::shared_ptr<rdma_event_channel>& ch, Phase phase) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch.get(), &id, nullptr, RDMA_PS_TCP) != 0) fail(errno, phase, "rdma_create_id");
  return own_id(id, ch);
}

sockaddr_storage to_sockaddr(std::string_view host, std::uint16_t port, Phase phase) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICSERV | (host.empty() ? AI_PASSIVE : 0);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string h(host);
  const std::string p = std::to_string(port);
  if (const int rc = ::getaddrinfo(h.empty() ? nullptr : h.c_str(), p.c_str(), &hints, &res); rc != 0)
    fail(rc == EAI_SYSTEM ? errno : EINVAL, phase, "cannot resolve '" + h + "': " + ::gai_strerror(rc));
  sockaddr_storage out{};
  std::memcpy(&out, res->ai_addr, std::min<std::size_t>(res->ai_addrlen, sizeof out));
  ::freeaddrinfo(res);
  return out;
}

std::string address_text(const sockaddr* sa) {
  if (sa == nullptr) return {};
  char text[INET6_ADDRSTRLEN] = {};
  std::uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);  // NOLINT
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    port = ntohs(in->sin_port);
    return std::string(text) + ":" + std::to_string(port);
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);  // NOLINT
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    port = ntohs(in6->sin6_port);
    return "[" + std::string(text) + "]:" + std::to_string(port);
  }
  return {};
}

struct Event {
  rdma_cm_event_type type{};
  int status = 0;
  rdma_cm_id* id = nullptr;
  std::vector<std::byte> private_data;
};

/// The next event on `ch`, acknowledged; empty when `deadline` passes first (ec clear) or on
/// failure (ec set).
std::optional<Event> next_event(rdma_event_channel* ch, Clock::time_point deadline, std::error_code& ec) {
  ec.clear();
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) == 0) {
      Event e{ev->event, ev->status, ev->id, {}};
      const bool carries_data = e.type == RDMA_CM_EVENT_CONNECT_REQUEST || e.type == RDMA_CM_EVENT_ESTABLISHED ||
                                e.type == RDMA_CM_EVENT_REJECTED || e.type == RDMA_CM_EVENT_CONNECT_RESPONSE;
      if (carries_data && ev->param.conn.private_data != nullptr) {
        const auto* p = static_cast<const std::byte*>(ev->param.conn.private_data);
        e.private_data.assign(p, p + ev->param.conn.private_data_len);
      }
      rdma_ack_cm_event(ev);
      return e;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      ec.assign(errno, std::generic_category());
      return std::nullopt;
    }
    const int left = ms_until(deadline);
    if (left <= 0) return std::nullopt;
    pollfd p{ch->fd, POLLIN, 0};
    if (::poll(&p, 1, left) < 0 && errno != EINTR) {
      ec.assign(errno, std::generic_category());
      return std::nullopt;
    }
  }
}

/// Waits for `wanted` (or `also`, when given) on `ch`; any other event ends the phase with an
/// error saying which.
Event expect_event(rdma_event_channel* ch, rdma_cm_event_type wanted, Clock::time_point deadline, Phase phase,
                   std::chrono::milliseconds budget, std::optional<rdma_cm_event_type> also = std::nullopt) {
  std::error_code ec;
  std::optional<Event> e = next_event(ch, deadline, ec);
  if (ec) fail(ec.value(), phase, "rdma_get_cm_event");
  if (!e)
    fail(ETIMEDOUT, phase, "no answer within " + std::to_string(budget.count()) + " ms (is the peer reachable?)");
  if (e->type == wanted || (also && e->type == *also)) return std::move(*e);
  const std::string what = std::string(rdma_event_str(e->type)) + " (status " + std::to_string(e->status) + ")";
  switch (e->type) {
    case RDMA_CM_EVENT_REJECTED:
      fail(ECONNREFUSED, phase,
           e->status == 8 ? "rejected: no listener on that port (" + what + ")" : "rejected by the peer (" + what + ")");
    case RDMA_CM_EVENT_UNREACHABLE: fail(EHOSTUNREACH, phase, "peer unreachable (" + what + ")");
    case RDMA_CM_EVENT_ADDR_ERROR:
      fail(e->status == -ENODEV ? ENODEV : (e->status < 0 ? -e->status : EHOSTUNREACH), phase,
           "address resolution failed (" + what + ")");
    case RDMA_CM_EVENT_ROUTE_ERROR:
      fail(e->status < 0 ? -e->status : ENETUNREACH, phase, "route resolution failed (" + what + ")");
    case RDMA_CM_EVENT_DEVICE_REMOVAL: fail(ENODEV, phase, "the RDMA device was removed (" + what + ")");
    default: fail(ECONNABORTED, phase, "unexpected " + what);
  }
}

std::vector<std::byte> frame(const ConnectionOptions& o, std::size_t limit, Phase phase) {
  const std::size_t extra = o.expose ? RemoteSlice::wire_size : 0;
  if (o.private_data.size() + extra > limit)
    fail(EMSGSIZE, phase,
         "private data of " + std::to_string(o.private_data.size()) + " bytes" +
             (extra != 0 ? " plus the 24-byte exposed slice" : "") + " exceeds the limit of " + std::to_string(limit) +
             " bytes; nothing was sent");
  return detail::frame_cm_private_data(o.expose, o.private_data);
}

rdma_conn_param conn_param(const ConnectionOptions& o, const std::vector<std::byte>& data, const Device& dev) {
  rdma_conn_param p{};
  p.private_data = data.empty() ? nullptr : data.data();
  p.private_data_len = static_cast<std::uint8_t>(data.size());
  const ibv_device_attr& a = dev.attributes().orig_attr;
  p.responder_resources = static_cast<std::uint8_t>(std::min<int>(o.responder_resources, a.max_qp_rd_atom));
  p.initiator_depth = static_cast<std::uint8_t>(std::min<int>(o.initiator_depth, a.max_qp_init_rd_atom));
  p.retry_count = std::min<std::uint8_t>(o.retry_count, 7);
  p.rnr_retry_count = std::min<std::uint8_t>(o.rnr_retry_count, 7);
  return p;
}

/// A Device over the context librdmacm opened for `id`; it keeps `id` (and so the context)
/// alive for as long as anything made from it lives.
Device device_of(const std::shared_ptr<rdma_cm_id>& id) {
  return Device::adopt(std::shared_ptr<ibv_context>(id->verbs, [id](ibv_context*) {}));
}

}  // namespace

std::string_view to_string(Phase p) noexcept {
  switch (p) {
    case Phase::resolve_address: return "address resolution";
    case Phase::resolve_route: return "route resolution";
    case Phase::connect: return "connect";
    case Phase::listen: return "listen";
    case Phase::accept: return "accept";
    case Phase::established: return "established connection";
  }
  return "unknown";
}

ConnectError::ConnectError(std::error_code code, Phase phase, std::string_view context, SourceLocation where)
    : Error(code, "rdma_cm " + std::string(to_string(phase)) + ": " + std::string(context), where), phase_(phase) {}

// ---------------------------------------------------------------------------------------------
struct Connection::Impl {
  std::shared_ptr<rdma_event_channel> channel;
  std::shared_ptr<rdma_cm_id> id;
  std::optional<Device> device;
  std::optional<ProtectionDomain> own_pd;
  const ProtectionDomain* pd = nullptr;
  std::optional<CompletionQueue> own_send_cq, own_recv_cq;
  CompletionQueue* send_cq = nullptr;
  CompletionQueue* recv_cq = nullptr;
  std::optional<QueuePair> qp;
  std::vector<std::byte> peer_private;
  std::optional<RemoteSlice> peer_remote;
  AccessFlags access;
  bool established = false;
  bool settled = false;       // settle_qp done
  bool disconnected = false;  // rdma_disconnect called
  bool peer_gone = false;
  unsigned spins = 0;

  ~Impl() {
    if (established && !disconnected) rdma_disconnect(id.get());
    qp.reset();  // before the CQs, PD and id it uses
  }

  /// Creates PD (unless shared), CQs (unless shared) and the QP on the id's device.
  void build(const ConnectionOptions& o, Phase phase) {
    ibv_context* ctx = id->verbs;
    if (ctx == nullptr) fail(ENODEV, phase, "no RDMA device for this address");
    device.emplace(device_of(id));
    const auto check_same = [&](ibv_context* other, const char* what) {
      if (other != ctx)
        fail(EINVAL, phase,
             std::string(what) + " is on another device context than the connection (" + device->name() +
                 "): make it from cm::device_for() or Listener::device()");
    };
    if (o.pd != nullptr) {
      check_same(o.pd->native_handle()->context, "ConnectionOptions::pd");
      pd = o.pd;
    } else {
      pd = &own_pd.emplace(*device);
    }
    const CqOptions cqo{.depth = o.cq_depth, .with_channel = true};
    if (o.send_cq != nullptr) check_same(o.send_cq->native_handle()->context, "ConnectionOptions::send_cq");
    if (o.recv_cq != nullptr) check_same(o.recv_cq->native_handle()->context, "ConnectionOptions::recv_cq");
    send_cq = o.send_cq != nullptr ? o.send_cq : &own_send_cq.emplace(*device, cqo);
    recv_cq = o.recv_cq != nullptr ? o.recv_cq : &own_recv_cq.emplace(*device, cqo);
    if (o.qp.type != QpType::rc) fail(EINVAL, phase, "rdma_cm connections are RC (QpOptions::type)");

    QpOptions q = o.qp;
    q.port = id->port_num;
    ibv_qp_init_attr init = QueuePair::init_attr(*send_cq, *recv_cq, q);
    if (rdma_create_qp(id.get(), pd->native_handle(), &init) != 0) fail(errno, phase, "rdma_create_qp");
    std::shared_ptr<ibv_srq> srq = q.srq != nullptr ? q.srq->shared_handle() : nullptr;
    std::shared_ptr<ibv_qp> raw(id->qp, [id_ = id, p = pd->shared_handle(), s = send_cq->shared_handle(),
                                         r = recv_cq->shared_handle(), srq](ibv_qp*) { rdma_destroy_qp(id_.get()); });
    qp.emplace(QueuePair::adopt(std::move(raw), q, init.cap, QpState::init));  // rdma_create_qp leaves it in INIT
    (void)qp->refresh_state();
    access = o.qp.access;

    std::uint8_t t = o.ack_timeout;
    if (rdma_set_option(id.get(), RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t) != 0)
      fail(errno, phase, "rdma_set_option(ACK_TIMEOUT)");
  }

  /// The peer's private data: an exposed slice first (when it decodes as one), then the rest.
  void take_private_data(std::vector<std::byte> data) {
    detail::CmPeerPrivateData p = detail::parse_cm_private_data(std::move(data));
    if (p.remote) peer_remote = p.remote;
    peer_private = std::move(p.rest);
  }

  /// Once the QP is in RTS: take back the remote rights rdma_cm granted on it that the options
  /// did not ask for, and shorten its RNR timer.
  void settle_qp(Phase phase) {
    // rdma_cm leaves min_rnr_timer at 0, which means 655 ms: a send that arrives just before
    // the peer posts its receive would stall that long. 12 is 0.64 ms, as in the core.
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.qp_access_flags = static_cast<unsigned>(access.value());
    a.min_rnr_timer = 12;
    if (const int rc = ibv_modify_qp(qp->native_handle(), &a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER);
        rc != 0)
      fail(detail::rc_to_errno(rc), phase, "ibv_modify_qp(RTS, access flags, min_rnr_timer)");
    (void)qp->refresh_state();
    settled = true;
  }

  /// After ESTABLISHED (the client's QP reaches RTS only then).
  void on_established(Phase phase) {
    established = true;
    if (!settled) settle_qp(phase);
  }

  /// Reads pending events without blocking, and notes a disconnect (or device removal).
  void pump(std::error_code& ec) noexcept {
    ec.clear();
    for (;;) {
      std::optional<Event> e = next_event(channel.get(), Clock::time_point{}, ec);
      if (!e) return;
      if (e->type == RDMA_CM_EVENT_DISCONNECTED || e->type == RDMA_CM_EVENT_DEVICE_REMOVAL) peer_gone = true;
    }
  }

  /// After the peer left: disconnect our side too, which moves the QP to ERR and flushes what
  /// is still posted (rxe leaves the QP in RTS otherwise, and a receive would wait forever).
  void settle() noexcept {
    if (peer_gone && !disconnected) {
      rdma_disconnect(id.get());
      disconnected = true;
    }
  }
};

Connection::Connection(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Connection::Connection(Connection&&) noexcept = default;
Connection& Connection::operator=(Connection&&) noexcept = default;
Connection::~Connection() = default;

Device& Connection::device() noexcept { return *impl_->device; }
const ProtectionDomain& Connection::pd() const noexcept { return *impl_->pd; }
CompletionQueue& Connection::send_cq() noexcept { return *impl_->send_cq; }
CompletionQueue& Connection::recv_cq() noexcept { return *impl_->recv_cq; }
QueuePair& Connection::qp() noexcept { return *impl_->qp; }
std::span<const std::byte> Connection::peer_private_data() const noexcept { return impl_->peer_private; }
const std::optional<RemoteSlice>& Connection::peer_remote() const noexcept { return impl_->peer_remote; }
RemoteSlice Connection::remote() const {
  if (!impl_->peer_remote) fail(EPROTO, Phase::established, "the peer exposed no buffer (ConnectionOptions::expose)");
  return *impl_->peer_remote;
}
RemoteSlice Connection::exchange(const RemoteSlice& mine, milliseconds timeout) {
  constexpr std::uint64_t kExchange = 0x7665726273786368;  // "verbsxch"
  constexpr std::size_t n = RemoteSlice::wire_size;
  const auto deadline = Clock::now() + timeout;
  auto mr = MemoryRegion::allocate(pd(), 2 * n, Access::local_write);
  const RemoteSlice::Wire w = mine.encode();
  std::memcpy(mr.data(), w.data(), n);
  qp().post_recv(mr.slice(n, n), kExchange).check();
  qp().post_send(mr.slice(0, n), {.wr_id = kExchange}).check();
  for (CompletionQueue* cq : {impl_->recv_cq, impl_->send_cq}) {
    const auto wc = wait_one(*cq, std::chrono::duration_cast<milliseconds>(
                                      std::max(Clock::duration::zero(), deadline - Clock::now())));
    if (!wc) fail(ETIMEDOUT, Phase::established, "exchange: the peer did not answer within " +
                                                     std::to_string(timeout.count()) + " ms");
    wc->throw_if_failed();
  }
  return RemoteSlice::decode(mr.bytes().subspan(n, n));
}

std::string Connection::peer_address() const { return address_text(rdma_get_peer_addr(impl_->id.get())); }
std::string Connection::local_address() const { return address_text(rdma_get_local_addr(impl_->id.get())); }
bool Connection::connected() const noexcept {
  return impl_->established && !impl_->disconnected && !impl_->peer_gone;
}
int Connection::fd() const noexcept { return impl_->channel->fd; }
rdma_cm_id* Connection::native_handle() const noexcept { return impl_->id.get(); }

bool Connection::poll_events() {
  std::error_code ec;
  impl_->pump(ec);
  if (ec) fail(ec.value(), Phase::established, "rdma_get_cm_event");
  impl_->settle();
  return !impl_->peer_gone;
}

void Connection::disconnect() {
  if (!impl_->established || impl_->disconnected) return;
  impl_->disconnected = true;
  if (rdma_disconnect(impl_->id.get()) != 0) fail(errno, Phase::established, "rdma_disconnect");
}

std::span<Completion> Connection::wait(CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                       std::error_code& ec) noexcept {
  Impl& c = *impl_;
  const auto deadline = Clock::now() + timeout;
  // Completions in the CQ always come first. When the connection is over, the CQ is polled
  // once more (a completion can land between a poll and the event that ends the connection:
  // the peer saw our ACK, then left); only then does our side disconnect, flushing what is
  // still posted, and the wait fails.
  const auto closed = [&]() { return c.peer_gone || c.disconnected; };
  const auto finish = [&]() -> std::span<Completion> {
    if (auto got = cq.poll(out, ec); !got.empty() || ec) return got;
    c.settle();
    ec.assign(c.peer_gone ? ECONNRESET : ENOTCONN, std::generic_category());
    return {};
  };
  for (bool first = true;; first = false) {
    if (auto got = cq.poll(out, ec); !got.empty() || ec) return got;
    if (!cq.has_channel()) {
      // Busy polling: look at the cm channel now and then (a system call each time; not on every
      // empty poll, which would cost a busy-polling ping-pong a system call per round trip).
      if ((++c.spins & 1023u) == 0 || (first && closed())) {
        if (c.pump(ec), ec) return {};
        if (closed()) return finish();
      }
      if (Clock::now() >= deadline) return {};
      continue;
    }
    if (c.pump(ec), ec) return {};
    if (closed()) return finish();
    if (Clock::now() >= deadline) return {};
    if (auto got = cq.arm_and_poll(out, ec); !got.empty() || ec) return got;
    pollfd fds[2] = {{cq.fd(), POLLIN, 0}, {c.channel->fd, POLLIN, 0}};
    if (::poll(fds, 2, std::max(1, ms_until(deadline))) < 0 && errno != EINTR) {
      ec.assign(errno, std::generic_category());
      return {};
    }
    if (fds[0].revents != 0 && (cq.consume_events(ec), ec)) return {};
    // A readable cm channel is read at the top of the loop, after the CQ.
  }
}

std::span<Completion> Connection::wait(CompletionQueue& cq, std::span<Completion> out, milliseconds timeout) {
  std::error_code ec;
  auto got = wait(cq, out, timeout, ec);
  if (ec)
    fail(ec.value(), Phase::established,
         ec.value() == ECONNRESET   ? "the peer disconnected"
         : ec.value() == ENOTCONN   ? "the connection was closed on this side"
                                    : "waiting for completions");
  return got;
}

// ---------------------------------------------------------------------------------------------
Connection connect(std::string_view host, std::uint16_t port, const ConnectOptions& o) {
  const auto deadline = Clock::now() + o.timeout;
  const auto step_deadline = [&] { return std::min(deadline, Clock::now() + o.resolve_timeout); };
  const std::vector<std::byte> data = frame(o.connection, max_connect_private_data, Phase::connect);

  auto c = std::make_unique<Connection::Impl>();
  c->channel = make_channel(Phase::resolve_address);
  c->id = make_id(c->channel, Phase::resolve_address);

  sockaddr_storage dst = to_sockaddr(host, port, Phase::resolve_address);
  sockaddr_storage src{};
  if (!o.source_address.empty()) src = to_sockaddr(o.source_address, 0, Phase::resolve_address);
  const std::string target = std::string(host) + ":" + std::to_string(port);
  const int resolve_ms = std::max(1, std::min(ms_until(deadline), static_cast<int>(o.resolve_timeout.count())));
  if (rdma_resolve_addr(c->id.get(), o.source_address.empty() ? nullptr : reinterpret_cast<sockaddr*>(&src),  // NOLINT
                        reinterpret_cast<sockaddr*>(&dst), resolve_ms) != 0) {                                 // NOLINT
    const int err = errno;
    fail(err, Phase::resolve_address,
         target + (err == ENODEV ? ": no RDMA device can reach this address" : ": rdma_resolve_addr failed"));
  }
  try {
    (void)expect_event(c->channel.get(), RDMA_CM_EVENT_ADDR_RESOLVED, step_deadline(), Phase::resolve_address,
                       o.resolve_timeout);
  } catch (const ConnectError& e) {
    fail(e.code().value(), Phase::resolve_address, target + ": " + e.context().substr(e.context().find(": ") + 2));
  }
  if (rdma_resolve_route(c->id.get(), resolve_ms) != 0) fail(errno, Phase::resolve_route, target + ": rdma_resolve_route");
  (void)expect_event(c->channel.get(), RDMA_CM_EVENT_ROUTE_RESOLVED, step_deadline(), Phase::resolve_route,
                     o.resolve_timeout);

  c->build(o.connection, Phase::connect);
  if (o.connection.before_handshake) o.connection.before_handshake({.qp = *c->qp, .pd = *c->pd, .peer_private_data = {}});
  rdma_conn_param p = conn_param(o.connection, data, *c->device);
  if (rdma_connect(c->id.get(), &p) != 0) fail(errno, Phase::connect, target + ": rdma_connect");
  Event e = expect_event(c->channel.get(), RDMA_CM_EVENT_ESTABLISHED, deadline, Phase::connect, o.timeout);
  c->take_private_data(std::move(e.private_data));
  c->on_established(Phase::connect);
  return Connection(std::move(c));
}

std::optional<Connection> connect(std::string_view host, std::uint16_t port, const ConnectOptions& options,
                                  std::error_code& ec) {
  try {
    ec.clear();
    return connect(host, port, options);
  } catch (const Error& e) {
    ec = e.code();
    return std::nullopt;
  }
}

Device device_for(std::string_view local_address) {
  auto ch = make_channel(Phase::listen);
  auto id = make_id(ch, Phase::listen);
  sockaddr_storage a = to_sockaddr(local_address, 0, Phase::listen);
  if (rdma_bind_addr(id.get(), reinterpret_cast<sockaddr*>(&a)) != 0)  // NOLINT
    fail(errno, Phase::listen, "rdma_bind_addr(" + std::string(local_address) + ")");
  if (id->verbs == nullptr) fail(ENODEV, Phase::listen, "no RDMA device has the address " + std::string(local_address));
  return device_of(id);
}

Device device_to(std::string_view host, milliseconds timeout) {
  auto ch = make_channel(Phase::resolve_address);
  auto id = make_id(ch, Phase::resolve_address);
  sockaddr_storage dst = to_sockaddr(host, 0, Phase::resolve_address);
  const int ms = static_cast<int>(std::clamp<std::int64_t>(timeout.count(), 1, 1 << 30));
  if (rdma_resolve_addr(id.get(), nullptr, reinterpret_cast<sockaddr*>(&dst), ms) != 0)  // NOLINT
    fail(errno, Phase::resolve_address, std::string(host) + ": rdma_resolve_addr");
  (void)expect_event(ch.get(), RDMA_CM_EVENT_ADDR_RESOLVED, Clock::now() + timeout, Phase::resolve_address, timeout);
  if (id->verbs == nullptr) fail(ENODEV, Phase::resolve_address, "no RDMA device reaches " + std::string(host));
  return device_of(id);
}

// ---------------------------------------------------------------------------------------------
struct Listener::Impl {
  std::shared_ptr<rdma_event_channel> channel;
  std::shared_ptr<rdma_cm_id> id;
  std::string address;
  std::uint16_t port = 0;
};

Listener::Listener(std::string_view address, std::uint16_t port, const ListenOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->channel = make_channel(Phase::listen);
  impl_->id = make_id(impl_->channel, Phase::listen);
  impl_->address = address;
  sockaddr_storage a = to_sockaddr(address, port, Phase::listen);
  const std::string where = std::string(address) + ":" + std::to_string(port);
  if (rdma_bind_addr(impl_->id.get(), reinterpret_cast<sockaddr*>(&a)) != 0)  // NOLINT
    fail(errno, Phase::listen, "rdma_bind_addr(" + where + ")");
  const bool wildcard = address.empty() || address == "0.0.0.0" || address == "::";
  if (!wildcard && impl_->id->verbs == nullptr)
    fail(ENODEV, Phase::listen, "no RDMA device has the address " + std::string(address));
  if (rdma_listen(impl_->id.get(), options.backlog) != 0) fail(errno, Phase::listen, "rdma_listen(" + where + ")");
  impl_->port = ntohs(rdma_get_src_port(impl_->id.get()));
}

Listener::Listener(Listener&&) noexcept = default;
Listener& Listener::operator=(Listener&&) noexcept = default;
Listener::~Listener() = default;

std::uint16_t Listener::port() const noexcept { return impl_->port; }
int Listener::fd() const noexcept { return impl_->channel->fd; }
rdma_cm_id* Listener::native_handle() const noexcept { return impl_->id.get(); }

Device Listener::device() const {
  if (impl_->id->verbs == nullptr)
    fail(ENODEV, Phase::listen, "a listener on a wildcard address has no single device: use cm::device_for(address)");
  return device_for(impl_->address);
}

Connection Listener::accept(milliseconds timeout, const ConnectionOptions& o) {
  const auto deadline = Clock::now() + timeout;
  const std::vector<std::byte> data = frame(o, max_accept_private_data, Phase::accept);
  for (;;) {
    std::error_code ec;
    std::optional<Event> req = next_event(impl_->channel.get(), deadline, ec);
    if (ec) fail(ec.value(), Phase::accept, "rdma_get_cm_event");
    if (!req) fail(ETIMEDOUT, Phase::accept, "no connection request within " + std::to_string(timeout.count()) + " ms");
    if (req->type != RDMA_CM_EVENT_CONNECT_REQUEST) continue;  // nothing else concerns a listener

    auto c = std::make_unique<Connection::Impl>();
    c->channel = make_channel(Phase::accept);
    c->id = own_id(req->id, c->channel);
    // Its own channel makes the connection independent of the listener and of the others.
    if (rdma_migrate_id(req->id, c->channel.get()) != 0) fail(errno, Phase::accept, "rdma_migrate_id");
    try {
      c->build(o, Phase::accept);
      c->take_private_data(std::move(req->private_data));
      if (o.before_handshake) o.before_handshake({.qp = *c->qp, .pd = *c->pd, .peer_private_data = c->peer_private});
    } catch (...) {
      rdma_reject(c->id.get(), nullptr, 0);
      throw;
    }
    rdma_conn_param p = conn_param(o, data, *c->device);
    if (rdma_accept(c->id.get(), &p) != 0) fail(errno, Phase::accept, "rdma_accept");
    // On InfiniBand and RoCE, rdma_accept leaves the QP in RTS and the reply on its way: the
    // client may send (or write) as soon as it has it, before ESTABLISHED reaches us. Settle
    // the QP now, not then.
    if (c->qp->refresh_state() == QpState::rts) c->settle_qp(Phase::accept);
    // DISCONNECTED instead of ESTABLISHED: the client connected and already left, and its RTU
    // was lost (connection management messages are datagrams; a busy rxe drops some), so its
    // DREQ came first. It was connected (only a connected side sends a DREQ): hand out the
    // connection, closed by the peer, as when the DREQ comes after ESTABLISHED.
    const Event e = expect_event(c->channel.get(), RDMA_CM_EVENT_ESTABLISHED, deadline, Phase::accept, timeout,
                                 RDMA_CM_EVENT_DISCONNECTED);
    c->on_established(Phase::accept);
    if (e.type == RDMA_CM_EVENT_DISCONNECTED) c->peer_gone = true;
    return Connection(std::move(c));
  }
}

std::optional<Connection> Listener::accept(milliseconds timeout, const ConnectionOptions& options,
                                           std::error_code& ec) {
  try {
    ec.clear();
    return accept(timeout, options);
  } catch (const Error& e) {
    ec = e.code();
    return std::nullopt;
  }
}

}  // namespace verbs::cm
