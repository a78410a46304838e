#include "cm/router.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>

#include "detail.hpp"

namespace verbs::cm {
namespace internal {

std::shared_ptr<Router> Router::make(bool shared, Phase phase, SourceLocation where) {
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr) fail(errno, phase, "rdma_create_event_channel", where);
  const int fl = ::fcntl(ch->fd, F_GETFL);
  if (fl < 0 || ::fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    const int err = errno;
    rdma_destroy_event_channel(ch);
    fail(err, phase, "fcntl(O_NONBLOCK) on the rdma_cm channel", where);
  }
  try {
    return std::make_shared<Router>(ch, shared);
  } catch (...) {
    rdma_destroy_event_channel(ch);
    throw;
  }
}

Router::~Router() {
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (notify_fd_ >= 0) ::close(notify_fd_);
  rdma_destroy_event_channel(ch_);
}

int Router::loop_fd() noexcept {
  const std::lock_guard lock(mutex_);
  if (epoll_fd_ >= 0) return epoll_fd_;
  const int n = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event e{};
  e.events = EPOLLIN;
  if (n < 0 || ep < 0 || ::epoll_ctl(ep, EPOLL_CTL_ADD, ch_->fd, &e) != 0 || ::epoll_ctl(ep, EPOLL_CTL_ADD, n, &e) != 0) {
    if (n >= 0) ::close(n);
    if (ep >= 0) ::close(ep);
    return -1;
  }
  notify_fd_ = n;
  epoll_fd_ = ep;
  if (!ready_.empty()) notify();  // listed before there was an fd to say so
  return epoll_fd_;
}

std::shared_ptr<rdma_cm_id> Router::make_id(rdma_port_space ps, Phase phase, SourceLocation where) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch_, &id, nullptr, ps) != 0) fail(errno, phase, "rdma_create_id", where);
  return own(id);
}

std::shared_ptr<rdma_cm_id> Router::own(rdma_cm_id* id) {
  // No route may outlive its id, whose address a new one could take. (Should the control block
  // fail to allocate, the deleter runs.)
  return {id, [router = shared_from_this()](rdma_cm_id* i) {
            router->remove(i);
            rdma_destroy_id(i);
          }};
}

void Router::add(const rdma_cm_id* id, Route r, std::vector<Event> earlier) {
  const std::lock_guard lock(mutex_);
  Route& in = routes_.insert_or_assign(id, r).first->second;
  if (const auto it = parked_.find(id); it != parked_.end()) {
    earlier.insert(earlier.begin(), std::make_move_iterator(it->second.begin()), std::make_move_iterator(it->second.end()));
    parked_.erase(it);
  }
  for (Event& e : earlier) (void)in.deliver(in.self, std::move(e));
  if (!earlier.empty()) list(id, in, false);
}

void Router::remove(const rdma_cm_id* id) noexcept {
  const std::lock_guard lock(mutex_);
  remove_locked(id);
}

void Router::remove_locked(const rdma_cm_id* id) noexcept {
  if (const auto it = routes_.find(id); it != routes_.end()) {
    if (it->second.listed) std::erase_if(ready_, [&](const auto& r) { return r.first == id; });
    routes_.erase(it);
  }
  parked_.erase(id);
}

std::vector<Event> Router::remove_taking(const rdma_cm_id* id, Inbox& inbox) noexcept {
  const std::lock_guard lock(mutex_);
  remove_locked(id);
  std::vector<Event> out;
  out.swap(inbox.events);
  return out;
}

std::vector<Event> Router::take_parked(const rdma_cm_id* id) noexcept {
  const std::lock_guard lock(mutex_);
  std::vector<Event> out;
  if (const auto it = parked_.find(id); it != parked_.end()) out = std::move(it->second);
  remove_locked(id);
  return out;
}

void Router::pump(std::error_code& ec, const Inbox* until) noexcept {
  const std::lock_guard lock(mutex_);
  pump_locked(ec, false, until);
}

