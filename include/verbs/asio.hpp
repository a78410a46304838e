// verbs/asio.hpp: asio integration, optional. Include it only in a program that has asio (the
// standalone library, Debian's libasio-dev, <asio.hpp>); the verbs library itself does not use
// it. Each wait is an asio initiating function taking any completion token (a callback,
// asio::use_awaitable for C++20 coroutines, asio::use_future, ...), and each honours asio's
// per-operation cancellation (a cancellation slot, e.g. `asio::experimental::awaitable_operators`
// `wait || timer`), besides cancel().
//
// In a coroutine built by g++ 12, pass options as named variables, not as temporaries inside the
// co_await expression: g++ 12 destroys such a temporary wrongly (a double free; GCC bug 100611).
//
// Deadlines: every wait takes one, as a timeout (`waiter.async_wait(buf, 2s, use_awaitable)`) or
// a time point of std::chrono::steady_clock, and completes with std::errc::timed_out when it
// passes with nothing to hand over (what came by then is handed over); the forms without one wait
// until something comes or they are cancelled: through a cancellation slot, the waiter's
// cancel(), or the waiter's end (destroyed or assigned over, it ends its wait in progress).
// Cancelled and past its deadline at once, a wait is cancelled (operation_aborted). A timeout
// longer than the clock holds is no deadline. Each step of a wait, and its deadline's expiry,
// runs in a handler on the operation's executor (a strand's, say), never in the initiation.
// async_connect is bounded by ClientOptions (timeout, resolve_timeout); async_accept's wait for a
// request by its deadline argument, and the handshake after it by ListenOptions::handshake_timeout.
// Nothing needs a timer raced by hand.
//
// Nothing here allocates per completion: a waiter holds one asio descriptor for its fd (a dup of
// it, registered with the reactor once) and one timer for its deadlines, made with it, and a wait
// that finds completions ready completes without touching the reactor (posted to the executor,
// as asio requires).
#pragma once

#include <sys/epoll.h>
#include <unistd.h>

#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/bind_executor.hpp>
#include <asio/compose.hpp>
#include <asio/error.hpp>
#include <asio/post.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>

#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include "verbs/cm.hpp"
#include "verbs/completion_channel.hpp"
#include "verbs/completion_queue.hpp"

namespace verbs::asio {

namespace net = ::asio;

/// The clock of the deadlines.
using Clock = std::chrono::steady_clock;
/// No deadline: the wait lasts until something comes or it is cancelled.
inline constexpr Clock::time_point no_deadline = Clock::time_point::max();

namespace detail {
/// A descriptor for readiness only, on a dup of `fd` (the fd stays its owner's; the dup goes
/// with the descriptor).
inline net::posix::stream_descriptor watch(const net::any_io_executor& ex, int fd) {
  const int d = ::dup(fd);
  if (d < 0) throw std::system_error(errno, std::generic_category(), "dup");
  return net::posix::stream_descriptor(ex, d);
}
/// The fd a wait sleeps on and the timer of its deadline: when the deadline passes, the timer
/// cancels the fd's wait (`expired` tells that cancellation from the caller's, `cancelled`).
/// Shared with the timer's handler through a weak_ptr, so that an expiry still queued when the
/// waiter goes, or when its wait has ended (`armed` moved on), does nothing.
struct Watch {
  explicit Watch(net::posix::stream_descriptor d) : fd(std::move(d)), timer(fd.get_executor()) {}
  net::posix::stream_descriptor fd;
  net::steady_timer timer;
  unsigned armed = 0;      // which arming is current
  bool expired = false;    // the current arming's deadline has passed
  bool cancelled = false;  // the wait in progress was asked to end (cancel(), or the waiter went)

