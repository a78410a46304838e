// verbs_regcost: what registering memory costs, MemoryRegion against raw ibv_reg_mr, on a device.
//
//   verbs_regcost [-d DEVICE] [--pairs N] [--max SIZE]
//
// For each size from 4 KiB to --max (default 256 MiB), by factors of 16, a buffer is allocated
// and touched once, then registered and deregistered --pairs times (default 9, at least 3) with
// each: `verbs::MemoryRegion(pd, buffer, access)` and its destruction, and `ibv_reg_mr` then
// `ibv_dereg_mr` on the same PD, in pairs (ours first in one, raw first in the next), so that
// each pair shares the machine's state. Access: local write, remote read and remote write, the same for
// both. Prints, per size, the median time to register and to deregister for both and the paired
// ratios (the median of each pair's own ratio, ours over raw), then one line per size:
//   paired reg_<size> <x>      (register and deregister together)
// Figures, not assertions: this is what docs/performance.md's "Memory registration" table comes from.
// Needs an RDMA device (run it in the SoftRoCE VM: scripts/rxe-vm -- build/bench/regcost/verbs_regcost).
#include <sys/mman.h>

#include <verbs/verbs.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 != 0 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

std::string size_name(std::size_t s) {
  if (s >= (1u << 20)) return std::to_string(s >> 20) + "M";
  return std::to_string(s >> 10) + "K";
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "verbs_regcost: %s\nusage: verbs_regcost [-d DEVICE] [--pairs N] [--max SIZE_MIB]\n", why);
  std::exit(64);
}

}  // namespace

int main(int argc, char** argv) try {
  std::string device;
  int pairs = 9;
  std::size_t max = std::size_t{256} << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage((a + " needs a value").c_str());
    const char* v = argv[++i];
    if (a == "-d") device = v;
    else if (a == "--pairs") pairs = std::atoi(v);
    else if (a == "--max") max = static_cast<std::size_t>(std::atoll(v)) << 20;
    else usage(("unknown option " + a).c_str());
  }
  if (pairs < 3) usage("--pairs: at least 3");
  if (max < 4096) usage("--max: at least 1 (MiB)");
  const verbs::Device dev = device.empty() ? verbs::Device::open_first() : verbs::Device::open(device);
  const verbs::ProtectionDomain pd(dev);
  const verbs::AccessFlags access = verbs::Access::local_write | verbs::Access::remote_read | verbs::Access::remote_write;
  const int raw_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  std::printf("verbs_regcost: device %s, %d pairs per size (ours and raw, each first in turn), times in microseconds\n",
              dev.name().c_str(), pairs);
  std::printf("%8s %14s %14s %8s %14s %14s %8s\n", "size", "reg ours", "reg raw", "paired", "dereg ours", "dereg raw",
              "paired");
  std::vector<std::string> lines;
  for (std::size_t size = 4096; size <= max; size *= 16) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of " + size_name(size) + " failed");
    std::memset(p, 1, size);  // touched once: registering faults in no page
    const std::span<std::byte> buf(static_cast<std::byte*>(p), size);
    std::vector<double> reg_ours, reg_raw, dereg_ours, dereg_raw, both_ratio, reg_ratio, dereg_ratio;
    const auto ours = [&](double& reg, double& dereg) {
      auto t0 = Clock::now();
      std::optional<verbs::MemoryRegion> mr(std::in_place, pd, buf, access);
      reg = us_since(t0);
      t0 = Clock::now();
      mr.reset();
      dereg = us_since(t0);
    };
    const auto raw = [&](double& reg, double& dereg) {
      auto t0 = Clock::now();
      ibv_mr* mr = ibv_reg_mr(pd.native_handle(), p, size, raw_access);
      reg = us_since(t0);
      if (mr == nullptr) throw std::runtime_error("ibv_reg_mr of " + size_name(size) + ": " + std::strerror(errno));
      t0 = Clock::now();
      if (ibv_dereg_mr(mr) != 0) throw std::runtime_error("ibv_dereg_mr failed");
      dereg = us_since(t0);
    };
    for (int k = 0; k < pairs + 1; ++k) {  // the first pair warms up, and is not counted
      double ro = 0, dro = 0, rr = 0, drr = 0;
      if (k % 2 == 0) {  // each goes first in every other pair
        ours(ro, dro);
        raw(rr, drr);
      } else {
        raw(rr, drr);
        ours(ro, dro);
      }
      if (k == 0) continue;
      reg_ours.push_back(ro), reg_raw.push_back(rr), dereg_ours.push_back(dro), dereg_raw.push_back(drr);
      reg_ratio.push_back(ro / rr), dereg_ratio.push_back(dro / drr), both_ratio.push_back((ro + dro) / (rr + drr));
    }
    ::munmap(p, size);
    std::printf("%8s %14.1f %14.1f %8.2f %14.1f %14.1f %8.2f\n", size_name(size).c_str(), median(reg_ours),
                median(reg_raw), median(reg_ratio), median(dereg_ours), median(dereg_raw), median(dereg_ratio));
    std::fflush(stdout);
    char line[64];
    std::snprintf(line, sizeof line, "paired reg_%s %.2f", size_name(size).c_str(), median(both_ratio));
    lines.emplace_back(line);
  }
  for (const std::string& l : lines) std::printf("%s\n", l.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "verbs_regcost: %s\n", e.what());
  return 1;
}
