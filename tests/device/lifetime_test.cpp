// Lifetimes: every object keeps what it needs alive, so any teardown order is safe, and a QP
// keeps working after the variables of its device, PD and CQs are gone.
#include <dirent.h>

#include <algorithm>
#include <array>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::WcOpcode;

/// Open file descriptors of this process; a leaked device context or channel keeps some open.
int open_fds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
  ::closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

/// Polls a CQ through its C handle (its wrapper may be gone) until the completion with
/// `wr_id` arrives; other completions are skipped. Empty after `timeout`.
std::optional<ibv_wc> poll_raw(ibv_cq* cq, std::uint64_t wr_id, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc{};
    const int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) return std::nullopt;
    if (n == 1 && wc.wr_id == wr_id) return wc;
  }
  return std::nullopt;
}

/// One of everything, in use: a connected RC pair (b receives from an SRQ), two regions, a CQ
/// with a channel and an address handle, each held so the test can destroy it at any moment.
struct World {
  std::optional<verbs::Device> device;
  std::optional<verbs::ProtectionDomain> pd;
  std::optional<verbs::MemoryRegion> src, dst;
  std::optional<verbs::CompletionQueue> cq;
  std::optional<verbs::SharedReceiveQueue> srq;
  std::optional<verbs::QueuePair> qa, qb;
  std::optional<verbs::AddressHandle> ah;
  ibv_cq* raw_cq = nullptr;
  std::uint64_t next_id = 1000;

  static constexpr std::size_t kObjects = 9;
  static constexpr std::array<const char*, kObjects> names{"Device", "ProtectionDomain", "MemoryRegion src",
                                                           "MemoryRegion dst", "CompletionQueue", "SharedReceiveQueue",
                                                           "QueuePair a", "QueuePair b", "AddressHandle"};

  explicit World(const std::string& device_name) {
    device.emplace(verbs::Device::open(device_name));
    pd.emplace(*device);
    src.emplace(verbs::MemoryRegion::allocate(*pd, 8192, all_access));
    dst.emplace(verbs::MemoryRegion::allocate(*pd, 8192, all_access));
    cq.emplace(*device, verbs::CqOptions{.depth = 64, .with_channel = true});
    srq.emplace(*pd, verbs::SrqOptions{.max_wr = 16});
    qa.emplace(*pd, *cq, verbs::QpOptions{.access = all_access});
    qb.emplace(*pd, *cq, verbs::QpOptions{.srq = &*srq, .access = all_access});
    qa->connect(qb->endpoint(), QpPair::fast());
    qb->connect(qa->endpoint(), QpPair::fast());
    ah.emplace(*pd, verbs::AhOptions{.dgid = qb->endpoint().gid, .dlid = qb->endpoint().lid,
                                     .sgid_index = static_cast<std::uint8_t>(qa->gid_index())});
    raw_cq = cq->native_handle();
    fill_pattern(src->bytes(), 5);

    // Put everything to use: a send into the SRQ and a write, both completed; then leave a
    // receive posted and a write in flight for the teardown to cope with.
    EXPECT_TRUE(posted(srq->post_recv(dst->slice(4096, 1024), 1)));
    EXPECT_TRUE(posted(srq->post_recv(dst->slice(5120, 1024), 2)));
    EXPECT_TRUE(posted(qa->post_send(src->slice(0, 100), {.wr_id = 3})));
    EXPECT_TRUE(write_works());
    EXPECT_TRUE(posted(qa->post_write(src->slice(0, 4096), dst->remote(), {.wr_id = 4})));
  }

  /// Writes a fresh pattern from src to dst through qa, waits for it on the raw CQ handle and
  /// compares the bytes.
  ::testing::AssertionResult write_works() {
    const std::uint64_t id = next_id++;
    fill_pattern(src->bytes().first(512), static_cast<unsigned>(id));
    if (auto r = posted(qa->post_write(src->slice(0, 512), dst->remote().slice(2048), {.wr_id = id})); !r) return r;
    const auto wc = poll_raw(raw_cq, id, 10s);
    if (!wc) return ::testing::AssertionFailure() << "write " << id << " did not complete within 10 s";
    if (wc->status != IBV_WC_SUCCESS)
      return ::testing::AssertionFailure() << "write " << id << ": " << ibv_wc_status_str(wc->status);
    return same_bytes(dst->bytes().subspan(2048, 512), src->bytes().first(512));
  }

  void destroy(std::size_t which) {
    switch (which) {
      case 0: device.reset(); break;
      case 1: pd.reset(); break;
      case 2: src.reset(); break;
      case 3: dst.reset(); break;
      case 4: cq.reset(); break;
      case 5: srq.reset(); break;
      case 6: qa.reset(); break;
      case 7: qb.reset(); break;
      case 8: ah.reset(); break;
      default: ADD_FAILURE() << "no object " << which;
    }
  }

