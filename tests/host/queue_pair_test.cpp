// QueuePair's posting path on a provider stub (stub_provider.hpp): the checks made before
// posting and the order in which they are reported, and the request the provider receives.
// The device tests cover the same calls on SoftRoCE; these need no device, and reach states
// (ERR, SQD) and limits (no send SGE at all) a real QP is awkward to put in.
#include <gtest/gtest.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <system_error>
#include <vector>

#include <infiniband/verbs.h>

#include <verbs/device.hpp>
#include <verbs/queue_pair.hpp>

#include "support/expect.hpp"
#include "support/stub_provider.hpp"
#include "support/stub_requests.hpp"
#include "support/stub_sges.hpp"

namespace {

using verbs::Errc;
using verbs::LocalSlice;
using verbs::PostResult;
using verbs::QpState;
using verbs::QpType;
using verbs::RecvWr;
using verbs::RemoteSlice;
using verbs::SendWr;
using verbs_stub::caps;
using verbs_stub::kDst;
using verbs_stub::kResult;
using verbs_stub::kSrc;
using verbs_stub::kTarget;

::testing::AssertionResult rejected(const PostResult& r, Errc why, std::uint32_t index = 0) {
  if (r.ok()) return ::testing::AssertionFailure() << "posted";
  if (r.error() != std::error_code(why)) return ::testing::AssertionFailure() << "rejected with " << r.error().message();
  if (r.failed_index() != index) return ::testing::AssertionFailure() << "at index " << r.failed_index();
  if (r.posted() != 0) return ::testing::AssertionFailure() << r.posted() << " posted";
  return ::testing::AssertionSuccess();
}


// ---- the order of the checks ----

TEST(QueuePairStub, BeforeRtsEverySendIsBadQpStateWhateverElseIsWrong) {
  for (const QpState s : {QpState::reset, QpState::init, QpState::rtr}) {
    verbs_stub::Provider stub;
    verbs::QueuePair qp = stub.queue_pair({}, s, caps(2));
    EXPECT_TRUE(rejected(qp.post_write(kSrc, kDst), Errc::bad_qp_state)) << to_string(s);
    EXPECT_TRUE(rejected(qp.post_fetch_add(kResult, kTarget, 1), Errc::bad_qp_state)) << to_string(s);
    std::vector<SendWr> chain{SendWr::write(kSrc, kDst), SendWr::send(kSrc)};
    EXPECT_TRUE(rejected(qp.post(chain), Errc::bad_qp_state)) << to_string(s);
    // Also with the wrong QP type (a read on UC), too many SGEs (none allowed) or a failed build check:
    verbs_stub::Provider uc_stub;
    verbs::QueuePair uc = uc_stub.queue_pair({.type = QpType::uc}, s, caps(0));
    EXPECT_TRUE(rejected(uc.post_read(kSrc, kDst), Errc::bad_qp_state)) << to_string(s);
    EXPECT_TRUE(rejected(uc.post_write(kSrc, kDst), Errc::bad_qp_state)) << to_string(s);
    EXPECT_TRUE(rejected(uc.post_write(kSrc, kDst.slice(0, 1)), Errc::bad_qp_state)) << to_string(s);
    EXPECT_EQ(stub.posted_sends + uc_stub.posted_sends, 0) << to_string(s);
  }
}

TEST(QueuePairStub, FromRtsOnSendsArePosted) {
  // SQD, SQE and ERR take sends too: the device holds or flushes them.
  for (const QpState s : {QpState::rts, QpState::sqd, QpState::sqe, QpState::err}) {
    verbs_stub::Provider stub;
    verbs::QueuePair qp = stub.queue_pair({}, s);
    EXPECT_TRUE(qp.post_write(kSrc, kDst).ok()) << to_string(s);
    EXPECT_EQ(stub.posted_sends, 1) << to_string(s);
  }
}

TEST(QueuePairStub, BuildTimeFailureComesBeforeWrongQpType) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({.type = QpType::uc});
  EXPECT_TRUE(rejected(qp.post_read(kSrc, kDst.slice(0, 1)), Errc::remote_too_small));
  EXPECT_TRUE(rejected(qp.post_fetch_add(kResult, kDst, 1), Errc::atomic_length));
  EXPECT_TRUE(rejected(qp.post_read(kSrc, kDst), Errc::wrong_qp_type));
  EXPECT_EQ(stub.posted_sends, 0);
}