  /// Starts the deadline of a wait (none for no_deadline); its expiry runs on `ex`, the wait's
  /// executor (a strand's, say), as the wait's own steps do.
  template <typename Executor>
  static void arm(const std::shared_ptr<Watch>& w, Clock::time_point deadline, const Executor& ex) {
    w->expired = false;
    const unsigned now = ++w->armed;
    if (deadline == no_deadline) return;
    w->timer.expires_at(deadline);
    w->timer.async_wait(net::bind_executor(ex, [weak = std::weak_ptr<Watch>(w), now](std::error_code ec) {
      if (auto p = weak.lock(); p && !ec && now == p->armed) {
        p->expired = true;
        p->fd.cancel();
      }
    }));
  }
  /// Ends the current deadline (the wait completed).
  void disarm() {
    ++armed;
    timer.cancel();
  }
  /// Ends the wait in progress, whether it sleeps on the fd or its next step is queued: it
  /// completes with operation_aborted.
  void cancel() {
    cancelled = true;
    fd.cancel();
  }
};
/// A waiter's Watch, move-only. A waiter that goes (destroyed, or assigned over) ends its wait in
/// progress, which completes with operation_aborted, and closes its fd: the operation holds the
/// Watch, and would otherwise sleep on for ever.
class WatchHandle {
 public:
  explicit WatchHandle(std::shared_ptr<Watch> w) : w_(std::move(w)) {}
  WatchHandle(WatchHandle&&) noexcept = default;
  WatchHandle& operator=(WatchHandle&& o) noexcept {
    if (this != &o) {
      end();
      w_ = std::move(o.w_);
    }
    return *this;
  }
  WatchHandle(const WatchHandle&) = delete;
  WatchHandle& operator=(const WatchHandle&) = delete;
  ~WatchHandle() { end(); }

  /// The Watch for a wait that begins; Error(Errc::empty_object) for a moved-from waiter.
  const std::shared_ptr<Watch>& begin(const char* waiter) const {
    if (!w_)
      throw Error(make_error_code(Errc::empty_object), std::string("verbs::asio::") + waiter + ": moved from");
    w_->cancelled = false;
    return w_;
  }
  /// Watch::cancel(); nothing for a moved-from waiter.
  void cancel() const {
    if (w_) w_->cancel();
  }

 private:
  void end() noexcept {
    if (!w_) return;
    std::error_code ignored;
    w_->cancelled = true;
    ++w_->armed;
    try {
      w_->timer.cancel();
    } catch (const std::system_error&) {  // (the timer's expiry is ignored anyway: `armed` moved on)
    }
    (void)w_->fd.close(ignored);
  }
  std::shared_ptr<Watch> w_;
};
/// A Watch of a dup of `fd`.
inline WatchHandle make_watch(const net::any_io_executor& ex, int fd) {
  return WatchHandle(std::make_shared<Watch>(watch(ex, fd)));
}
/// `timeout` from now as a deadline: none for a timeout past what the clock holds (compared in
/// long double, so that seconds::max() does not wrap on its way to nanoseconds).
template <typename Rep, typename Period>
Clock::time_point deadline_in(std::chrono::duration<Rep, Period> timeout) {
  using Wide = std::chrono::duration<long double, std::nano>;
  const Clock::time_point now = Clock::now();
  if (Wide(timeout) >= Wide(no_deadline - now)) return no_deadline;
  return now + std::chrono::duration_cast<Clock::duration>(timeout);
}
/// Refuses a cm object's fd() of -1: the object is on an EventChannel, whose fd is every
/// object's on it, readable for the others' news too (a wait on it would spin).
inline void require_own_fd(int fd, const char* what) {
  if (fd < 0)
    throw Error(make_error_code(Errc::bad_argument),
                std::string("verbs::asio::") + what +
                    ": the object is on an EventChannel and has no fd of its own; watch the channel's fd() and "
                    "call its poll_events(), or give it a channel of its own");
}
/// watch() of a cm object's fd(), refused on an EventChannel.
inline net::posix::stream_descriptor watch_own(const net::any_io_executor& ex, int fd, const char* what) {
  require_own_fd(fd, what);
  return watch(ex, fd);
}

/// What every wait here does, around what it reads: `try_read(self)` is called in a handler only
/// (never from inside the initiating function), first in a step posted by the initiation and
/// then each time the fd is readable, and once more when the deadline cancelled the fd's wait
/// (what came meanwhile is handed over); it returns whether it completed the wait (through
/// done() or hand_over()). A wait cancelled (its slot, cancel(), the waiter gone) reads nothing
/// more, so what a wait read is always handed over (with `wait || timer`, a wait whose result
/// would be dropped reads nothing); cancelled and past its deadline at once, it is cancelled.
template <typename Derived>
struct WaitOp {
  std::shared_ptr<Watch> w;
  Clock::time_point deadline;
  enum { start, first, sleeping } step = start;

