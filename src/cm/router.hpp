// The router room of verbs::cm (docs/design/cm.md): one rdma_cm event channel and the routes of
// its ids. Every id the library makes is on a Router; "a channel of its own" is a Router with one
// route, and an EventChannel is a Router the user holds. Not installed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cm/event.hpp"

namespace verbs::cm::internal {

struct Inbox;

/// The channel and who each of its events is for. Shared by the EventChannel (if any) and every
/// object on it (through their ids' deleters too).
class Router : public std::enable_shared_from_this<Router> {
 public:
  /// Called under the mutex with an event of the route's id (a connection request: of the
  /// listener's): must not block nor call into the Router. False: a connection request it could
  /// not keep, which the Router then rejects.
  using Deliver = bool (*)(void* self, Event&& e) noexcept;
  struct Route {
    void* self;
    Deliver deliver;
    std::uint64_t key = 0;
    bool listed = false;  // its key is in `ready_`
  };

  /// A new non-blocking channel; `shared`: an EventChannel's, whose objects have no fd of their
  /// own and whose keys poll_keys() returns. Throws ConnectError (EMFILE, ENODEV without rdma_cm).
  static std::shared_ptr<Router> make(bool shared, Phase phase, SourceLocation where);
  Router(rdma_event_channel* ch, bool shared) noexcept : ch_(ch), shared_(shared) {}
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;
  ~Router();

  [[nodiscard]] rdma_event_channel* channel() const noexcept { return ch_; }
  /// What an object on this channel shows an event loop: the channel's fd, or -1 on an
  /// EventChannel (whose fd, loop_fd(), is every object's).
  [[nodiscard]] int object_fd() const noexcept { return shared_ ? -1 : ch_->fd; }
  /// EventChannel::fd(): an epoll set over the channel and an eventfd written while keys wait for
  /// poll_keys() that another thread listed; made on the first call. -1 if it cannot be made.
  int loop_fd() noexcept;
  /// The mutex every read of the channel holds, and every route and inbox is guarded by.
  std::mutex& mutex() noexcept { return mutex_; }

  /// Where a connection accepted from a listener on this Router goes: `given` (its
  /// ConnectionOptions::channel's), else this one if it is an EventChannel's, else a channel of
  /// its own.
  std::shared_ptr<Router> onto(std::shared_ptr<Router> given, Phase phase, SourceLocation where) {
    if (given) return given;
    return shared_ ? shared_from_this() : make(false, phase, where);
  }
  /// Whether a listener on this Router may accept onto `given` (null: none named): one on an
  /// EventChannel accepts onto that channel only (its requests' ids are on it).
  [[nodiscard]] bool may_accept_onto(const Router* given) const noexcept {
    return !shared_ || given == nullptr || given == this;
  }
  /// A new id on this channel, in port space `ps`; its deleter removes its route first.
  std::shared_ptr<rdma_cm_id> make_id(rdma_port_space ps, Phase phase, SourceLocation where);
  /// Takes `id` (a connection request's, on this channel), with the same deleter.
  std::shared_ptr<rdma_cm_id> own(rdma_cm_id* id);
  /// Routes the events of `id` to `r`; throws std::bad_alloc. What came for a request's id
  /// since its request (parked), and `earlier` (what another Router parked for it), go to `r`
  /// first, in order.
  void add(const rdma_cm_id* id, Route r, std::vector<Event> earlier = {});
  /// Stops routing `id`: once it returns, its route is not called any more.
  void remove(const rdma_cm_id* id) noexcept;
  /// remove(), and what `inbox` kept, taken in the same critical section (nothing can be
  /// delivered to it in between).
  std::vector<Event> remove_taking(const rdma_cm_id* id, Inbox& inbox) noexcept;
  /// The events parked for a request's `id` (its route removed): for the Router it moves to.
  std::vector<Event> take_parked(const rdma_cm_id* id) noexcept;
  /// Reads every pending event and hands each to its id's route, or (with `until`) only until
  /// that inbox has one: the rest stay in the channel, whose fd stays readable for them (a
  /// loop that watches a listener's fd and takes one request per call relies on it). Sets `ec`
  /// on failure.
  void pump(std::error_code& ec, const Inbox* until = nullptr) noexcept;
  /// pump(), then the keys of the routes with news since the last call (EventChannel's).
  std::span<const std::uint64_t> poll_keys(std::error_code& ec) noexcept;
  /// Runs `call` (an rdma_cm command on one of its ids) under the mutex, which every reader
  /// holds: librdmacm writes into the id on both paths (rdma_resolve_addr copies the destination
  /// after its write(2) while rdma_get_cm_event copies the resolved address in). 0, or errno.
  template <typename Call>
  [[nodiscard]] int command(Call&& call) {
    const std::lock_guard lock(mutex_);
    return std::forward<Call>(call)() == 0 ? 0 : errno;
  }
  /// Rejects and destroys a connection request nobody keeps: the client hears at once.
  static void refuse(rdma_cm_id* id) noexcept;
  /// refuse() for a request taken off this Router, what was parked for it dropped.
  void refuse_request(rdma_cm_id* id) noexcept {
    (void)take_parked(id);
    refuse(id);
  }