TEST(QueuePairStub, WrongQpTypeComesBeforeTooManySge) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({.type = QpType::uc}, QpState::rts, caps(0));
  EXPECT_TRUE(rejected(qp.post_read(kSrc, kDst), Errc::wrong_qp_type));
  EXPECT_TRUE(rejected(qp.post_write(kSrc, kDst), Errc::too_many_sge));
}

TEST(QueuePairStub, UnaddressedSendOnUdSaysItNeedsAnAddressAndRdmaIsWrongQpType) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({.type = QpType::ud});
  EXPECT_TRUE(rejected(qp.post_send(kSrc), Errc::ud_needs_address));
  EXPECT_TRUE(rejected(qp.post_send_imm(kSrc, 1), Errc::ud_needs_address));
  EXPECT_TRUE(rejected(qp.post_write(kSrc, kDst), Errc::wrong_qp_type));
  EXPECT_EQ(stub.posted_sends, 0);
}

// ---- scatter/gather entries and inline data ----

TEST(QueuePairStub, OneSgeNeedsAQpWithAtLeastOne) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({}, QpState::rts, caps(0));
  EXPECT_TRUE(rejected(qp.post_write(kSrc, kDst), Errc::too_many_sge));
  EXPECT_TRUE(rejected(qp.post(SendWr::send(kSrc)), Errc::too_many_sge));
  // No SGE at all is fine: a write with immediate and nothing else.
  EXPECT_TRUE(qp.post(SendWr::write_imm(std::span<const LocalSlice>{}, kDst, 7)).ok());
  EXPECT_EQ(stub.posted_sends, 1);
  EXPECT_EQ(stub.last_send.num_sge, 0);
}

TEST(QueuePairStub, SgeCountOverTheQpsIsRejected) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({}, QpState::rts, caps(2));
  const std::array<LocalSlice, 3> three{kSrc, kSrc, kSrc};
  EXPECT_TRUE(rejected(qp.post_write(three, kDst.slice(0, 128), {}), Errc::remote_too_small));
  EXPECT_TRUE(rejected(qp.post_send(three), Errc::too_many_sge));
  EXPECT_TRUE(qp.post_send(std::span(three).first(2)).ok());
  EXPECT_EQ(stub.last_send.num_sge, 2);
  EXPECT_EQ(stub.last_send.sg_list, reinterpret_cast<const ibv_sge*>(three.data()));  // NOLINT
}

TEST(QueuePairStub, InlineDataOverTheQpsInlineSizeIsRejected) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({}, QpState::rts, caps(2, 64));
  const LocalSlice big{0x1000, 65, 0x11};
  EXPECT_TRUE(rejected(qp.post_send(big, {.inline_data = true}), Errc::inline_too_large));
  const std::array<LocalSlice, 2> two{kSrc, LocalSlice{0x2000, 1, 0x11}};
  EXPECT_TRUE(rejected(qp.post_send(two, {.inline_data = true}), Errc::inline_too_large));
  EXPECT_TRUE(qp.post_send(big).ok()) << "not inline: no limit";
  EXPECT_TRUE(qp.post_send(kSrc, {.inline_data = true}).ok());
  EXPECT_EQ(stub.last_send.send_flags & IBV_SEND_INLINE, unsigned{IBV_SEND_INLINE});
  EXPECT_EQ(stub.posted_sends, 2);
}

// ---- chains ----

TEST(QueuePairStub, ChainReportsTheFirstFailingRequestAndPostsNothing) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({.type = QpType::uc});
  std::vector<SendWr> chain{SendWr::write(kSrc, kDst), SendWr::send(kSrc), SendWr::read(kSrc, kDst),
                            SendWr::write(kSrc, kDst.slice(0, 1))};
  EXPECT_TRUE(rejected(qp.post(chain), Errc::wrong_qp_type, 2));
  chain[2] = SendWr::send(kSrc);
  EXPECT_TRUE(rejected(qp.post(chain), Errc::remote_too_small, 3));
  EXPECT_EQ(stub.posted_sends, 0);
  chain.pop_back();
  EXPECT_TRUE(qp.post(chain).ok());
  EXPECT_EQ(stub.posted_sends, 3);
}

// ---- multi-SGE requests are values: they carry their slices ----

