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
// Timeouts: async_connect and async_accept keep the limits of their options; for the waits, race
// a timer (`co_await (waiter.async_wait(buf, use_awaitable) || timer.async_wait(use_awaitable))`
// cancels the loser through its slot), or call cancel() from a timer's handler.
//
// Nothing here allocates per completion: a waiter holds one asio descriptor for its fd (a dup of
// it, registered with the reactor once), and a wait that finds completions ready completes
// without touching the reactor (posted to the executor, as asio requires).
#pragma once

#include <sys/epoll.h>
#include <unistd.h>

#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
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

namespace detail {
/// A descriptor for readiness only, on a dup of `fd` (the fd stays its owner's; the dup goes
/// with the descriptor).
inline net::posix::stream_descriptor watch(const net::any_io_executor& ex, int fd) {
  const int d = ::dup(fd);
  if (d < 0) throw std::system_error(errno, std::generic_category(), "dup");
  return net::posix::stream_descriptor(ex, d);
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
/// The wait of ChannelWaiter and DeviceEventWaiter: `read(out, ec)` (non-blocking) until it
/// gives something, sleeping on `fd` between. As CqWaiter's, it reads only in a handler, and
/// never once cancelled, so what it read is always handed over.
template <typename Event, typename Read>
struct ReadOp {
  net::posix::stream_descriptor* fd;
  Read read;
  std::span<Event> out;
  bool started = false;
  template <typename Self>
  void operator()(Self& self, std::error_code ec = {}) {
    if (!started) {  // never complete from inside the initiating function
      started = true;
      return net::post(fd->get_executor(), std::move(self));
    }
    if (ec) return self.complete(ec, 0);
    if (self.get_cancellation_state().cancelled() != net::cancellation_type::none)
      return self.complete(net::error::operation_aborted, 0);
    const std::span<Event> got = read(out, ec);
    if (ec) return self.complete(ec, 0);
    if (!got.empty()) return self.complete(std::error_code{}, got.size());
    fd->async_wait(net::posix::descriptor_base::wait_read, std::move(self));
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
  CqWaiter(const net::any_io_executor& ex, const CompletionQueue& cq) : cq_(&cq), fd_(open(ex, cq)) {}

  /// Waits until `cq` has completions and completes with void(std::error_code, std::size_t n):
  /// the first n entries of `out` are filled. Polls first: ready completions cost no system
  /// call. Errors: asio::error::operation_aborted when cancelled, or the device's error. `out`
  /// must live until completion.
  template <typename Token>
  auto async_wait(std::span<Completion> out, Token&& token) {
    return net::async_compose<Token, void(std::error_code, std::size_t)>(Op{this, out}, token, fd_);
  }
  /// Cancels the wait in progress (it completes with operation_aborted).
  void cancel() { fd_.cancel(); }
  /// The CQ waited on.
  [[nodiscard]] const CompletionQueue& cq() const noexcept { return *cq_; }

 private:
  static net::posix::stream_descriptor open(const net::any_io_executor& ex, const CompletionQueue& cq) {
    if (!cq.has_channel() || cq.shares_channel())
      throw Error(make_error_code(Errc::bad_argument),
                  "verbs::asio::CqWaiter: the CQ needs a completion channel of its own (CqOptions::with_channel); "
                  "for a shared one use ChannelWaiter");
    return detail::watch(ex, cq.fd());
  }

  // Reads the CQ only in a handler, and only when not cancelled: what an operation read is
  // always handed over (with `wait || timer`, a wait whose result would be dropped reads nothing).
  struct Op {
    CqWaiter* w;
    std::span<Completion> out;
    enum { start, check, woken } state = start;
    template <typename Self>
    void operator()(Self& self, std::error_code ec = {}) {
      if (state == start) {  // never complete from inside the initiating function
        state = check;
        return net::post(w->fd_.get_executor(), std::move(self));
      }
      if (ec) return self.complete(ec, 0);
      if (self.get_cancellation_state().cancelled() != net::cancellation_type::none)
        return self.complete(net::error::operation_aborted, 0);
      if (state == woken) {
        (void)w->cq_->consume_events(ec);
        if (ec) return self.complete(ec, 0);
      }
      std::span<Completion> got = w->cq_->poll(out, ec);
      if (!ec && got.empty()) got = w->cq_->arm_and_poll(out, ec);
      if (ec) return self.complete(ec, 0);
      if (!got.empty()) return self.complete(std::error_code{}, got.size());
      state = woken;
      w->fd_.async_wait(net::posix::descriptor_base::wait_read, std::move(self));
    }
  };

  const CompletionQueue* cq_;
  net::posix::stream_descriptor fd_;
};

/// Waits in asio for the events of a CompletionChannel shared by many CQs: one waiter for all
/// of them. Move-only; one wait at a time; the CompletionChannel object must outlive the
/// waiter, and not be moved meanwhile (the waiter reads through it).
class ChannelWaiter {
 public:
  /// Watches `channel`'s fd. Throws std::system_error when it cannot be duplicated.
  ChannelWaiter(const net::any_io_executor& ex, const CompletionChannel& channel)
      : channel_(&channel), fd_(detail::watch(ex, channel.fd())) {}

  /// Waits until the channel has events and completes with void(std::error_code, std::size_t
  /// n): the first n entries of `out` say which CQs fired; handle each (drain_and_arm) before
  /// the next wait. `out` must live until completion.
  template <typename Token>
  auto async_wait(std::span<CqEvent> out, Token&& token) {
    // get_events() of a const channel: reading does not change what the channel is.
    auto* ch = const_cast<CompletionChannel*>(channel_);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
    auto read = [ch](std::span<CqEvent> o, std::error_code& ec) { return ch->get_events(o, ec); };
    return net::async_compose<Token, void(std::error_code, std::size_t)>(
        detail::ReadOp<CqEvent, decltype(read)>{&fd_, read, out}, token, fd_);
  }
  /// Cancels the wait in progress (it completes with operation_aborted).
  void cancel() { fd_.cancel(); }

 private:
  const CompletionChannel* channel_;
  net::posix::stream_descriptor fd_;
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
  ConnectionWaiter(const net::any_io_executor& ex, cm::Connection& conn) : conn_(&conn), fd_(open(ex, conn)) {}

  /// Completes with void(std::error_code) once the connection is over (no error), or with
  /// operation_aborted when cancelled, or rdma_cm's error.
  template <typename Token>
  auto async_wait_closed(Token&& token) {
    return net::async_compose<Token, void(std::error_code)>(Op{this}, token, fd_);
  }
  /// Cancels the wait in progress.
  void cancel() { fd_.cancel(); }

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

  struct Op {
    ConnectionWaiter* w;
    bool started = false;
    template <typename Self>
    void operator()(Self& self, std::error_code ec = {}) {
      if (!started) {  // never complete from inside the initiating function
        started = true;
        return net::post(w->fd_.get_executor(), std::move(self));
      }
      if (ec) return self.complete(ec);
      if (self.get_cancellation_state().cancelled() != net::cancellation_type::none)
        return self.complete(net::error::operation_aborted);
      try {
        if (!w->conn_->poll_events()) return self.complete(std::error_code{});
      } catch (const Error& e) {
        return self.complete(e.code());
      }
      w->fd_.async_wait(net::posix::descriptor_base::wait_read, std::move(self));
    }
  };

  cm::Connection* conn_;
  net::posix::stream_descriptor fd_;
};

/// Waits in asio for a device's async events (Device::async_fd, Device::poll_async_events):
/// port up and down, SRQ limit, CQ overrun, QP and device errors. Move-only; the device must
/// outlive the waiter (its objects keep its context alive, but not the Device value).
class DeviceEventWaiter {
 public:
  /// Watches `device`'s async fd. Throws std::system_error when it cannot be duplicated.
  DeviceEventWaiter(const net::any_io_executor& ex, const Device& device)
      : device_(&device), fd_(detail::watch(ex, device.async_fd())) {}

  /// Waits until events are pending and completes with void(std::error_code, std::size_t n):
  /// the first n entries of `out` (already acknowledged). `out` must live until completion.
  template <typename Token>
  auto async_wait(std::span<AsyncEvent> out, Token&& token) {
    auto read = [d = device_](std::span<AsyncEvent> o, std::error_code& ec) { return d->poll_async_events(o, ec); };
    return net::async_compose<Token, void(std::error_code, std::size_t)>(
        detail::ReadOp<AsyncEvent, decltype(read)>{&fd_, read, out}, token, fd_);
  }
  /// Cancels the wait in progress (it completes with operation_aborted).
  void cancel() { fd_.cancel(); }

 private:
  const Device* device_;
  net::posix::stream_descriptor fd_;
};

namespace detail {
/// Drives a PendingConnect or PendingAccept: step() when its fd is readable or its deadline
/// passes (a timer cancels the fd's wait then), until it gives the connection or fails.
template <typename Pending>
struct Stepper {
  struct State {
    State(const net::any_io_executor& ex, Pending p)
        : pending(std::move(p)), fd(watch_own(ex, pending.fd(), "async_connect/async_accept")), timer(ex) {}
    Pending pending;
    net::posix::stream_descriptor fd;
    net::steady_timer timer;
    unsigned armed = 0;      // which arming of the timer is current (a stale expiry is ignored)
    bool expired = false;    // the current arming cancelled the fd's wait
  };
  std::shared_ptr<State> s;
  std::optional<cm::Connection> done{};
  std::error_code failed{};
  enum { running, finishing } state = running;

  template <typename Self>
  void operator()(Self& self, std::error_code ec = {}) {
    if (state == finishing) return self.complete(failed, std::move(done));
    if (ec && ec != net::error::operation_aborted) return finish(self, ec);
    if (ec == net::error::operation_aborted && !s->expired) return finish(self, ec);  // the caller cancelled
    s->expired = false;
    std::error_code step_ec;
    if (auto c = s->pending.step(step_ec)) {
      done.emplace(std::move(*c));
      return finish(self, {});
    }
    if (step_ec) return finish(self, step_ec);
    // At the deadline the timer cancels the fd's wait, and step() then fails with ETIMEDOUT.
    s->timer.expires_at(s->pending.deadline());
    s->timer.async_wait([st = std::weak_ptr<State>(s), armed = ++s->armed](std::error_code tec) {
      if (auto p = st.lock(); p && !tec && armed == p->armed) {
        p->expired = true;
        p->fd.cancel();
      }
    });
    s->fd.async_wait(net::posix::descriptor_base::wait_read, std::move(self));
  }
  template <typename Self>
  void finish(Self& self, std::error_code ec) {
    failed = ec;
    s->timer.cancel();
    state = finishing;
    net::post(s->fd.get_executor(), std::move(self));  // never from inside the initiation
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

/// Listener::accept in asio: waits for a connection request, answers it and completes with
/// void(std::error_code, std::optional<cm::Connection>) once the client confirmed (within
/// ListenOptions::handshake_timeout), or with the error (the request is then rejected).
/// Cancellation: operation_aborted. Call it again for the next client; `listener` must outlive
/// the operation. One accept at a time per listener. The options are copied, but what they
/// point at (private_data's bytes, pd, send_cq, recv_cq, qp.srq) is read when a request comes,
/// so it must live until the operation completes; before_handshake runs inside it.
template <typename Token>
auto async_accept(const net::any_io_executor& ex, cm::Listener& listener, const cm::ConnectionOptions& options,
                  Token&& token);

namespace detail {
struct AcceptOp {
  cm::Listener* listener;
  cm::ConnectionOptions options;
  std::shared_ptr<net::posix::stream_descriptor> fd;
  std::optional<cm::Connection> done{};
  std::error_code failed{};
  enum { waiting, handshake, finishing } state = waiting;
  std::shared_ptr<typename Stepper<cm::PendingAccept>::State> hs{};

  template <typename Self>
  void operator()(Self& self, std::error_code ec = {}, std::optional<cm::Connection> c = std::nullopt) {
    if (state == finishing) return self.complete(failed, std::move(done));
    if (state == handshake) {  // the handshake's own operation completed
      done = std::move(c);
      return finish(self, ec);
    }
    if (ec) return finish(self, ec);
    try {
      if (auto pending = listener->start_accept(options)) {
        state = handshake;
        hs = std::make_shared<typename Stepper<cm::PendingAccept>::State>(fd->get_executor(), std::move(*pending));
        return net::async_compose<Self, void(std::error_code, std::optional<cm::Connection>)>(
            Stepper<cm::PendingAccept>{hs}, self, fd->get_executor());  // moved from: the token is forwarded
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
    fd->async_wait(net::posix::descriptor_base::wait_read, std::move(self));
  }
  template <typename Self>
  void finish(Self& self, std::error_code ec) {
    failed = ec;
    state = finishing;
    net::post(fd->get_executor(), std::move(self));
  }
};
}  // namespace detail

template <typename Token>
auto async_accept(const net::any_io_executor& ex, cm::Listener& listener, const cm::ConnectionOptions& options,
                  Token&& token) {
  // Refused before any request is answered: a connection accepted onto an EventChannel has no
  // fd of its own to step its handshake by.
  if (options.channel) detail::require_own_fd(-1, "async_accept");
  auto fd = std::make_shared<net::posix::stream_descriptor>(detail::watch_own(ex, listener.fd(), "async_accept"));
  return net::async_compose<Token, void(std::error_code, std::optional<cm::Connection>)>(
      detail::AcceptOp{&listener, options, fd}, token, ex);
}

}  // namespace verbs::asio
