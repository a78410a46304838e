// The cycle counter perftest times with (rdtsc on x86-64), calibrated against steady_clock.
// Elsewhere, steady_clock's nanoseconds stand in for cycles.
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define VERBS_PERF_RDTSC 1
#endif

namespace perf {

class Ticks {
 public:
  /// The counter, as cheap as it gets: one rdtsc.
  static std::uint64_t now() noexcept {
#ifdef VERBS_PERF_RDTSC
    return __rdtsc();
#else
    return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
  }

  /// Counter ticks per microsecond. perftest regresses rdtsc on gettimeofday over about 20 ms
  /// at start; here the counter is compared with steady_clock from the program's start (start())
  /// to now, a much longer baseline (at least 50 ms: waits for it if asked sooner).
  static double per_us() noexcept {
#ifdef VERBS_PERF_RDTSC
    const Origin& o = origin();
    for (;;) {
      const auto t = std::chrono::steady_clock::now();
      const std::uint64_t c = now();
      const double us = std::chrono::duration<double, std::micro>(t - o.time).count();
      if (us >= 50'000) return static_cast<double>(c - o.ticks) / us;
    }
#else
    return 1000.0;
#endif
  }
  /// Takes the calibration's starting point; call early.
  static void start() noexcept { (void)origin(); }
  static const char* name() noexcept {
#ifdef VERBS_PERF_RDTSC
    return "rdtsc";
#else
    return "steady_clock";
#endif
  }

 private:
  struct Origin {
    std::chrono::steady_clock::time_point time = std::chrono::steady_clock::now();
    std::uint64_t ticks = now();
  };
  static const Origin& origin() noexcept {
    static const Origin o;
    return o;
  }
};

/// Gives up when the peer has been silent too long: checked only on empty polls, and then only
/// every 1024th time, so the cost on the data path is one counter and a branch.
class Watchdog {
 public:
  Watchdog(std::chrono::seconds limit, double ticks_per_us) noexcept
      : limit_(static_cast<std::uint64_t>(static_cast<double>(limit.count()) * 1e6 * ticks_per_us)) {
    progress();
  }
  void progress() noexcept {
    since_ = 0;
    spins_ = 0;
  }
  /// True once `limit` passed without progress().
  bool starved() noexcept {
    if ((++spins_ & 1023u) != 0) return false;
    const std::uint64_t t = Ticks::now();
    if (since_ == 0) since_ = t;  // the silence starts at the first check after progress
    return t - since_ > limit_;
  }

 private:
  std::uint64_t limit_;
  std::uint64_t since_ = 0;
  std::uint32_t spins_ = 0;
};

}  // namespace perf
