// multicast: a multicast group through rdma_cm, as rdma-core's mckey does it, and
// interoperable with mckey both ways.
//
//   receiver: multicast [-a BIND_ADDR] [-n MESSAGES] [-s SIZE] [-t SECONDS] GROUP
//   sender:   multicast -S [-a BIND_ADDR] [-n MESSAGES] [-s SIZE] [-w SECONDS] GROUP
//
// Both join GROUP (an IPv4 224.0.0.0/4 or IPv6 ff00::/8 address) on a cm::Datagram bound to
// BIND_ADDR, the address of the RDMA device's netdev. The receiver posts its receives, says
// "joined", and waits for MESSAGES messages; the sender waits SECONDS (mckey waits 3 s, for
// InfiniBand switches to learn the group), sends MESSAGES messages of SIZE bytes to the group
// (mckey's 100 by default), and leaves. UD is unreliable: a receiver that joined late misses
// what was sent before.
#include <verbs/cm_datagram.hpp>
#include <verbs/verbs.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "example_args.hpp"

namespace {

constexpr const char* kName = "multicast";
constexpr std::size_t kGrh = 40;

struct Options {
  std::string group, bind;
  bool sender = false;
  std::uint64_t count = 10, size = 100, timeout = 30, pause = 0;
};

void usage() {
  std::printf("Usage: %s [-a BIND_ADDR] [-n MESSAGES] [-s SIZE] [-t SECONDS] GROUP        (receiver)\n"
              "       %s -S [-a BIND_ADDR] [-n MESSAGES] [-s SIZE] [-w SECONDS] GROUP     (sender)\n\n"
              "A multicast group through rdma_cm, as rdma-core's mckey does it.\n\nOptions:\n"
              "  -S            send (default: receive)\n"
              "  -a BIND_ADDR  the local address, of the RDMA device's netdev (default: the first with an RDMA device)\n"
              "  -n MESSAGES   messages to send or receive (default 10)\n"
              "  -s SIZE       bytes per message, at most the path MTU (default 100)\n"
              "  -t SECONDS    the longest the receiver waits for a message (default 30)\n"
              "  -w SECONDS    how long the sender waits after joining, before it sends (default 0)\n"
              "  -h, --help    show this help\n",
              kName, kName);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      usage();
      std::exit(0);
    }
    if (arg == "-S") {
      o.sender = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      if (!o.group.empty()) throw std::invalid_argument("more than one GROUP given (see --help)");
      o.group = arg;
      continue;
    }
    if (arg.size() != 2 || i + 1 >= argc) throw std::invalid_argument(std::string(arg) + ": see --help");
    const char flag = arg[1];
    const std::string_view value = argv[++i];
    switch (flag) {
      case 'a': o.bind = value; break;
      case 'n': o.count = example::parse_number(value, flag); break;
      case 's': o.size = example::parse_number(value, flag); break;
      case 't': o.timeout = example::parse_number(value, flag); break;
      case 'w': o.pause = example::parse_number(value, flag); break;
      default: throw std::invalid_argument("unknown option -" + std::string(1, flag) + " (see --help)");
    }
  }
  if (o.group.empty()) throw std::invalid_argument("no GROUP given (see --help)");
  if (o.count == 0 || o.count > 4096) throw std::invalid_argument("-n: 1 to 4096");
  if (o.size == 0 || o.size > 4096) throw std::invalid_argument("-s: 1 to 4096 (a UD message fits one packet)");
  if (o.timeout == 0) throw std::invalid_argument("-t: must be at least 1 second");
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  example::Args where;  // the examples' choice of local address: the first with an RDMA device
  where.bind = o.bind;
  const std::string local = example::local_address(where);
  const auto n = static_cast<std::uint32_t>(o.count);
  verbs::cm::Datagram d(local, 0, {.qp = {.type = verbs::QpType::ud, .max_send_wr = n, .max_recv_wr = n},
                                   .cq_depth = static_cast<int>(2 * n)});
  const std::size_t stride = kGrh + o.size;
  auto mr = verbs::MemoryRegion::allocate(d.pd(), o.count * stride, verbs::Access::local_write);
  if (!o.sender)
    for (std::uint64_t k = 0; k < o.count; ++k) d.qp().post_recv(mr.slice(k * stride, stride), k).check();
  const verbs::cm::DatagramPeer group = d.join(o.group, std::chrono::seconds(o.timeout));
  std::printf("%s: joined %s from %s\n", kName, o.group.c_str(), local.c_str());
  std::fflush(stdout);
  const std::chrono::seconds timeout(o.timeout);
  if (o.sender) {
    std::this_thread::sleep_for(std::chrono::seconds(o.pause));
    for (std::size_t k = 0; k < o.size; ++k) mr.data()[k] = static_cast<std::byte>(k);
    for (std::uint64_t k = 0; k < o.count; ++k) {
      d.qp().post(verbs::SendWr::send_imm(mr.slice(0, o.size), d.qp().qp_num(), {.wr_id = k, .signaled = true})
                      .to(group.ah, group.qp_num, group.qkey)).check();
      verbs::Completion wc;
      if (d.send_cq().wait(std::span(&wc, 1), timeout).empty()) throw std::runtime_error("a send did not complete");
      wc.throw_if_failed();
    }
    std::printf("%s: sent %llu messages of %llu bytes to %s\n", kName, static_cast<unsigned long long>(o.count),
                static_cast<unsigned long long>(o.size), o.group.c_str());
  } else {
    for (std::uint64_t k = 0; k < o.count; ++k) {
      verbs::Completion wc;
      if (d.recv_cq().wait(std::span(&wc, 1), timeout).empty())
        throw std::runtime_error("received " + std::to_string(k) + " of " + std::to_string(o.count) +
                                 " messages; nothing more within " + std::to_string(o.timeout) + " s");
      wc.throw_if_failed();
      if (wc.byte_len() != stride)
        throw std::runtime_error("a message of " + std::to_string(wc.byte_len() - kGrh) + " bytes, expected " +
                                 std::to_string(o.size) + " (give both sides the same -s)");
    }
    std::printf("%s: received %llu messages of %llu bytes from %s\n", kName, static_cast<unsigned long long>(o.count),
                static_cast<unsigned long long>(o.size), o.group.c_str());
  }
  d.leave(o.group);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", kName, e.what());
  return 1;
}