  template <typename Self>
  void operator()(Self& self, std::error_code ec = {}) {
    if (step == start) {
      step = first;
      return net::post(w->fd.get_executor(), std::move(self));
    }
    if (step == first) {  // in a handler, on the wait's executor: the deadline starts here
      step = sleeping;
      Watch::arm(w, deadline, net::get_associated_executor(self, w->fd.get_executor()));
    }
    const bool deadline_passed = ec == net::error::operation_aborted && w->expired;
    if (ec && !deadline_passed) return done(self, ec);
    if (w->cancelled || self.get_cancellation_state().cancelled() != net::cancellation_type::none)
      return done(self, net::error::operation_aborted);
    if (static_cast<Derived&>(*this).try_read(self)) return;
    if (w->expired) return done(self, std::make_error_code(std::errc::timed_out));
    w->fd.async_wait(net::posix::descriptor_base::wait_read, std::move(self));
  }
  template <typename Self, typename... Result>
  void done(Self& self, std::error_code ec, Result&&... result) {
    w->disarm();
    if constexpr (sizeof...(Result) == 0 && Derived::counts) {
      self.complete(ec, std::size_t{0});
    } else {
      self.complete(ec, std::forward<Result>(result)...);
    }
  }
  /// Completes a counting wait with what a read gave: its n results when there are any (an
  /// error that came with them comes again at the next read), else its error; false when it
  /// gave neither (nothing yet).
  template <typename Self>
  bool hand_over(Self& self, std::error_code ec, std::size_t n) {
    if (n > 0) {
      done(self, std::error_code{}, n);
    } else if (ec) {
      done(self, ec);
    } else {
      return false;
    }
    return true;
  }
};

/// The wait of ChannelWaiter and DeviceEventWaiter: `read(out, ec)` (non-blocking) until it
/// gives something, sleeping on the fd between.
template <typename Event, typename Read>
struct ReadOp : WaitOp<ReadOp<Event, Read>> {
  static constexpr bool counts = true;
  ReadOp(std::shared_ptr<Watch> watch, Clock::time_point until, Read r, std::span<Event> o)
      : WaitOp<ReadOp>{std::move(watch), until}, read(std::move(r)), out(o) {}
  Read read;
  std::span<Event> out;
  template <typename Self>
  bool try_read(Self& self) {
    std::error_code ec;
    const std::size_t n = read(out, ec).size();
    return this->hand_over(self, ec, n);
  }
};
}  // namespace detail

/// Waits in asio for the completions of one CQ that has a completion channel of its own
/// (CqOptions::with_channel; a cm::Connection's CQs have one). Move-only; one wait at a time;
/// the CQ must outlive the waiter.
class CqWaiter {
 public:
  /// Watches `cq`'s channel fd. Throws Error(Errc::bad_argument) for a CQ without a channel of
  /// its own, std::system_error when the fd cannot be duplicated.
  CqWaiter(const net::any_io_executor& ex, const CompletionQueue& cq) : cq_(&cq), w_(open(ex, cq)) {}

  ///@{
  /// Waits until `cq` has completions and completes with void(std::error_code, std::size_t n):
  /// the first n entries of `out` are filled. Polls first: ready completions cost no system
  /// call. Errors: std::errc::timed_out when the deadline (a steady_clock time point, or a
  /// timeout from now) passes first, asio::error::operation_aborted when cancelled, or the
  /// device's error. `out` must live until completion.
  template <typename Token>
  auto async_wait(std::span<Completion> out, Token&& token) {
    return async_wait(out, no_deadline, std::forward<Token>(token));
  }
  template <typename Token>
  auto async_wait(std::span<Completion> out, Clock::time_point deadline, Token&& token) {
    const auto& w = w_.begin("CqWaiter");
    return net::async_compose<Token, void(std::error_code, std::size_t)>(Op{{w, deadline}, cq_, out}, token, w->fd);
  }
  template <typename Rep, typename Period, typename Token>
  auto async_wait(std::span<Completion> out, std::chrono::duration<Rep, Period> timeout, Token&& token) {
    return async_wait(out, detail::deadline_in(timeout), std::forward<Token>(token));
  }
  ///@}
  /// Cancels the wait in progress (it completes with operation_aborted).
  void cancel() { w_.cancel(); }
  /// The CQ waited on.
  [[nodiscard]] const CompletionQueue& cq() const noexcept { return *cq_; }