// A request built from a span of slices and kept (a chain in a vector, as post(span<SendWr>)
// invites) may be posted after the caller's array has been reused, or has gone out of scope:
// the provider must still be handed the slices the request was built from.
const std::array<LocalSlice, 3> kThree{LocalSlice{0x1000, 10, 1}, LocalSlice{0x2000, 20, 2}, LocalSlice{0x3000, 30, 3}};
const LocalSlice kReused{0xdead0000, 1, 0xbad};

TEST(QueuePairStub, AChainOfMultiSgeRequestsPostsItsSlicesAfterTheCallersArrayIsReused) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({}, QpState::rts, caps(4));
  verbs_stub::SgeRecorder sges(stub);
  std::array<LocalSlice, 3> slices = kThree;
  std::vector<SendWr> chain;
  chain.push_back(SendWr::write(slices, kDst, {.wr_id = 1}));
  chain.push_back(SendWr::write_imm(slices, kDst, 7, {.wr_id = 2}));
  chain.push_back(SendWr::read(slices, kDst, {.wr_id = 3}));
  chain.push_back(SendWr::send(slices, {.wr_id = 4}));
  chain.push_back(SendWr::send_imm(slices, 8, {.wr_id = 5}));
  // The caller's array, reused before the post. (Left to go out of scope instead, the array's
  // last stores are dead to the optimiser, and what a borrowing request reads is undefined.)
  slices.fill(kReused);
  ASSERT_TRUE(qp.post(chain).ok());
  ASSERT_EQ(sges.sends.size(), 5u);
  for (std::size_t i = 0; i < sges.sends.size(); ++i)
    EXPECT_TRUE(verbs_stub::same_sges(sges.sends[i], kThree)) << "request " << i;
}

TEST(QueuePairStub, AKeptMultiSgeRequestPostedAloneCarriesItsSlices) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({}, QpState::rts, caps(4));
  verbs_stub::SgeRecorder sges(stub);
  std::array<LocalSlice, 3> slices = kThree;
  const SendWr kept = SendWr::send(slices, {.wr_id = 1});
  SendWr moved = SendWr::write(slices, kDst, {.wr_id = 2});
  slices.fill(kReused);
  ASSERT_TRUE(qp.post(kept).ok());              // an lvalue: posted from a copy
  ASSERT_TRUE(qp.post(std::move(moved)).ok());  // a temporary: posted in place
  ASSERT_EQ(sges.sends.size(), 2u);
  EXPECT_TRUE(verbs_stub::same_sges(sges.sends[0], kThree));
  EXPECT_TRUE(verbs_stub::same_sges(sges.sends[1], kThree));
}

TEST(QueuePairStub, KeptMultiSgeReceivesPostTheirSlicesAfterTheCallersArrayIsReused) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({}, QpState::rts,
                                        {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 4, .max_inline_data = 0});
  verbs_stub::SgeRecorder sges(stub);
  std::array<LocalSlice, 3> slices = kThree;
  std::vector<RecvWr> receives;
  receives.emplace_back(std::span<const LocalSlice>(slices), 1);
  receives.emplace_back(std::span<const LocalSlice>(slices).first(2), 2);
  slices.fill(kReused);
  ASSERT_TRUE(qp.post_recv(receives).ok());
  ASSERT_EQ(sges.recvs.size(), 2u);
  EXPECT_TRUE(verbs_stub::same_sges(sges.recvs[0], kThree));
  EXPECT_TRUE(verbs_stub::same_sges(sges.recvs[1], std::span(kThree).first(2)));
}

