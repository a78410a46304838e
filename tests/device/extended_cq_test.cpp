// The extended CQ on a device: CompletionQueue::start_poll's passes read the fields asked for
// at creation, pass after pass without reading what the device never wrote (rxe's
// ibv_next_poll/ibv_end_poll before rdma-core 55), each field alone, UD receives, timestamps
// probed, creation refused over the device's limits, and the resize and moderation of any CQ.
#include <array>
#include <chrono>
#include <thread>
#include <cstring>
#include <optional>
#include <vector>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::Errc;
using verbs::ExCompletion;
using verbs::WcField;
using verbs::WcOpcode;

/// Passes over `cq` until `n` completions came (or the timeout): their copies.
std::vector<ExCompletion> collect_ex(const verbs::CompletionQueue& cq, std::size_t n,
                                     std::chrono::milliseconds timeout = 10s) {
  std::vector<ExCompletion> got;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
    verbs::CompletionPoll pass = cq.start_poll();
    for (const ExCompletion& c : pass) got.push_back(c);
    EXPECT_FALSE(pass.error()) << pass.error().message();
  }
  return got;
}

class ExtendedCq : public RegionsTest<64 * 1024> {};

TEST_F(ExtendedCq, APassReadsTheFieldsAskedFor) {
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(),
           {.depth = 256, .extended = true, .fields = WcField::byte_len | WcField::imm | WcField::qp_num | WcField::src_qp});
  ASSERT_TRUE(p.b.native_handle() != nullptr);
  ASSERT_TRUE(p.cq_b.extended());
  EXPECT_EQ(p.cq_b.fields(), WcField::byte_len | WcField::imm | WcField::qp_num | WcField::src_qp);
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(0, 4096), 10)));
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(4096, 4096), 11)));
  ASSERT_TRUE(posted(p.a.post_send_imm(src->slice(0, 1000), 0xfeed, {.wr_id = 1})));
  ASSERT_TRUE(posted(p.a.post_write_imm(src->slice(0, 64), dst->remote().slice(8192, 64), 7, {.wr_id = 2})));
  const std::vector<ExCompletion> b = collect_ex(p.cq_b, 2);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].wr_id(), 10u);
  EXPECT_TRUE(b[0].ok()) << b[0].error_code().message();
  EXPECT_EQ(b[0].opcode(), WcOpcode::recv);
  EXPECT_EQ(b[0].byte_len(), 1000u);
  EXPECT_EQ(b[0].imm_data(), 0xfeedu);
  EXPECT_EQ(b[0].qp_num(), p.b.qp_num());
  EXPECT_TRUE(b[0].src_qp().has_value()) << "asked for, so read (its value is the sender's QP on UD only)";
  EXPECT_EQ(b[1].wr_id(), 11u);
  EXPECT_EQ(b[1].opcode(), WcOpcode::recv_rdma_with_imm);
  EXPECT_EQ(b[1].imm_data(), 7u);
  EXPECT_FALSE(b[0].slid().has_value()) << "not asked for";
  EXPECT_FALSE(b[0].completion_timestamp().has_value());
  EXPECT_TRUE(same_bytes(dst->bytes().first(1000), src->bytes().first(1000)));
  const std::vector<ExCompletion> a = collect_ex(p.cq_a, 2);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].wr_id(), 1u);
  EXPECT_EQ(a[0].opcode(), WcOpcode::send);
  EXPECT_EQ(a[0].qp_num(), p.a.qp_num());
  EXPECT_EQ(a[1].opcode(), WcOpcode::rdma_write);
  EXPECT_EQ(a[1].wr_id(), 2u);
  // A plain CQ: a pass over it says so, and reads nothing.
  verbs::CompletionQueue plain_cq(*dev);
  verbs::CompletionPoll plain = plain_cq.start_poll();
  EXPECT_TRUE(plain.begin() == plain.end());
  EXPECT_EQ(plain.error(), std::error_code(Errc::bad_argument));
  EXPECT_FALSE(plain_cq.extended());
}