std::span<const std::uint64_t> Router::poll_keys(std::error_code& ec) noexcept {
  const std::lock_guard lock(mutex_);
  // What this call lists it returns at once: notify_fd_ is written only for what another
  // thread's pump() lists (two system calls per call saved, the common case of an event loop).
  pump_locked(ec, true);
  if (!ec) {
    handed_.clear();
    try {
      handed_.reserve(ready_.size());
    } catch (const std::bad_alloc&) {
      ec = std::make_error_code(std::errc::not_enough_memory);
    }
  }
  if (ec) {  // what was listed stays for the next call: the fd must say so
    if (!ready_.empty()) notify();
    return {};
  }
  if (notified_) {  // ready_ is taken now; a later listing writes it again
    std::uint64_t n = 0;
    (void)!::read(notify_fd_, &n, sizeof n);
    notified_ = false;
  }
  for (const auto& [id, key] : ready_) {
    handed_.push_back(key);
    if (const auto it = routes_.find(id); it != routes_.end()) it->second.listed = false;
  }
  ready_.clear();
  return handed_;
}

void Router::refuse(rdma_cm_id* id) noexcept {
  rdma_reject(id, nullptr, 0);
  rdma_destroy_id(id);
}

bool Router::park(void* self, Event&& e) noexcept {
  auto& r = *static_cast<Router*>(self);
  try {
    r.parked_[e.id].push_back(std::move(e));
  } catch (const std::bad_alloc&) {
    // Lost: the handshake of that request then ends at its deadline instead of at once.
  }
  return true;
}

void Router::list(const rdma_cm_id* id, Route& r, bool for_loop) noexcept {
  if (!shared_ || r.listed) return;  // only an EventChannel's keys are polled
  try {
    ready_.emplace_back(id, r.key);
    r.listed = true;
    if (!for_loop) notify();
  } catch (const std::bad_alloc&) {
    // Not listed: poll_keys() will not name it; its owner has the event all the same.
  }
}

void Router::notify() noexcept {
  if (notified_ || notify_fd_ < 0) return;  // no fd yet: loop_fd() writes it when made
  const std::uint64_t one = 1;
  (void)!::write(notify_fd_, &one, sizeof one);
  notified_ = true;
}

void Router::pump_locked(std::error_code& ec, bool for_loop, const Inbox* until) noexcept {
  ec.clear();
  for (;;) {
    if (until != nullptr && (!until->events.empty() || until->lost)) return;
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch_, &ev) != 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) ec.assign(errno, std::generic_category());
      return;
    }
    // A connection request is the listener's; the id it brings is new (the caller's to accept
    // or reject and destroy).
    rdma_cm_id* request = ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? ev->id : nullptr;
    const rdma_cm_id* id = request != nullptr ? ev->listen_id : ev->id;
    std::optional<Event> e;
    try {
      e.emplace(to_event(ev));
    } catch (const std::bad_alloc&) {
      ec = std::make_error_code(std::errc::not_enough_memory);
    }
    rdma_ack_cm_event(ev);  // at once: rdma_destroy_id(3) waits for its id's events
    if (!e) {
      if (request != nullptr) refuse(request);
      return;
    }
    if (request != nullptr) {
      // Its events are kept from now on, until an accept routes them (add()) or refuses it.
      try {
        routes_.insert_or_assign(request, Route{this, &Router::park});
      } catch (const std::bad_alloc&) {
        refuse(request);
        continue;
      }
    }
    const auto it = routes_.find(id);
    if (it == routes_.end() || !it->second.deliver(it->second.self, std::move(*e))) {
      // Its owner is gone, or a listener could not keep the request.
      if (request != nullptr) {
        routes_.erase(request);
        refuse(request);
      }
      continue;
    }
    // A request's parked events are nobody's news yet: add() lists its connection with them.
    if (it->second.deliver != &Router::park) list(id, it->second, for_loop);
  }
}

Inbox::~Inbox() { close_fd(); }

void Inbox::close_fd() noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

bool Inbox::keep(Event&& e) noexcept {
  bool kept = true;
  try {
    events.push_back(std::move(e));
  } catch (const std::bad_alloc&) {
    lost = true;
    kept = false;
  }
  if (fd >= 0) {
    const std::uint64_t one = 1;
    (void)!::write(fd, &one, sizeof one);
  }
  return kept;
}

