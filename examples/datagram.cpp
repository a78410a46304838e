// datagram: UD through rdma_cm, as rdma-core's udaddy does it, and interoperable with udaddy
// both ways (udaddy listens on port 7174: give -p 7174).
//
//   server: datagram [-p PORT] [-a BIND_ADDR] [-c CLIENTS] [-n MESSAGES] [-s SIZE]
//   client: datagram [-p PORT] [-n MESSAGES] [-s SIZE] HOST
//
// The server is one cm::Datagram: one UD QP that answers every client's request (SIDR) with its
// own number. From each client in turn it receives MESSAGES messages, then answers each with one
// of its own, sent to the QP number the client put in the immediate data (udaddy's convention)
// through an address handle made from the first receive. The client resolves the server,
// sends its MESSAGES messages with its QP number as the immediate, and waits for as many
// replies. Messages are SIZE bytes (udaddy's 100 by default); a receive needs 40 more, the GRH.
#include <verbs/cm_datagram.hpp>
#include <verbs/verbs.hpp>

#include <array>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "example_args.hpp"

namespace {

constexpr const char* kName = "datagram";
constexpr std::size_t kGrh = 40;

/// The next completion of `cq`, which must have succeeded; throws after `timeout`.
verbs::Completion next(const verbs::CompletionQueue& cq, std::chrono::seconds timeout, const char* what) {
  verbs::Completion wc;
  if (cq.wait(std::span(&wc, 1), timeout).empty())
    throw std::runtime_error(std::string("no ") + what + " within " + std::to_string(timeout.count()) + " s");
  wc.throw_if_failed();
  return wc;
}

/// A region of `count` slots of `size` bytes after a GRH each, and the receives posted on them.
struct Slots {
  verbs::MemoryRegion mr;
  std::size_t stride;
  Slots(verbs::cm::Datagram& d, std::uint64_t count, std::size_t size)
      : mr(verbs::MemoryRegion::allocate(d.pd(), count * (kGrh + size) + size, verbs::Access::local_write)),
        stride(kGrh + size) {}
  void post(verbs::cm::Datagram& d, std::uint64_t k) { d.qp().post_recv(mr.slice(k * stride, stride), k).check(); }
  /// Where a send's payload sits (after the receive slots).
  [[nodiscard]] verbs::LocalSlice payload(std::uint64_t count, std::size_t size) { return mr.slice(count * stride, size); }
};

void serve(const example::Args& args, std::uint64_t clients, std::uint64_t count, std::size_t size) {
  const std::string local = example::local_address(args);
  verbs::cm::Datagram d(local, args.port, {.qp = {.type = verbs::QpType::ud,
                                                  .max_send_wr = static_cast<std::uint32_t>(count),
                                                  .max_recv_wr = static_cast<std::uint32_t>(count)},
                                           .cq_depth = static_cast<int>(2 * count)});
  Slots slots(d, count, size);
  d.listen();
  example::print_listening(kName, local, d.port());
  for (std::uint64_t c = 0; c < clients; ++c) {
    for (std::uint64_t k = 0; k < count; ++k) slots.post(d, k);  // before the answer: the client sends at once
    const verbs::cm::DatagramRequest req = d.accept(args.timeout);
    std::optional<verbs::AddressHandle> back;
    std::uint32_t qpn = 0;
    for (std::uint64_t k = 0; k < count; ++k) {
      const verbs::Completion wc = next(d.recv_cq(), args.timeout, "message");
      if (wc.byte_len() != kGrh + size)
        throw std::runtime_error("a message of " + std::to_string(wc.byte_len() - kGrh) + " bytes, expected " +
                                 std::to_string(size) + " (give both sides the same -s)");
      if (!back) {
        back.emplace(verbs::AddressHandle::reply_to(d.pd(), wc, slots.mr.data() + wc.wr_id() * slots.stride));
        qpn = wc.imm_data().value_or(wc.src_qp());
      }
    }
    for (std::uint64_t k = 0; k < count; ++k)
      d.qp().post(verbs::SendWr::send_imm(slots.payload(count, size), d.qp().qp_num(), {.wr_id = k, .signaled = true})
                      .to(*back, qpn, verbs::cm::datagram_qkey)).check();
    for (std::uint64_t k = 0; k < count; ++k) (void)next(d.send_cq(), args.timeout, "send completion");
    std::printf("%s: %s: received %llu messages of %zu bytes and answered each\n", kName, req.peer_address.c_str(),
                static_cast<unsigned long long>(count), size);
    std::fflush(stdout);
  }
}

void run_client(const example::Args& args, std::uint64_t count, std::size_t size) {
  const std::string local = example::local_address(args);
  verbs::cm::Datagram d(local, 0, {.qp = {.type = verbs::QpType::ud,
                                          .max_send_wr = static_cast<std::uint32_t>(count),
                                          .max_recv_wr = static_cast<std::uint32_t>(count)},
                                   .cq_depth = static_cast<int>(2 * count)});
  Slots slots(d, count, size);
  for (std::uint64_t k = 0; k < count; ++k) slots.post(d, k);  // the replies may come at once
  const verbs::cm::DatagramPeer server = d.resolve(args.host, args.port, {.timeout = args.timeout});
  std::printf("%s: resolved %s:%u: QP %u, Q_Key 0x%x\n", kName, args.host.c_str(), static_cast<unsigned>(args.port),
              server.qp_num, server.qkey);
  for (std::uint64_t k = 0; k < count; ++k)
    d.qp().post(verbs::SendWr::send_imm(slots.payload(count, size), d.qp().qp_num(), {.wr_id = k, .signaled = true})
                    .to(server.ah, server.qp_num, server.qkey)).check();
  for (std::uint64_t k = 0; k < count; ++k) (void)next(d.send_cq(), args.timeout, "send completion");
  for (std::uint64_t k = 0; k < count; ++k) {
    const verbs::Completion wc = next(d.recv_cq(), args.timeout, "reply");
    if (wc.src_qp() != server.qp_num)
      throw std::runtime_error("a reply from QP " + std::to_string(wc.src_qp()) + ", not the server's " +
                               std::to_string(server.qp_num));
  }
  std::printf("%s: sent %llu messages of %zu bytes and received as many replies\n", kName,
              static_cast<unsigned long long>(count), size);
}

}  // namespace

int main(int argc, char** argv) try {
  std::uint64_t clients = 1, count = 10, size = 100;
  const example::Args args = example::parse_args(
      argc, argv, kName, "UD through rdma_cm (SIDR), as rdma-core's udaddy does it (its port: -p 7174).",
      {{'c', "CLIENTS", "server: clients to serve before exiting", &clients, 1},
       {'n', "MESSAGES", "messages each way", &count, 1},
       {'s', "SIZE", "bytes per message, at most the path MTU", &size, 1}});
  if (count > 4096) throw std::invalid_argument("-n: at most 4096");
  if (size > 4096) throw std::invalid_argument("-s: at most 4096 (a UD message fits one packet)");
  if (args.server())
    serve(args, clients, count, size);
  else
    run_client(args, count, size);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", kName, e.what());
  return 1;
}