 private:
  static detail::WatchHandle open(const net::any_io_executor& ex, const CompletionQueue& cq) {
    if (!cq.has_channel() || cq.shares_channel())
      throw Error(make_error_code(Errc::bad_argument),
                  "verbs::asio::CqWaiter: the CQ needs a completion channel of its own (CqOptions::with_channel); "
                  "for a shared one use ChannelWaiter");
    return detail::make_watch(ex, cq.fd());
  }

  // Polls, then arms the CQ and polls again (a completion between the two raises an event),
  // and once the fd woke it, takes the channel's events first.
  struct Op : detail::WaitOp<Op> {
    static constexpr bool counts = true;
    const CompletionQueue* cq;
    std::span<Completion> out;
    bool woken = false;
    template <typename Self>
    bool try_read(Self& self) {
      std::error_code ec;
      if (woken) (void)cq->consume_events(ec);
      woken = true;  // the next call follows a wake-up
      std::span<Completion> got;
      if (!ec) got = cq->poll(out, ec);
      if (!ec && got.empty()) got = cq->arm_and_poll(out, ec);
      return this->hand_over(self, ec, got.size());
    }
  };

  const CompletionQueue* cq_;
  detail::WatchHandle w_;
};

/// Waits in asio for the events of a CompletionChannel shared by many CQs: one waiter for all
/// of them. Move-only; one wait at a time; the CompletionChannel object must outlive the
/// waiter, and not be moved meanwhile (the waiter reads through it).
class ChannelWaiter {
 public:
  /// Watches `channel`'s fd. Throws std::system_error when it cannot be duplicated.
  ChannelWaiter(const net::any_io_executor& ex, const CompletionChannel& channel)
      : channel_(&channel), w_(detail::make_watch(ex, channel.fd())) {}

  ///@{
  /// Waits until the channel has events and completes with void(std::error_code, std::size_t
  /// n): the first n entries of `out` say which CQs fired; handle each (drain_and_arm) before
  /// the next wait. std::errc::timed_out when the deadline passes first (as CqWaiter's).
  /// `out` must live until completion.
  template <typename Token>
  auto async_wait(std::span<CqEvent> out, Token&& token) {
    return async_wait(out, no_deadline, std::forward<Token>(token));
  }
  template <typename Token>
  auto async_wait(std::span<CqEvent> out, Clock::time_point deadline, Token&& token) {
    // get_events() of a const channel: reading does not change what the channel is.
    auto* ch = const_cast<CompletionChannel*>(channel_);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
    auto read = [ch](std::span<CqEvent> o, std::error_code& ec) { return ch->get_events(o, ec); };
    const auto& w = w_.begin("ChannelWaiter");
    return net::async_compose<Token, void(std::error_code, std::size_t)>(
        detail::ReadOp<CqEvent, decltype(read)>{w, deadline, read, out}, token, w->fd);
  }
  template <typename Rep, typename Period, typename Token>
  auto async_wait(std::span<CqEvent> out, std::chrono::duration<Rep, Period> timeout, Token&& token) {
    return async_wait(out, detail::deadline_in(timeout), std::forward<Token>(token));
  }
  ///@}
  /// Cancels the wait in progress (it completes with operation_aborted).
  void cancel() { w_.cancel(); }

 private:
  const CompletionChannel* channel_;
  detail::WatchHandle w_;
};

/// Waits in asio for a cm::Connection to end (the peer disconnected or died, the device went,
/// a fatal async event of its QP), reading its rdma_cm events and the device's async events as
/// they come (Connection::poll_events): once it has ended, its QP is in ERR and what is posted
/// flushes, so a CqWaiter on its CQs completes too. It watches the connection's rdma_cm fd and
/// the device's native async fd together (one epoll fd of its own). Move-only; the connection
/// must outlive the waiter.
class ConnectionWaiter {
 public:
  /// Throws std::system_error when the epoll fd cannot be made.
  ConnectionWaiter(const net::any_io_executor& ex, cm::Connection& conn)
      : conn_(&conn), w_(std::make_shared<detail::Watch>(open(ex, conn))) {}

