// atomic_counter: many clients increment one counter in the server's memory with RDMA atomics.
//
//   server: atomic_counter [-p PORT] [-a BIND_ADDR] [-c CLIENTS]
//   client: atomic_counter [-p PORT] [-n ADDS] HOST            (run several at once)
//
// The server exposes one 8-byte, 8-aligned counter with remote atomic access to every client.
// Each client does ADDS fetch-and-adds of 1, one after the other, and checks that the old values
// it gets back are distinct and increasing (other clients' adds may fall in between). Each client
// announces its ADDS in the handshake; the server waits until all CLIENTS have come and gone, then
// checks that the counter equals the sum, without having touched it itself.
#include <poll.h>

#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <list>
#include <string>
#include <system_error>
#include <vector>

#include "example_args.hpp"

namespace {

constexpr const char* kName = "atomic_counter";

void serve(const example::Args& args, std::uint64_t expected_clients) {
  const std::string local = example::local_address(args);
  verbs::cm::Listener listener(local, args.port);
  example::print_listening(kName, local, listener.port());

  // Atomics need an 8-byte, 8-aligned target; allocate() gives page-aligned, zeroed memory.
  verbs::ProtectionDomain pd{listener.device()};
  auto counter = verbs::MemoryRegion::allocate(pd, sizeof(std::uint64_t),
                                               verbs::Access::local_write | verbs::Access::remote_atomic);
  const verbs::cm::ConnectionOptions options{.qp = {.access = verbs::Access::remote_atomic},
                                             .pd = &pd,
                                             .expose = counter.remote()};

  // Nothing to do but accept and notice departures: poll() the listener and each connection's
  // rdma_cm event channel.
  std::list<verbs::cm::Connection> conns;
  std::uint64_t accepted = 0, announced = 0;
  const int timeout_ms = static_cast<int>(std::chrono::milliseconds(args.timeout).count());
  while (accepted < expected_clients || !conns.empty()) {
    std::vector<pollfd> fds;
    if (accepted < expected_clients) fds.push_back({listener.fd(), POLLIN, 0});
    for (const verbs::cm::Connection& c : conns) fds.push_back({c.fd(), POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
    if (ready == 0) throw std::runtime_error("nothing happened for " + std::to_string(args.timeout.count()) + " s");

    if (accepted < expected_clients && fds[0].revents != 0) {
      verbs::cm::Connection& c = conns.emplace_back(listener.accept(args.timeout, options));
      std::uint64_t adds = 0;  // the client's announcement, in its first 8 bytes of private data
      std::memcpy(&adds, c.peer_private_data().data(), sizeof adds);
      announced += adds;
      ++accepted;
    }
    std::erase_if(conns, [](verbs::cm::Connection& c) { return !c.poll_events(); });  // the ones that left
  }

  // Every client has disconnected, so every atomic it sent has been executed.
  std::uint64_t value = 0;
  std::memcpy(&value, counter.data(), sizeof value);
  std::printf("%s: %llu clients announced %llu adds; counter = %llu\n", kName,
              static_cast<unsigned long long>(accepted), static_cast<unsigned long long>(announced),
              static_cast<unsigned long long>(value));
  if (value != announced) throw std::runtime_error("the counter does not match the adds announced");
}

void run_client(const example::Args& args, std::uint64_t adds) {
  // Private data is raw bytes; both ends are this program on like hosts, so host byte order will do.
  std::array<std::byte, sizeof adds> hello{};
  std::memcpy(hello.data(), &adds, sizeof adds);
  verbs::cm::Connection conn = verbs::cm::connect(
      args.host, args.port,
      {.timeout = args.timeout, .source_address = args.bind, .connection = {.private_data = hello}});
  const verbs::RemoteSlice counter = conn.remote();
  auto old = verbs::MemoryRegion::allocate(conn.pd(), sizeof(std::uint64_t), verbs::Access::local_write);

  std::uint64_t first = 0, last = 0;
  for (std::uint64_t i = 0; i < adds; ++i) {
    // The counter's old value lands in `old`; the add happens in the server's memory, atomically
    // with respect to every other client's.
    conn.qp().post_fetch_add(old.slice(), counter, 1, {.wr_id = i}).check();
    const std::optional<verbs::Completion> wc = conn.wait_one(conn.send_cq(), args.timeout);
    if (!wc) throw std::runtime_error("no completion within " + std::to_string(args.timeout.count()) + " s");
    wc->throw_if_failed();
    std::uint64_t value = 0;
    std::memcpy(&value, old.data(), sizeof value);
    if (i > 0 && value <= last)
      throw std::runtime_error("add " + std::to_string(i) + " returned " + std::to_string(value) + " after " +
                               std::to_string(last) + ": not increasing");
    if (i == 0) first = value;
    last = value;
  }
  std::printf("%s: %llu adds returned distinct, increasing values from %llu to %llu\n", kName,
              static_cast<unsigned long long>(adds), static_cast<unsigned long long>(first),
              static_cast<unsigned long long>(last));
}

}  // namespace

int main(int argc, char** argv) try {
  std::uint64_t clients = 1, adds = 1000;
  const example::Args args =
      example::parse_args(argc, argv, kName, "Clients increment one counter in the server's memory with RDMA atomics.",
                          {{'c', "CLIENTS", "server: clients to wait for", &clients, 1},
                           {'n', "ADDS", "client: fetch-and-adds of 1 to do", &adds, 1}});
  if (args.server())
    serve(args, clients);
  else
    run_client(args, adds);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", kName, e.what());
  return 1;
}