  /// What is still held must still work.
  void check_survivors() {
    if (qa && qb && src && dst) { EXPECT_TRUE(write_works()); }
    if (pd) { EXPECT_NO_THROW((void)verbs::MemoryRegion::allocate(*pd, 4096, verbs::Access::local_write)); }
    if (device) { EXPECT_NO_THROW(verbs::ProtectionDomain another(*device)); }
    if (cq) { EXPECT_NO_THROW((void)cq->poll_one()); }
    if (srq) { EXPECT_NO_THROW((void)srq->limit()); }
  }
};

class Lifetime : public DeviceTest {
 protected:
  /// Builds a World, destroys its objects in `order`, checking the survivors after each step,
  /// and checks that every descriptor the World opened is closed again.
  void teardown_in(const std::vector<std::size_t>& order) {
    ASSERT_EQ(order.size(), World::kObjects);
    { World warm_up(dev->name()); }  // the first use of a device may open descriptors for good
    const int before = open_fds();
    {
      World w(dev->name());
      EXPECT_GT(open_fds(), before) << "the World opened no descriptor, so the leak check below proves nothing";
      std::string done;
      for (const std::size_t i : order) {
        done += done.empty() ? "" : ", ";
        done += World::names[i];
        SCOPED_TRACE("destroyed so far: " + done);
        w.destroy(i);
        w.check_survivors();
        if (HasFatalFailure()) return;
      }
    }
    EXPECT_EQ(open_fds(), before) << "descriptors leaked: some object (or the device context) was never destroyed";
  }
};

class RandomTeardown : public Lifetime, public ::testing::WithParamInterface<unsigned> {};

TEST_F(Lifetime, ReverseOrderTeardownNeverFails) {
  std::vector<std::size_t> order(World::kObjects);
  std::iota(order.rbegin(), order.rend(), std::size_t{0});
  teardown_in(order);
}

TEST_F(Lifetime, CreationOrderTeardownParentsFirstNeverFails) {
  std::vector<std::size_t> order(World::kObjects);
  std::iota(order.begin(), order.end(), std::size_t{0});
  teardown_in(order);
}

TEST_P(RandomTeardown, AnyOrderNeverFailsAndReleasesEverything) {
  std::vector<std::size_t> order(World::kObjects);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 gen(GetParam());
  std::shuffle(order.begin(), order.end(), gen);
  std::string text;
  for (const std::size_t i : order) text += std::string(text.empty() ? "" : ", ") + World::names[i];
  SCOPED_TRACE("order: " + text);
  teardown_in(order);
}

INSTANTIATE_TEST_SUITE_P(Lifetime, RandomTeardown, ::testing::Range(1u, 7u),
                         [](const auto& seed) { return "seed" + std::to_string(seed.param); });

// The CQ (with its completion channel) last: it then holds the last reference to the device
// context, and the channel must be destroyed before the context is closed (ibv_destroy_comp_channel
// locks the context's mutex). Reading freed memory inside libibverbs is invisible to ASan; the
// valgrind.lifetime test runs this under memcheck.
TEST_F(Lifetime, CompletionQueueWithAChannelLastReleasesTheContextLast) {
  std::vector<std::size_t> order{8, 7, 6, 5, 3, 2, 1, 0, 4};
  ASSERT_STREQ(World::names[order.back()], "CompletionQueue");
  teardown_in(order);
}

// Each object in turn destroyed last, the rest in reverse order: whatever is last holds the last
// reference to the device context, so its deleter runs ibv_close_device (the CQ last, above, is
// issue 10's item 1; valgrind.lifetime runs these under memcheck too).
class LastOwner : public Lifetime, public ::testing::WithParamInterface<std::size_t> {};

TEST_P(LastOwner, TearsDownCleanlyWhenDestroyedLast) {
  std::vector<std::size_t> order;
  for (std::size_t i = World::kObjects; i-- > 0;)
    if (i != GetParam()) order.push_back(i);
  order.push_back(GetParam());
  teardown_in(order);
}

INSTANTIATE_TEST_SUITE_P(Lifetime, LastOwner, ::testing::Range(std::size_t{0}, World::kObjects),
                         [](const auto& last) {
                           std::string name = World::names[last.param];
                           std::erase(name, ' ');
                           return name + "Last";
                         });

