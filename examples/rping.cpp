// rping: the ping-pong of rdma-core's rping (rdmacm-utils), written with verbs, speaking the
// same wire protocol so that it works against the real tool in either role.
//
// The protocol, per ping:
//   client: fills its source buffer, sends {addr, rkey, size} of it      (16 bytes, big-endian)
//   server: RDMA-reads that many bytes into its buffer, sends "go ahead"  (16 bytes)
//   client: sends {addr, rkey, size} of its sink buffer
//   server: RDMA-writes the string it read into the sink, sends "go ahead"
//   client: checks (with -V) that the sink now equals the source
// The client disconnects after -C pings; the server then ends.
#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "rping_wire.hpp"

using namespace std::chrono_literals;

namespace {

struct Options {
  bool server = false, client = false, verbose = false, validate = false;
  std::string addr;
  std::uint16_t port = 7174;
  int count = 0;  // 0: until the peer disconnects (server) or forever (client)
  int size = 64;
};

/// The 16-byte advertisement rping exchanges: where a buffer is and how to reach it.
using rping::Advert;

constexpr int kMinSize = 26;  // "rdma-ping-2147483647: " plus its terminator, as rping checks
constexpr int kMaxSize = 64 * 1024 - 1;
constexpr auto kStep = 30s;   // the longest any single step may take

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: rping -s [-vV] [-S size] [-C count] [-a addr] [-p port]\n"
               "       rping -c [-vV] [-S size] [-C count] -a addr [-p port]\n"
               "  -s        server          -c        client\n"
               "  -a addr   address to bind (server) or connect to (client)\n"
               "  -p port   port (default 7174)\n"
               "  -C count  pings (default: until disconnected)\n"
               "  -S size   ping data size, %d..%d (default 64)\n"
               "  -v        print the ping data        -V  validate the ping data\n"
               "Interoperates with rdma-core's rping in either role.\n",
               kMinSize, kMaxSize);
}

Options parse(int argc, char** argv) {
  Options o;
  static const option longs[] = {{"help", no_argument, nullptr, 'h'}, {nullptr, 0, nullptr, 0}};
  for (int c; (c = ::getopt_long(argc, argv, "scvVda:p:C:S:h", longs, nullptr)) != -1;) {
    switch (c) {
      case 's': o.server = true; break;
      case 'c': o.client = true; break;
      case 'v': o.verbose = true; break;
      case 'V': o.validate = true; break;
      case 'd': break;  // rping's debug output: nothing to add here
      case 'a': o.addr = optarg; break;
      case 'p': o.port = static_cast<std::uint16_t>(std::atoi(optarg)); break;
      case 'C': o.count = std::atoi(optarg); break;
      case 'S': o.size = std::atoi(optarg); break;
      case 'h': usage(stdout); std::exit(0);
      default: usage(stderr); std::exit(2);
    }
  }
  if (o.server == o.client || (o.client && o.addr.empty()) || o.size < kMinSize || o.size > kMaxSize || o.count < 0) {
    usage(stderr);
    std::exit(2);
  }
  return o;
}

void put_advert(const verbs::MemoryRegion& mr, const verbs::MemoryRegion& buffer, std::uint32_t size) {
  const auto a = rping::encode_advert(buffer.iova(), buffer.rkey(), size);
  std::memcpy(mr.data(), a.data(), a.size());
}

verbs::RemoteSlice get_advert(const verbs::MemoryRegion& mr) {
  return rping::decode_advert(mr.bytes().first<sizeof(Advert)>());
}

/// Waits for one completion on `cq`; false when the peer has gone (the normal end).
bool await(verbs::cm::Connection& c, const verbs::CompletionQueue& cq, verbs::WcOpcode expected) {
  std::error_code ec;
  verbs::Completion wc;
  if (c.wait(cq, std::span(&wc, 1), kStep, ec).empty()) {
    if (ec == std::errc::connection_reset) return false;
    throw verbs::Error(ec ? ec : make_error_code(verbs::Errc::timed_out), "waiting for a completion");
  }
  wc.throw_if_failed();
  if (wc.opcode() != expected) throw std::runtime_error("unexpected completion opcode");
  if (expected == verbs::WcOpcode::recv && wc.byte_len() != sizeof(Advert))
    throw std::runtime_error("received " + std::to_string(wc.byte_len()) + " bytes, expected 16");
  return true;
}

