// CompletionChannel: one channel for many CQs; reading it says which CQ fired; its
// acknowledgements are batched, and destroying a CQ never waits for them; CQs keep it alive.
#include <poll.h>

#include <future>
#include <thread>
#include <type_traits>

#include <verbs/completion_channel.hpp>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::Completion;
using verbs::CqEvent;
using verbs::Errc;
using verbs::WcOpcode;

static_assert(std::is_nothrow_move_constructible_v<verbs::CompletionChannel> &&
              std::is_nothrow_move_assignable_v<verbs::CompletionChannel>);
static_assert(std::is_nothrow_swappable_v<verbs::CompletionChannel>);
static_assert(!std::is_copy_constructible_v<verbs::CompletionChannel>);

/// Busy-polls `cq` for `n` completions (its own wait() is refused on a shared channel).
std::vector<Completion> collect_polling(const verbs::CompletionQueue& cq, std::size_t n) {
  std::vector<Completion> out;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (out.size() < n && std::chrono::steady_clock::now() < deadline)
    if (auto c = cq.poll_one()) out.push_back(*c);
  return out;
}

int wait_readable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count()));
}

class CompletionChannel : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    channel.emplace(*dev);
    src.emplace(verbs::MemoryRegion::allocate(*pd, 4096, all_access));
    dst.emplace(verbs::MemoryRegion::allocate(*pd, 4096, all_access));
    fill_pattern(src->bytes(), 3);
  }
  std::optional<verbs::CompletionChannel> channel;
  std::optional<verbs::MemoryRegion> src, dst;
  int tag_a = 0, tag_b = 0;
  std::error_code ec;
};

// Two connected QPs, each on its own CQ, both CQs on one channel, told apart by CqEvent.
struct SharedPair {
  SharedPair(const verbs::Device& dev, const verbs::ProtectionDomain& pd, verbs::CompletionChannel& ch, void* ctx_a,
             void* ctx_b)
      : cq_a(dev, {.depth = 64, .channel = &ch, .context = ctx_a}),
        cq_b(dev, {.depth = 64, .channel = &ch, .context = ctx_b}),
        a(pd, cq_a, {.access = all_access}),
        b(pd, cq_b, {.access = all_access}) {
    a.connect(b.endpoint(), QpPair::fast());
    b.connect(a.endpoint(), QpPair::fast());
  }
  verbs::CompletionQueue cq_a, cq_b;
  verbs::QueuePair a, b;
};

/// Destroys `p` on another thread; false when that has not returned within `timeout` (the
/// thread is then left behind, blocked, rather than hanging the test).
bool destroyed_within(std::unique_ptr<SharedPair> p, std::chrono::milliseconds timeout) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  std::thread([q = std::move(p), done]() mutable {
    q.reset();
    done->set_value();
  }).detach();
  return f.wait_for(timeout) == std::future_status::ready;
}