// The SGE count against the QP's: every count a request may hold (0 to max_wr_slices), on QPs
// of 0 to 4 send and receive SGEs, posted alone and in a chain.
TEST(QueuePairStub, KeptRequestsOfEverySgeCountAreCheckedAgainstTheQps) {
  const std::array<LocalSlice, verbs::max_wr_slices> four{kThree[0], kThree[1], kThree[2], LocalSlice{0x4000, 40, 4}};
  const RemoteSlice big{.addr = 0x20000, .length = 4096, .rkey = 0x22};
  for (std::uint32_t max = 0; max <= 4; ++max)
    for (std::size_t n = 0; n <= verbs::max_wr_slices; ++n) {
      verbs_stub::Provider stub;
      verbs::QueuePair qp = stub.queue_pair(
          {}, QpState::rts, {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = max, .max_recv_sge = max, .max_inline_data = 0});
      verbs_stub::SgeRecorder sges(stub);
      const std::span<const LocalSlice> slices = std::span(four).first(n);
      const bool fits = n <= max;
      const auto expect = [&](const PostResult& r, std::uint32_t index = 0) {
        return fits ? ::testing::AssertionResult(r.ok()) << r.error().message() : rejected(r, Errc::too_many_sge, index);
      };
      EXPECT_TRUE(expect(qp.post(SendWr::write(slices, big)))) << n << " SGEs, QP of " << max;
      std::vector<SendWr> chain{SendWr::write_imm(std::span<const LocalSlice>{}, big, 1), SendWr::send(slices)};
      EXPECT_TRUE(expect(qp.post(chain), 1)) << n << " SGEs, QP of " << max;
      std::vector<RecvWr> receives{RecvWr(), RecvWr(slices)};
      EXPECT_TRUE(expect(qp.post_recv(receives), 1)) << n << " SGEs, QP of " << max;
      if (n == 1) {  // the one-slice forms
        EXPECT_TRUE(expect(qp.post_send(four[0]))) << "QP of " << max;
        EXPECT_TRUE(expect(qp.post_recv(four[0]))) << "QP of " << max;
      }
      for (const auto* posted : {&sges.sends, &sges.recvs})
        for (const std::vector<ibv_sge>& one : *posted) {
          if (one.empty()) continue;  // the empty requests of the chains
          EXPECT_TRUE(verbs_stub::same_sges(one, slices)) << n << " SGEs, QP of " << max;
        }
    }
}

TEST(QueuePairStub, AKeptRequestOfMoreThanMaxWrSlicesIsRefusedWithNothingPosted) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair(
      {}, QpState::rts, {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 8, .max_recv_sge = 8, .max_inline_data = 0});
  const std::array<LocalSlice, 5> five{kThree[0], kThree[1], kThree[2], LocalSlice{0x4000, 40, 4},
                                       LocalSlice{0x5000, 50, 5}};
  const RemoteSlice big{.addr = 0x20000, .length = 4096, .rkey = 0x22};
  EXPECT_TRUE(rejected(qp.post(SendWr::send(five)), Errc::too_many_slices));
  const SendWr kept = SendWr::write(five, big);
  EXPECT_TRUE(rejected(qp.post(kept), Errc::too_many_slices));
  std::vector<SendWr> chain{SendWr::send(kSrc), SendWr::read(five, big)};
  EXPECT_TRUE(rejected(qp.post(chain), Errc::too_many_slices, 1));
  std::vector<RecvWr> receives{RecvWr(kSrc), RecvWr(five)};
  EXPECT_TRUE(rejected(qp.post_recv(receives), Errc::too_many_slices, 1));
  EXPECT_EQ(stub.posted_sends, 0);
  EXPECT_EQ(stub.posted_recvs, 0);
}

TEST(QueuePairStub, TooManySlicesComesBeforeTooManySge) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({}, QpState::rts, caps(2));  // and 1 receive SGE
  const std::array<LocalSlice, 5> five{kThree[0], kThree[1], kThree[2], LocalSlice{0x4000, 40, 4},
                                       LocalSlice{0x5000, 50, 5}};
  EXPECT_TRUE(rejected(qp.post(SendWr::send(five)), Errc::too_many_slices));
  EXPECT_TRUE(rejected(qp.post(SendWr::send(kThree)), Errc::too_many_sge));
  RecvWr many(five);
  EXPECT_TRUE(rejected(qp.post_recv(std::span(&many, 1)), Errc::too_many_slices));
  RecvWr three(kThree);
  EXPECT_TRUE(rejected(qp.post_recv(std::span(&three, 1)), Errc::too_many_sge));
}

