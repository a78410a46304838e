// echo_asio: the echo server of echo_epoll with asio and C++20 coroutines, one per connection,
// all on one thread (needs the standalone asio, libasio-dev; the verbs library does not).
//
//   server: echo_asio [-p PORT] [-a BIND_ADDR] [-c CLIENTS] [-i IDLE_SECONDS]
//   client: echo_asio [-p PORT] [-c CONNECTIONS] [-n MESSAGES] [-s SIZE] [-w SECONDS] HOST
//
// The server accepts with verbs::asio::async_accept and gives each connection a coroutine that
// awaits, at once, its CQ (a verbs::asio::CqWaiter), its end (a ConnectionWaiter) and its idle
// limit (a timer): it echoes what comes, ends when the client leaves or dies, and drops a
// client silent for IDLE_SECONDS (default 10). After CLIENTS clients (0: never) have come and
// gone it prints what it did, with the longest stall of the loop: how late a 10 ms heartbeat
// ever woke, which is how long some step kept the thread (nothing in it may block):
//   echo_asio: served 53 clients, 10000 messages (1 silent and dropped, 1 gone); longest stall 4 ms
// The client is echo_epoll's (examples/echo_client.hpp).
#include <verbs/asio.hpp>
#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>

#include "echo_client.hpp"
#include "example_args.hpp"

namespace {

using namespace asio::experimental::awaitable_operators;
using Clock = std::chrono::steady_clock;
constexpr const char* kName = "echo_asio";
constexpr std::size_t kSlots = 8;
constexpr std::size_t kMax = example::kEchoMax;
constexpr std::uint64_t kSend = 1u << 16;

struct Stats {
  std::uint64_t accepted = 0, live = 0, messages = 0, silent = 0, gone = 0;
  Clock::duration longest_stall{};
};

/// Echoes each message from the slot it arrived in, and gives the slot a receive again once the
/// echo has left (`cq` is the connection's send and receive CQ). Returns when a request failed
/// (flushed: the connection has ended) or anything threw, saying why in `why`; `last` is when
/// the client was last heard.
asio::awaitable<void> echo(verbs::cm::Connection& conn, verbs::MemoryRegion& slots, std::uint64_t& echoed,
                           Clock::time_point& last, std::string& why) try {
  verbs::asio::CqWaiter completions(co_await asio::this_coro::executor, conn.recv_cq());
  std::array<verbs::Completion, 16> wcs;
  while (why.empty()) {
    const std::size_t n = co_await completions.async_wait(wcs, asio::use_awaitable);
    last = Clock::now();
    for (const verbs::Completion& wc : std::span(wcs).first(n)) {
      if (!wc.ok()) {
        if (why.empty()) why = "a request failed: " + wc.error_code().message();
      } else if (wc.wr_id() & kSend) {
        conn.qp().post_recv(slots.slice((wc.wr_id() & ~kSend) * kMax, kMax), wc.wr_id() & ~kSend).check();
      } else {
        conn.qp().post_send(slots.slice(wc.wr_id() * kMax, wc.byte_len()), {.wr_id = kSend | wc.wr_id()}).check();
        ++echoed;
      }
    }
  }
} catch (const std::exception& e) {
  // Returning, not throwing: `||` ends at the first branch to succeed, and would leave a
  // failure here unseen while it waited for the others.
  why = e.what();
}

/// Returns once nothing was heard from the client for `idle` since `last`. Its timer is set
/// again only when it fires, not for every message.
asio::awaitable<void> silence(const Clock::time_point& last, std::chrono::seconds idle) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  for (;;) {
    t.expires_at(last + idle);
    co_await t.async_wait(asio::use_awaitable);
    if (Clock::now() >= last + idle) co_return;
  }
}