  ///@{
  /// Completes with void(std::error_code) once the connection is over (no error), or with
  /// std::errc::timed_out when the deadline passes first (the connection goes on),
  /// operation_aborted when cancelled, or rdma_cm's error.
  template <typename Token>
  auto async_wait_closed(Token&& token) {
    return async_wait_closed(no_deadline, std::forward<Token>(token));
  }
  template <typename Token>
  auto async_wait_closed(Clock::time_point deadline, Token&& token) {
    const auto& w = w_.begin("ConnectionWaiter");
    return net::async_compose<Token, void(std::error_code)>(Op{{w, deadline}, conn_}, token, w->fd);
  }
  template <typename Rep, typename Period, typename Token>
  auto async_wait_closed(std::chrono::duration<Rep, Period> timeout, Token&& token) {
    return async_wait_closed(detail::deadline_in(timeout), std::forward<Token>(token));
  }
  ///@}
  /// Cancels the wait in progress.
  void cancel() { w_.cancel(); }

 private:
  static net::posix::stream_descriptor open(const net::any_io_executor& ex, cm::Connection& conn) {
    detail::require_own_fd(conn.fd(), "ConnectionWaiter");
    const int ep = ::epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
    net::posix::stream_descriptor d(ex, ep);  // owns it from here
    for (const int fd : {conn.fd(), conn.device().native_handle()->async_fd}) {
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.fd = fd;
      if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) != 0) throw std::system_error(errno, std::generic_category(), "epoll_ctl");
    }
    return d;
  }

  struct Op : detail::WaitOp<Op> {
    static constexpr bool counts = false;
    cm::Connection* conn;
    template <typename Self>
    bool try_read(Self& self) {
      try {
        if (conn->poll_events()) return false;
      } catch (const Error& e) {
        this->done(self, e.code());
        return true;
      }
      this->done(self, std::error_code{});
      return true;
    }
  };

  cm::Connection* conn_;
  detail::WatchHandle w_;
};

/// Waits in asio for a device's async events (Device::async_fd, Device::poll_async_events):
/// port up and down, SRQ limit, CQ overrun, QP and device errors. Move-only; the device must
/// outlive the waiter (its objects keep its context alive, but not the Device value).
class DeviceEventWaiter {
 public:
  /// Watches `device`'s async fd. Throws std::system_error when it cannot be duplicated.
  DeviceEventWaiter(const net::any_io_executor& ex, const Device& device)
      : device_(&device), w_(detail::make_watch(ex, device.async_fd())) {}

  ///@{
  /// Waits until events are pending and completes with void(std::error_code, std::size_t n):
  /// the first n entries of `out` (already acknowledged). std::errc::timed_out when the
  /// deadline passes first (as CqWaiter's). `out` must live until completion.
  template <typename Token>
  auto async_wait(std::span<AsyncEvent> out, Token&& token) {
    return async_wait(out, no_deadline, std::forward<Token>(token));
  }
  template <typename Token>
  auto async_wait(std::span<AsyncEvent> out, Clock::time_point deadline, Token&& token) {
    auto read = [d = device_](std::span<AsyncEvent> o, std::error_code& ec) { return d->poll_async_events(o, ec); };
    const auto& w = w_.begin("DeviceEventWaiter");
    return net::async_compose<Token, void(std::error_code, std::size_t)>(
        detail::ReadOp<AsyncEvent, decltype(read)>{w, deadline, read, out}, token, w->fd);
  }
  template <typename Rep, typename Period, typename Token>
  auto async_wait(std::span<AsyncEvent> out, std::chrono::duration<Rep, Period> timeout, Token&& token) {
    return async_wait(out, detail::deadline_in(timeout), std::forward<Token>(token));
  }
  ///@}
  /// Cancels the wait in progress (it completes with operation_aborted).
  void cancel() { w_.cancel(); }

