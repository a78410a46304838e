// The data path (post and poll) must not allocate or throw. The throwing side is a compile-time
// property (noexcept); allocation is counted at run time by replacing the global operator new,
// which every C++ allocation in the library would go through (replaced_new.cpp).
#include "fixture.hpp"
#include "replaced_new.hpp"

namespace verbs::test {
namespace {

// Every posting call, and polling with an error_code, is noexcept.
static_assert(noexcept(std::declval<QueuePair&>().post(std::declval<SendWr>())));
static_assert(noexcept(std::declval<QueuePair&>().post(std::declval<std::span<SendWr>>())));
static_assert(noexcept(std::declval<QueuePair&>().post_write(LocalSlice{}, RemoteSlice{})));
static_assert(noexcept(std::declval<QueuePair&>().post_read(LocalSlice{}, RemoteSlice{})));
static_assert(noexcept(std::declval<QueuePair&>().post_send(LocalSlice{})));
static_assert(noexcept(std::declval<QueuePair&>().post_fetch_add(LocalSlice{}, RemoteSlice{}, 1)));
static_assert(noexcept(std::declval<QueuePair&>().post_recv(LocalSlice{})));
static_assert(noexcept(std::declval<SharedReceiveQueue&>().post_recv(LocalSlice{})));
static_assert(noexcept(SendWr::write(LocalSlice{}, RemoteSlice{})));
static_assert(noexcept(std::declval<CompletionQueue&>().poll(std::span<Completion>{},
                                                              std::declval<std::error_code&>())));

class DataPath : public DeviceTest {};

TEST_F(DataPath, PostAndPollDoNotAllocate) {
  QpPair qps(*dev, *pd, {.access = Access::remote_write});
  auto src = MemoryRegion::allocate(*pd, 4096, Access::local_write);
  auto dst = MemoryRegion::allocate(*pd, 4096, Access::local_write | Access::remote_write);
  const LocalSlice from = src.slice(0, 64);
  const RemoteSlice to = dst.remote().slice(0, 64);
  std::array<Completion, 16> wcs;
  std::array<SendWr, 4> chain{SendWr::write(from, to, {.signaled = false}), SendWr::write(from, to, {.signaled = false}),
                              SendWr::write(from, to, {.signaled = false}), SendWr::write(from, to, {.wr_id = 9})};

  constexpr int rounds = 50;
  int completions = 0;
  std::error_code ec;
  replaced_new::count = 0;
  replaced_new::counting = true;
  for (int i = 0; i < rounds; ++i) {
    const bool posted = qps.a.post_write(from, to, {.wr_id = static_cast<std::uint64_t>(i)}).ok() &&
                        qps.a.post(chain).ok() && qps.b.post_recv(dst.slice(64, 64), 1).ok();
    if (!posted) break;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    int want = 2;
    while (want > 0 && std::chrono::steady_clock::now() < deadline) {
      const auto got = qps.cq_a.poll(wcs, ec);
      for (const Completion& c : got) completions += c.ok() ? 1 : 0;
      want -= static_cast<int>(got.size());
    }
  }
  replaced_new::counting = false;
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(completions, 2 * rounds);
  EXPECT_EQ(replaced_new::count.load(), 0) << "operator new called on the data path";
}

}  // namespace
}  // namespace verbs::test
