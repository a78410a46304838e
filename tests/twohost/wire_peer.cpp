// wire_peer: traffic across the wire with every byte checked, for the cross-host fault tests.
//
//   wire_peer serve [-a ADDR] [-p PORT] [--idle SECONDS] [--clients N] [--echo-delay MS]
//   wire_peer run HOST [-p PORT] [-c CONNECTIONS] [-t SECONDS | -n ROUNDS] [transport options]
//
// The server accepts connections until --clients have come (default: forever), each served on
// its own thread: it exposes a region of its own to that client (remote read, write and atomic)
// and echoes every message the client sends, after checking its checksum. A connection that
// fails, or whose client stays silent for --idle seconds (default 10), is dropped and said so
// (for silence: how long its wait took, how long since the last message, and the wall clock);
// the server goes on accepting. --echo-delay holds each echo back (a server that takes its time to
// answer: its client spends the round waiting, probing).
//
// The client opens CONNECTIONS connections (default 1), each on its own thread, and on each
// repeats a round until -t SECONDS have passed or -n ROUNDS are done:
//   1. writes a pattern of the round's size (8 B .. 48 KiB) into the server's region,
//   2. reads it back and compares,
//   3. sends a message (sequence number, pattern, checksum) and compares the echo,
//   4. fetch-and-adds 1 to the region's counter and checks the old value is the number of adds
//      before it (a lost or twice-executed atomic shows),
// and at the end reads the counter once more. Every operation waits at most --op-timeout
// (default 30 s), so nothing hangs; while it waits for an echo, an 8-byte read probes the server
// every 200 ms (a host that vanishes fails that read within the transport's bound). Transport options: --ack-timeout N, --retry N,
// --rnr-retry N (TransportOptions); --max-size BYTES caps the round's size; with --atomics-only a
// round is step 4 alone (no message: keep it shorter than the server's --idle). Output: one line
// per connection and a summary,
//   wire_peer: 2 connections, 412 rounds (1648 operations) in 10.2 s: 0 lost, 0 wrong
// or, on the first failure of a connection,
//   wire_peer: connection 1: FAILED in round 17 (read): <error> after 2107 ms; at 1764601234567
// where the last figure is the wall clock (ms since the epoch) when the failure was seen.
// Exit status: 0 all checked, 1 a failure (or a mismatch), 64 bad usage.
#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kRegion = 64 * 1024;   // the server's region per connection: counter, then data
constexpr std::size_t kData = 64;            // where the data starts in it
constexpr std::size_t kMaxMsg = 4096;        // largest message sent (and each receive buffer)
constexpr std::size_t kRecvs = 16;           // receives the server keeps posted
constexpr std::size_t kSizes[] = {8, 1000, 4096, 16384, 49152};
constexpr auto kProbe = std::chrono::milliseconds(200);  // a client's wait for an echo between probes
std::mutex print_mutex;

template <typename... A>
void say(const char* fmt, A... a) {
  const std::lock_guard lock(print_mutex);
  std::printf(fmt, a...);
  std::fflush(stdout);
}

std::uint64_t wall_ms() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

std::uint64_t fnv(const std::byte* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<std::uint8_t>(p[i])) * 1099511628211ull;
  return h;
}

void fill(std::byte* p, std::size_t n, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = static_cast<std::byte>(x);
  }
}

struct Options {
  std::string host, addr;
  std::uint16_t port = 7480;
  int connections = 1;
  double seconds = 0;
  std::uint64_t rounds = 0;
  int idle = 10, op_timeout = 30, echo_delay = 0;
  std::uint64_t clients = 0;
  std::size_t max_size = 49152;  // --max-size: the largest round's size
  bool atomics_only = false;     // --atomics-only: each round is the fetch-and-add alone
  verbs::TransportOptions transport{};
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "wire_peer: %s\nusage: wire_peer serve [-a ADDR] [-p PORT] [--idle S] [--clients N] [--echo-delay MS]\n"
                       "       wire_peer run HOST [-p PORT] [-c N] [-t SECONDS | -n ROUNDS] [--op-timeout S]\n"
                       "                 [--ack-timeout N] [--retry N] [--rnr-retry N] [--max-size BYTES] [--atomics-only]\n",
               why.c_str());
  std::exit(64);
}