 private:
  const Device* device_;
  detail::WatchHandle w_;
};

namespace detail {
/// Drives a PendingConnect or PendingAccept: step() when its fd is readable or its deadline
/// passes (the Watch's timer cancels the fd's wait then), until it gives the connection or fails.
template <typename Pending>
struct Stepper {
  struct State {
    State(const net::any_io_executor& ex, Pending p)
        : pending(std::move(p)),
          w(std::make_shared<Watch>(watch_own(ex, pending.fd(), "async_connect/async_accept"))) {}
    Pending pending;
    std::shared_ptr<Watch> w;
  };
  std::shared_ptr<State> s;
  std::optional<cm::Connection> done{};
  std::error_code failed{};
  enum { start, running, finishing } state = start;

  template <typename Self>
  void operator()(Self& self, std::error_code ec = {}) {
    if (state == start) {  // every step in a handler, on the operation's executor
      state = running;
      return net::post(s->w->fd.get_executor(), std::move(self));
    }
    if (state == finishing) return self.complete(failed, std::move(done));
    if (ec && ec != net::error::operation_aborted) return finish(self, ec);
    if (ec == net::error::operation_aborted && !s->w->expired) return finish(self, ec);  // the caller cancelled
    if (self.get_cancellation_state().cancelled() != net::cancellation_type::none)
      return finish(self, net::error::operation_aborted);  // cancelled while this step was queued
    std::error_code step_ec;
    if (auto c = s->pending.step(step_ec)) {
      done.emplace(std::move(*c));
      return finish(self, {});
    }
    if (step_ec) return finish(self, step_ec);
    // At the phase's deadline the timer cancels the fd's wait, and step() then fails with ETIMEDOUT.
    Watch::arm(s->w, s->pending.deadline(), net::get_associated_executor(self, s->w->fd.get_executor()));
    s->w->fd.async_wait(net::posix::descriptor_base::wait_read, std::move(self));
  }
  template <typename Self>
  void finish(Self& self, std::error_code ec) {
    failed = ec;
    s->w->disarm();
    state = finishing;
    net::post(s->w->fd.get_executor(), std::move(self));  // never from inside the initiation
  }
};
}  // namespace detail

/// cm::connect in asio: cm::start_connect, then PendingConnect::step as its fd says, every phase
/// bounded by its limit (ClientOptions). Completes with void(std::error_code,
/// std::optional<cm::Connection>): the connection, or the ConnectError's code (ECONNREFUSED,
/// ETIMEDOUT, ...), or operation_aborted when cancelled. Throws ConnectError for what fails at
/// once (see start_connect: `host` is a numeric address, since nothing here may block), and
/// Error(Errc::bad_argument) for a connection on an EventChannel (it has no fd of its own).
template <typename Token>
auto async_connect(const net::any_io_executor& ex, std::string_view host, std::uint16_t port,
                   const cm::ClientOptions& options, Token&& token) {
  if (options.connection.channel) detail::require_own_fd(-1, "async_connect");
  using S = detail::Stepper<cm::PendingConnect>;
  auto state = std::make_shared<typename S::State>(ex, cm::start_connect(host, port, options));
  return net::async_compose<Token, void(std::error_code, std::optional<cm::Connection>)>(S{state}, token, ex);
}

///@{
/// Listener::accept in asio: waits for a connection request, answers it and completes with
/// void(std::error_code, std::optional<cm::Connection>) once the client confirmed (within
/// ListenOptions::handshake_timeout), or with the error (the request is then rejected). With a
/// deadline (a steady_clock time point, or a timeout from now), std::errc::timed_out when no
/// request came by then (nothing is consumed: a request that comes later is the next accept's);
/// a request that came in time is answered within handshake_timeout. Cancellation:
/// operation_aborted. Call it again for the next client; `listener` must outlive the
/// operation. One accept at a time per listener. The options are copied, but what they point
/// at (private_data's bytes, pd, send_cq, recv_cq, qp.srq) is read when a request comes, so it
/// must live until the operation completes; before_handshake runs inside it.
template <typename Token>
auto async_accept(const net::any_io_executor& ex, cm::Listener& listener, const cm::ConnectionOptions& options,
                  Clock::time_point deadline, Token&& token);
