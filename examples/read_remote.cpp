// read_remote: RDMA-read a buffer the server exposes, and check it byte for byte.
//
//   server: read_remote [-p PORT] [-a BIND_ADDR] [-s SIZE]
//   client: read_remote [-p PORT] [-k CHUNK] HOST
//
// The server fills SIZE bytes with a known pattern, registers them for remote read only, and
// exposes them in the handshake. The client learns the buffer's address, length and rkey from
// Connection::remote(), reads it in CHUNK-sized RDMA reads with several in flight, checks every
// byte, and then sends the server an 8-byte "done" message with the count it checked. The
// server's CPU takes no part in the reads.
#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "example_args.hpp"

namespace {

constexpr const char* kName = "read_remote";
constexpr int kInFlight = 8;  // reads outstanding at once (the connection allows up to 16)

/// The byte at offset i. It changes from one 4 KiB page to the next, so that a chunk read from
/// the wrong offset does not pass.
std::byte pattern(std::uint64_t i) { return static_cast<std::byte>(i + 7 * (i >> 12)); }

void serve(const example::Args& args, std::uint64_t size) {
  const std::string local = example::local_address(args);
  verbs::cm::Listener listener(local, args.port);
  example::print_listening(kName, local, listener.port());

  // The buffer exists before the connection, so its PD comes from the listener's device.
  verbs::ProtectionDomain pd{listener.device()};
  auto data = verbs::MemoryRegion::allocate(pd, size, verbs::Access::remote_read);  // nothing else
  for (std::uint64_t i = 0; i < size; ++i) data.data()[i] = pattern(i);
  auto done = verbs::MemoryRegion::allocate(pd, sizeof(std::uint64_t), verbs::Access::local_write);

  verbs::cm::Connection conn =
      listener.accept(args.timeout, {.qp = {.access = verbs::Access::remote_read}, .pd = &pd, .expose = data.remote()});
  conn.qp().post_recv(done.slice()).check();
  // Sleeps until the client's message, or fails when the client disconnects or the time is up.
  const std::optional<verbs::Completion> wc = conn.wait_one(conn.recv_cq(), args.timeout);
  if (!wc) throw std::runtime_error("the client sent nothing within " + std::to_string(args.timeout.count()) + " s");
  wc->throw_if_failed();
  std::uint64_t checked = 0;
  std::memcpy(&checked, done.data(), sizeof checked);
  std::printf("%s: %s read and checked %llu of %llu bytes\n", kName, conn.peer_address().c_str(),
              static_cast<unsigned long long>(checked), static_cast<unsigned long long>(size));
  if (checked != size) throw std::runtime_error("the client did not check the whole buffer");
}

void run_client(const example::Args& args, std::uint64_t chunk) {
  verbs::cm::Connection conn = verbs::cm::connect(args.host, args.port, {.timeout = args.timeout, .source_address = args.bind});
  const verbs::RemoteSlice remote = conn.remote();  // the server's buffer: its length says how much to read
  auto copy = verbs::MemoryRegion::allocate(conn.pd(), remote.length, verbs::Access::local_write);

  const auto start = std::chrono::steady_clock::now();
  const std::uint64_t chunks = (remote.length + chunk - 1) / chunk;
  std::uint64_t posted = 0, completed = 0;
  std::array<verbs::Completion, kInFlight> wcs;
  while (completed < chunks) {
    for (; posted < chunks && posted - completed < kInFlight; ++posted) {
      const std::uint64_t offset = posted * chunk, len = std::min(chunk, remote.length - offset);
      conn.qp().post_read(copy.slice(offset, len), remote.slice(offset, len), {.wr_id = posted}).check();
    }
    const auto got = conn.wait(conn.send_cq(), wcs, args.timeout);  // sleeps; watches the connection
    if (got.empty())
      throw std::runtime_error("reads did not complete within " + std::to_string(args.timeout.count()) + " s");
    for (const verbs::Completion& wc : got) wc.throw_if_failed();
    completed += got.size();
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;

  for (std::uint64_t i = 0; i < remote.length; ++i)
    if (copy.data()[i] != pattern(i))
      throw std::runtime_error("byte " + std::to_string(i) + " differs: read " +
                               std::to_string(static_cast<unsigned>(copy.data()[i])) + ", expected " +
                               std::to_string(static_cast<unsigned>(pattern(i))));

  // Tell the server we are done, and how much we checked; wait until the send completes, since
  // leaving earlier would tear the connection down under it.
  auto done = verbs::MemoryRegion::allocate(conn.pd(), sizeof(std::uint64_t));
  std::memcpy(done.data(), &remote.length, sizeof(std::uint64_t));
  conn.qp().post_send(done.slice()).check();
  const std::optional<verbs::Completion> wc = conn.wait_one(conn.send_cq(), args.timeout);
  if (!wc) throw std::runtime_error("the done message did not complete");
  wc->throw_if_failed();
  std::printf("%s: read %llu bytes in %llu reads of up to %llu bytes (%.1f MB/s): all as expected\n", kName,
              static_cast<unsigned long long>(remote.length), static_cast<unsigned long long>(chunks),
              static_cast<unsigned long long>(chunk), static_cast<double>(remote.length) / took.count() / 1e6);
}

}  // namespace

int main(int argc, char** argv) try {
  std::uint64_t size = 1 << 20, chunk = 64 << 10;
  const example::Args args = example::parse_args(
      argc, argv, kName, "RDMA-read the buffer the server exposes, and check it byte for byte.",
      {{'s', "SIZE", "server: bytes to expose", &size, 1}, {'k', "CHUNK", "client: bytes per RDMA read", &chunk, 1}});
  if (chunk > UINT32_MAX) throw std::invalid_argument("-k: at most 4 GiB - 1 per read");
  if (args.server())
    serve(args, size);
  else
    run_client(args, chunk);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", kName, e.what());
  return 1;
}