// QueuePair's span forms read the caller's slices during the call: more than a SendWr or RecvWr
// holds, up to the QP's own limit.
TEST(QueuePairStub, TheSpanFormsTakeMoreSlicesThanARequestHolds) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair(
      {}, QpState::rts, {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 6, .max_recv_sge = 6, .max_inline_data = 0});
  verbs_stub::SgeRecorder sges(stub);
  std::array<LocalSlice, 7> seven{};
  for (std::size_t i = 0; i < seven.size(); ++i) seven[i] = LocalSlice{0x1000 * (i + 1), 16, static_cast<std::uint32_t>(i)};
  const std::span<const LocalSlice> six = std::span(seven).first(6);
  const RemoteSlice big{.addr = 0x20000, .length = 4096, .rkey = 0x22};
  ASSERT_TRUE(qp.post_write(six, big).ok());
  ASSERT_TRUE(qp.post_read(six, big).ok());
  ASSERT_TRUE(qp.post_send(six).ok());
  ASSERT_TRUE(qp.post_recv(six).ok());
  ASSERT_EQ(sges.sends.size(), 3u);
  for (const std::vector<ibv_sge>& posted : sges.sends) EXPECT_TRUE(verbs_stub::same_sges(posted, six));
  ASSERT_EQ(sges.recvs.size(), 1u);
  EXPECT_TRUE(verbs_stub::same_sges(sges.recvs[0], six));
  EXPECT_TRUE(rejected(qp.post_send(seven), Errc::too_many_sge)) << "the QP's limit still holds";
  EXPECT_TRUE(rejected(qp.post_recv(std::span<const LocalSlice>(seven)), Errc::too_many_sge));
}

// A UD receive needs room for the 40-byte GRH, counted over all its slices, in every form.
TEST(QueuePairStub, AUdReceiveWithoutRoomForTheGrhIsRefusedInEveryForm) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair(
      {.type = QpType::ud}, QpState::rts,
      {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 6, .max_inline_data = 0});
  const std::array<LocalSlice, 6> eight_each{LocalSlice{0x1000, 8, 1}, LocalSlice{0x2000, 8, 1}, LocalSlice{0x3000, 8, 1},
                                             LocalSlice{0x4000, 8, 1}, LocalSlice{0x5000, 8, 1}, LocalSlice{0x6000, 7, 1}};
  EXPECT_TRUE(rejected(qp.post_recv(LocalSlice{0x1000, 39, 1}), Errc::ud_recv_too_small));
  EXPECT_TRUE(qp.post_recv(LocalSlice{0x1000, 40, 1}).ok());
  EXPECT_TRUE(rejected(qp.post_recv(std::span(eight_each).subspan(1)), Errc::ud_recv_too_small)) << "39 in 5";
  EXPECT_TRUE(qp.post_recv(std::span(eight_each).first(5)).ok()) << "40 in 5";
  std::vector<RecvWr> chain{RecvWr(std::span(eight_each).first(4)), RecvWr(std::span(eight_each).first(1))};
  EXPECT_TRUE(rejected(qp.post_recv(chain), Errc::ud_recv_too_small)) << "32 in 4";
  chain[0] = RecvWr(std::span(eight_each).first(1));
  chain[1] = RecvWr(LocalSlice{0x1000, 40, 1});
  EXPECT_TRUE(rejected(qp.post_recv(chain), Errc::ud_recv_too_small)) << "8 in 1";
  EXPECT_EQ(stub.posted_recvs, 2);
}

// ---- what the provider gets ----

// The request as a careful C programmer writes it: zeroed, then filled.
ibv_send_wr raw(ibv_wr_opcode op, std::uint64_t wr_id) {
  ibv_send_wr wr;
  std::memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  return wr;
}

// Every byte of what was posted, padding included, against `expected`; sg_list must point at
// a copy of `sge` (the request's own).
void expect_posted(const verbs_stub::Provider& stub, ibv_send_wr expected, const ibv_sge& sge) {
  std::array<unsigned char, sizeof(ibv_send_wr)> got = stub.last_send_bytes;
  ASSERT_NE(stub.last_send.sg_list, nullptr);
  EXPECT_EQ(std::memcmp(&stub.last_sge, &sge, sizeof sge), 0);
  ibv_sge* const none = nullptr;
  std::memcpy(got.data() + offsetof(ibv_send_wr, sg_list), &none, sizeof none);
  expected.sg_list = nullptr;
  std::array<unsigned char, sizeof(ibv_send_wr)> want{};
  std::memcpy(want.data(), &expected, sizeof expected);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "byte " << i;
}