template <typename Token>
auto async_accept(const net::any_io_executor& ex, cm::Listener& listener, const cm::ConnectionOptions& options,
                  Token&& token) {
  return async_accept(ex, listener, options, no_deadline, std::forward<Token>(token));
}
template <typename Rep, typename Period, typename Token>
auto async_accept(const net::any_io_executor& ex, cm::Listener& listener, const cm::ConnectionOptions& options,
                  std::chrono::duration<Rep, Period> timeout, Token&& token) {
  return async_accept(ex, listener, options, detail::deadline_in(timeout), std::forward<Token>(token));
}
///@}

namespace detail {
/// Waits for a request on the listener's fd (until the deadline), then hands the handshake to a
/// Stepper.
struct AcceptOp {
  cm::Listener* listener;
  cm::ConnectionOptions options;
  std::shared_ptr<Watch> w;
  Clock::time_point deadline;
  std::optional<cm::Connection> done{};
  std::error_code failed{};
  enum { starting, waiting, handshake, finishing } state = starting;
  bool armed = false;
  std::shared_ptr<typename Stepper<cm::PendingAccept>::State> hs{};

  template <typename Self>
  void operator()(Self& self, std::error_code ec = {}, std::optional<cm::Connection> c = std::nullopt) {
    if (state == finishing) return self.complete(failed, std::move(done));
    if (state == handshake) {  // the handshake's own operation completed
      done = std::move(c);
      return finish(self, ec);
    }
    if (state == starting) {  // from the initiation: every step in a handler, on the operation's executor
      state = waiting;
      return net::post(w->fd.get_executor(), std::move(self));
    }
    if (!armed) {
      armed = true;
      Watch::arm(w, deadline, net::get_associated_executor(self, w->fd.get_executor()));
    }
    // Past the deadline, a request that came meanwhile is still taken (once more below).
    if (ec && !(ec == net::error::operation_aborted && w->expired)) return finish(self, ec);
    if (self.get_cancellation_state().cancelled() != net::cancellation_type::none)
      return finish(self, net::error::operation_aborted);
    try {
      if (auto pending = listener->start_accept(options)) {
        w->disarm();
        state = handshake;
        hs = std::make_shared<typename Stepper<cm::PendingAccept>::State>(w->fd.get_executor(), std::move(*pending));
        return net::async_compose<Self, void(std::error_code, std::optional<cm::Connection>)>(
            Stepper<cm::PendingAccept>{hs}, self, w->fd.get_executor());  // moved from: the token is forwarded
      }
    } catch (const Error& e) {
      return finish(self, e.code());
    } catch (const cm::Reject&) {  // before_handshake refused the request (it was rejected)
      return finish(self, std::make_error_code(std::errc::connection_refused));
    } catch (const std::system_error& e) {
      return finish(self, e.code());
    } catch (const std::bad_alloc&) {
      return finish(self, std::make_error_code(std::errc::not_enough_memory));
    } catch (...) {  // before_handshake threw something else (the request was rejected)
      return finish(self, std::make_error_code(std::errc::connection_aborted));
    }
    if (w->expired) return finish(self, std::make_error_code(std::errc::timed_out));
    w->fd.async_wait(net::posix::descriptor_base::wait_read, std::move(self));
  }
  template <typename Self>
  void finish(Self& self, std::error_code ec) {
    failed = ec;
    w->disarm();
    state = finishing;
    net::post(w->fd.get_executor(), std::move(self));
  }
};
}  // namespace detail

template <typename Token>
auto async_accept(const net::any_io_executor& ex, cm::Listener& listener, const cm::ConnectionOptions& options,
                  Clock::time_point deadline, Token&& token) {
  // Refused before any request is answered: a connection accepted onto an EventChannel has no
  // fd of its own to step its handshake by.
  if (options.channel) detail::require_own_fd(-1, "async_accept");
  auto w = std::make_shared<detail::Watch>(detail::watch_own(ex, listener.fd(), "async_accept"));
  return net::async_compose<Token, void(std::error_code, std::optional<cm::Connection>)>(
      detail::AcceptOp{&listener, options, w, deadline}, token, ex);
}

}  // namespace verbs::asio