TEST_F(CompletionChannel, FdIsNonBlockingAndEmptyReadsReturnAtOnce) {
  ASSERT_GE(channel->fd(), 0);
  std::array<CqEvent, 4> ev{};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(channel->get_events(ev).empty());
  EXPECT_TRUE(channel->wait(ev, 50ms).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

TEST_F(CompletionChannel, ReadingItSaysWhichCqFired) {
  SharedPair p(*dev, *pd, *channel, &tag_a, &tag_b);
  EXPECT_TRUE(p.cq_a.has_channel() && p.cq_a.shares_channel());
  EXPECT_EQ(p.cq_a.fd(), channel->fd());
  std::array<Completion, 8> wcs{};
  std::array<CqEvent, 4> ev{};
  ASSERT_TRUE(p.cq_a.arm_and_poll(wcs).empty());
  ASSERT_TRUE(p.cq_b.arm_and_poll(wcs).empty());

  // A write completes on a's CQ only.
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 64), dst->remote(), {.wr_id = 1})));
  auto got = channel->wait(ev, 10s);
  ASSERT_EQ(got.size(), 1u) << "no event within 10 s";
  EXPECT_TRUE(got[0].is(p.cq_a));
  EXPECT_FALSE(got[0].is(p.cq_b));
  EXPECT_EQ(got[0].context, &tag_a);
  std::size_t n = p.cq_a.drain_and_arm(wcs, [&](std::span<Completion> batch) {
    for (const Completion& c : batch) EXPECT_TRUE(completed(c, WcOpcode::rdma_write, 1));
  }, ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(n, 1u);

  // A send: b's CQ for the receive, a's for the send; one event each.
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(1024, 1024), 7)));
  ASSERT_TRUE(posted(p.a.post_send(src->slice(0, 100), {.wr_id = 2})));
  bool saw_a = false, saw_b = false;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!(saw_a && saw_b) && std::chrono::steady_clock::now() < deadline) {
    for (const CqEvent& e : channel->wait(ev, 1s)) {
      const verbs::CompletionQueue& q = e.is(p.cq_a) ? p.cq_a : p.cq_b;
      ASSERT_TRUE(e.is(q));
      EXPECT_EQ(e.context, e.is(p.cq_a) ? static_cast<void*>(&tag_a) : static_cast<void*>(&tag_b));
      (e.is(p.cq_a) ? saw_a : saw_b) = true;
      q.drain_and_arm(wcs, [&](std::span<Completion> batch) {
        for (const Completion& c : batch)
          EXPECT_TRUE(e.is(p.cq_a) ? completed(c, WcOpcode::send, 2) : completed(c, WcOpcode::recv, 7));
      }, ec);
      ASSERT_FALSE(ec) << ec.message();
    }
  }
  EXPECT_TRUE(saw_a && saw_b) << "an event missing: a " << saw_a << ", b " << saw_b;
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(1024, 100), src->bytes().first(100)));
  // Both armed and idle: no spurious event.
  EXPECT_EQ(wait_readable(channel->fd(), 200ms), 0);
}

// Arming raises one event however many completions follow; drain_and_arm hands all of them
// over and re-arms, so the next completion raises the next event.
TEST_F(CompletionChannel, DrainAndArmTakesEveryCompletionAndRearms) {
  SharedPair p(*dev, *pd, *channel, &tag_a, &tag_b);
  std::array<Completion, 4> wcs{};  // smaller than the burst: several batches
  std::array<CqEvent, 4> ev{};
  ASSERT_TRUE(p.cq_a.arm_and_poll(wcs).empty());
  for (std::uint64_t i = 0; i < 10; ++i)
    ASSERT_TRUE(posted(p.a.post_write(src->slice(8 * i, 8), dst->remote().slice(8 * i, 8), {.wr_id = 100 + i})));
  ASSERT_EQ(channel->wait(ev, 10s).size(), 1u);
  std::vector<std::uint64_t> ids;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (ids.size() < 10 && std::chrono::steady_clock::now() < deadline) {
    p.cq_a.drain_and_arm(wcs, [&](std::span<Completion> batch) {
      for (const Completion& c : batch) ids.push_back(c.wr_id());
    }, ec);
    ASSERT_FALSE(ec) << ec.message();
    if (ids.size() < 10) (void)channel->wait(ev, 1s);  // the rest raise the next event
  }
  ASSERT_EQ(ids.size(), 10u);
  for (std::uint64_t i = 0; i < 10; ++i) EXPECT_EQ(ids[i], 100 + i);
  // Armed again: one more write raises an event.
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = 200})));
  const auto more = channel->wait(ev, 10s);
  ASSERT_EQ(more.size(), 1u) << "drain_and_arm left the CQ unarmed";
  EXPECT_TRUE(more[0].is(p.cq_a));
}

