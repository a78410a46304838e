// write_pingpong: RDMA write-with-immediate ping-pong, and its latency.
//
//   server: write_pingpong [-p PORT] [-a BIND_ADDR] [-n ITERS] [-s SIZE]
//   client: write_pingpong [-p PORT] [-n ITERS] [-s SIZE] HOST
//
// Each side exposes a buffer in the connection handshake (ConnectionOptions::expose) and learns
// the other's (Connection::remote()). Message i is an RDMA write into the peer's buffer carrying
// immediate value i: the immediate consumes a receive on the peer (one with no buffer, since the
// data itself lands by RDMA) and so wakes it. The client writes, the server writes back, and the
// client times each round trip. Both sides check the immediate and the last byte of every message.
// The minimum and average are over every round trip; the median and p99 over every round trip
// up to a million, and beyond that over every k-th (k = ITERS / 1000000, rounded up), so that a
// long run keeps at most 8 MB of samples (-n 100000000 took 800 MB, which a 1 GB guest spent
// over 30 s paging in before the first write).
#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "example_args.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kName = "write_pingpong";
constexpr int kReceives = 16;  // receives kept posted for the peer's immediates
constexpr std::uint32_t kMaxSamples = 1'000'000;  // round trips kept for the median and p99

/// One side of the ping-pong.
class PingPong {
 public:
  PingPong(verbs::cm::Connection& conn, const verbs::MemoryRegion& in, const verbs::MemoryRegion& out,
           std::size_t size, std::chrono::seconds timeout)
      : conn_(conn), peer_(conn.remote()), in_(in), out_(out), size_(size), timeout_(timeout) {
    for (int k = 0; k < kReceives; ++k) post_receive();
  }

  /// Writes message `i` into the peer's buffer, with immediate `i` and `i` in its last byte.
  void send(std::uint32_t i) {
    out_.data()[size_ - 1] = static_cast<std::byte>(i);
    conn_.qp().post_write_imm(out_.slice(0, size_), peer_, i, {.wr_id = i}).check();
  }

  /// Waits for message `i` and checks it. The first wait sleeps on the completion channel; the
  /// others busy-poll, which saves the wake-up of a sleeping thread on every message. Both
  /// watch the connection, so a peer that gives up or dies reads as "the peer disconnected"
  /// within milliseconds, not as a flushed or timed-out request seconds later.
  void receive(std::uint32_t i, bool first = false) {
    const verbs::Completion wc = first ? wait(conn_.recv_cq()) : spin(conn_.recv_cq());
    if (wc.imm_data() != i) throw std::runtime_error("expected message " + std::to_string(i) + ", got another");
    // The data of a write with immediate is in place once its receive completes.
    if (in_.data()[size_ - 1] != static_cast<std::byte>(i))
      throw std::runtime_error("message " + std::to_string(i) + ": wrong last byte");
    post_receive();  // replaces the one this message consumed
  }

  /// Collects the completion of our write `i`: a signaled write holds a send-queue slot until
  /// it is polled. Once the peer has answered, it is there.
  void sent(std::uint32_t i) {
    if (spin(conn_.send_cq()).wr_id() != i) throw std::runtime_error("write completions out of order");
  }

 private:
  void post_receive() { conn_.qp().post_recv(std::span<const verbs::LocalSlice>{}).check(); }

  verbs::Completion wait(const verbs::CompletionQueue& cq) {
    const std::optional<verbs::Completion> wc = conn_.wait_one(cq, timeout_);
    if (!wc) throw std::runtime_error("the peer did not answer within " + std::to_string(timeout_.count()) + " s");
    wc->throw_if_failed();
    return *wc;
  }
  /// Busy-polls `cq`, and looks at the connection every 1024 empty polls (Connection::spin):
  /// polling the CQ alone would leave a dead peer unnoticed until the transport gives up.
  verbs::Completion spin(const verbs::CompletionQueue& cq) {
    const std::optional<verbs::Completion> wc = conn_.spin_one(cq, timeout_);
    if (!wc) throw std::runtime_error("the peer did not answer within " + std::to_string(timeout_.count()) + " s");
    wc->throw_if_failed();
    return *wc;
  }

