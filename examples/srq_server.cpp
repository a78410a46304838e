// srq_server: one shared receive queue and one receive CQ for all of a server's connections.
//
//   server: srq_server [-p PORT] [-a BIND_ADDR] [-c CLIENTS]
//   client: srq_server [-p PORT] [-n MESSAGES] HOST            (run several at once)
//
// Posting receives on every connection ties up buffers per client; with a SharedReceiveQueue,
// one pool of receives serves them all, and one CQ reports them all. Both are made before any
// connection, on the listener's device, and handed to each accepted connection (its QP then
// takes receives from the SRQ: QpOptions::srq). The server tells the connections apart by the
// QP number of each completion. Each client sends MESSAGES numbered messages; the server checks
// that it got all of them, in order, from each.
#include <poll.h>

#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "example_args.hpp"

namespace {

constexpr const char* kName = "srq_server";
constexpr std::uint32_t kSlots = 128;  // receives in the SRQ, shared by all connections

/// What a client sends: "message seq of count".
struct Message {
  std::uint64_t seq;
  std::uint64_t count;
};

/// What the server knows of one connection, found by QP number.
struct Peer {
  std::string address;        // set when the connection is accepted
  std::uint64_t received = 0;
  std::uint64_t count = 0;    // as the messages say
  [[nodiscard]] bool done() const { return count != 0 && received == count; }
};

void serve(const example::Args& args, std::uint64_t expected) {
  const std::string local = example::local_address(args);
  verbs::cm::Listener listener(local, args.port);
  example::print_listening(kName, local, listener.port());

  // Shared objects come from the listener's device, like the connections' own.
  const verbs::Device device = listener.device();
  verbs::ProtectionDomain pd{device};
  verbs::SharedReceiveQueue srq{pd, {.max_wr = kSlots}};
  // Deep enough for every receive the SRQ holds: a full CQ loses completions.
  verbs::CompletionQueue recv_cq{device, {.depth = kSlots, .with_channel = true}};
  auto slots = verbs::MemoryRegion::allocate(pd, kSlots * sizeof(Message), verbs::Access::local_write);
  const auto post_receive = [&](std::uint64_t slot) {
    srq.post_recv(slots.slice(slot * sizeof(Message), sizeof(Message)), slot).check();
  };
  for (std::uint32_t k = 0; k < kSlots; ++k) post_receive(k);  // before any client can send
  const verbs::cm::ConnectionOptions options{.qp = {.srq = &srq}, .cq_depth = 16, .pd = &pd, .recv_cq = &recv_cq};

  std::vector<verbs::cm::Connection> conns;
  std::map<std::uint32_t, Peer> peers;  // by QP number
  const auto all_done = [&] {
    if (conns.size() < expected) return false;
    for (const auto& [qpn, peer] : peers)
      if (!peer.done()) return false;
    return true;
  };
  const int timeout_ms = static_cast<int>(std::chrono::milliseconds(args.timeout).count());
  recv_cq.req_notify();
  while (!all_done()) {
    std::vector<pollfd> fds{{recv_cq.fd(), POLLIN, 0}};
    if (conns.size() < expected) fds.push_back({listener.fd(), POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
    if (ready == 0) throw std::runtime_error("nothing happened for " + std::to_string(args.timeout.count()) + " s");

    if (fds.size() > 1 && fds[1].revents != 0) {
      verbs::cm::Connection& c = conns.emplace_back(listener.accept(args.timeout, options));
      peers[c.qp().qp_num()].address = c.peer_address();  // its messages may have come already
    }
    recv_cq.consume_events();
    recv_cq.req_notify();  // re-armed before polling, so a completion that comes after wakes poll()
    std::array<verbs::Completion, 32> wcs;
    for (auto got = recv_cq.poll(wcs); !got.empty(); got = recv_cq.poll(wcs)) {
      for (const verbs::Completion& wc : got) {
        wc.throw_if_failed();
        Message m{};
        std::memcpy(&m, slots.data() + wc.wr_id() * sizeof(Message), sizeof m);
        post_receive(wc.wr_id());  // the slot is free again
        Peer& peer = peers[wc.qp_num()];
        if (m.seq != peer.received || (peer.count != 0 && m.count != peer.count) || m.count == 0)
          throw std::runtime_error("QP " + std::to_string(wc.qp_num()) + ": message " + std::to_string(m.seq) + " of " +
                                   std::to_string(m.count) + " out of order");
        peer.count = m.count;
        ++peer.received;
      }
    }
  }

  std::uint64_t total = 0;
  for (const auto& [qpn, peer] : peers) {
    if (peer.address.empty()) throw std::runtime_error("messages from QP " + std::to_string(qpn) + ", never accepted");
    std::printf("%s: QP %u (%s): %llu messages, all in order\n", kName, qpn, peer.address.c_str(),
                static_cast<unsigned long long>(peer.received));
    total += peer.received;
  }
  std::printf("%s: %zu connections, %llu messages through one shared receive queue\n", kName, peers.size(),
              static_cast<unsigned long long>(total));
}

void run_client(const example::Args& args, std::uint64_t count) {
  verbs::cm::Connection conn = verbs::cm::connect(args.host, args.port, {.timeout = args.timeout, .source_address = args.bind});
  auto buf = verbs::MemoryRegion::allocate(conn.pd(), sizeof(Message));
  for (std::uint64_t i = 0; i < count; ++i) {
    const Message m{.seq = i, .count = count};
    std::memcpy(buf.data(), &m, sizeof m);
    conn.qp().post_send(buf.slice(), {.wr_id = i}).check();
    // One message in flight at a time: the buffer may be reused once its send has completed.
    const std::optional<verbs::Completion> wc = conn.wait_one(conn.send_cq(), args.timeout);
    if (!wc) throw std::runtime_error("no completion within " + std::to_string(args.timeout.count()) + " s");
    wc->throw_if_failed();
  }
  std::printf("%s: sent %llu messages\n", kName, static_cast<unsigned long long>(count));
}

}  // namespace

int main(int argc, char** argv) try {
  std::uint64_t clients = 1, count = 100;
  const example::Args args =
      example::parse_args(argc, argv, kName, "One shared receive queue and one receive CQ for all connections.",
                          {{'c', "CLIENTS", "server: clients to wait for", &clients, 1},
                           {'n', "MESSAGES", "client: messages to send", &count, 1}});
  if (args.server())
    serve(args, clients);
  else
    run_client(args, count);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", kName, e.what());
  return 1;
}
