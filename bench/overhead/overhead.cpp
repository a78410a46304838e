// Zero-overhead check: the same work written with the library and with raw verbs, in this one
// translation unit, counted in instructions by callgrind against a provider stub (no device).
//
//   post:    build an RDMA write with one SGE and post it (checking the result)
//   post_wr: the same write through the extended QP API (ibv_wr_start, ibv_wr_rdma_write,
//            ibv_wr_set_sge, ibv_wr_complete; the library's SendBatch)
//   poll:    poll a batch of kBatch completions into an array (checking for an error)
//
// lib_post/raw_post, lib_post_wr/raw_post_wr and lib_poll/raw_poll are noinline and extern "C", so callgrind can count
// each one inclusively (its call into the stub included) with --toggle-collect=<name>.
//
//   verbs_overhead               checks that both sides do the same work, then runs itself under
//                                valgrind --tool=callgrind once per function and prints the
//                                instruction counts and `overhead post|poll <library / raw>`
//   verbs_overhead --check       only the check (exit status 1 if the two sides differ)
//   verbs_overhead --run F N     calls F N times (what callgrind runs)
//
// Without valgrind it prints a note and exits 0 after the check. The ratio is a figure to read,
// not a threshold. The stubs are as small as they can be (post: return 0; poll: copy the
// prepared completions), so the ratio shows what the library adds to a verb at its cheapest.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <infiniband/verbs.h>

#include <verbs/completion_queue.hpp>
#include <verbs/queue_pair.hpp>

#include "support/stub_provider.hpp"

namespace {

constexpr int kBatch = 16;
std::array<ibv_wc, kBatch> g_prepared{};

// The measured stubs: the least a provider can do.
int post_send_stub(ibv_qp*, ibv_send_wr*, ibv_send_wr**) { return 0; }
int poll_cq_stub(ibv_cq*, int n, ibv_wc* wc) {
  n = n < kBatch ? n : kBatch;
  std::memcpy(wc, g_prepared.data(), static_cast<std::size_t>(n) * sizeof(ibv_wc));
  return n;
}
// The extended QP's: as little again.
void wr_start_stub(ibv_qp_ex*) {}
int wr_complete_stub(ibv_qp_ex*) { return 0; }
void wr_rdma_write_stub(ibv_qp_ex*, std::uint32_t, std::uint64_t) {}
void wr_set_sge_stub(ibv_qp_ex*, std::uint32_t, std::uint64_t, std::uint32_t) {}

}  // namespace

// What the raw side's caller keeps for the peer's buffer: {addr, length, rkey}, as RemoteSlice.
struct raw_remote {
  std::uint64_t addr;
  std::uint64_t length;
  std::uint32_t rkey;
};

extern "C" {

// ---- the library, written the idiomatic way ----
__attribute__((noinline)) bool lib_post(verbs::QueuePair& qp, const verbs::LocalSlice& src,
                                        const verbs::RemoteSlice& dst, std::uint64_t id) {
  return qp.post_write(src, dst, {.wr_id = id}).ok();
}

__attribute__((noinline)) bool lib_post_wr(verbs::QueuePair& qp, const verbs::LocalSlice& src,
                                           const verbs::RemoteSlice& dst, std::uint64_t id) {
  return qp.batch().write(src, dst, {.wr_id = id}).complete().ok();
}

__attribute__((noinline)) int lib_poll(const verbs::CompletionQueue& cq, std::span<verbs::Completion> out) {
  std::error_code ec;
  const std::size_t n = cq.poll(out, ec).size();
  return ec ? -1 : static_cast<int>(n);
}

// ---- raw verbs, written the way a careful C programmer would ----
__attribute__((noinline)) bool raw_post(ibv_qp* qp, const ibv_sge* src, const raw_remote* dst, std::uint64_t id) {
  struct ibv_sge sge = *src;
  struct ibv_send_wr wr = {};
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = dst->addr;
  wr.wr.rdma.rkey = dst->rkey;
  struct ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad) == 0;
}

__attribute__((noinline)) bool raw_post_wr(ibv_qp_ex* qpx, const ibv_sge* src, const raw_remote* dst,
                                           std::uint64_t id) {
  ibv_wr_start(qpx);
  qpx->wr_id = id;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(qpx, dst->rkey, dst->addr);
  ibv_wr_set_sge(qpx, src->lkey, src->addr, src->length);
  return ibv_wr_complete(qpx) == 0;
}

__attribute__((noinline)) int raw_poll(ibv_cq* cq, ibv_wc* wc, int n) {
  const int got = ibv_poll_cq(cq, n, wc);
  if (got < 0) return -1;
  return got;
}

}  // extern "C"

namespace {

struct Setup {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({.extended = true});
  verbs::CompletionQueue cq = stub.completion_queue();
  const verbs::LocalSlice src{0x10000, 4096, 0x1234};
  const verbs::RemoteSlice dst{.addr = 0x7f0000, .length = 4096, .rkey = 0x5678};
  const raw_remote raw_dst{dst.addr, dst.length, dst.rkey};
  std::array<verbs::Completion, kBatch> lib_wc{};
  std::array<ibv_wc, kBatch> raw_wc{};