// rdma-core tests/test_cqex.py CQEXAPITest.test_create_cq_ex: an extended CQ made with each
// completion field alone (and with none); a receive read through it carries that field and no
// other, and the values read are the receive's.
TEST_F(ExtendedCq, EachFieldAloneIsReadAndNoOther) {
  for (const WcField f : {WcField::byte_len, WcField::imm, WcField::qp_num, WcField::src_qp, WcField::slid, WcField::sl,
                          WcField::dlid_path_bits}) {
    SCOPED_TRACE(testing::Message() << "WcField 0x" << std::hex << static_cast<std::uint64_t>(f));
    QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 16, .extended = true, .fields = f});
    EXPECT_EQ(p.cq_b.fields(), verbs::WcFields(f));
    ASSERT_TRUE(posted(p.b.post_recv(dst->slice(0, 4096), 1)));
    ASSERT_TRUE(posted(p.a.post_send_imm(src->slice(0, 100), 5, {.wr_id = 2})));
    const std::vector<ExCompletion> got = collect_ex(p.cq_b, 1);
    ASSERT_EQ(got.size(), 1u);
    const ExCompletion& c = got[0];
    EXPECT_TRUE(c.ok() && c.wr_id() == 1 && c.opcode() == WcOpcode::recv) << c.error_code().message();
    EXPECT_EQ(c.fields(), verbs::WcFields(f));
    EXPECT_EQ(c.byte_len(), f == WcField::byte_len ? std::optional<std::uint32_t>(100) : std::nullopt);
    EXPECT_EQ(c.imm_data(), f == WcField::imm ? std::optional<std::uint32_t>(5) : std::nullopt);
    EXPECT_EQ(c.qp_num(), f == WcField::qp_num ? std::optional<std::uint32_t>(p.b.qp_num()) : std::nullopt);
    EXPECT_EQ(c.src_qp().has_value(), f == WcField::src_qp);
    EXPECT_EQ(c.slid().has_value(), f == WcField::slid);
    EXPECT_EQ(c.sl().has_value(), f == WcField::sl);
    EXPECT_EQ(c.dlid_path_bits().has_value(), f == WcField::dlid_path_bits);
  }
  const verbs::CompletionQueue none(*dev, {.extended = true, .fields = {}});
  EXPECT_TRUE(none.extended());
  EXPECT_TRUE(none.fields().empty());
}

// rdma-core tests/test_cqex.py CQEXAPITest.test_create_cq_ex_bad_flow: an extended CQ deeper
// than the device's max_cqe, or on a completion vector past the last (without a channel), is
// refused with EINVAL by ibv_create_cq_ex; at max_cqe and on the last vector it is made.
TEST_F(ExtendedCq, OverMaxCqeOrOnACompletionVectorOutOfRangeIsRefused) {
  const int max_cqe = dev->attributes().orig_attr.max_cqe;
  const int vectors = dev->native_handle()->num_comp_vectors;
  const auto deep = thrown_error([&] { verbs::CompletionQueue cq(*dev, {.depth = max_cqe + 1, .extended = true}); });
  ASSERT_TRUE(deep);
  EXPECT_EQ(deep->code(), std::errc::invalid_argument) << deep->what();
  EXPECT_EQ(deep->context(), "ibv_create_cq_ex");
  const auto vector =
      thrown_error([&] { verbs::CompletionQueue cq(*dev, {.comp_vector = vectors, .extended = true}); });
  ASSERT_TRUE(vector);
  EXPECT_EQ(vector->code(), std::errc::invalid_argument) << vector->what();
  EXPECT_EQ(vector->context(), "ibv_create_cq_ex");
  const verbs::CompletionQueue big(*dev, {.depth = max_cqe, .extended = true});
  EXPECT_GE(big.capacity(), max_cqe);
  const verbs::CompletionQueue last(*dev, {.depth = 16, .comp_vector = vectors - 1, .extended = true});
  EXPECT_TRUE(last.extended());
}