 private:
  static bool park(void* self, Event&& e) noexcept;
  void remove_locked(const rdma_cm_id* id) noexcept;
  void pump_locked(std::error_code& ec, bool for_loop, const Inbox* until = nullptr) noexcept;
  void list(const rdma_cm_id* id, Route& r, bool for_loop) noexcept;
  void notify() noexcept;

  rdma_event_channel* const ch_;
  const bool shared_;
  std::mutex mutex_;
  std::unordered_map<const rdma_cm_id*, Route> routes_;
  // What came for a connection request's id before an accept took it (a REJECTED, a
  // DEVICE_REMOVAL): its route until then is park().
  std::unordered_map<const rdma_cm_id*, std::vector<Event>> parked_;
  std::vector<std::pair<const rdma_cm_id*, std::uint64_t>> ready_;  // routes with news, in order
  std::vector<std::uint64_t> handed_;                                 // what poll_keys() last returned
  int notify_fd_ = -1, epoll_fd_ = -1;
  bool notified_ = false;  // notify_fd_ was written since poll_keys() last read it
};

/// The events a Router's readers handed to one owner that reads them later (a handshake in
/// progress, a listener), under the Router's mutex. `fd` is made by an owner that will sleep
/// (a blocking connect or accept: before it sends anything to the peer), since another thread
/// may read its event off the channel; keep() writes it.
struct Inbox {
  std::vector<Event> events;
  bool lost = false;  // one could not be kept (no memory)
  int fd = -1;

  Inbox() = default;
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;
  ~Inbox();

  /// Under the mutex: closes `fd` (nobody sleeps on the inbox any more).
  void close_fd() noexcept;
  /// Under the mutex: keeps `e` (false, and `lost`, when it cannot) and wakes a sleeper.
  bool keep(Event&& e) noexcept;
  /// The next event without blocking: one kept already, else one this read of the channel hands
  /// over; empty when there is none. Throws ConnectError: the read's errno, or ENOMEM once an
  /// event was lost.
  std::optional<Event> next(Router& router, Phase phase, SourceLocation where);
  /// Before sleeping on several inboxes at once: makes `fd` (under the mutex keep() runs under)
  /// and says whether to sleep (false: something was kept already). Throws ConnectError.
  bool arm(Router& router, Phase phase, SourceLocation where);
  /// Sleeps until the channel is readable or something is kept, or `deadline`.
  void sleep(Router& router, Clock::time_point deadline, Phase phase, SourceLocation where);
  /// The same over up to two (router, inbox) pairs at once (an accept() and its handshake).
  static void sleep_on(std::initializer_list<std::pair<Router*, Inbox*>> watched, Clock::time_point deadline,
                       Phase phase, SourceLocation where);
};

/// The Router of an EventChannel (a friend of it).
struct ChannelAccess {
  static const std::shared_ptr<Router>& hub(const EventChannel& c) noexcept { return c.hub_; }
  /// The Router of an options' `channel`: null when there is none; EINVAL naming `field` when
  /// its EventChannel is empty (moved from).
  static std::shared_ptr<Router> router_of(const std::optional<ChannelKey>& k, Phase phase, const char* field,
                                           SourceLocation where);
  /// router_of(), or a channel of the object's own when there is none.
  static std::shared_ptr<Router> router_or_own(const std::optional<ChannelKey>& k, Phase phase, const char* field,
                                               SourceLocation where) {
    return k ? router_of(k, phase, field, where) : Router::make(false, phase, where);
  }
  static std::uint64_t key_of(const std::optional<ChannelKey>& k) noexcept { return k ? k->value() : 0; }
};

}  // namespace verbs::cm::internal
