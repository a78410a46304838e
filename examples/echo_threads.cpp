// echo_threads: the echo server of echo_epoll and echo_asio the simple way, a thread per
// connection with blocking waits: what the one-thread servers are measured against
// (bench/echo-scale).
//
//   server: echo_threads [-p PORT] [-a BIND_ADDR] [-c CLIENTS] [-i IDLE_SECONDS]
//   client: echo_threads [-p PORT] [-c CONNECTIONS] [-n MESSAGES] [-s SIZE] [-w SECONDS] HOST
//
// The server's main thread blocks in Listener::accept; each connection gets a thread of its own
// that sleeps in Connection::wait_one (on the connection's completion channel and rdma_cm fd)
// until a message comes, echoes it, and posts the receive again. A client that disconnects
// ends its thread; one silent for IDLE_SECONDS (default 10) is dropped. After CLIENTS clients
// (0: never) have come and gone it prints what it did:
//   echo_threads: served 4 clients, 4000 messages (0 silent and dropped, 4 gone)
// The client is echo_epoll's (examples/echo_client.hpp).
#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <list>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "echo_client.hpp"
#include "example_args.hpp"

namespace {

constexpr const char* kName = "echo_threads";
constexpr std::size_t kSlots = 8;   // receives posted per connection
constexpr std::size_t kMax = example::kEchoMax;  // the largest message

struct Totals {
  std::atomic<std::uint64_t> messages{0}, silent{0}, gone{0};
};

/// A connection's thread, and whether it has finished (then the accepting thread joins it).
struct Worker {
  std::thread thread;
  std::atomic<bool> done{false};
};

/// One connection's thread: echo until the client goes, fails or stays silent for `idle`.
void serve_one(verbs::cm::Connection conn, std::shared_ptr<verbs::MemoryRegion> slots, std::chrono::seconds idle,
               Totals& totals, std::atomic<bool>& done) {
  const std::string peer = conn.peer_address();
  std::uint64_t echoed = 0;
  std::string over;
  try {
    for (;;) {
      const std::optional<verbs::Completion> wc = conn.wait_one(conn.recv_cq(), idle);
      if (!wc) {
        over = "silent for " + std::to_string(idle.count()) + " s: dropped";
        ++totals.silent;
        break;
      }
      wc->throw_if_failed();
      const std::uint64_t slot = wc->wr_id();
      conn.qp().post_send(slots->slice(slot * kMax, wc->byte_len()), {.wr_id = slot}).check();
      const std::optional<verbs::Completion> sent = conn.wait_one(conn.send_cq(), idle);
      if (!sent) throw std::runtime_error("an echo did not complete within " + std::to_string(idle.count()) + " s");
      sent->throw_if_failed();
      conn.qp().post_recv(slots->slice(slot * kMax, kMax), slot).check();
      ++echoed;
    }
  } catch (const std::exception& e) {
    over = conn.connected() ? std::string("a request failed: ") + e.what() : "gone";
    if (!conn.connected()) ++totals.gone;
  }
  std::printf("%s: %s: %llu echoes; %s\n", kName, peer.c_str(), static_cast<unsigned long long>(echoed), over.c_str());
  std::fflush(stdout);
  totals.messages += echoed;
  done = true;
}

void serve(const example::Args& args, std::uint64_t expected, std::chrono::seconds idle) {
  const std::string local = example::local_address(args);
  verbs::cm::Listener listener(local, args.port);
  const verbs::ProtectionDomain pd{listener.device()};
  example::print_listening(kName, local, listener.port());
  Totals totals;
  std::list<Worker> workers;
  std::uint64_t accepted = 0;
  while (expected == 0 || accepted < expected) {
    workers.remove_if([](Worker& w) {  // those that have finished (a server that runs for ever)
      if (!w.done) return false;
      w.thread.join();
      return true;
    });
    std::shared_ptr<verbs::MemoryRegion> slots;
    std::optional<verbs::cm::Connection> conn;
    try {
      slots = std::make_shared<verbs::MemoryRegion>(
          verbs::MemoryRegion::allocate(pd, kSlots * kMax, verbs::Access::local_write));
      conn.emplace(listener.accept(std::chrono::seconds(60),
                                   {.pd = &pd, .before_handshake = [&](const verbs::cm::Handshake& h) {
                                      for (std::size_t k = 0; k < kSlots; ++k)
                                        h.qp.post_recv(slots->slice(k * kMax, kMax), k).check();
                                    }}));
    } catch (const verbs::cm::ConnectError& e) {
      if (e.code() != std::errc::timed_out) std::printf("%s: a request failed: %s\n", kName, e.what());
      continue;  // no request for a minute: wait on
    } catch (const std::exception& e) {
      std::printf("%s: a request failed: %s\n", kName, e.what());
      continue;
    }
    ++accepted;
    Worker& w = workers.emplace_back();
    w.thread = std::thread(serve_one, std::move(*conn), std::move(slots), idle, std::ref(totals), std::ref(w.done));
  }
  for (Worker& w : workers) w.thread.join();
  std::printf("%s: served %llu clients, %llu messages (%llu silent and dropped, %llu gone)\n", kName,
              static_cast<unsigned long long>(accepted), static_cast<unsigned long long>(totals.messages.load()),
              static_cast<unsigned long long>(totals.silent.load()), static_cast<unsigned long long>(totals.gone.load()));
}

}  // namespace

int main(int argc, char** argv) {
  return example::run_echo_program(argc, argv, kName,
                                   "Echo server with a thread per connection and blocking waits, and its clients.",
                                   serve);
}