// ---- server -----------------------------------------------------------------------------------
// `region` is what the connection exposes: held until the connection is over.
void serve_one(verbs::cm::Connection conn, [[maybe_unused]] std::shared_ptr<verbs::MemoryRegion> region,
               std::shared_ptr<verbs::MemoryRegion> bufs, int idle, int echo_delay_ms) {
  const std::string peer = conn.peer_address();
  std::uint64_t echoed = 0;
  std::string why;
  // When the last message came (or the connection was accepted), to say how long the silence
  // that ended it lasted: the idle limit, measured here, apart from how long the test's own
  // steps (powering a host off) took.
  auto heard = std::chrono::steady_clock::now();
  try {
    for (;;) {
      const auto waiting = std::chrono::steady_clock::now();
      const auto wc = conn.wait_one(conn.recv_cq(), std::chrono::seconds(idle));
      if (!wc) {
        const auto now = std::chrono::steady_clock::now();
        const auto ms = [&](auto since) {
          return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - since).count());
        };
        why = "silent for " + std::to_string(idle) + " s: dropped (the wait took " + ms(waiting) + " ms, " + ms(heard) +
              " ms since the last message; at " + std::to_string(wall_ms()) + ")";
        break;
      }
      heard = std::chrono::steady_clock::now();
      wc->throw_if_failed();
      const std::size_t slot = wc->wr_id();
      const std::byte* m = bufs->bytes().data() + slot * kMaxMsg;
      const std::size_t n = wc->byte_len();
      std::uint64_t sum = 0;
      if (n < 24 || (std::memcpy(&sum, m + n - 8, 8), sum != fnv(m, n - 8))) {
        why = "a message failed its checksum";
        break;
      }
      // Echo it from the same buffer, then give the buffer back to the receive queue.
      if (echo_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(echo_delay_ms));
      conn.qp().post_send(bufs->slice(slot * kMaxMsg, n), {.wr_id = slot}).check();
      const auto sent = conn.wait_one(conn.send_cq(), std::chrono::seconds(idle));
      if (!sent) {
        why = "an echo did not complete within " + std::to_string(idle) + " s";
        break;
      }
      sent->throw_if_failed();
      conn.qp().post_recv(bufs->slice(slot * kMaxMsg, kMaxMsg), slot).check();
      ++echoed;
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  say("wire_peer: %s: %llu messages echoed; %s\n", peer.c_str(), static_cast<unsigned long long>(echoed), why.c_str());
}

int serve(const Options& o) {
  verbs::cm::Listener listener(o.addr, o.port);
  verbs::Device device = listener.device();
  verbs::ProtectionDomain pd{device};
  say("wire_peer: listening on %s:%u\n", o.addr.c_str(), static_cast<unsigned>(listener.port()));
  std::vector<std::thread> threads;
  std::uint64_t accepted = 0;
  while (o.clients == 0 || accepted < o.clients) {
    auto region = std::make_shared<verbs::MemoryRegion>(verbs::MemoryRegion::allocate(
        pd, kRegion, verbs::Access::local_write | verbs::Access::remote_read | verbs::Access::remote_write |
                         verbs::Access::remote_atomic));
    auto bufs = std::make_shared<verbs::MemoryRegion>(
        verbs::MemoryRegion::allocate(pd, kRecvs * kMaxMsg, verbs::Access::local_write));
    std::optional<verbs::cm::Connection> conn;
    try {
      conn.emplace(listener.accept(
          std::chrono::hours(24),
          {.qp = {.access = verbs::Access::remote_read | verbs::Access::remote_write | verbs::Access::remote_atomic},
           .transport = o.transport,
           .pd = &pd,
           .expose = region->remote(),
           .before_handshake = [&](const verbs::cm::Handshake& h) {
             for (std::size_t i = 0; i < kRecvs; ++i) h.qp.post_recv(bufs->slice(i * kMaxMsg, kMaxMsg), i).check();
           }}));
    } catch (const std::exception& e) {
      say("wire_peer: accept failed: %s\n", e.what());  // the next one may work
      std::this_thread::sleep_for(200ms);                 // not a hot loop on a broken listener
      continue;
    }
    ++accepted;
    say("wire_peer: connection %llu from %s\n", static_cast<unsigned long long>(accepted), conn->peer_address().c_str());
    threads.emplace_back(serve_one, std::move(*conn), region, bufs, o.idle, o.echo_delay);
  }
  for (std::thread& t : threads) t.join();
  say("wire_peer: served %llu connections\n", static_cast<unsigned long long>(accepted));
  return 0;
}

