// SharedReceiveQueue: one receive queue behind two connected QPs, its limit event, and the
// checks on posting receives.
#include <array>
#include <type_traits>
#include <vector>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::Completion;
using verbs::Errc;
using verbs::LocalSlice;
using verbs::WcOpcode;

static_assert(std::is_nothrow_move_constructible_v<verbs::SharedReceiveQueue> &&
              std::is_nothrow_move_assignable_v<verbs::SharedReceiveQueue>);
static_assert(std::is_nothrow_swappable_v<verbs::SharedReceiveQueue>);

constexpr std::size_t kSlot = 1024;

/// Clients c1 and c2, each connected to a server QP (s1, s2); both server QPs take their
/// receives from one SRQ and complete on one CQ.
class SharedReceiveQueue : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    srq.emplace(*pd, verbs::SrqOptions{.max_wr = 64, .max_sge = 2});
    src.emplace(verbs::MemoryRegion::allocate(*pd, 64 * 1024, all_access));
    slots.emplace(verbs::MemoryRegion::allocate(*pd, 64 * kSlot, verbs::Access::local_write));
    fill_pattern(src->bytes(), 1);
    client_cq.emplace(*dev);
    server_cq.emplace(*dev);
    c1.emplace(*pd, *client_cq, verbs::QpOptions{.access = all_access});
    c2.emplace(*pd, *client_cq, verbs::QpOptions{.access = all_access});
    s1.emplace(*pd, *server_cq, verbs::QpOptions{.srq = &*srq, .access = all_access});
    s2.emplace(*pd, *server_cq, verbs::QpOptions{.srq = &*srq, .access = all_access});
    c1->connect(s1->endpoint(), QpPair::fast());
    s1->connect(c1->endpoint(), QpPair::fast());
    c2->connect(s2->endpoint(), QpPair::fast());
    s2->connect(c2->endpoint(), QpPair::fast());
  }
  /// Posts receives into slots first..first+n-1 (wr_id = slot number).
  void post_slots(std::uint64_t first, std::uint64_t n) {
    for (std::uint64_t i = first; i < first + n; ++i)
      ASSERT_TRUE(posted(srq->post_recv(slots->slice(i * kSlot, kSlot), i)));
  }
  [[nodiscard]] std::span<std::byte> slot(std::uint64_t i) const { return slots->bytes().subspan(i * kSlot, kSlot); }
  /// Sends `n` small messages from c1 and waits for them on both sides.
  void send_from_c1(std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) ASSERT_TRUE(posted(c1->post_send(src->slice(i, 16), {.wr_id = 1000 + i})));
    for (const Completion& c : collect(*client_cq, n)) EXPECT_TRUE(c.ok()) << describe(c);
    for (const Completion& c : collect(*server_cq, n)) EXPECT_TRUE(completed(c, WcOpcode::recv, c.wr_id()));
  }

  std::optional<verbs::SharedReceiveQueue> srq;
  std::optional<verbs::MemoryRegion> src, slots;
  std::optional<verbs::CompletionQueue> client_cq, server_cq;
  std::optional<verbs::QueuePair> c1, c2, s1, s2;
};

TEST_F(SharedReceiveQueue, SendsFromTwoPeersLandInItAndQpNumTellsThemApart) {
  EXPECT_GE(srq->max_wr(), 64u);
  post_slots(0, 4);
  ASSERT_TRUE(posted(c1->post_send(src->slice(0, 100), {.wr_id = 1})));
  ASSERT_TRUE(posted(c2->post_send(src->slice(1000, 200), {.wr_id = 2})));
  EXPECT_EQ(collect(*client_cq, 2).size(), 2u);
  const auto got = collect(*server_cq, 2);
  ASSERT_EQ(got.size(), 2u);
  int from_s1 = 0, from_s2 = 0;
  std::vector<std::uint64_t> used;
  for (const Completion& c : got) {
    ASSERT_TRUE(completed(c, WcOpcode::recv, c.wr_id()));
    ASSERT_LT(c.wr_id(), 4u);
    used.push_back(c.wr_id());
    if (c.qp_num() == s1->qp_num()) {
      ++from_s1;
      EXPECT_EQ(c.byte_len(), 100u);
      EXPECT_TRUE(same_bytes(slot(c.wr_id()).first(100), src->bytes().first(100)));
    } else if (c.qp_num() == s2->qp_num()) {
      ++from_s2;
      EXPECT_EQ(c.byte_len(), 200u);
      EXPECT_TRUE(same_bytes(slot(c.wr_id()).first(200), src->bytes().subspan(1000, 200)));
    } else {
      ADD_FAILURE() << "completion from neither server QP: " << describe(c);
    }
  }
  EXPECT_EQ(from_s1, 1);
  EXPECT_EQ(from_s2, 1);
  EXPECT_NE(used[0], used[1]) << "two messages in one receive";
  expect_no_completion(*server_cq, 100ms);
}

