// CompletionQueue: polling, waiting with and without a completion channel, and the
// req_notify + poll(fd) + consume_events flow of an event loop.
#include <fcntl.h>
#include <poll.h>

#include <array>
#include <thread>
#include <type_traits>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::Completion;
using verbs::Errc;
using verbs::WcOpcode;

static_assert(std::is_nothrow_move_constructible_v<verbs::CompletionQueue> &&
              std::is_nothrow_move_assignable_v<verbs::CompletionQueue>);
static_assert(std::is_nothrow_swappable_v<verbs::CompletionQueue>);
static_assert(!std::is_copy_constructible_v<verbs::CompletionQueue>);

class CompletionQueue : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    src.emplace(verbs::MemoryRegion::allocate(*pd, 4096, all_access));
    dst.emplace(verbs::MemoryRegion::allocate(*pd, 4096, all_access));
    fill_pattern(src->bytes(), 1);
  }
  /// A connected pair whose CQs have completion channels.
  QpPair channel_pair() {
    return QpPair(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 64, .with_channel = true});
  }

  std::optional<verbs::MemoryRegion> src, dst;
};

/// Polls (never arms the channel) until one completion arrives or `timeout` passes.
std::optional<Completion> poll_only(const verbs::CompletionQueue& cq, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  do {
    if (auto c = cq.poll_one()) return c;
  } while (std::chrono::steady_clock::now() < deadline);
  return std::nullopt;
}

/// poll(2) on one fd; returns poll's result.
int wait_readable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count()));
}

TEST_F(CompletionQueue, DepthIsAtLeastWhatWasAsked) {
  const verbs::CompletionQueue cq(*dev, {.depth = 16});
  EXPECT_GE(cq.capacity(), 16);
  EXPECT_FALSE(cq.has_channel());
}

TEST_F(CompletionQueue, DepthOverTheDeviceMaximumThrowsEinval) {
  const int too_deep = dev->attributes().orig_attr.max_cqe + 1;
  const auto e = thrown_error([&] { verbs::CompletionQueue cq(*dev, {.depth = too_deep}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::make_error_code(std::errc::invalid_argument));
  EXPECT_EQ(e->context(), "ibv_create_cq");
}

TEST_F(CompletionQueue, PollOnAnEmptyQueueReturnsNothing) {
  verbs::CompletionQueue cq(*dev);
  std::array<Completion, 4> out;
  EXPECT_TRUE(cq.poll(out).empty());
  std::error_code ec = make_error_code(Errc::timed_out);
  EXPECT_TRUE(cq.poll(out, ec).empty());
  EXPECT_FALSE(ec) << "an empty poll is not an error";
  EXPECT_FALSE(cq.poll_one());
}

TEST_F(CompletionQueue, WithoutChannelFdIsMinusOneAndReqNotifyIsRefused) {
  verbs::CompletionQueue cq(*dev);
  EXPECT_EQ(cq.fd(), -1);
  const auto e = thrown_error([&] { cq.req_notify(); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), make_error_code(Errc::bad_argument));
  EXPECT_TRUE(contains(e->what(), "with_channel"));
  EXPECT_EQ(cq.consume_events(), 0);
}

TEST_F(CompletionQueue, ChannelFdIsValidAndNonBlocking) {
  const verbs::CompletionQueue cq(*dev, {.with_channel = true});
  EXPECT_TRUE(cq.has_channel());
  ASSERT_GE(cq.fd(), 0);
  const int flags = ::fcntl(cq.fd(), F_GETFL);
  ASSERT_NE(flags, -1) << "fd() is not an open descriptor";
  EXPECT_NE(flags & O_NONBLOCK, 0);
  EXPECT_EQ(wait_readable(cq.fd(), 0ms), 0) << "no event before anything happened";
}

TEST_F(CompletionQueue, PollReturnsCompletionsInPostOrder) {
  QpPair p(*dev, *pd, {.access = all_access});
  for (std::uint64_t id = 1; id <= 5; ++id)
    ASSERT_TRUE(posted(p.a.post_write(src->slice(id * 100, 100), dst->remote().slice(id * 100), {.wr_id = id})));
  const auto got = collect(p.cq_a, 5);
  ASSERT_EQ(got.size(), 5u);
  for (std::uint64_t id = 1; id <= 5; ++id) EXPECT_TRUE(completed(got[id - 1], WcOpcode::rdma_write, id));
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(100, 500), src->bytes().subspan(100, 500)));
  EXPECT_FALSE(p.cq_a.poll_one());
}