// ---- client -----------------------------------------------------------------------------------
struct Result {
  std::uint64_t rounds = 0, ops = 0;
  Clock::duration longest{};  // the slowest round: what a fault held up
  bool failed = false;
};

Result run_one(const Options& o, int k, Clock::time_point end) {
  Result r;
  const char* step = "connect";
  auto posted = Clock::now();
  const auto op_timeout = std::chrono::seconds(o.op_timeout);
  try {
    verbs::cm::Connection conn = verbs::cm::connect(
        o.host, o.port, {.timeout = 20s, .connection = {.transport = o.transport}});
    const verbs::RemoteSlice remote = conn.remote();
    auto mine = verbs::MemoryRegion::allocate(conn.pd(), 3 * kRegion, verbs::Access::local_write);
    std::byte* out = mine.bytes().data();
    std::byte* back = out + kRegion;
    std::byte* msg = out + 2 * kRegion;
    const auto done = [&](const verbs::CompletionQueue& cq) {
      const auto wc = conn.wait_one(cq, op_timeout);
      if (!wc) throw std::runtime_error("no completion within " + std::to_string(o.op_timeout) + " s");
      wc->throw_if_failed();
      ++r.ops;
      return *wc;
    };
    std::uint64_t adds = 0;
    for (std::uint64_t i = 0; o.rounds != 0 ? i < o.rounds : Clock::now() < end; ++i) {
      const auto round_start = Clock::now();
      const std::size_t size = std::min(kSizes[i % std::size(kSizes)], o.max_size);
      const std::uint64_t seed = (static_cast<std::uint64_t>(k) << 40) ^ i;
      if (!o.atomics_only) {
        step = "write";
        fill(out, size, seed);
        posted = Clock::now();
        conn.qp().post_write(mine.slice(0, size), remote.slice(kData, size)).check();
        done(conn.send_cq());
        step = "read";
        std::memset(back, 0, size);
        posted = Clock::now();
        conn.qp().post_read(mine.slice(kRegion, size), remote.slice(kData, size)).check();
        done(conn.send_cq());
        if (std::memcmp(out, back, size) != 0) throw std::runtime_error("read back other bytes than written");
        step = "send";
        const std::size_t n = std::min(size + 24, kMaxMsg);
        std::memcpy(msg, &i, 8);
        fill(msg + 8, n - 16, seed + 1);
        const std::uint64_t sum = fnv(msg, n - 8);
        std::memcpy(msg + n - 8, &sum, 8);
        std::memcpy(back, msg, n);
        conn.qp().post_recv(mine.slice(2 * kRegion + kMaxMsg, kMaxMsg), 1).check();
        posted = Clock::now();
        conn.qp().post_send(mine.slice(2 * kRegion, n)).check();
        done(conn.send_cq());
        // The send was acknowledged: until the echo comes nothing of ours is posted, and a peer
        // whose host vanishes now would never be noticed (RC retries only what is outstanding).
        // So every kProbe without the echo, an 8-byte read of the counter probes the peer: it
        // fails within the transport's bound when nobody answers (docs/connections.md, "Failure bounds").
        const auto echo_by = Clock::now() + op_timeout;
        std::optional<verbs::Completion> got;
        while (!(got = conn.wait_one(conn.recv_cq(), kProbe))) {
          if (Clock::now() >= echo_by) throw std::runtime_error("no echo within " + std::to_string(o.op_timeout) + " s");
          step = "send (probe)";
          posted = Clock::now();
          conn.qp().post_read(mine.slice(kRegion - 8, 8), remote.slice(0, 8)).check();
          done(conn.send_cq());
          step = "send";
        }
        got->throw_if_failed();
        ++r.ops;
        const verbs::Completion echo = *got;
        if (echo.byte_len() != n || std::memcmp(msg + kMaxMsg, back, n) != 0)
          throw std::runtime_error("the echo differs from the message");
      }
      step = "atomic";
      posted = Clock::now();
      conn.qp().post_fetch_add(mine.slice(kRegion, 8), remote.slice(0, 8), 1).check();
      done(conn.send_cq());
      std::uint64_t old = 0;
      std::memcpy(&old, back, 8);
      if (old != adds)
        throw std::runtime_error("fetch-and-add returned " + std::to_string(old) + ", expected " + std::to_string(adds));
      ++adds;
      ++r.rounds;
      r.longest = std::max(r.longest, Clock::now() - round_start);
    }
    step = "final read";
    posted = Clock::now();
    conn.qp().post_read(mine.slice(kRegion, 8), remote.slice(0, 8)).check();
    done(conn.send_cq());
    std::uint64_t total = 0;
    std::memcpy(&total, back, 8);
    if (total != adds) throw std::runtime_error("the counter reads " + std::to_string(total) + " after " +
                                                std::to_string(adds) + " adds");
    say("wire_peer: connection %d: %llu rounds, %llu operations, all checked\n", k,
        static_cast<unsigned long long>(r.rounds), static_cast<unsigned long long>(r.ops));
    say("wire_peer: connection %d: longest round %lld ms\n", k,
        static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(r.longest).count()));
  } catch (const std::exception& e) {
    r.failed = true;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - posted).count();
    say("wire_peer: connection %d: FAILED in round %llu (%s): %s after %lld ms; at %llu\n", k,
        static_cast<unsigned long long>(r.rounds), step, e.what(), static_cast<long long>(ms),
        static_cast<unsigned long long>(wall_ms()));
  }
  return r;
}