  Setup() {
    for (int i = 0; i < kBatch; ++i) {
      g_prepared[static_cast<std::size_t>(i)].wr_id = static_cast<std::uint64_t>(i);
      g_prepared[static_cast<std::size_t>(i)].opcode = IBV_WC_RDMA_WRITE;
      g_prepared[static_cast<std::size_t>(i)].qp_num = stub.qp.qp_num;
    }
  }
  void measuring_stubs() {
    stub.vctx.context.ops.post_send = &post_send_stub;
    stub.vctx.context.ops.poll_cq = &poll_cq_stub;
    stub.qp_ex.wr_start = &wr_start_stub;
    stub.qp_ex.wr_complete = &wr_complete_stub;
    stub.qp_ex.wr_rdma_write = &wr_rdma_write_stub;
    stub.qp_ex.wr_set_sge = &wr_set_sge_stub;
  }
};

// Both sides hand the provider the same request and get the same completions.
bool check() {
  Setup s;  // the recording stubs of stub_provider.hpp
  bool ok = true;
  const auto fail = [&](const char* what) {
    std::fprintf(stderr, "overhead: the library and raw verbs differ: %s\n", what);
    ok = false;
  };
  // Every byte of the two requests but sg_list (each points at its own copy of the SGE).
  const auto posted = [&] {
    auto bytes = s.stub.last_send_bytes;
    std::memset(bytes.data() + offsetof(ibv_send_wr, sg_list), 0, sizeof(ibv_sge*));
    return bytes;
  };
  if (!lib_post(s.qp, s.src, s.dst, 42)) fail("lib_post failed");
  const auto lib = posted();
  const ibv_sge lib_sge = s.stub.last_sge;
  if (!raw_post(&s.stub.qp, &s.src.native(), &s.raw_dst, 42)) fail("raw_post failed");
  const auto raw = posted();
  const ibv_sge raw_sge = s.stub.last_sge;
  if (s.stub.posted_sends != 2) fail("not one post each");
  if (lib != raw) fail("the work requests");
  if (std::memcmp(&lib_sge, &raw_sge, sizeof lib_sge) != 0) fail("the SGEs");
  if (lib_post(s.qp, s.src, verbs::RemoteSlice{s.dst.addr, 1, s.dst.rkey}, 1) || s.stub.posted_sends != 2)
    fail("the library posted a write larger than its remote slice");

  // Through the extended API: the same calls with the same arguments, one complete each.
  if (!lib_post_wr(s.qp, s.src, s.dst, 43)) fail("lib_post_wr failed");
  if (!raw_post_wr(&s.stub.qp_ex, &s.src.native(), &s.raw_dst, 43)) fail("raw_post_wr failed");
  if (s.stub.ex_posted.size() != 2 || s.stub.wr_completes != 2) fail("not one ibv_wr_complete each");
  if (s.stub.ex_posted.size() == 2) {
    const verbs_stub::ExWr &l = s.stub.ex_posted[0], &r = s.stub.ex_posted[1];
    if (l.opcode != r.opcode || l.wr_id != r.wr_id || l.flags != r.flags || l.rkey != r.rkey ||
        l.remote_addr != r.remote_addr || l.sges.size() != 1 || r.sges.size() != 1 ||
        std::memcmp(l.sges.data(), r.sges.data(), sizeof(ibv_sge)) != 0)
      fail("the extended API's requests");
  }
  if (lib_post_wr(s.qp, s.src, verbs::RemoteSlice{s.dst.addr, 1, s.dst.rkey}, 1) || s.stub.ex_posted.size() != 2)
    fail("the library's batch posted a write larger than its remote slice");

  s.measuring_stubs();
  if (lib_poll(s.cq, s.lib_wc) != kBatch || raw_poll(&s.stub.cq, s.raw_wc.data(), kBatch) != kBatch)
    fail("a poll did not return the batch");
  if (std::memcmp(s.lib_wc.data(), s.raw_wc.data(), sizeof s.raw_wc) != 0) fail("the completions");
  return ok;
}

int run(std::string_view fn, long n) {
  Setup s;
  s.measuring_stubs();
  long good = 0;
  if (fn == "lib_post") {
    for (long i = 0; i < n; ++i) good += lib_post(s.qp, s.src, s.dst, static_cast<std::uint64_t>(i)) ? 1 : 0;
  } else if (fn == "raw_post") {
    for (long i = 0; i < n; ++i) good += raw_post(&s.stub.qp, &s.src.native(), &s.raw_dst, static_cast<std::uint64_t>(i)) ? 1 : 0;
  } else if (fn == "lib_post_wr") {
    for (long i = 0; i < n; ++i) good += lib_post_wr(s.qp, s.src, s.dst, static_cast<std::uint64_t>(i)) ? 1 : 0;
  } else if (fn == "raw_post_wr") {
    for (long i = 0; i < n; ++i)
      good += raw_post_wr(&s.stub.qp_ex, &s.src.native(), &s.raw_dst, static_cast<std::uint64_t>(i)) ? 1 : 0;
  } else if (fn == "lib_poll") {
    for (long i = 0; i < n; ++i) good += lib_poll(s.cq, s.lib_wc) == kBatch ? 1 : 0;
  } else if (fn == "raw_poll") {
    for (long i = 0; i < n; ++i) good += raw_poll(&s.stub.cq, s.raw_wc.data(), kBatch) == kBatch ? 1 : 0;
  } else {
    std::fprintf(stderr, "overhead: unknown function %.*s\n", static_cast<int>(fn.size()), fn.data());
    return 64;
  }
  return good == n ? 0 : 1;
}

bool have_valgrind() {
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/bin:/bin";
  while (!rest.empty()) {
    const std::size_t colon = rest.find(':');
    const std::string dir(rest.substr(0, colon));
    if (::access((dir + "/valgrind").c_str(), X_OK) == 0) return true;
    rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
  }
  return false;
}

// Instructions of `fn` and its callees over `n` calls, or a negative number on failure.
double count(const std::string& self, const std::string& fn, long n) {
  char dir_template[] = "/tmp/verbs-overhead-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return -1;
  const std::string dir = dir_template;
  const std::string out = dir + "/callgrind.out", err = dir + "/valgrind.log";
  const std::string toggle = "--toggle-collect=" + fn, out_arg = "--callgrind-out-file=" + out;
  const std::string n_arg = std::to_string(n);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::setenv("LD_BIND_NOW", "1", 1);  // no lazy symbol resolution inside a counted call
    const char* argv[] = {"valgrind", "--tool=callgrind", "--collect-atstart=no", toggle.c_str(), out_arg.c_str(),
                          self.c_str(), "--run", fn.c_str(), n_arg.c_str(), nullptr};
    ::execvp("valgrind", const_cast<char* const*>(argv));  // NOLINT
    ::_exit(127);
  }
  int status = 0;
  double total = -1;
  if (pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    std::ifstream in(out);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("summary:", 0) == 0 || line.rfind("totals:", 0) == 0) {
        total = std::strtod(line.c_str() + line.find(':') + 1, nullptr);
        break;
      }
    }
  } else {
    std::ifstream in(err);
    std::fprintf(stderr, "overhead: valgrind failed on %s:\n%s\n", fn.c_str(),
                 std::string(std::istreambuf_iterator<char>(in), {}).c_str());
  }
  std::remove(out.c_str());
  std::remove(err.c_str());
  ::rmdir(dir.c_str());
  return total < 0 ? -1 : total / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  if (args.size() == 3 && args[0] == "--run") return run(args[1], std::strtol(std::string(args[2]).c_str(), nullptr, 10));
  if (!check()) return 1;
  if (args.size() == 1 && args[0] == "--check") {
    std::printf("overhead: the library and raw verbs post the same request and poll the same completions\n");
    return 0;
  }
  if (!args.empty()) {
    std::fprintf(stderr, "usage: verbs_overhead [--check | --run FUNCTION N]\n");
    return 64;
  }
  if (!have_valgrind()) {
    std::printf("overhead: valgrind is not installed, so nothing was measured (apt-get install valgrind)\n");
    return 0;
  }
  std::array<char, 4096> self{};
  const ssize_t len = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (len <= 0) return 1;
  const long n = 100000;
  const double lib_post_ir = count(self.data(), "lib_post", n), raw_post_ir = count(self.data(), "raw_post", n);
  const double lib_poll_ir = count(self.data(), "lib_poll", n), raw_poll_ir = count(self.data(), "raw_poll", n);
  const double lib_wr_ir = count(self.data(), "lib_post_wr", n), raw_wr_ir = count(self.data(), "raw_post_wr", n);
  if (lib_post_ir <= 0 || raw_post_ir <= 0 || lib_poll_ir <= 0 || raw_poll_ir <= 0 || lib_wr_ir <= 0 || raw_wr_ir <= 0)
    return 1;
  std::printf("overhead: instructions per call (callgrind, provider stub included; poll: %d completions)\n", kBatch);
  std::printf("overhead: post  library %.1f  raw %.1f\n", lib_post_ir, raw_post_ir);
  std::printf("overhead: post_wr  library %.1f  raw %.1f\n", lib_wr_ir, raw_wr_ir);
  std::printf("overhead: poll  library %.1f  raw %.1f\n", lib_poll_ir, raw_poll_ir);
  std::printf("overhead post %.2f\n", lib_post_ir / raw_post_ir);
  std::printf("overhead post_wr %.2f\n", lib_wr_ir / raw_wr_ir);
  std::printf("overhead poll %.2f\n", lib_poll_ir / raw_poll_ir);
  return 0;
}
