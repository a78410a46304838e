// echo_epoll: an echo server for many clients on one thread, with epoll and no dependency.
//
//   server: echo_epoll [-p PORT] [-a BIND_ADDR] [-c CLIENTS] [-i IDLE_SECONDS]
//   client: echo_epoll [-p PORT] [-c CONNECTIONS] [-n MESSAGES] [-s SIZE] [-w SECONDS] HOST
//
// The server never blocks but in epoll_wait. Every connection's CQ is on one CompletionChannel,
// whose events say which connection fired (CqOptions::context); connection requests are taken
// with Listener::start_accept and their handshakes finished by PendingAccept::step as their
// fds say; a client that disconnects or dies is noticed on its rdma_cm fd, and one silent for
// IDLE_SECONDS (default 10) is dropped. A round of the loop takes at most kPerRound requests and
// closes at most kPerRound connections (each makes or destroys a QP, a CQ and a region): a wave of
// 50 clients arriving or leaving together is spread over rounds, between which the others'
// echoes go on. After CLIENTS clients (0: never) have come and gone it
// prints what it did, with the longest time one round of the loop took outside epoll_wait:
//   echo_epoll: served 53 clients, 10000 messages (1 silent and dropped, 1 gone); longest step 3 ms
//
// The client opens CONNECTIONS connections (default 1), one thread each, waits SECONDS (default
// 0) without sending, then sends MESSAGES messages (default 1000) of SIZE bytes (default 64, at
// most 4096) one at a time on each, and checks every echo.
#include <sys/epoll.h>

#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "echo_client.hpp"
#include "example_args.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kName = "echo_epoll";
constexpr std::size_t kSlots = 8;      // receives posted per connection
constexpr std::size_t kMax = example::kEchoMax;  // the largest message
constexpr std::uint64_t kSend = 1u << 16;  // wr_id of an echo: kSend | slot
constexpr int kPerRound = 4;  // connection requests taken, and connections closed, in one round

// ---- server ----------------------------------------------------------------------------------

struct Peer;
/// What an epoll event is about.
struct Source {
  enum Kind { listener, channel, peer } kind;
  Peer* p = nullptr;
};

/// One client: its CQ (send and receive, on the shared channel), its receive slots, and the
/// connection, first as a handshake in progress.
struct Peer {
  Source source{Source::peer, this};
  verbs::CompletionQueue cq;
  verbs::MemoryRegion slots;
  std::optional<verbs::cm::PendingAccept> pending;
  std::optional<verbs::cm::Connection> conn;  // after cq and slots: destroyed first
  Clock::time_point last = Clock::now();
  std::uint64_t echoed = 0;
  std::string over;  // why it ended, once it has

  Peer(const verbs::Device& dev, const verbs::ProtectionDomain& pd, verbs::CompletionChannel& ch)
      : cq(dev, {.depth = 2 * kSlots + 4, .channel = &ch, .context = this}),
        slots(verbs::MemoryRegion::allocate(pd, kSlots * kMax, verbs::Access::local_write)) {}

  void post_receive(std::uint64_t slot) { conn->qp().post_recv(slots.slice(slot * kMax, kMax), slot).check(); }

  /// The CQ fired (or the connection was just established): echo what came, re-post what left.
  void on_completions() {
    std::array<verbs::Completion, 16> wcs;
    std::error_code ec;
    cq.drain_and_arm(wcs, [&](std::span<verbs::Completion> batch) {
      for (const verbs::Completion& wc : batch) {
        if (!wc.ok()) {  // flushed once the client has gone: the rdma_cm fd says why
          if (over.empty()) over = "a request failed: " + wc.error_code().message();
          continue;
        }
        last = Clock::now();
        if (wc.wr_id() & kSend) {  // an echo left: its slot takes a receive again
          post_receive(wc.wr_id() & ~kSend);
        } else {
          conn->qp().post_send(slots.slice(wc.wr_id() * kMax, wc.byte_len()), {.wr_id = kSend | wc.wr_id()}).check();
          ++echoed;
        }
      }
    }, ec);
    if (ec) over = "polling failed: " + ec.message();
  }

  /// Its rdma_cm fd is readable (or its handshake's deadline passed).
  void on_cm() {
    if (pending) {
      std::error_code ec;
      if (auto c = pending->step(ec)) {
        conn.emplace(std::move(*c));
        pending.reset();
        last = Clock::now();
        on_completions();  // what came before ESTABLISHED, and the first arming
      } else if (ec) {
        over = "the handshake failed: " + ec.message();
      }
      return;
    }
    if (!conn->poll_events()) over = "gone";
  }
};

