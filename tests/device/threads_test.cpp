// Threads: libibverbs makes each verb thread safe per object, so threads that share a device and
// a protection domain, each with its own QPs and CQs, must not disturb each other, and neither
// may registration on the shared PD. Suites named *Threads are also labelled "threads", which
// scripts/test runs under ThreadSanitizer (tests/CMakeLists.txt).
#include <atomic>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::WcOpcode;

class CoreThreads : public DeviceTest {};

/// One poster: its own connected pair (created in its thread), writes with immediate data from
/// a to b and sends back from b to a, each completion polled by this thread on its own CQs, and
/// every byte checked.
void post_and_poll(const verbs::Device& dev, const verbs::ProtectionDomain& pd, unsigned seed, int rounds,
                   std::atomic<int>& done) {
  QpPair p(dev, pd, {.max_send_wr = 16, .max_recv_wr = 16, .access = all_access}, QpPair::fast(), {.depth = 64});
  auto src = verbs::MemoryRegion::allocate(pd, 4096, all_access);
  auto dst = verbs::MemoryRegion::allocate(pd, 4096, all_access);
  for (int i = 0; i < rounds; ++i) {
    const auto id = static_cast<std::uint64_t>(i);
    fill_pattern(src.bytes(), seed * 1000 + static_cast<unsigned>(i));
    const std::size_t len = 64 + static_cast<std::size_t>(i % 16) * 200;
    if (!posted(p.b.post_recv(std::span<const verbs::LocalSlice>{}, id))) return ADD_FAILURE() << "post_recv " << i;
    if (auto r = posted(p.a.post_write_imm(src.slice(0, len), dst.remote(), static_cast<std::uint32_t>(i),
                                          {.wr_id = id}));
        !r)
      return ADD_FAILURE() << "post_write_imm " << i << ": " << r.message();
    if (!completed(expect_completion(p.cq_b), WcOpcode::recv_rdma_with_imm, id)) return ADD_FAILURE() << "round " << i;
    if (!completed(expect_completion(p.cq_a), WcOpcode::rdma_write, id)) return ADD_FAILURE() << "round " << i;
    if (auto r = same_bytes(dst.bytes().first(len), src.bytes().first(len)); !r)
      return ADD_FAILURE() << "round " << i << ": " << r.message();

    // And back: a send from b into a receive on a.
    if (!posted(p.a.post_recv(src.slice(2048, 256), id))) return ADD_FAILURE() << "post_recv a " << i;
    if (!posted(p.b.post_send(dst.slice(0, 100), {.wr_id = id}))) return ADD_FAILURE() << "post_send b " << i;
    if (!completed(expect_completion(p.cq_b), WcOpcode::send, id)) return ADD_FAILURE() << "send round " << i;
    if (!completed(expect_completion(p.cq_a), WcOpcode::recv, id)) return ADD_FAILURE() << "recv round " << i;
  }
  done.fetch_add(1);
}

TEST_F(CoreThreads, TwoPostersAndARegistrarShareOneDeviceAndPd) {
  constexpr int kRounds = 500;
  std::atomic<int> posters_done{0};
  std::atomic<bool> stop{false};
  std::atomic<int> registered{0};

  // The registrar: regions of varying sizes made and destroyed on the shared PD, some kept a
  // while, so registration and deregistration overlap the posters' traffic.
  std::thread registrar([&] {
    std::vector<verbs::MemoryRegion> kept;
    for (std::size_t k = 0; !stop.load(); ++k) {
      try {
        kept.push_back(verbs::MemoryRegion::allocate(*pd, 4096 * (1 + k % 8), all_access));
        if (kept.size() > 4) kept.erase(kept.begin());
        registered.fetch_add(1);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "registration " << k << ": " << e.what();
        return;
      }
    }
  });
  // An exception must not leave a thread (std::terminate): it becomes the test's failure.
  const auto poster = [&](unsigned seed) {
    try {
      post_and_poll(*dev, *pd, seed, kRounds, posters_done);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "poster " << seed << ": " << e.what();
    }
  };
  std::thread first(poster, 1u);
  std::thread second(poster, 2u);
  first.join();
  second.join();
  stop.store(true);
  registrar.join();

  EXPECT_EQ(posters_done.load(), 2) << "a poster stopped early (see its failure above)";
  EXPECT_GT(registered.load(), 0) << "the registrar never registered a region while the posters ran";
}

// libibverbs lets ibv_query_qp and ibv_post_send run on one QP from two threads at once, and
// query_state() only reads the device's view (refresh_state() is the one that changes what posts
// read): a monitoring thread may query a QP while another posts on it (docs/threads.md).
TEST_F(CoreThreads, QueryStateWhileAnotherThreadPosts) {
  QpPair p(*dev, *pd, {.max_send_wr = 16, .access = all_access}, QpPair::fast(), {.depth = 64});
  auto src = verbs::MemoryRegion::allocate(*pd, 4096, all_access);
  auto dst = verbs::MemoryRegion::allocate(*pd, 4096, all_access);
  std::atomic<bool> stop{false};
  std::atomic<int> queries{0};
  std::thread monitor([&] {
    try {
      while (!stop.load()) {
        EXPECT_EQ(p.a.query_state(), verbs::QpState::rts);
        queries.fetch_add(1);
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "query_state: " << e.what();
    }
  });
  for (int i = 0; i < 300; ++i) {
    const auto id = static_cast<std::uint64_t>(i);
    if (auto r = posted(p.a.post_write(src.slice(0, 256), dst.remote(), {.wr_id = id})); !r) {
      ADD_FAILURE() << "write " << i << ": " << r.message();
      break;
    }
    if (!completed(expect_completion(p.cq_a), WcOpcode::rdma_write, id)) break;
  }
  stop.store(true);
  monitor.join();
  EXPECT_GT(queries.load(), 0) << "the monitor never queried while the writes ran";
}

}  // namespace