// ibv_destroy_cq waits until every event of the CQ is acknowledged. The channel acknowledges in
// batches, and before the CQ goes: destroying a CQ with events read and not acknowledged
// returns at once.
TEST_F(CompletionChannel, DestroyingACqWithUnacknowledgedEventsDoesNotBlock) {
  auto p = std::make_unique<SharedPair>(*dev, *pd, *channel, &tag_a, &tag_b);
  std::array<Completion, 8> wcs{};
  std::array<CqEvent, 4> ev{};
  for (std::uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(p->cq_a.arm_and_poll(wcs).empty());
    ASSERT_TRUE(posted(p->a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = i})));
    ASSERT_EQ(channel->wait(ev, 10s).size(), 1u);
    ASSERT_EQ(collect_polling(p->cq_a, 1).size(), 1u);
  }
  EXPECT_EQ(channel->unacknowledged(), 3u) << "acknowledged one by one, not in a batch";
  ASSERT_TRUE(destroyed_within(std::move(p), 10s)) << "destroying the CQ blocked on unacknowledged events";
  EXPECT_EQ(channel->unacknowledged(), 0u);
}

TEST_F(CompletionChannel, AckBatchOfOneCqIsAcknowledgedAndCounted) {
  SharedPair p(*dev, *pd, *channel, &tag_a, &tag_b);
  std::array<Completion, 8> wcs{};
  std::array<CqEvent, 4> ev{};
  std::uint64_t events = 0;
  for (unsigned i = 0; i < verbs::CompletionChannel::ack_batch + 2; ++i) {
    ASSERT_TRUE(p.cq_a.arm_and_poll(wcs).empty());
    ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = i})));
    events += channel->wait(ev, 10s).size();
    ASSERT_EQ(collect_polling(p.cq_a, 1).size(), 1u);
  }
  EXPECT_EQ(events, verbs::CompletionChannel::ack_batch + 2u);
  EXPECT_EQ(channel->unacknowledged(), 2u);
}

// A CQ keeps its channel alive: the CompletionChannel object may go first.
TEST_F(CompletionChannel, CqsOutliveTheChannelObject) {
  auto p = std::make_unique<SharedPair>(*dev, *pd, *channel, &tag_a, &tag_b);
  const int fd = channel->fd();
  channel.reset();
  std::array<Completion, 8> wcs{};
  ASSERT_TRUE(p->cq_a.arm_and_poll(wcs).empty());
  ASSERT_TRUE(posted(p->a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = 5})));
  EXPECT_EQ(wait_readable(fd, 10000ms), 1) << "the channel's fd no longer reports events";
  const auto c = collect_polling(p->cq_a, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(completed(c[0], WcOpcode::rdma_write, 5));
  EXPECT_TRUE(destroyed_within(std::move(p), 10s));
}

TEST_F(CompletionChannel, ACqOnASharedChannelRefusesItsOwnWaitAndConsumeEvents) {
  verbs::CompletionQueue cq(*dev, {.depth = 16, .channel = &*channel});
  std::array<Completion, 4> wcs{};
  cq.wait(wcs, 10ms, ec);
  EXPECT_EQ(ec, Errc::bad_argument);
  try {
    (void)cq.consume_events();
    ADD_FAILURE() << "consume_events on a shared channel's CQ succeeded";
  } catch (const verbs::Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_argument);
    EXPECT_NE(std::string(e.what()).find("CompletionChannel::get_events"), std::string::npos) << e.what();
  }
}

TEST_F(CompletionChannel, OwnAndSharedChannelTogetherAreRefused) {
  try {
    verbs::CompletionQueue cq(*dev, {.depth = 16, .with_channel = true, .channel = &*channel});
    ADD_FAILURE() << "a CQ with both channels was made";
  } catch (const verbs::Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_argument) << e.what();
  }
  verbs::CompletionChannel moved = std::move(*channel);
  try {
    verbs::CompletionQueue cq(*dev, {.depth = 16, .channel = &*channel});
    ADD_FAILURE() << "a CQ on a moved-from channel was made";
  } catch (const verbs::Error& e) {
    EXPECT_EQ(e.code(), Errc::empty_object) << e.what();
  }
  std::array<CqEvent, 1> ev{};
  (void)channel->get_events(ev, ec);
  EXPECT_EQ(ec, Errc::empty_object);
  EXPECT_EQ(channel->fd(), -1);
}

}  // namespace