TEST_F(SharedReceiveQueue, PostRecvOnAQpWithAnSrqIsRejected) {
  EXPECT_TRUE(rejected(s1->post_recv(slots->slice(0, kSlot), 1), Errc::qp_has_srq));
  std::array<verbs::RecvWr, 2> chain{verbs::RecvWr(slots->slice(0, 64), 2), verbs::RecvWr(slots->slice(64, 64), 3)};
  EXPECT_TRUE(rejected(s2->post_recv(chain), Errc::qp_has_srq));
  expect_no_completion(*server_cq, 100ms);

  // The message goes to the SRQ's receive, not to one of the refused ones.
  post_slots(5, 1);
  ASSERT_TRUE(posted(c1->post_send(src->slice(0, 64), {.wr_id = 4})));
  const Completion r = expect_completion(*server_cq);
  EXPECT_TRUE(completed(r, WcOpcode::recv, 5));
  EXPECT_EQ(r.qp_num(), s1->qp_num());
  EXPECT_TRUE(all_bytes(slots->bytes().first(kSlot), std::byte{0}));
}

TEST_F(SharedReceiveQueue, LimitEventFiresWhenReceivesDropBelowTheLimit) {
  post_slots(0, 8);
  EXPECT_EQ(srq->limit(), 0u);
  srq->arm(4);
  EXPECT_EQ(srq->limit(), 4u);

  send_from_c1(4);  // 4 receives left: not below the limit yet
  if (const auto early = dev->wait_async_event(300ms)) FAIL() << "event at 4 receives left: " << early->name();

  send_from_c1(1);  // 3 left
  const auto ev = dev->wait_async_event(5s);
  ASSERT_TRUE(ev) << "no SRQ limit event within 5 s";
  EXPECT_EQ(ev->type, IBV_EVENT_SRQ_LIMIT_REACHED) << ev->name();
  EXPECT_EQ(ev->raw.element.srq, srq->native_handle());
  EXPECT_EQ(srq->limit(), 0u) << "the limit disarms itself when it fires";

  send_from_c1(2);  // disarmed: no second event
  if (const auto again = dev->wait_async_event(200ms)) ADD_FAILURE() << "second event: " << again->name();
}

// ibv_create_srq(3): srq_limit "is irrelevant" at creation (hardware ignores it); only
// ibv_modify_srq arms it, so SrqOptions::limit must be armed that way.
TEST_F(SharedReceiveQueue, ALimitGivenAtCreationIsArmed) {
  verbs::SharedReceiveQueue armed(*pd, {.max_wr = 64, .limit = 4});
  EXPECT_EQ(armed.limit(), 4u);
}

