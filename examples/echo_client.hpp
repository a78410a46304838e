// What the echo examples (echo_epoll, echo_asio, echo_threads) share: their options, and their
// client: CONNECTIONS connections, one thread each, that wait QUIET seconds without sending, then,
// once all are connected, send COUNT messages of SIZE bytes one at a time and check every echo.
#pragma once

#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "example_args.hpp"

namespace example {

/// The options all three echo programs take (echo_epoll, echo_asio, echo_threads).
struct EchoOptions {
  Args args;
  std::uint64_t clients = 0;  ///< -c: the server's clients before it exits, or the client's connections
  std::uint64_t idle = 10;    ///< -i: the server drops a client silent this long (seconds)
  std::uint64_t count = 1000; ///< -n: messages per connection
  std::uint64_t size = 64;    ///< -s: bytes per message
  std::uint64_t quiet = 0;    ///< -w: seconds a client waits, silent, before sending
  std::uint64_t together = 0; ///< -b 1: the client's connections send once all are connected
};

inline constexpr std::size_t kEchoMax = 4096;  // the largest message

inline EchoOptions parse_echo_args(int argc, char** argv, const char* name, const char* what) {
  EchoOptions o;
  o.args = parse_args(argc, argv, name, what,
                      {{'c', "N", "server: clients to serve before exiting (0: never); client: connections", &o.clients, 0},
                       {'i', "SECONDS", "server: drop a client silent this long", &o.idle, 1},
                       {'n', "MESSAGES", "client: messages per connection", &o.count, 0},
                       {'s', "SIZE", "client: bytes per message, at most 4096", &o.size, 1},
                       {'w', "SECONDS", "client: wait this long, silent, before sending", &o.quiet, 0},
                       {'b', "0|1", "client: 1 = each connection sends once all are connected (to measure)", &o.together, 0}});
  if (o.together > 1) throw std::invalid_argument("-b: 0 or 1");
  if (o.size > kEchoMax) throw std::invalid_argument("-s: at most 4096");
  return o;
}

/// One connection: connect, wait `quiet`, meet the others at `start` if there is one (all
/// connected), then send and check. Returns when its messages were sent and checked: the time
/// it started sending is in `began`.
inline void run_echo_client(const EchoOptions& o, std::barrier<>* start, bool& arrived,
                            std::chrono::steady_clock::time_point& began) {
  const Args& args = o.args;
  const std::size_t size = o.size;
  verbs::cm::Connection conn =
      verbs::cm::connect(args.host, args.port, {.timeout = args.timeout, .source_address = args.bind});
  auto buf = verbs::MemoryRegion::allocate(conn.pd(), 2 * size, verbs::Access::local_write);
  const std::span<std::byte> out = buf.bytes().first(size), in = buf.bytes().subspan(size, size);
  std::this_thread::sleep_for(std::chrono::seconds(o.quiet));
  arrived = true;
  if (start != nullptr) start->arrive_and_wait();
  began = std::chrono::steady_clock::now();
  const auto wait = [&](const verbs::CompletionQueue& cq) {
    const std::optional<verbs::Completion> wc = conn.wait_one(cq, args.timeout);
    if (!wc) throw std::runtime_error("no answer within " + std::to_string(args.timeout.count()) + " s");
    wc->throw_if_failed();
    return *wc;
  };
  for (std::uint64_t i = 0; i < o.count; ++i) {
    for (std::size_t k = 0; k < size; ++k) out[k] = static_cast<std::byte>(i * 131 + k * 7 + size);
    std::memset(in.data(), 0, size);
    conn.qp().post_recv(buf.slice(size, size), i).check();  // before the send: the echo may be quick
    conn.qp().post_send(buf.slice(0, size), {.wr_id = i}).check();
    (void)wait(conn.send_cq());
    const verbs::Completion echo = wait(conn.recv_cq());
    if (echo.byte_len() != size || std::memcmp(in.data(), out.data(), size) != 0)
      throw std::runtime_error("message " + std::to_string(i) + " came back changed");
  }
}

/// The client: -c connections (at least 1), a thread each; with -b 1 they send once all are
/// connected. Prints one line when every echo was checked, and one with the rate, from the
/// first connection's first send to the last one's last echo:
///   echo_epoll: 16 connections, 1000 messages of 64 bytes each, echoed and checked
///   echo_epoll: 16000 messages in 2.514 s once all were connected: 6364 messages/s
/// ("once all were connected" with -b 1, "since the first was connected" without).
inline int run_echo_clients(const char* name, const EchoOptions& o) {
  using Clock = std::chrono::steady_clock;
  const std::uint64_t connections = o.clients == 0 ? 1 : o.clients;
  std::atomic<std::uint64_t> failed{0};
  std::barrier<> start(static_cast<std::ptrdiff_t>(connections));
  std::vector<Clock::time_point> began(connections), ended(connections);
  std::vector<std::thread> threads;
  for (std::uint64_t c = 0; c < connections; ++c)
    threads.emplace_back([&, c] {
      bool arrived = false;
      try {
        run_echo_client(o, o.together != 0 ? &start : nullptr, arrived, began[c]);
        ended[c] = Clock::now();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", name, e.what());
        ++failed;
        if (o.together != 0 && !arrived) start.arrive_and_drop();  // the others need not wait for this one
      }
    });
  for (std::thread& t : threads) t.join();
  if (failed != 0) {
    std::fprintf(stderr, "%s: %llu of %llu connections failed\n", name, static_cast<unsigned long long>(failed.load()),
                 static_cast<unsigned long long>(connections));
    return 1;
  }
  std::printf("%s: %llu connections, %llu messages of %llu bytes each, echoed and checked\n", name,
              static_cast<unsigned long long>(connections), static_cast<unsigned long long>(o.count),
              static_cast<unsigned long long>(o.size));
  if (o.count > 0) {
    const double secs =
        std::chrono::duration<double>(*std::max_element(ended.begin(), ended.end()) -
                                      *std::min_element(began.begin(), began.end())).count();
    const double total = static_cast<double>(connections * o.count);
    std::printf("%s: %.0f messages in %.3f s %s: %.0f messages/s\n", name, total, secs,
                o.together != 0 ? "once all were connected" : "since the first was connected", total / secs);
  }
  return 0;
}

/// main() of an echo program whose server is `serve(args, clients, idle)`: the options, then
/// the client or the server; errors are printed and give exit status 1.
template <typename Serve>
int run_echo_program(int argc, char** argv, const char* name, const char* what, Serve&& serve) try {
  const EchoOptions o = parse_echo_args(argc, argv, name, what);
  if (!o.args.server()) return run_echo_clients(name, o);
  serve(o.args, o.clients, std::chrono::seconds(o.idle));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", name, e.what());
  return 1;
}

}  // namespace example