int run_server(const Options& o) {
  verbs::cm::Listener listener(o.addr.empty() ? "0.0.0.0" : o.addr, o.port);
  std::printf("rping: listening on %s:%u\n", o.addr.empty() ? "0.0.0.0" : o.addr.c_str(), listener.port());
  std::fflush(stdout);
  verbs::cm::Connection c = listener.accept(600s, {.qp = {.max_send_wr = 16, .max_recv_wr = 2}});

  // Receives the client's adverts; sends an empty "go ahead"; reads into and writes from `data`.
  auto recv_mr = verbs::MemoryRegion::allocate(c.pd(), sizeof(Advert), verbs::Access::local_write);
  auto send_mr = verbs::MemoryRegion::allocate(c.pd(), sizeof(Advert));
  auto data = verbs::MemoryRegion::allocate(c.pd(), static_cast<std::size_t>(o.size), verbs::Access::local_write);
  c.qp().post_recv(recv_mr.slice(0, sizeof(Advert))).check();

  for (int ping = 0;; ++ping) {
    if (!await(c, c.recv_cq(), verbs::WcOpcode::recv)) break;  // the client is done
    const verbs::RemoteSlice source = get_advert(recv_mr);
    c.qp().post_recv(recv_mr.slice(0, sizeof(Advert))).check();
    if (source.length > data.size()) throw std::runtime_error("the client's buffer is larger than -S");
    c.qp().post_read(data.slice(0, source.length), source).check();
    if (!await(c, c.send_cq(), verbs::WcOpcode::rdma_read)) break;
    if (o.verbose) std::printf("server ping data: %s\n", reinterpret_cast<const char*>(data.data()));
    c.qp().post_send(send_mr.slice()).check();
    if (!await(c, c.send_cq(), verbs::WcOpcode::send)) break;

    if (!await(c, c.recv_cq(), verbs::WcOpcode::recv)) break;
    const verbs::RemoteSlice sink = get_advert(recv_mr);
    c.qp().post_recv(recv_mr.slice(0, sizeof(Advert))).check();
    const std::size_t len = ::strnlen(reinterpret_cast<const char*>(data.data()), data.size() - 1) + 1;
    c.qp().post_write(data.slice(0, len), sink).check();
    if (!await(c, c.send_cq(), verbs::WcOpcode::rdma_write)) break;
    c.qp().post_send(send_mr.slice()).check();
    if (!await(c, c.send_cq(), verbs::WcOpcode::send)) break;
  }
  return 0;
}

int run_client(const Options& o) {
  verbs::cm::Connection c = verbs::cm::connect(o.addr, o.port, {.timeout = 30s,
      .connection = {.qp = {.max_send_wr = 16, .max_recv_wr = 2,
                            .access = verbs::Access::remote_read | verbs::Access::remote_write}}});
  const auto size = static_cast<std::size_t>(o.size);
  const verbs::AccessFlags remote = verbs::Access::local_write | verbs::Access::remote_read | verbs::Access::remote_write;
  auto recv_mr = verbs::MemoryRegion::allocate(c.pd(), sizeof(Advert), verbs::Access::local_write);
  auto send_mr = verbs::MemoryRegion::allocate(c.pd(), sizeof(Advert));
  auto source = verbs::MemoryRegion::allocate(c.pd(), size, remote);
  auto sink = verbs::MemoryRegion::allocate(c.pd(), size, remote);
  c.qp().post_recv(recv_mr.slice(0, sizeof(Advert))).check();

  char start = 'A';
  for (int ping = 0; o.count == 0 || ping < o.count; ++ping) {
    // rping's pattern: a header, then letters from `start` cycling through 'A'..'z'.
    auto* text = reinterpret_cast<char*>(source.data());
    int i = std::snprintf(text, size, "rdma-ping-%d: ", ping);
    for (char ch = start; i < o.size; ++i) {
      text[i] = ch;
      ch = ch == 'z' ? 'A' : static_cast<char>(ch + 1);
    }
    start = start == 'z' ? 'A' : static_cast<char>(start + 1);
    text[size - 1] = '\0';

    put_advert(send_mr, source, static_cast<std::uint32_t>(size));
    c.qp().post_send(send_mr.slice()).check();
    if (!await(c, c.send_cq(), verbs::WcOpcode::send) || !await(c, c.recv_cq(), verbs::WcOpcode::recv))
      throw std::runtime_error("the server went away");
    c.qp().post_recv(recv_mr.slice(0, sizeof(Advert))).check();

    put_advert(send_mr, sink, static_cast<std::uint32_t>(size));
    c.qp().post_send(send_mr.slice()).check();
    if (!await(c, c.send_cq(), verbs::WcOpcode::send) || !await(c, c.recv_cq(), verbs::WcOpcode::recv))
      throw std::runtime_error("the server went away");
    c.qp().post_recv(recv_mr.slice(0, sizeof(Advert))).check();

    if (o.validate && std::memcmp(source.data(), sink.data(), size) != 0) {
      std::fprintf(stderr, "rping: data mismatch in ping %d\n", ping);
      return 1;
    }
    if (o.verbose) std::printf("ping data: %s\n", reinterpret_cast<const char*>(sink.data()));
  }
  c.disconnect();
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  return o.server ? run_server(o) : run_client(o);
} catch (const std::exception& e) {
  std::fprintf(stderr, "rping: %s\n", e.what());
  return 1;
}
