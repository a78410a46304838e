// A peer for the cm tests, run as a separate process: connects to ADDR PORT and then idles
// until killed (or 60 s pass).
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <verbs/cm.hpp>

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::fprintf(stderr, "usage: verbs_cm_peer ADDR PORT\n");
    return 2;
  }
  verbs::cm::Connection c =
      verbs::cm::connect(argv[1], static_cast<std::uint16_t>(std::atoi(argv[2])), {.timeout = std::chrono::seconds(20)});
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "verbs_cm_peer: %s\n", e.what());
  return 1;
}