TEST_F(CompletionQueue, WaitWithChannelSleepsUntilTheCompletion) {
  QpPair p = channel_pair();
  const auto start = std::chrono::steady_clock::now();
  std::thread poster([&] {
    std::this_thread::sleep_for(200ms);
    EXPECT_TRUE(posted(p.a.post_write(src->slice(0, 512), dst->remote(), {.wr_id = 31})));
  });
  std::array<Completion, 4> out;
  const auto got = p.cq_a.wait(out, 10s);
  const auto took = std::chrono::steady_clock::now() - start;
  poster.join();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(completed(got[0], WcOpcode::rdma_write, 31));
  EXPECT_GE(took, 200ms) << "wait returned before anything was posted";
  EXPECT_LT(took, 5s);
  EXPECT_TRUE(same_bytes(dst->bytes().first(512), src->bytes().first(512)));
}

TEST_F(CompletionQueue, WaitWithChannelAndNothingPostedTimesOutEmpty) {
  QpPair p = channel_pair();
  std::array<Completion, 4> out;
  const auto start = std::chrono::steady_clock::now();
  const auto got = p.cq_a.wait(out, 500ms);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(got.empty());
  EXPECT_GE(took, 500ms);
  EXPECT_LT(took, 2500ms);
  EXPECT_FALSE(p.cq_a.wait_one(0ms));
}

TEST_F(CompletionQueue, WaitWithoutChannelBusyPollsAndTimesOutEmpty) {
  verbs::CompletionQueue cq(*dev);
  const auto start = std::chrono::steady_clock::now();
  const auto got = cq.wait_one(300ms);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(got);
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 2300ms);
}

TEST_F(CompletionQueue, ReqNotifyPollFdAndConsumeEventsDeliverEachCompletionOnce) {
  QpPair p = channel_pair();
  const verbs::CompletionQueue& cq = p.cq_a;
  cq.req_notify();
  EXPECT_EQ(wait_readable(cq.fd(), 0ms), 0);

  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 256), dst->remote(), {.wr_id = 41})));
  ASSERT_EQ(wait_readable(cq.fd(), 10s), 1) << "no channel event within 10 s";
  EXPECT_EQ(cq.consume_events(), 1);
  const auto c = cq.poll_one();
  ASSERT_TRUE(c);
  EXPECT_TRUE(completed(*c, WcOpcode::rdma_write, 41));
  EXPECT_EQ(wait_readable(cq.fd(), 0ms), 0) << "the event was consumed";
  EXPECT_EQ(cq.consume_events(), 0);

  // Re-armed and idle: no spurious event.
  cq.req_notify();
  EXPECT_EQ(wait_readable(cq.fd(), 200ms), 0);

  ASSERT_TRUE(posted(p.a.post_write(src->slice(256, 256), dst->remote().slice(256), {.wr_id = 42})));
  ASSERT_EQ(wait_readable(cq.fd(), 10s), 1);
  EXPECT_EQ(cq.consume_events(), 1);
  const auto c2 = cq.poll_one();
  ASSERT_TRUE(c2);
  EXPECT_TRUE(completed(*c2, WcOpcode::rdma_write, 42));
  EXPECT_TRUE(same_bytes(dst->bytes().first(512), src->bytes().first(512)));

  // Not re-armed: a completion raises no event, but can still be polled.
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = 43})));
  const auto c3 = poll_only(cq, 10s);
  ASSERT_TRUE(c3);
  EXPECT_TRUE(completed(*c3, WcOpcode::rdma_write, 43));
  EXPECT_EQ(wait_readable(cq.fd(), 100ms), 0);
}

TEST_F(CompletionQueue, SolicitedOnlyArmingWakesOnlyForSolicitedSends) {
  QpPair p = channel_pair();
  const verbs::CompletionQueue& rcq = p.cq_b;
  for (std::uint64_t id = 1; id <= 2; ++id) ASSERT_TRUE(posted(p.b.post_recv(dst->slice(id * 1024, 1024), id)));
  rcq.req_notify(true);

  ASSERT_TRUE(posted(p.a.post_send(src->slice(0, 100), {.wr_id = 51})));
  const auto plain = poll_only(rcq, 10s);
  ASSERT_TRUE(plain);
  EXPECT_TRUE(completed(*plain, WcOpcode::recv, 1));
  EXPECT_EQ(wait_readable(rcq.fd(), 200ms), 0) << "an unsolicited send woke a solicited-only waiter";

  ASSERT_TRUE(posted(p.a.post_send(src->slice(100, 100), {.wr_id = 52, .solicited = true})));
  ASSERT_EQ(wait_readable(rcq.fd(), 10s), 1) << "a solicited send raised no event";
  EXPECT_EQ(rcq.consume_events(), 1);
  const auto solicited = rcq.poll_one();
  ASSERT_TRUE(solicited);
  EXPECT_TRUE(completed(*solicited, WcOpcode::recv, 2));
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(1024, 100), src->bytes().first(100)));
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(2048, 100), src->bytes().subspan(100, 100)));
  EXPECT_EQ(collect(p.cq_a, 2).size(), 2u);
}

}  // namespace