// rdma-core tests/test_cqex.py CqExTestCase.test_ud_traffic_cq_ex: UD sends whose completions
// are read through the extended CQ's passes: the receive says which QP sent it, and its
// byte_len counts the 40-byte GRH before the payload.
TEST_F(ExtendedCq, UdReceivesReadThroughAPassNameTheSenderAndCountTheGrh) {
  QpPair u(*dev, *pd, {.type = verbs::QpType::ud}, QpPair::fast(),
           {.depth = 64, .extended = true, .fields = WcField::byte_len | WcField::qp_num | WcField::src_qp});
  const verbs::AddressHandle ah(*pd, u.a, u.b.endpoint());
  for (std::uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(posted(u.b.post_recv(dst->slice(i * 1024, 40 + 512), 10 + i)));
    ASSERT_TRUE(posted(u.a.post(verbs::SendWr::send(src->slice(i * 512, 100 + i), {.wr_id = i})
                                    .to(ah, u.b.qp_num(), u.b.endpoint().qkey))));
  }
  const std::vector<ExCompletion> b = collect_ex(u.cq_b, 3);
  ASSERT_EQ(b.size(), 3u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(b[i].ok() && b[i].wr_id() == 10 + i && b[i].opcode() == WcOpcode::recv) << b[i].wr_id();
    EXPECT_EQ(b[i].byte_len(), 40 + 100 + i);
    EXPECT_EQ(b[i].src_qp(), u.a.qp_num());
    EXPECT_EQ(b[i].qp_num(), u.b.qp_num());
    EXPECT_NE(b[i].wc_flags() & IBV_WC_GRH, 0u);
    EXPECT_TRUE(same_bytes(dst->bytes().subspan(i * 1024 + 40, 100 + i), src->bytes().subspan(i * 512, 100 + i)));
  }
  const std::vector<ExCompletion> a = collect_ex(u.cq_a, 3);
  ASSERT_EQ(a.size(), 3u);
  for (std::uint32_t i = 0; i < 3; ++i) EXPECT_TRUE(a[i].ok() && a[i].wr_id() == i && a[i].opcode() == WcOpcode::send);
}

// Rounds of 1-3 completions, each read by passes to the end and followed by a pass over the
// empty CQ, which must read nothing: with rxe's start/next/end_poll of rdma-core 44 the
// consumer index passes the producer, and the next pass reads entries never written.
TEST_F(ExtendedCq, PassAfterPassReadsEachCompletionOnceAndNothingElse) {
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 64, .extended = true});
  std::uint64_t id = 0;
  for (int round = 0; round < 40; ++round) {
    const int k = 1 + round % 3;
    for (int j = 0; j < k; ++j)
      ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8), dst->remote().slice(0, 8), {.wr_id = ++id})));
    const std::vector<ExCompletion> got = collect_ex(p.cq_a, static_cast<std::size_t>(k));
    ASSERT_EQ(got.size(), static_cast<std::size_t>(k)) << "round " << round;
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(got[j].wr_id(), id - k + 1 + j) << "round " << round;
      EXPECT_TRUE(got[j].ok()) << "round " << round << ": " << got[j].error_code().message();
      EXPECT_EQ(got[j].opcode(), WcOpcode::rdma_write);
    }
    verbs::CompletionPoll empty = p.cq_a.start_poll();
    std::size_t extra = 0;
    for (const ExCompletion& c : empty) {
      ADD_FAILURE() << "round " << round << ": a pass over the empty CQ read wr_id " << c.wr_id() << " status "
                    << static_cast<int>(c.status());
      if (++extra > 3) break;
    }
    ASSERT_EQ(extra, 0u);
  }
}

// A pass left early (ibv_end_poll at its end of scope) leaves the rest for the next one.
TEST_F(ExtendedCq, APassLeftEarlyLeavesTheRestForTheNext) {
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 64, .extended = true});
  for (std::uint64_t i = 1; i <= 5; ++i)
    ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8), dst->remote().slice(0, 8), {.wr_id = i})));
  std::this_thread::sleep_for(200ms);  // all five in the CQ
  std::vector<std::uint64_t> ids;
  {
    verbs::CompletionPoll pass = p.cq_a.start_poll();
    for (const ExCompletion& c : pass) {
      ids.push_back(c.wr_id());
      if (ids.size() == 2) break;
    }
    EXPECT_EQ(pass.count(), 2u);
  }
  for (const ExCompletion& c : collect_ex(p.cq_a, 3)) ids.push_back(c.wr_id());
  EXPECT_EQ(ids, (std::vector<std::uint64_t>{1, 2, 3, 4, 5}));
}

