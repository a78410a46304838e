// verbs::rails when memory runs out: what a completion accounts for (its chunk, its transfer, its
// rail) must not hang on the allocation of the text that says why it failed. Its tests make
// every allocation of their thread fail (replaced_new.hpp), so a ThreadSanitizer build leaves
// the file out (tests/CMakeLists.txt), as it does data_path_test.cpp.
#include <chrono>
#include <new>
#include <thread>

#include "rails_fixture.hpp"
#include "replaced_new.hpp"

namespace verbs::test {
namespace {

using replaced_new::NoMemory;

class RailsAllocation : public CmFixture {};

TEST_F(RailsAllocation, ARefusedChunkIsAccountedForWhenNoMemoryIsLeftToSayWhy) {
  // A read the target refuses, on one rail of 2 QPs (4 chunks in flight): its failed completions
  // are polled while this thread can allocate nothing. Each must still be counted (its chunk,
  // its transfer, its rail taken down); only the text of why may be lost. Before, the first
  // failed completion threw while its text was made, after its QP's count went down and before
  // its transfer's: the transfer never ended, and the rest of the CQ batch was lost.
  std::vector<std::byte> remote(1 << 20), back(1 << 20);
  LyingTarget target(remote);
  Group g = Group::connect(options_for(target.port(), 1, 2), 30s);
  const rails::Region dst = g.register_memory(back);
  const std::uint64_t r = g.read(dst, 0, 0, 256 << 10);
  int threw = 0;
  {
    const NoMemory none;
    // Until the refusal took the rail down (it goes down only once a failed completion was
    // handled), or 10 s.
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (g.live_rails() > 0 && std::chrono::steady_clock::now() < deadline) {
      try {
        g.progress();
      } catch (const std::bad_alloc&) {
        ++threw;
      }
      std::this_thread::sleep_for(5ms);
    }
  }
  EXPECT_EQ(g.live_rails(), 0u) << "the refusal was not handled while no memory was left (progress() threw "
                                << threw << " times)";
  const auto rc = finish(g, r, 20s);
  EXPECT_FALSE(rc.ok());
  EXPECT_TRUE(rc.error == WcStatus::rem_access_err || rc.error == WcStatus::rem_inv_req_err) << rc.error << " " << rc.what;
  // Memory again: the rail comes back, and carries a write.
  std::vector<std::byte> local(1 << 20);
  fill_pattern(local, 3);
  const rails::Region src = g.register_memory(local);
  const auto w = finish(g, g.write(src, 0, 0, local.size()));
  EXPECT_TRUE(w.ok()) << w.what;
  EXPECT_TRUE(same_bytes(remote, local));
}

}  // namespace
}  // namespace verbs::test