TEST(QueuePairStub, PostedRequestsAreByteForByteWhatRawVerbsBuild) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair();

  ASSERT_TRUE(qp.post_write(kSrc, kDst, {.wr_id = 1}).ok());
  ibv_send_wr w = raw(IBV_WR_RDMA_WRITE, 1);
  w.wr.rdma.remote_addr = kDst.addr;
  w.wr.rdma.rkey = kDst.rkey;
  expect_posted(stub, w, kSrc.native());

  ASSERT_TRUE(qp.post_write_imm(kSrc, kDst, 0x01020304, {.wr_id = 2}).ok());
  w = raw(IBV_WR_RDMA_WRITE_WITH_IMM, 2);
  w.imm_data = htonl(0x01020304);
  w.wr.rdma.remote_addr = kDst.addr;
  w.wr.rdma.rkey = kDst.rkey;
  expect_posted(stub, w, kSrc.native());

  ASSERT_TRUE(qp.post_read(kSrc, kDst, {.wr_id = 3}).ok());
  w = raw(IBV_WR_RDMA_READ, 3);
  w.wr.rdma.remote_addr = kDst.addr;
  w.wr.rdma.rkey = kDst.rkey;
  expect_posted(stub, w, kSrc.native());

  ASSERT_TRUE(qp.post_send(kSrc, {.wr_id = 4}).ok());
  expect_posted(stub, raw(IBV_WR_SEND, 4), kSrc.native());

  ASSERT_TRUE(qp.post_compare_swap(kResult, kTarget, 5, 6, {.wr_id = 5}).ok());
  w = raw(IBV_WR_ATOMIC_CMP_AND_SWP, 5);
  w.wr.atomic.remote_addr = kTarget.addr;
  w.wr.atomic.compare_add = 5;
  w.wr.atomic.swap = 6;
  w.wr.atomic.rkey = kTarget.rkey;
  expect_posted(stub, w, kResult.native());
  EXPECT_EQ(stub.posted_sends, 5);
}

TEST(QueuePairStub, ProviderErrorIsReportedAsItsErrno) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair();
  stub.post_rc = ENOMEM;
  const PostResult r = qp.post_write(kSrc, kDst);
  EXPECT_EQ(r.error(), std::error_code(ENOMEM, std::generic_category()));
  EXPECT_EQ(r.failed_index(), 0u);
  std::vector<SendWr> chain{SendWr::write(kSrc, kDst), SendWr::send(kSrc)};
  stub.post_rc = -EAGAIN;  // some providers return a negated errno
  EXPECT_EQ(qp.post(chain).error(), std::error_code(EAGAIN, std::generic_category()));
}

// ---- inline data, atomics, moved-from QPs ----

TEST(QueuePairStub, InlineDataIsRefusedOnReadsAndAtomics) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({}, QpState::rts, caps(1, 256));
  const verbs::PostOptions in{.inline_data = true};
  EXPECT_TRUE(rejected(qp.post_read(kSrc, kDst, in), Errc::inline_not_allowed));
  EXPECT_TRUE(rejected(qp.post_fetch_add(kResult, kTarget, 1, in), Errc::inline_not_allowed));
  EXPECT_TRUE(rejected(qp.post_compare_swap(kResult, kTarget, 1, 2, in), Errc::inline_not_allowed));
  EXPECT_EQ(stub.posted_sends, 0);
  EXPECT_TRUE(qp.post_write(kSrc, kDst, in).ok()) << "writes and sends may be inline";
  EXPECT_TRUE(qp.post_send(kSrc, in).ok());
  EXPECT_EQ(stub.posted_sends, 2);
}

TEST(QueuePairStub, AtomicsAreRefusedWhenTheDeviceHasNone) {
  verbs_stub::Provider stub;
  stub.atomic_cap = IBV_ATOMIC_NONE;
  verbs::QueuePair qp = stub.queue_pair();
  EXPECT_TRUE(rejected(qp.post_fetch_add(kResult, kTarget, 1), Errc::atomics_unsupported));
  EXPECT_TRUE(rejected(qp.post_compare_swap(kResult, kTarget, 1, 2), Errc::atomics_unsupported));
  EXPECT_EQ(stub.posted_sends, 0);
  EXPECT_TRUE(qp.post_read(kSrc, kDst).ok());
}

