// The connection room of verbs::cm (docs/design/cm.md): an established connection's state, its
// waits, and its teardown.
#include "cm/connection_impl.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>

namespace verbs::cm {

using namespace internal;

// ---- Connection::Impl: state and events ----

Connection::Impl::~Impl() {
  // Out of the Router and the async reader first: their routes must not be called with this
  // Impl half destroyed.
  if (on_router) router->remove(id.get());
  if (routed_qp != nullptr) hub->remove_route(routed_qp);
  if (established && !disconnected) {
    to_error();
    rdma_disconnect(id.get());
  }
  qp.reset();  // before the CQs, PD and id it uses
  if (const int fd = over_fd.load(); fd >= 0) ::close(fd);
  if (const int fd = gone_fd.load(); fd >= 0) ::close(fd);
}

void Connection::Impl::join(std::uint64_t key, std::vector<Event> earlier) {
  router->add(id.get(), {this, &Impl::deliver, key}, std::move(earlier));
  on_router = true;
}

void Connection::Impl::on_established() {
  established = true;
  std::vector<Event> left;  // what came with the last handshake event (DISCONNECTED after ESTABLISHED)
  {
    const std::lock_guard lock(router->mutex());
    handshaking = false;
    left.swap(inbox.events);
    inbox.close_fd();  // no handshake sleeps any more: the connection holds its channel only
  }
  for (const Event& e : left) note(e);
}

void Connection::Impl::note(const Event& e) noexcept {
  if (e.type == RDMA_CM_EVENT_ESTABLISHED) confirmed = true;
  // Before ESTABLISHED (a connection accept() handed out at once): the client gave up.
  if (!confirmed && (e.type == RDMA_CM_EVENT_REJECTED || e.type == RDMA_CM_EVENT_CONNECT_ERROR ||
                     e.type == RDMA_CM_EVENT_UNREACHABLE)) {
    never_confirmed = true;
    peer_gone = true;
  }
  if (e.type == RDMA_CM_EVENT_DISCONNECTED) {
    confirmed = true;  // only a connected client sends a DREQ (its RTU was lost): it was connected
    peer_gone = true;
  }
  if (e.type == RDMA_CM_EVENT_DEVICE_REMOVAL) device_removed = true;
  if (e.type == RDMA_CM_EVENT_ADDR_CHANGE) address_changed = true;
  if (over()) wake_all();
}

void Connection::Impl::expire() noexcept {
  if (confirmed || over() || Clock::now() < confirm_by || never_confirmed.exchange(true)) return;
  peer_gone = true;
  wake_all();
}

bool Connection::Impl::deliver(void* self, Event&& e) noexcept {
  auto& c = *static_cast<Impl*>(self);
  if (c.handshaking)
    (void)c.inbox.keep(std::move(e));  // one it cannot keep fails the handshake (next())
  else
    c.note(e);
  return true;
}

void Connection::Impl::on_async_event(void* self, const AsyncEvent& e) noexcept {
  auto& c = *static_cast<Impl*>(self);
  const bool ends = e.type == IBV_EVENT_QP_FATAL || e.type == IBV_EVENT_QP_REQ_ERR || e.type == IBV_EVENT_QP_ACCESS_ERR ||
                    e.type == IBV_EVENT_DEVICE_FATAL;
  if (!ends) return;
  int none = -1;
  (void)c.fatal_event.compare_exchange_strong(none, static_cast<int>(e.type));
  c.wake_all();
}

int Connection::Impl::wake_fd(std::atomic<int>& slot) noexcept {
  if (const int fd = slot.load(); fd >= 0) return fd;
  const int made = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (made < 0) return -1;
  int none = -1;
  if (slot.compare_exchange_strong(none, made)) return made;
  ::close(made);  // another thread's came first
  return none;
}

void Connection::Impl::wake_all() noexcept {
  const std::uint64_t one = 1;
  if (const int fd = over_fd.load(); fd >= 0) (void)!::write(fd, &one, sizeof one);
  if (peer_gone || device_removed)
    if (const int fd = gone_fd.load(); fd >= 0) (void)!::write(fd, &one, sizeof one);
}

int Connection::Impl::over_errno() const noexcept {
  if (const int t = fatal_event.load(); t >= 0) return t == IBV_EVENT_DEVICE_FATAL ? ENODEV : EIO;
  if (never_confirmed) return ECONNABORTED;
  return peer_gone ? ECONNRESET : device_removed ? ENODEV : ENOTCONN;
}

std::string Connection::Impl::over_text() const {
  if (const int t = fatal_event.load(); t >= 0) {
    AsyncEvent e;
    e.type = static_cast<ibv_event_type>(t);
    return std::string(t == IBV_EVENT_DEVICE_FATAL ? "the RDMA device" : "the connection's QP") +
           " got the async event " + std::string(e.type_name()) + " (" + std::string(e.name()) + ")";
  }
  if (never_confirmed)
    return "the client did not confirm the connection (no ESTABLISHED within ListenOptions::handshake_timeout, or "
           "its handshake failed)";
  return peer_gone        ? "the peer disconnected"
         : device_removed ? "the RDMA device was removed (DEVICE_REMOVAL)"
                          : "the connection was closed on this side";
}

void Connection::Impl::settle() noexcept {
  if ((peer_gone || device_removed || failed()) && !disconnected.exchange(true)) {
    to_error();  // once, whichever thread gets here first
    rdma_disconnect(id.get());
    wake_all();
  }
}

void Connection::Impl::pump(std::error_code& ec) noexcept {
  pump_cm(ec);
  if (!ec) hub->pump(ec);
}

// ---- Connection ----

Connection::Connection(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Connection::Connection(Connection&&) noexcept = default;
Connection& Connection::operator=(Connection&&) noexcept = default;
Connection::~Connection() = default;

Device& Connection::device() noexcept { return *impl_->device; }
const ProtectionDomain& Connection::pd() const noexcept { return *impl_->pd; }
const CompletionQueue& Connection::send_cq() const noexcept { return *impl_->send_cq; }
const CompletionQueue& Connection::recv_cq() const noexcept { return *impl_->recv_cq; }
const QueuePair& Connection::qp() const noexcept { return *impl_->qp; }
std::span<const std::byte> Connection::peer_private_data() const noexcept { return impl_->peer_private; }
const std::optional<RemoteSlice>& Connection::peer_remote() const noexcept { return impl_->peer_remote; }
RemoteSlice Connection::remote(SourceLocation where) const {
  if (!impl_->peer_remote) fail(EPROTO, Phase::established, "the peer exposed no buffer (ConnectionOptions::expose)", where);
  return *impl_->peer_remote;
}
std::string Connection::peer_address() const { return address_text(rdma_get_peer_addr(impl_->id.get())); }
std::string Connection::local_address() const { return address_text(rdma_get_local_addr(impl_->id.get())); }
bool Connection::connected() const noexcept {
  const Impl& c = *impl_;
  return c.established && !c.over() && (c.confirmed || Clock::now() < c.confirm_by);
}
bool Connection::address_changed() const noexcept { return impl_->address_changed; }
int Connection::fd() const noexcept { return impl_->router->object_fd(); }
rdma_cm_id* Connection::native_handle() const noexcept { return impl_->id.get(); }

bool Connection::poll_events(SourceLocation where) {
  std::error_code ec;
  impl_->pump(ec);
  if (ec) fail(ec.value(), Phase::established, "reading rdma_cm and async events", where);
  impl_->settle();
  return !impl_->peer_gone && !impl_->device_removed && !impl_->failed();
}

bool Connection::wait_disconnected(milliseconds timeout, std::error_code& ec) noexcept {
  Impl& c = *impl_;
  const auto deadline = detail::deadline_after(timeout);
  const int gone_fd = Impl::wake_fd(c.gone_fd);  // made before the flags are read
  if (gone_fd < 0) {
    ec.assign(errno, std::generic_category());
    return false;
  }
  for (;;) {
    if (c.pump_cm(ec), ec) return false;
    if (c.peer_gone || c.device_removed) {
      c.settle();
      return true;
    }
    if (Clock::now() >= deadline) return false;
    std::array<pollfd, 2> fds{{{c.router->channel()->fd, POLLIN, 0}, {gone_fd, POLLIN, 0}}};
    if (::poll(fds.data(), fds.size(), std::max(1, ms_until(c.wake_by(deadline)))) < 0 && errno != EINTR) {
      ec.assign(errno, std::generic_category());
      return false;
    }
  }
}

bool Connection::wait_disconnected(milliseconds timeout, SourceLocation where) {
  std::error_code ec;
  const bool over = wait_disconnected(timeout, ec);
  if (ec) fail(ec.value(), Phase::established, "waiting for the disconnect: rdma_get_cm_event", where);
  return over;
}

void Connection::disconnect(SourceLocation where) {
  if (!impl_->established || impl_->disconnected.exchange(true)) return;
  impl_->wake_all();  // threads in wait() now fail with ENOTCONN
  impl_->to_error();
  if (rdma_disconnect(impl_->id.get()) != 0) fail(errno, Phase::established, "rdma_disconnect", where);
}

std::span<Completion> Connection::wait(const CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                       std::error_code& ec) noexcept {
  return wait_cq(cq, out, timeout, ec, false);
}

std::span<Completion> Connection::spin(const CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                       std::error_code& ec) noexcept {
  return wait_cq(cq, out, timeout, ec, true);
}

// Completions in the CQ always come first. When the connection is over, the CQ is polled once
// more (a completion can land between a poll and the event that ends the connection: the peer
// saw our ACK, then left); only then does this side disconnect, flushing what is still posted,
// and the wait fails.
std::span<Completion> Connection::wait_cq(const CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                          std::error_code& ec, bool busy) noexcept {
  Impl& c = *impl_;
  ec.clear();
  const bool spinning = busy || !cq.has_channel();
  if (!spinning && cq.shares_channel()) {  // its events are the channel's: sleeping here would take them
    ec = make_error_code(Errc::bad_argument);
    return {};
  }
  const auto deadline = detail::deadline_after(timeout);
  const auto finish = [&]() -> std::span<Completion> {
    if (auto got = cq.poll(out, ec); !got.empty() || ec) return got;
    c.settle();
    ec.assign(c.over_errno(), std::generic_category());
    return {};
  };
  c.expire();          // a spin that never pumps still sees an unconfirmed client's limit pass
  unsigned spins = 0;  // per call: a count shared by threads would be a race on the data path
  int over_fd = -1;    // poll(2) skips -1
  for (bool first = true;; first = false) {
    if (auto got = cq.poll(out, ec); !got.empty() || ec) return got;
    if (spinning) {
      // Busy polling: look at the connection now and then (a system call each time; not on
      // every empty poll, which would cost a busy-polling ping-pong one per round trip).
      if ((++spins & 1023u) == 0 || (first && c.over())) {
        if (c.pump(ec), ec) return {};
        if (c.over()) return finish();
      }
      if (Clock::now() >= deadline) return {};
      continue;
    }
    if (over_fd < 0 && (over_fd = Impl::wake_fd(c.over_fd)) < 0) {  // before over() is read and the CQ armed
      ec.assign(errno, std::generic_category());
      return {};
    }
    if (c.pump_cm(ec), ec) return {};
    if (c.over()) return finish();
    if (Clock::now() >= deadline) return {};
    if (auto got = cq.arm_and_poll(out, ec); !got.empty() || ec) return got;
    // The device's async fd: an event of this QP (or DEVICE_FATAL) ends the connection; any
    // other is kept for Device::poll_async_events by the reader (detail::AsyncHub).
    std::array<pollfd, 4> fds{{{cq.fd(), POLLIN, 0},
                               {c.router->channel()->fd, POLLIN, 0},
                               {over_fd, POLLIN, 0},
                               {c.hub->native_fd(), POLLIN, 0}}};
    if (::poll(fds.data(), fds.size(), std::max(1, ms_until(c.wake_by(deadline)))) < 0 && errno != EINTR) {
      ec.assign(errno, std::generic_category());
      return {};
    }
    if (fds[3].revents != 0 && (c.hub->pump(ec), ec)) return {};
    if (fds[0].revents != 0 && (cq.consume_events(ec), ec)) return {};
    // A readable cm channel is read at the top of the loop, after the CQ.
  }
}

std::span<Completion> Connection::wait(const CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                       SourceLocation where) {
  return wait_or_throw(cq, out, timeout, false, where);
}

std::span<Completion> Connection::spin(const CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                       SourceLocation where) {
  return wait_or_throw(cq, out, timeout, true, where);
}

std::span<Completion> Connection::wait_or_throw(const CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                                bool busy, SourceLocation where) {
  std::error_code ec;
  auto got = wait_cq(cq, out, timeout, ec, busy);
  if (ec == Errc::bad_argument)
    detail::throw_error(ec,
                        "Connection::wait: the CQ's completion channel is shared with other CQs (CqOptions::channel), "
                        "whose events it would take: wait on that CompletionChannel, or spin()",
                        where);
  if (ec) {
    const bool ended = impl_->over() && ec.value() == impl_->over_errno();
    fail(ec.value(), Phase::established, ended ? impl_->over_text() : "waiting for completions", where);
  }
  return got;
}

}  // namespace verbs::cm