// An async event leads back to the object it concerns: the context given at creation is the
// event's element's context.
TEST_F(SharedReceiveQueue, TheLimitEventCarriesTheSrqsContext) {
  int marker = 0;
  verbs::SharedReceiveQueue own(*pd, {.max_wr = 16, .limit = 2, .context = &marker});
  verbs::QueuePair server(*pd, *server_cq, verbs::QpOptions{.srq = &own, .access = all_access});
  verbs::QueuePair client(*pd, *client_cq, verbs::QpOptions{.access = all_access});
  client.connect(server.endpoint(), QpPair::fast());
  server.connect(client.endpoint(), QpPair::fast());
  for (std::uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(posted(own.post_recv(slots->slice(i * kSlot, kSlot), i)));
  ASSERT_TRUE(posted(client.post_send(src->slice(0, 16), {.wr_id = 1})));
  ASSERT_TRUE(posted(client.post_send(src->slice(0, 16), {.wr_id = 2})));
  (void)collect(*client_cq, 2);
  (void)collect(*server_cq, 2);
  const auto ev = dev->wait_async_event(5s);
  ASSERT_TRUE(ev) << "no SRQ limit event within 5 s";
  EXPECT_EQ(ev->type, IBV_EVENT_SRQ_LIMIT_REACHED) << ev->name();
  EXPECT_EQ(ev->context(), &marker);
}

// QP events (LAST_WQE_REACHED, QP_FATAL, ...) name the ibv_qp, whose qp_context is the one
// given at creation (rxe raised no LAST_WQE_REACHED when an SRQ QP went to ERR: see the host
// test of AsyncEvent::context for the mapping).
TEST_F(SharedReceiveQueue, AQpCarriesTheContextItWasCreatedWith) {
  int marker = 0;
  verbs::QueuePair server(*pd, *server_cq, verbs::QpOptions{.srq = &*srq, .access = all_access, .context = &marker});
  EXPECT_EQ(server.native_handle()->qp_context, &marker);
  EXPECT_EQ(srq->native_handle()->srq_context, nullptr);
}

TEST_F(SharedReceiveQueue, ArmingAboveItsCapacityThrowsEinval) {
  const auto e = thrown_error([&] { srq->arm(1u << 30); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::make_error_code(std::errc::invalid_argument));
  EXPECT_TRUE(contains(e->what(), "ibv_modify_srq"));
  EXPECT_EQ(srq->limit(), 0u);
}

TEST_F(SharedReceiveQueue, MoreSgesThanItHasIsRejected) {
  const std::vector<LocalSlice> sges(srq->max_sge() + 1, slots->slice(0, 8));
  verbs::RecvWr wr(sges, 7);
  EXPECT_TRUE(rejected(srq->post_recv(std::span(&wr, 1)), Errc::too_many_sge));
  // With a good receive first, the whole chain is still refused.
  std::array<verbs::RecvWr, 2> chain{verbs::RecvWr(slots->slice(0, 8), 8), wr};
  EXPECT_TRUE(rejected(srq->post_recv(chain), Errc::too_many_sge, 1));
  post_slots(9, 1);
  ASSERT_TRUE(posted(c2->post_send(src->slice(0, 8), {.wr_id = 10})));
  EXPECT_TRUE(completed(expect_completion(*server_cq), WcOpcode::recv, 9)) << "an earlier receive was posted";
}

TEST_F(SharedReceiveQueue, CreationOverTheDeviceSgeLimitThrowsEinval) {
  const auto too_many = static_cast<std::uint32_t>(dev->attributes().orig_attr.max_srq_sge + 1);
  const auto e = thrown_error([&] { verbs::SharedReceiveQueue big(*pd, {.max_sge = too_many}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::make_error_code(std::errc::invalid_argument));
  EXPECT_EQ(e->context(), "ibv_create_srq");
}

// Resizing (rdma-core tests/test_srq.py resizes too): the receives posted before stay posted and
// complete in order, the room grows by what was asked; a shrink under what is posted (refused by
// the device), 0 and more than max_srq_wr (refused before it) are errors that lose nothing.
TEST_F(SharedReceiveQueue, ResizeKeepsThePostedReceivesAndMakesRoomForMore) {
  if ((dev->attributes().orig_attr.device_cap_flags & IBV_DEVICE_SRQ_RESIZE) == 0)
    GTEST_SKIP() << dev->name() << " does not resize SRQs (no IBV_DEVICE_SRQ_RESIZE)";
  post_slots(0, 4);
  // Fill what is left with receives into the last slot, which no message reaches.
  const auto fill = [&](std::uint32_t most) {
    std::uint32_t n = 0;
    while (n < most && srq->post_recv(slots->slice(63 * kSlot, kSlot), 63)) ++n;
    return n;
  };
  const std::uint32_t cap = 4 + fill(1u << 16);
  ASSERT_GE(cap, srq->max_wr()) << "the SRQ took fewer receives than it was granted";
  ASSERT_LT(cap, 1u << 16);

  srq->resize(2 * cap);
  EXPECT_GE(srq->max_wr(), 2 * cap);
  const std::uint32_t more = fill(4 * cap);
  EXPECT_GE(more, cap) << "the room grew by less than asked";
  EXPECT_LT(more, 4 * cap);

  // A shrink under what is posted, 0 and more than the device has are refused, and change nothing.
  const std::uint32_t granted = srq->max_wr();
  const auto small = thrown_error([&] { srq->resize(4); });
  ASSERT_TRUE(small) << "shrinking to 4 under " << cap + more << " posted receives was accepted";
  EXPECT_EQ(small->code(), std::make_error_code(std::errc::invalid_argument)) << small->what();
  const auto zero = thrown_error([&] { srq->resize(0); });
  ASSERT_TRUE(zero);
  EXPECT_EQ(zero->code(), std::make_error_code(std::errc::invalid_argument));
  const auto max = static_cast<std::uint32_t>(dev->attributes().orig_attr.max_srq_wr);
  const auto big = thrown_error([&] { srq->resize(max + 1); });
  ASSERT_TRUE(big);
  EXPECT_EQ(big->code(), std::make_error_code(std::errc::invalid_argument));
  EXPECT_TRUE(contains(big->what(), "max_srq_wr")) << big->what();
  EXPECT_EQ(srq->max_wr(), granted);
  ibv_srq_attr now{};
  ASSERT_EQ(ibv_query_srq(srq->native_handle(), &now), 0);
  EXPECT_EQ(now.max_wr, granted) << "a refused resize changed the SRQ";
  EXPECT_FALSE(srq->post_recv(slots->slice(63 * kSlot, kSlot), 63)) << "still full: the refusal freed no room";

  // The four receives posted before the resize take the next four messages, in order.
  for (std::uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(posted(c1->post_send(src->slice(100 * i, 16), {.wr_id = i})));
  EXPECT_EQ(collect(*client_cq, 4).size(), 4u);
  const auto got = collect(*server_cq, 4);
  ASSERT_EQ(got.size(), 4u);
  for (std::uint64_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(completed(got[i], WcOpcode::recv, i));
    EXPECT_TRUE(same_bytes(slot(i).first(16), src->bytes().subspan(100 * i, 16))) << "message " << i;
  }
}

TEST_F(SharedReceiveQueue, AMovedFromOneRefusesResize) {
  verbs::SharedReceiveQueue taken(std::move(*srq));
  const auto e = thrown_error([&] { srq->resize(128); });  // NOLINT(bugprone-use-after-move): the point
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), Errc::empty_object) << e->what();
}

}  // namespace