/// One client. One race for the whole session, not one per message: the echoes, the client's
/// goodbye (or its death, which its kernel reports), and its silence; the first to complete
/// without an exception cancels the others (asio's `||` ignores a branch that throws, so echo()
/// catches its own).
asio::awaitable<void> session(verbs::cm::Connection conn, verbs::MemoryRegion slots, Stats& stats,
                              std::chrono::seconds idle) {
  const auto ex = co_await asio::this_coro::executor;
  verbs::asio::ConnectionWaiter end(ex, conn);
  std::uint64_t echoed = 0;
  std::string why;
  Clock::time_point last = Clock::now();
  const std::string peer = conn.peer_address();
  try {
    const auto got = co_await (echo(conn, slots, echoed, last, why) || end.async_wait_closed(asio::use_awaitable) ||
                               silence(last, idle));
    if (got.index() == 1) {
      why = "gone";
      ++stats.gone;
    } else if (got.index() == 2) {
      why = "silent for " + std::to_string(idle.count()) + " s: dropped";
      ++stats.silent;
    } else {  // a request failed: the connection has ended; say how, once the events tell
      // (Not forever: a client whose host died sends no goodbye.)
      const auto [ec] = co_await end.async_wait_closed(idle, asio::experimental::as_tuple(asio::use_awaitable));
      if (!ec) {
        why = "gone";
        ++stats.gone;
      }
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  std::printf("%s: %s: %llu echoes; %s\n", kName, peer.c_str(), static_cast<unsigned long long>(echoed), why.c_str());
  std::fflush(stdout);
  stats.messages += echoed;
  --stats.live;
}

asio::awaitable<void> serve(const example::Args& args, std::uint64_t expected, std::chrono::seconds idle,
                            Stats& stats) {
  const auto ex = co_await asio::this_coro::executor;
  const std::string local = example::local_address(args);
  verbs::cm::Listener listener(local, args.port);
  const verbs::Device dev = listener.device();
  const verbs::ProtectionDomain pd{dev};
  example::print_listening(kName, local, listener.port());
  while (expected == 0 || stats.accepted < expected) {
    // The connection's CQ (one for both directions, with its own channel for CqWaiter) and its
    // slots, with their receives posted before the handshake.
    verbs::CompletionQueue cq(dev, {.depth = 2 * kSlots + 4, .with_channel = true});
    std::optional<verbs::MemoryRegion> slots;
    const verbs::cm::ConnectionOptions options{
        .pd = &pd,
        .send_cq = &cq,
        .recv_cq = &cq,
        .before_handshake = [&](const verbs::cm::Handshake& h) {
          slots.emplace(verbs::MemoryRegion::allocate(h.pd, kSlots * kMax, verbs::Access::local_write));
          for (std::size_t k = 0; k < kSlots; ++k) h.qp.post_recv(slots->slice(k * kMax, kMax), k).check();
        }};
    std::optional<verbs::cm::Connection> conn;
    try {
      conn = co_await verbs::asio::async_accept(ex, listener, options, asio::use_awaitable);
    } catch (const std::exception& e) {
      std::printf("%s: a request failed: %s\n", kName, e.what());
      continue;
    }
    ++stats.accepted;
    ++stats.live;
    asio::co_spawn(ex, session(std::move(*conn), std::move(*slots), stats, idle), asio::detached);
  }
}

/// Wakes every 10 ms and notes how late it woke: a step that kept the thread shows here.
asio::awaitable<void> heartbeat(Stats& stats, const bool& done) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  while (!done) {
    const auto due = Clock::now() + std::chrono::milliseconds(10);
    t.expires_at(due);
    co_await t.async_wait(asio::use_awaitable);
    stats.longest_stall = std::max(stats.longest_stall, Clock::now() - due);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const example::EchoOptions o = example::parse_echo_args(
      argc, argv, kName, "Echo server for many clients on one thread (asio coroutines), and its clients.");
  if (!o.args.server()) return example::run_echo_clients(kName, o);
  const example::Args& args = o.args;
  const std::uint64_t clients = o.clients, idle = o.idle;

  asio::io_context io(1);
  Stats stats;
  bool accepting_done = false, done = false;
  std::exception_ptr failed;
  asio::co_spawn(io, serve(args, clients, std::chrono::seconds(idle), stats), [&](std::exception_ptr e) {
    failed = e;
    accepting_done = true;
  });
  asio::co_spawn(io, heartbeat(stats, done), asio::detached);
  while (!done) {
    io.run_one();
    done = failed != nullptr || (accepting_done && stats.live == 0);
  }
  if (failed) std::rethrow_exception(failed);
  std::printf("%s: served %llu clients, %llu messages (%llu silent and dropped, %llu gone); longest stall %lld ms\n",
              kName, static_cast<unsigned long long>(stats.accepted), static_cast<unsigned long long>(stats.messages),
              static_cast<unsigned long long>(stats.silent), static_cast<unsigned long long>(stats.gone),
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(stats.longest_stall).count()));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", kName, e.what());
  return 1;
}
