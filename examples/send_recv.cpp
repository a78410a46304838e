// send_recv: an echo server for several clients at once, with send and receive, in one thread.
//
//   server: send_recv [-p PORT] [-a BIND_ADDR] [-c CLIENTS]
//   client: send_recv [-p PORT] [-n MESSAGES] [-s SIZE] HOST
//
// The server accepts CLIENTS connections and echoes every message back on the connection it
// came from. It keeps no thread per connection: one poll() watches the listener, and each
// connection's two completion channels and rdma_cm event channel. The client tells the server
// its message size in the handshake (private data), sends its messages one by one, and checks
// that each comes back unchanged. The server posts its receives, sized from the request, before
// it accepts (before_handshake), so the client's first message never finds the queue empty.
#include <poll.h>

#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <list>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "example_args.hpp"

namespace {

constexpr const char* kName = "send_recv";
constexpr std::size_t kSlots = 16;  // receives the server keeps posted on each connection

/// Polls `cq` until it is empty, calling `handle` on each completion.
template <typename F>
void drain(const verbs::CompletionQueue& cq, F&& handle) {
  std::array<verbs::Completion, 16> wcs;
  for (auto got = cq.poll(wcs); !got.empty(); got = cq.poll(wcs))
    for (const verbs::Completion& wc : got) handle(wc);
}

/// One client of the server: its connection and the slots its messages arrive in. A message is
/// echoed from its own slot, and the slot takes a receive again once that send has completed.
struct Client {
  verbs::cm::Connection conn;
  std::size_t size;
  verbs::MemoryRegion slots;
  std::uint64_t echoed = 0;

  /// `posted`: the slots, each with a receive posted (before the handshake).
  Client(verbs::cm::Connection c, std::size_t message_size, verbs::MemoryRegion posted)
      : conn(std::move(c)), size(message_size), slots(std::move(posted)) {
    conn.recv_cq().req_notify();  // make each CQ's fd readable at its next completion
    conn.send_cq().req_notify();
  }
  void post_receive(std::uint64_t slot) { conn.qp().post_recv(slots.slice(slot * size, size), slot).check(); }