void serve(const example::Args& args, std::uint64_t expected, std::chrono::seconds idle) {
  const std::string local = example::local_address(args);
  verbs::cm::Listener listener(local, args.port);
  const verbs::Device dev = listener.device();
  const verbs::ProtectionDomain pd{dev};
  verbs::CompletionChannel channel{dev};
  example::print_listening(kName, local, listener.port());

  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  Source on_listener{Source::listener}, on_channel{Source::channel};
  const auto watch = [&](int fd, Source* s) {
    epoll_event e{EPOLLIN, {.ptr = s}};
    if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) != 0) throw std::system_error(errno, std::generic_category(), "epoll_ctl");
  };
  watch(listener.fd(), &on_listener);
  watch(channel.fd(), &on_channel);

  std::list<std::unique_ptr<Peer>> peers;
  std::unique_ptr<Peer> spare;  // made for a request that was not there yet
  std::uint64_t accepted = 0, messages = 0, silent = 0, gone = 0;
  Clock::duration longest{};
  std::array<epoll_event, 64> events;
  std::array<verbs::CqEvent, 64> cq_events;

  // Takes up to kPerRound requests; the listener's fd stays readable while more wait.
  const auto accept_some = [&] {
    for (int taken = 0; taken < kPerRound && (expected == 0 || accepted < expected); ++taken) {
      if (!spare) spare = std::make_unique<Peer>(dev, pd, channel);
      Peer& p = *spare;
      std::optional<verbs::cm::PendingAccept> pending;
      try {
        pending = listener.start_accept({.pd = &pd,
                                         .send_cq = &p.cq,
                                         .recv_cq = &p.cq,
                                         .before_handshake = [&](const verbs::cm::Handshake& h) {
                                           for (std::size_t k = 0; k < kSlots; ++k)
                                             h.qp.post_recv(p.slots.slice(k * kMax, kMax), k).check();
                                         }});
      } catch (const std::exception& e) {
        std::printf("%s: a request failed: %s\n", kName, e.what());
        spare.reset();  // its CQ may hold the failed request's flushes
        continue;
      }
      if (!pending) return;
      p.pending.emplace(std::move(*pending));
      watch(p.pending->fd(), &p.source);
      ++accepted;
      peers.push_back(std::move(spare));
    }
    // All have come: stop watching the listener (a further request would keep it readable).
    if (expected != 0 && accepted == expected) (void)::epoll_ctl(ep, EPOLL_CTL_DEL, listener.fd(), nullptr);
  };

  bool more_to_close = false;  // the last round left connections to close
  while (expected == 0 || accepted < expected || !peers.empty()) {
    // Sleep until something happens or the nearest limit: a handshake's, or a client's silence.
    auto next = Clock::now() + std::chrono::seconds(60);
    if (more_to_close) next = Clock::now();
    for (const auto& p : peers) next = std::min(next, p->pending ? p->pending->deadline() : p->last + idle);
    const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
    const int n = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()),
                               static_cast<int>(std::clamp<long long>(wait_ms, 0, 60000)));
    if (n < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "epoll_wait");
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      Source& s = *static_cast<Source*>(events[static_cast<std::size_t>(i)].data.ptr);
      if (s.kind == Source::listener) {
        accept_some();
      } else if (s.kind == Source::channel) {
        for (const verbs::CqEvent& e : channel.get_events(cq_events)) {
          Peer& p = *static_cast<Peer*>(e.context);
          if (p.conn && p.over.empty()) p.on_completions();
        }
      } else if (s.p->over.empty()) {
        s.p->on_cm();
      }
    }
    const auto now = Clock::now();
    int closed = 0;
    more_to_close = false;
    for (auto it = peers.begin(); it != peers.end();) {
      Peer& p = **it;
      if (p.over.empty() && p.pending && now >= p.pending->deadline()) p.on_cm();  // fails it
      if (p.over.empty() && p.conn && now >= p.last + idle) {
        p.over = "silent for " + std::to_string(idle.count()) + " s: dropped";
        ++silent;
      }
      if (p.over.empty()) {
        ++it;
        continue;
      }
      if (closed == kPerRound) {  // the next round closes it
        more_to_close = true;
        ++it;
        continue;
      }
      ++closed;
      if (p.over == "gone") ++gone;
      std::printf("%s: %s: %llu echoes; %s\n", kName, p.conn ? p.conn->peer_address().c_str() : "a client",
                  static_cast<unsigned long long>(p.echoed), p.over.c_str());
      std::fflush(stdout);
      messages += p.echoed;
      (void)::epoll_ctl(ep, EPOLL_CTL_DEL, p.conn ? p.conn->fd() : p.pending->fd(), nullptr);
      it = peers.erase(it);
    }
    longest = std::max(longest, Clock::now() - t0);
  }
  ::close(ep);
  std::printf("%s: served %llu clients, %llu messages (%llu silent and dropped, %llu gone); longest step %lld ms\n",
              kName, static_cast<unsigned long long>(accepted), static_cast<unsigned long long>(messages),
              static_cast<unsigned long long>(silent), static_cast<unsigned long long>(gone),
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(longest).count()));
}

}  // namespace

int main(int argc, char** argv) {
  return example::run_echo_program(argc, argv, kName,
                                   "Echo server for many clients on one thread (epoll), and its clients.",
                                   serve);
}