TEST(QueuePairStub, MovedFromQueuePairRefusesEveryPostAndTransition) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair();
  verbs::QueuePair moved(std::move(qp));
  EXPECT_TRUE(static_cast<bool>(moved));
  EXPECT_FALSE(static_cast<bool>(qp));  // NOLINT(bugprone-use-after-move): what this test is about
  EXPECT_EQ(qp.native_handle(), nullptr);
  EXPECT_TRUE(rejected(qp.post_write(kSrc, kDst), Errc::empty_object));
  std::vector<SendWr> chain{SendWr::write(kSrc, kDst), SendWr::send(kSrc)};
  EXPECT_TRUE(rejected(qp.post(chain), Errc::empty_object));
  EXPECT_TRUE(rejected(qp.post_recv(kSrc), Errc::empty_object));
  EXPECT_EQ(stub.posted_sends, 0);
  EXPECT_EQ(stub.posted_recvs, 0);
  EXPECT_THROW(qp.to_error(), verbs::Error);
  EXPECT_THROW((void)qp.query_state(), verbs::Error);
  try {
    qp.reset();
    ADD_FAILURE() << "reset() of a moved-from QueuePair did not throw";
  } catch (const verbs::Error& e) {
    EXPECT_EQ(e.code(), Errc::empty_object);
    EXPECT_NE(std::string(e.what()).find("moved from"), std::string::npos) << e.what();
  }
  // The moved-to QP works, and move assignment hands it back.
  EXPECT_TRUE(moved.post_write(kSrc, kDst).ok());
  qp = std::move(moved);
  EXPECT_TRUE(qp.post_write(kSrc, kDst).ok());
  EXPECT_TRUE(rejected(moved.post_write(kSrc, kDst), Errc::empty_object));  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(stub.posted_sends, 2);
}

// ---- what setting a QP up asks the device ----

// A QP's setup reads the device attributes (read/atomic limits, atomics) and the port (MTU,
// LID, link layer). While a Device on the context lives, the attributes are the ones it read
// once: a cm connection made a QP with four queries (a system call each) where raw verbs make
// none, and 256 connections at once set up measurably slower than cmtime's.
TEST(QueuePairStub, SetUpWhileADeviceLivesAsksForThePortOnly) {
  verbs_stub::Provider stub;
  {
    verbs::QueuePair alone = stub.queue_pair();
    EXPECT_EQ(stub.device_queries, 1) << "no Device on the context: its attributes are asked for";
    EXPECT_EQ(stub.port_queries, 1);
  }
  const verbs::Device dev = stub.device_handle();
  ASSERT_EQ(stub.device_queries, 2) << "the Device reads them once";
  for (int i = 0; i < 3; ++i) verbs::QueuePair qp = stub.queue_pair();
  EXPECT_EQ(stub.device_queries, 2) << "a QP on a live Device's context reads them again";
  EXPECT_EQ(stub.port_queries, 4);
  const verbs::Device again = stub.device_handle();  // a second Device on the same context
  EXPECT_EQ(stub.device_queries, 2);
  EXPECT_EQ(again.attributes().orig_attr.max_qp_rd_atom, 16);
}

// ---- the PSN ----

TEST(QueuePairStub, ThePsnIsRandomPerQpUnlessTheOptionsGiveIt) {
  verbs_stub::Provider a_stub, b_stub, c_stub;
  const verbs::QueuePair a = a_stub.queue_pair();
  const verbs::QueuePair b = b_stub.queue_pair();
  EXPECT_LE(a.endpoint().psn, 0xffffffu);
  EXPECT_LE(b.endpoint().psn, 0xffffffu);
  EXPECT_NE(a.endpoint().psn, b.endpoint().psn) << "two QPs drew the same PSN (1 in 2^24: run again)";
  const verbs::QueuePair c = c_stub.queue_pair({.psn = 0xabcdef});
  EXPECT_EQ(c.endpoint().psn, 0xabcdefu);
  verbs_stub::Provider zero_stub;
  EXPECT_EQ(zero_stub.queue_pair({.psn = 0}).endpoint().psn, 0u);
}

TEST(QueuePairStub, APsnOverTwentyFourBitsIsRefusedSayingSo) {
  verbs_stub::Provider stub;
  const auto e = verbs::test::thrown_by([&] { (void)stub.queue_pair({.psn = 0x1000000}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), Errc::bad_argument);
  EXPECT_TRUE(verbs::test::contains(e->what(), "QpOptions::psn")) << e->what();
  EXPECT_TRUE(verbs::test::contains(e->what(), "24 bits")) << e->what();
}

}  // namespace