  /// Handles whatever is ready, without blocking. False once the client has disconnected.
  bool service() {
    // rdma_cm events first: after a disconnect, our receives are flushed, which is no error.
    if (!conn.poll_events()) return false;
    // Acknowledge the wake-ups and re-arm before polling: a completion that arrives after the
    // poll makes the fd readable again, so none is left behind.
    for (const verbs::CompletionQueue* cq : {&conn.recv_cq(), &conn.send_cq()}) {
      cq->consume_events();
      cq->req_notify();
    }
    drain(conn.recv_cq(), [&](const verbs::Completion& wc) {  // a message: echo it from its slot
      wc.throw_if_failed();
      conn.qp().post_send(slots.slice(wc.wr_id() * size, wc.byte_len()), {.wr_id = wc.wr_id()}).check();
      ++echoed;
    });
    drain(conn.send_cq(), [&](const verbs::Completion& wc) {  // an echo left: its slot is free
      wc.throw_if_failed();
      post_receive(wc.wr_id());
    });
    return true;
  }
};

void serve(const example::Args& args, std::uint64_t expected) {
  const std::string local = example::local_address(args);
  verbs::cm::Listener listener(local, args.port);
  example::print_listening(kName, local, listener.port());
  const int timeout_ms = static_cast<int>(std::chrono::milliseconds(args.timeout).count());

  std::list<Client> clients;
  std::uint64_t accepted = 0, messages = 0;
  while (accepted < expected || !clients.empty()) {
    std::vector<pollfd> fds;
    if (accepted < expected) fds.push_back({listener.fd(), POLLIN, 0});
    for (Client& c : clients)
      for (const int fd : {c.conn.fd(), c.conn.recv_cq().fd(), c.conn.send_cq().fd()}) fds.push_back({fd, POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
    if (ready == 0) throw std::runtime_error("nothing happened for " + std::to_string(args.timeout.count()) + " s");

    if (accepted < expected && fds[0].revents != 0) {  // a connection request
      // Size the slots from the request and post their receives before accepting: the client
      // may send as soon as it is connected. A request without a valid size is rejected.
      unsigned long long size = 0;
      std::optional<verbs::MemoryRegion> slots;
      const auto prepare = [&](const verbs::cm::Handshake& h) {
        const std::string text(reinterpret_cast<const char*>(h.peer_private_data.data()), h.peer_private_data.size());
        if (std::sscanf(text.c_str(), "size %llu", &size) != 1 || size == 0 || size > (1u << 20))
          throw std::invalid_argument("the request asked for no valid message size");
        slots.emplace(verbs::MemoryRegion::allocate(h.pd, kSlots * size, verbs::Access::local_write));
        for (std::size_t k = 0; k < kSlots; ++k) h.qp.post_recv(slots->slice(k * size, size), k).check();
      };
      try {
        verbs::cm::Connection conn = listener.accept(args.timeout, {.before_handshake = prepare});
        clients.emplace_back(std::move(conn), size, std::move(*slots));
        ++accepted;
      } catch (const std::invalid_argument& e) {
        std::printf("%s: rejected a client: %s\n", kName, e.what());
      }
    }
    // Rather than map each readable fd back to its client, look at every client: service()
    // never blocks.
    for (auto it = clients.begin(); it != clients.end();) {
      if (it->service()) {
        ++it;
        continue;
      }
      std::printf("%s: %s left after %llu echoes\n", kName, it->conn.peer_address().c_str(),
                  static_cast<unsigned long long>(it->echoed));
      messages += it->echoed;
      it = clients.erase(it);
    }
  }
  std::printf("%s: served %llu clients, %llu messages\n", kName, static_cast<unsigned long long>(accepted),
              static_cast<unsigned long long>(messages));
}

void run_client(const example::Args& args, std::uint64_t count, std::size_t size) {
  const std::string hello = "size " + std::to_string(size);
  verbs::cm::Connection conn =
      verbs::cm::connect(args.host, args.port,
                         {.timeout = args.timeout,
                          .source_address = args.bind,
                          .connection = {.private_data = std::as_bytes(std::span(hello))}});
  // [0, size) is what we send, [size, 2 size) where the echo lands.
  auto buf = verbs::MemoryRegion::allocate(conn.pd(), 2 * size, verbs::Access::local_write);
  const std::span<std::byte> out = buf.bytes().first(size), in = buf.bytes().subspan(size, size);
  const auto wait = [&](const verbs::CompletionQueue& cq) {  // watches the connection too
    const std::optional<verbs::Completion> wc = conn.wait_one(cq, args.timeout);
    if (!wc) throw std::runtime_error("no answer within " + std::to_string(args.timeout.count()) + " s");
    wc->throw_if_failed();
    return *wc;
  };
  for (std::uint64_t i = 0; i < count; ++i) {
    for (std::size_t k = 0; k < size; ++k) out[k] = static_cast<std::byte>(i * 31 + k);
    std::memset(in.data(), 0, size);
    conn.qp().post_recv(buf.slice(size, size), i).check();  // before the send: the echo may be quick
    conn.qp().post_send(buf.slice(0, size), {.wr_id = i}).check();
    (void)wait(conn.send_cq());
    const verbs::Completion echo = wait(conn.recv_cq());
    if (echo.byte_len() != size || std::memcmp(in.data(), out.data(), size) != 0)
      throw std::runtime_error("message " + std::to_string(i) + " came back changed");
  }
  std::printf("%s: %llu messages of %zu bytes echoed and checked\n", kName, static_cast<unsigned long long>(count),
              size);
}

}  // namespace

int main(int argc, char** argv) try {
  std::uint64_t clients = 1, count = 1000, size = 64;
  const example::Args args =
      example::parse_args(argc, argv, kName, "Echo server for several clients at once, with send and receive.",
                          {{'c', "CLIENTS", "server: clients to serve before exiting", &clients, 1},
                           {'n', "MESSAGES", "client: messages to send", &count, 1},
                           {'s', "SIZE", "client: bytes per message, at most 1M", &size, 1}});
  if (size > (1u << 20)) throw std::invalid_argument("-s: at most 1M");
  if (args.server())
    serve(args, clients);
  else
    run_client(args, count, size);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", kName, e.what());
  return 1;
}