  verbs::cm::Connection& conn_;
  verbs::RemoteSlice peer_;
  const verbs::MemoryRegion& in_;
  const verbs::MemoryRegion& out_;
  std::size_t size_;
  std::chrono::seconds timeout_;
};

}  // namespace

int main(int argc, char** argv) try {
  std::uint64_t iters = 1000, size = 8;
  const example::Args args = example::parse_args(
      argc, argv, kName, "RDMA write-with-immediate ping-pong; the client prints the latency (half round trip).",
      {{'n', "ITERS", "round trips", &iters, 1}, {'s', "SIZE", "bytes per message", &size, 1}});
  if (iters >= UINT32_MAX) throw std::invalid_argument("-n: the immediate value counts to 2^32 - 1");

  // The buffer the peer writes into is exposed in the handshake, so it exists before the
  // connection: its PD comes from the device of our address (the connection then uses that PD).
  const std::string local = example::local_address(args);
  verbs::ProtectionDomain pd{verbs::cm::device_for(local)};
  auto in = verbs::MemoryRegion::allocate(pd, size, verbs::Access::local_write | verbs::Access::remote_write);
  auto out = verbs::MemoryRegion::allocate(pd, size);  // written from: needs no access right

  // Both sides send their parameters as private data, and each checks that the other's agree.
  const std::string params = "iters " + std::to_string(iters) + " size " + std::to_string(size);
  const verbs::cm::ConnectionOptions options{.qp = {.access = verbs::Access::remote_write},
                                             .pd = &pd,
                                             .private_data = std::as_bytes(std::span(params)),
                                             .expose = in.remote()};
  std::optional<verbs::cm::Listener> listener;
  if (args.server()) {
    listener.emplace(local, args.port);
    example::print_listening(kName, local, listener->port());
  }
  verbs::cm::Connection conn =
      args.server() ? listener->accept(args.timeout, options)
                    : verbs::cm::connect(args.host, args.port,
                                         {.timeout = args.timeout, .source_address = local, .connection = options});
  const auto peer_data = conn.peer_private_data();  // zero-padded to the field's size
  const std::string theirs(reinterpret_cast<const char*>(peer_data.data()),
                           ::strnlen(reinterpret_cast<const char*>(peer_data.data()), peer_data.size()));
  if (theirs != params)
    throw std::runtime_error("the peer runs with '" + theirs + "', we with '" + params +
                             "': give both the same -n and -s");

  PingPong side(conn, in, out, size, args.timeout);
  const auto n = static_cast<std::uint32_t>(iters);
  if (args.server()) {
    side.send(0);  // message 0 says "my receives are posted": the client starts only then
    for (std::uint32_t i = 1; i <= n; ++i) {
      side.receive(i, i == 1);
      side.sent(i - 1);
      side.send(i);
    }
    side.sent(n);
    std::printf("%s: answered %u messages of %llu bytes from %s\n", kName, n, static_cast<unsigned long long>(size),
                conn.peer_address().c_str());
    return 0;
  }

  side.receive(0, true);
  // 1 up to a million round trips; in 64 bits, as n + kMaxSamples - 1 overflows 32 near -n 2^32.
  const auto stride = static_cast<std::uint32_t>((std::uint64_t{n} + kMaxSamples - 1) / kMaxSamples);
  std::vector<double> half_rtt_us;
  half_rtt_us.reserve(n / stride + 1);
  double sum = 0, min = 0;
  for (std::uint32_t i = 1; i <= n; ++i) {
    const auto t0 = Clock::now();
    side.send(i);
    side.receive(i);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2;
    sum += us;
    min = i == 1 ? us : std::min(min, us);
    if (i % stride == 0) half_rtt_us.push_back(us);
    side.sent(i);
  }
  std::sort(half_rtt_us.begin(), half_rtt_us.end());
  const std::size_t kept = half_rtt_us.size();
  const double p99 = half_rtt_us[(kept * 99 + 99) / 100 - 1];  // the ceil(0.99 k)-th smallest
  std::printf("%s: %u iterations of %llu bytes: latency median %.1f us, p99 %.1f us, min %.1f us, avg %.1f us "
              "(half round trip)\n",
              kName, n, static_cast<unsigned long long>(size), half_rtt_us[kept / 2], p99, min, sum / n);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", kName, e.what());
  return 1;
}