int run(const Options& o) {
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  if (const auto bound = verbs::failure_bound(o.transport).transport)
    say("wire_peer: a request fails within %lld ms of a silent peer; an echo awaited probes it every %lld ms\n",
        static_cast<long long>(bound->count()), static_cast<long long>(kProbe.count()));
  std::vector<Result> results(static_cast<std::size_t>(o.connections));
  std::vector<std::thread> threads;
  for (int k = 0; k < o.connections; ++k)
    threads.emplace_back([&, k] { results[static_cast<std::size_t>(k)] = run_one(o, k + 1, end); });
  for (std::thread& t : threads) t.join();
  Result all;
  int failed = 0;
  for (const Result& r : results) {
    all.rounds += r.rounds;
    all.ops += r.ops;
    failed += r.failed ? 1 : 0;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  say("wire_peer: %d connections, %llu rounds (%llu operations) in %.1f s: %s\n", o.connections,
      static_cast<unsigned long long>(all.rounds), static_cast<unsigned long long>(all.ops), secs,
      failed == 0 ? "0 lost, 0 wrong" : (std::to_string(failed) + " connections FAILED").c_str());
  return failed == 0 ? 0 : 1;
}

std::uint64_t number(const char* s, const char* what) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0') usage(std::string("bad number for ") + what + ": " + s);
  return v;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) usage("no mode (serve or run)");
  const std::string mode = argv[1];
  Options o;
  const char* addr = std::getenv("VERBS_TEST_ADDR");
  o.addr = addr != nullptr ? addr : "192.0.2.1";
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const auto val = [&]() -> const char* {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "-a") o.addr = val();
    else if (a == "-p") o.port = static_cast<std::uint16_t>(number(val(), "-p"));
    else if (a == "-c") o.connections = static_cast<int>(number(val(), "-c"));
    else if (a == "-t") o.seconds = std::atof(val());
    else if (a == "-n") o.rounds = number(val(), "-n");
    else if (a == "--idle") o.idle = static_cast<int>(number(val(), "--idle"));
    else if (a == "--op-timeout") o.op_timeout = static_cast<int>(number(val(), "--op-timeout"));
    else if (a == "--echo-delay") o.echo_delay = static_cast<int>(number(val(), "--echo-delay"));
    else if (a == "--clients") o.clients = number(val(), "--clients");
    else if (a == "--ack-timeout") o.transport.ack_timeout = static_cast<std::uint8_t>(number(val(), a.c_str()));
    else if (a == "--retry") o.transport.retry_count = static_cast<std::uint8_t>(number(val(), a.c_str()));
    else if (a == "--rnr-retry") o.transport.rnr_retry_count = static_cast<std::uint8_t>(number(val(), a.c_str()));
    else if (a == "--atomics-only") o.atomics_only = true;
    else if (a == "--max-size") {
      o.max_size = number(val(), "--max-size");
      if (o.max_size < 8 || o.max_size > 49152) usage("--max-size: 8 to 49152");
    }
    else if (a[0] != '-' && mode == "run" && o.host.empty()) o.host = a;
    else usage("unknown argument " + a);
  }
  if (mode == "serve") return serve(o);
  if (mode != "run") usage("unknown mode " + mode);
  if (o.host.empty()) usage("run needs the server's HOST");
  if (o.seconds <= 0 && o.rounds == 0) o.rounds = 100;
  return run(o);
} catch (const std::exception& e) {
  std::fprintf(stderr, "wire_peer: %s\n", e.what());
  return 1;
}