TEST_F(ExtendedCq, AFailedCompletionSaysWhy) {
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 64, .extended = true});
  verbs::RemoteSlice bad = dst->remote().slice(0, 8);
  bad.rkey ^= 0x5a5a00;
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8), bad, {.wr_id = 9})));
  const std::vector<ExCompletion> got = collect_ex(p.cq_a, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id(), 9u);
  EXPECT_FALSE(got[0].ok());
  EXPECT_EQ(got[0].status(), verbs::WcStatus::rem_access_err);
  EXPECT_EQ(got[0].error_code(), std::error_code(verbs::WcStatus::rem_access_err));
}

TEST_F(ExtendedCq, TimestampsOnlyWhereTheDeviceHasThem) {
  const std::uint64_t mask = dev->attributes().completion_timestamp_mask;
  if (mask == 0) {
    const auto e = thrown_error([&] {
      verbs::CompletionQueue cq(*dev, {.extended = true, .fields = WcField::completion_timestamp});
    });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code(), std::errc::operation_not_supported);
    EXPECT_TRUE(contains(e->what(), "completion_timestamp_mask")) << e->what();
    return;  // no timestamps (rxe): refused before creation, as the name says and as checked
  }
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(),
           {.depth = 64, .extended = true, .fields = WcField::completion_timestamp});
  for (std::uint64_t i = 1; i <= 2; ++i)
    ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8), dst->remote().slice(0, 8), {.wr_id = i})));
  const std::vector<ExCompletion> got = collect_ex(p.cq_a, 2);
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(got[0].completion_timestamp() && got[1].completion_timestamp());
  EXPECT_LE(*got[0].completion_timestamp(), *got[1].completion_timestamp() | ~mask);
}

TEST_F(ExtendedCq, ResizeKeepsTheCompletionsWaiting) {
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 16});
  const int before = p.cq_a.capacity();
  for (std::uint64_t i = 1; i <= 10; ++i)
    ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8), dst->remote().slice(0, 8), {.wr_id = i})));
  // Wait until all ten are in the CQ (a pass would take them): poll nothing, just wait.
  std::this_thread::sleep_for(200ms);
  p.cq_a.resize(256);
  EXPECT_GE(p.cq_a.capacity(), 256);
  EXPECT_GT(p.cq_a.capacity(), before);
  const auto shrink = thrown_error([&] { p.cq_a.resize(2); });
  ASSERT_TRUE(shrink);
  EXPECT_TRUE(contains(shrink->what(), "ibv_resize_cq(2)")) << shrink->what();
  const std::vector<verbs::Completion> got = collect(p.cq_a, 10);
  ASSERT_EQ(got.size(), 10u);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(completed(got[i], WcOpcode::rdma_write, i + 1));
}

// Moderation (ibv_modify_cq): rxe refuses it (EOPNOTSUPP), and that refusal is asserted there, so
// that an rxe that moderates is noticed. Elsewhere a moderated CQ's completions still wake a
// waiter; that the device holds its events back is not observable here, and not asserted.
TEST_F(ExtendedCq, ModerationIsRefusedOnRxeAndAModeratedCqStillWakesAWaiter) {
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 64, .with_channel = true});
  if (is_rxe(*dev)) {
    const auto e = thrown_error([&] { p.cq_a.moderate(4, 100); });
    ASSERT_TRUE(e) << platform(*dev) << " moderates its CQs, which rxe of Linux 6.1 refused: the success path below "
                   << "can run here now";
    EXPECT_TRUE(e->code() == std::errc::operation_not_supported || e->code() == std::errc::function_not_supported)
        << platform(*dev) << ": " << e->what();
    return;
  }
  p.cq_a.moderate(4, 100);
  for (std::uint64_t i = 1; i <= 4; ++i)
    ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8), dst->remote().slice(0, 8), {.wr_id = i})));
  std::array<verbs::Completion, 4> buf{};
  std::size_t n = 0;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (n < 4 && std::chrono::steady_clock::now() < deadline)
    n += p.cq_a.wait(std::span(buf).subspan(n), 1s).size();
  EXPECT_EQ(n, 4u);
}

}  // namespace