std::optional<Event> Inbox::next(Router& router, Phase phase, SourceLocation where) {
  std::error_code ec;
  const auto take = [&]() -> std::optional<Event> {
    const std::lock_guard lock(router.mutex());
    if (lost) ec = std::make_error_code(std::errc::not_enough_memory);
    if (lost || events.empty()) return std::nullopt;
    Event e = std::move(events.front());
    events.erase(events.begin());
    return e;
  };
  std::optional<Event> e = take();  // handed over already (another reader read it)?
  if (!e && !ec) {
    router.pump(ec, this);
    if (!ec) e = take();
  }
  if (ec) fail(ec.value(), phase, "rdma_get_cm_event", where);
  return e;
}

bool Inbox::arm(Router& router, Phase phase, SourceLocation where) {
  const std::lock_guard lock(router.mutex());
  if (fd < 0) {
    fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) fail(errno, phase, "eventfd", where);
  }
  return events.empty() && !lost;
}

void Inbox::sleep(Router& router, Clock::time_point deadline, Phase phase, SourceLocation where) {
  sleep_on({{&router, this}}, deadline, phase, where);
}

void Inbox::sleep_on(std::initializer_list<std::pair<Router*, Inbox*>> watched, Clock::time_point deadline, Phase phase,
                     SourceLocation where) {
  std::array<pollfd, 4> fds{};
  if (watched.size() > fds.size() / 2) fail(EINVAL, phase, "Inbox::sleep_on: more than two inboxes", where);
  std::size_t n = 0;
  for (const auto& [router, inbox] : watched) {
    if (!inbox->arm(*router, phase, where)) return;  // it has news already
    fds[n++] = {router->channel()->fd, POLLIN, 0};
    fds[n++] = {inbox->fd, POLLIN, 0};
  }
  if (::poll(fds.data(), n, std::max(1, ms_until(deadline))) < 0 && errno != EINTR) fail(errno, phase, "poll", where);
  for (const auto& [router, inbox] : watched) {
    std::uint64_t count = 0;
    (void)!::read(inbox->fd, &count, sizeof count);  // what it says is in `events`, which next() reads
  }
}

}  // namespace internal

EventChannel::EventChannel(SourceLocation where) : hub_(internal::Router::make(true, Phase::connect, where)) {}
EventChannel::EventChannel(EventChannel&&) noexcept = default;
EventChannel& EventChannel::operator=(EventChannel&&) noexcept = default;
EventChannel::~EventChannel() = default;
int EventChannel::fd() const noexcept { return hub_ ? hub_->loop_fd() : -1; }
rdma_event_channel* EventChannel::native_handle() const noexcept { return hub_ ? hub_->channel() : nullptr; }

namespace internal {
std::shared_ptr<Router> ChannelAccess::router_of(const std::optional<ChannelKey>& k, Phase phase, const char* field,
                                                 SourceLocation where) {
  if (!k) return nullptr;
  std::shared_ptr<Router> r = k->channel().hub_;
  if (!r) fail(EINVAL, phase, std::string(field) + ": its EventChannel is empty (moved from)", where);
  return r;
}
}  // namespace internal

std::span<const std::uint64_t> EventChannel::poll_events(std::error_code& ec) noexcept {
  if (!hub_) {
    ec = make_error_code(Errc::empty_object);
    return {};
  }
  return hub_->poll_keys(ec);
}

std::span<const std::uint64_t> EventChannel::poll_events(SourceLocation where) {
  if (!hub_)
    detail::throw_error(make_error_code(Errc::empty_object), "EventChannel::poll_events: the EventChannel is empty (moved from)",
                        where);
  std::error_code ec;
  const auto keys = hub_->poll_keys(ec);
  if (ec) internal::fail(ec.value(), Phase::established, "EventChannel::poll_events: rdma_get_cm_event", where);
  return keys;
}

}  // namespace verbs::cm