TEST_F(Lifetime, QueuePairOutlivesTheVariablesOfItsDevicePdAndCqs) {
  std::optional<verbs::Device> device(verbs::Device::open(dev->name()));
  std::optional<verbs::ProtectionDomain> own_pd(std::in_place, *device);
  std::optional<verbs::CompletionQueue> cq_a(std::in_place, *device), cq_b(std::in_place, *device);
  const verbs::MemoryRegion src = verbs::MemoryRegion::allocate(*own_pd, 8192, all_access);
  const verbs::MemoryRegion dst = verbs::MemoryRegion::allocate(*own_pd, 8192, all_access);
  verbs::QueuePair a(*own_pd, *cq_a, {.access = all_access});
  verbs::QueuePair b(*own_pd, *cq_b, {.access = all_access});
  a.connect(b.endpoint(), QpPair::fast());
  b.connect(a.endpoint(), QpPair::fast());
  ibv_cq* const raw_a = cq_a->native_handle();
  ibv_cq* const raw_b = cq_b->native_handle();

  cq_a.reset();
  cq_b.reset();
  own_pd.reset();
  device.reset();

  fill_pattern(src.bytes(), 6);
  ASSERT_TRUE(posted(a.post_write(src.slice(0, 3000), dst.remote().slice(100), {.wr_id = 1})));
  const auto wc = poll_raw(raw_a, 1, 10s);
  ASSERT_TRUE(wc) << "no completion within 10 s";
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc->status);
  EXPECT_EQ(wc->opcode, IBV_WC_RDMA_WRITE);
  EXPECT_TRUE(same_bytes(dst.bytes().subspan(100, 3000), src.bytes().first(3000)));

  ASSERT_TRUE(posted(b.post_recv(dst.slice(4096, 1024), 2)));
  ASSERT_TRUE(posted(a.post_send(src.slice(5000, 777), {.wr_id = 3})));
  const auto recv = poll_raw(raw_b, 2, 10s);
  ASSERT_TRUE(recv) << "no receive completion within 10 s";
  EXPECT_EQ(recv->status, IBV_WC_SUCCESS) << ibv_wc_status_str(recv->status);
  EXPECT_EQ(recv->byte_len, 777u);
  EXPECT_TRUE(same_bytes(dst.bytes().subspan(4096, 777), src.bytes().subspan(5000, 777)));
  const auto sent = poll_raw(raw_a, 3, 10s);
  ASSERT_TRUE(sent);
  EXPECT_EQ(sent->status, IBV_WC_SUCCESS);
}

TEST_F(Lifetime, MovedFromObjectsAreEmptyAndHarmless) {
  World w(dev->name());
  std::optional<verbs::QueuePair> qa(std::move(*w.qa)), qb(std::move(*w.qb));
  std::optional<verbs::MemoryRegion> src(std::move(*w.src)), dst(std::move(*w.dst));
  std::optional<verbs::CompletionQueue> cq(std::move(*w.cq));
  std::optional<verbs::AddressHandle> ah(std::move(*w.ah));
  std::optional<verbs::ProtectionDomain> pd2(std::move(*w.pd));
  EXPECT_EQ(w.qa->native_handle(), nullptr);
  EXPECT_EQ(w.src->native_handle(), nullptr);
  EXPECT_EQ(w.cq->native_handle(), nullptr);
  EXPECT_EQ(w.ah->native_handle(), nullptr);
  EXPECT_EQ(w.pd->native_handle(), nullptr);
  // Every moved-from object refuses with Errc::empty_object, rather than handing null to the device.
  const auto empty = [](const auto& call) {
    try {
      call();
    } catch (const verbs::Error& e) {
      return e.code() == verbs::Errc::empty_object;
    }
    return false;
  };
  EXPECT_EQ(w.src->size(), 0u);
  EXPECT_EQ(w.src->data(), nullptr);
  EXPECT_EQ(w.src->remote(), verbs::RemoteSlice{});
  EXPECT_TRUE(empty([&] { (void)w.src->slice(0, 8); }));
  EXPECT_TRUE(empty([&] { (void)verbs::MemoryRegion::allocate(*w.pd, 64); }));
  EXPECT_TRUE(empty([&] { verbs::SharedReceiveQueue s(*w.pd); }));
  EXPECT_TRUE(empty([&] { verbs::QueuePair q(*pd2, *w.cq); }));
  EXPECT_TRUE(empty([&] { (void)w.qa->query_state(); }));
  EXPECT_EQ(w.qa->post_write(src->slice(0, 8), dst->remote()).error(), verbs::Errc::empty_object);
  std::optional<verbs::SharedReceiveQueue> srq(std::move(*w.srq));
  EXPECT_EQ(w.srq->post_recv(dst->slice(0, 8)).error(), verbs::Errc::empty_object);
  EXPECT_EQ(verbs::SendWr::send(src->slice(0, 8)).to(*w.ah, 1, 1).error(), verbs::Errc::empty_object);
  std::error_code ec;
  EXPECT_TRUE(w.cq->poll(std::span<verbs::Completion>{}, ec).empty());
  EXPECT_EQ(ec, verbs::Errc::empty_object);
  w.srq.swap(srq);
  // Destroy the moved-from shells first; the moved-to objects must be untouched.
  for (std::size_t i = 0; i < World::kObjects; ++i)
    if (i != 0 && i != 5) w.destroy(i);
  w.qa.swap(qa);
  w.qb.swap(qb);
  w.src.swap(src);
  w.dst.swap(dst);
  EXPECT_TRUE(w.write_works());
}

}  // namespace
