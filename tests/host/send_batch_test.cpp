// SendBatch (the extended QP API, ibv_wr_*) on the provider stub: what each call hands the
// provider, one ibv_wr_complete per batch, the same checks and errors as QueuePair::post, the
// abort of a refused or abandoned batch, and the multi-SGE split on rxe. The device tests run
// the same calls on SoftRoCE with the data checked.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <infiniband/verbs.h>

#include <verbs/queue_pair.hpp>

#include "support/stub_provider.hpp"
#include "support/stub_requests.hpp"
#include "support/stub_sges.hpp"

namespace {

using verbs::Errc;
using verbs::LocalSlice;
using verbs::PostResult;
using verbs::QpOptions;
using verbs::QpState;
using verbs::QpType;
using verbs::RemoteSlice;
using verbs::SendWr;
using verbs_stub::caps;
using verbs_stub::kDst;
using verbs_stub::kResult;
using verbs_stub::kSrc;
using verbs_stub::kTarget;

const QpOptions kExtended{.extended = true};


::testing::AssertionResult refused(const PostResult& r, Errc why, std::uint32_t index, std::uint32_t posted = 0) {
  if (r.ok()) return ::testing::AssertionFailure() << "posted";
  if (r.error() != std::error_code(why)) return ::testing::AssertionFailure() << "refused with " << r.error().message();
  if (r.failed_index() != index) return ::testing::AssertionFailure() << "at index " << r.failed_index();
  if (r.posted() != posted) return ::testing::AssertionFailure() << r.posted() << " posted";
  return ::testing::AssertionSuccess();
}

std::vector<std::uint64_t> ids(const std::vector<verbs_stub::ExWr>& ws) {
  std::vector<std::uint64_t> r;
  for (const verbs_stub::ExWr& w : ws) r.push_back(w.wr_id);
  return r;
}

TEST(SendBatchStub, RequestsGoThroughTheWrCallsAndOneComplete) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair(kExtended);
  ASSERT_TRUE(qp.extended());
  ASSERT_TRUE(qp.batch()
                  .write(kSrc, kDst, {.wr_id = 1})
                  .write_imm(kSrc, kDst, 0x01020304, {.wr_id = 2, .signaled = false})
                  .read(kSrc, kDst, {.wr_id = 3, .fence = true})
                  .send(kSrc, {.wr_id = 4, .solicited = true})
                  .send_imm(kSrc, 7, {.wr_id = 5})
                  .send_inv(kSrc, 0x99, {.wr_id = 6})
                  .local_inv(0x98, {.wr_id = 7})
                  .fetch_add(kResult, kTarget, 5, {.wr_id = 8})
                  .compare_swap(kResult, kTarget, 9, 10, {.wr_id = 9})
                  .complete()
                  .ok());
  EXPECT_EQ(stub.wr_starts, 1);
  EXPECT_EQ(stub.wr_completes, 1);
  EXPECT_EQ(stub.wr_aborts, 0);
  EXPECT_EQ(stub.posted_sends, 0) << "nothing through ibv_post_send";
  ASSERT_EQ(stub.ex_posted.size(), 9u);
  const std::vector<verbs_stub::ExWr>& p = stub.ex_posted;
  EXPECT_EQ(ids(p), (std::vector<std::uint64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  const ibv_wr_opcode ops[] = {IBV_WR_RDMA_WRITE,    IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ,
                               IBV_WR_SEND,          IBV_WR_SEND_WITH_IMM,       IBV_WR_SEND_WITH_INV,
                               IBV_WR_LOCAL_INV,     IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_CMP_AND_SWP};
  for (std::size_t i = 0; i < p.size(); ++i) EXPECT_EQ(p[i].opcode, ops[i]) << i;
  EXPECT_EQ(p[0].flags, unsigned{IBV_SEND_SIGNALED});
  EXPECT_EQ(p[1].flags, 0u);
  EXPECT_EQ(p[2].flags, unsigned{IBV_SEND_SIGNALED | IBV_SEND_FENCE});
  EXPECT_EQ(p[3].flags, unsigned{IBV_SEND_SIGNALED | IBV_SEND_SOLICITED});
  for (int i : {0, 1, 2}) {
    EXPECT_EQ(p[i].rkey, kDst.rkey);
    EXPECT_EQ(p[i].remote_addr, kDst.addr);
  }
  EXPECT_EQ(p[1].imm_or_rkey, htonl(0x01020304)) << "the immediate in network order, as SendWr::write_imm";
  EXPECT_EQ(p[4].imm_or_rkey, htonl(7));
  EXPECT_EQ(p[5].imm_or_rkey, 0x99u);
  EXPECT_EQ(p[6].imm_or_rkey, 0x98u);
  EXPECT_TRUE(p[6].sges.empty()) << "a local invalidate carries no SGE";
  for (int i : {7, 8}) {
    EXPECT_EQ(p[i].rkey, kTarget.rkey);
    EXPECT_EQ(p[i].remote_addr, kTarget.addr);
    ASSERT_EQ(p[i].sges.size(), 1u);
    EXPECT_EQ(p[i].sges[0].addr, kResult.addr());
  }
  EXPECT_EQ(p[7].compare_add, 5u);
  EXPECT_EQ(p[8].compare_add, 9u);
  EXPECT_EQ(p[8].swap, 10u);
  for (int i : {0, 1, 2, 3, 4, 5}) {
    ASSERT_EQ(p[i].sges.size(), 1u) << i;
    EXPECT_EQ(p[i].sges[0].addr, kSrc.addr());
    EXPECT_EQ(p[i].sges[0].length, kSrc.length());
    EXPECT_EQ(p[i].sges[0].lkey, kSrc.lkey());
  }
}

// (A UD send with its address goes through ibv_wr_set_ud_addr: on the device, which makes the
// address handle.)
TEST(SendBatchStub, UdRefusalsAreQueuePairPosts) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair({.type = QpType::ud, .extended = true});
  EXPECT_TRUE(refused(qp.batch().add(SendWr::send(kSrc)).complete(), Errc::ud_needs_address, 0));
  EXPECT_TRUE(refused(qp.batch().send(kSrc).complete(), Errc::ud_needs_address, 0));
  EXPECT_TRUE(refused(qp.batch().write(kSrc, kDst).complete(), Errc::wrong_qp_type, 0));
}

TEST(SendBatchStub, InlineDataIsCopiedByTheProvider) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair(kExtended, QpState::rts, caps(1, 64));
  std::array<unsigned char, 16> payload{};
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<unsigned char>(i + 1);
  const LocalSlice s{reinterpret_cast<std::uintptr_t>(payload.data()), payload.size(), 0};
  ASSERT_TRUE(qp.batch().send(s, {.inline_data = true}).complete().ok());
  ASSERT_EQ(stub.ex_posted.size(), 1u);
  EXPECT_TRUE(stub.ex_posted[0].sges.empty());
  EXPECT_EQ(stub.ex_posted[0].inline_bytes, std::vector<unsigned char>(payload.begin(), payload.end()));
  EXPECT_EQ(stub.ex_posted[0].flags, unsigned{IBV_SEND_SIGNALED | IBV_SEND_INLINE});
}

// The same request refused by post() and by a batch, with the same error.
TEST(SendBatchStub, ChecksAreQueuePairPostsChecks) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair(kExtended, QpState::rts, caps(2, 32));
  const LocalSlice big{0x1000, 64, 0x11};
  const LocalSlice three[] = {kSrc, kSrc, kSrc};
  const SendWr bad[] = {
      SendWr::write(big, RemoteSlice{.addr = 0x2000, .length = 8, .rkey = 1}),
      SendWr::write(big, kDst, {.inline_data = true}),
      SendWr::read(kSrc, kDst, {.inline_data = true}),
      SendWr::fetch_add(kResult, RemoteSlice{.addr = 0x3004, .length = 8, .rkey = 1}, 1),
      SendWr::fetch_add(kSrc, kTarget, 1),
      SendWr::write(std::span(three), kDst),
  };
  for (const SendWr& w : bad) {
    const PostResult direct = qp.post(w);
    ASSERT_FALSE(direct.ok());
    verbs::SendBatch b = qp.batch();
    b.write(kSrc, kDst, {.wr_id = 1}).add(w).write(kSrc, kDst, {.wr_id = 3});
    EXPECT_TRUE(refused(b.complete(), static_cast<Errc>(direct.error().value()), 1)) << direct.error().message();
  }
  // The typed calls refuse as the builders they mirror.
  EXPECT_TRUE(refused(qp.batch().write(big, RemoteSlice{.addr = 0x2000, .length = 8, .rkey = 1}).complete(),
                      Errc::remote_too_small, 0));
  EXPECT_TRUE(refused(qp.batch().read(kSrc, kDst, {.inline_data = true}).complete(), Errc::inline_not_allowed, 0));
  EXPECT_TRUE(refused(qp.batch().send(big, {.inline_data = true}).complete(), Errc::inline_too_large, 0));
  EXPECT_TRUE(refused(qp.batch().fetch_add(kSrc, kTarget, 1).complete(), Errc::atomic_length, 0));
  EXPECT_TRUE(refused(qp.batch().compare_swap(kResult, RemoteSlice{.addr = 0x3004, .length = 8, .rkey = 1}, 1, 2)
                          .complete(),
                      Errc::atomic_misaligned, 0));
  EXPECT_TRUE(refused(qp.batch().local_inv(1, {.inline_data = true}).complete(), Errc::inline_not_allowed, 0));
  EXPECT_EQ(stub.ex_posted.size(), 0u) << "a refused batch posts nothing";
  EXPECT_EQ(stub.wr_completes, 0);
  EXPECT_EQ(stub.posted_sends, 0);
  EXPECT_EQ(stub.wr_aborts, stub.wr_starts) << "every refused batch was aborted";
  EXPECT_FALSE(stub.wr_open);
}

TEST(SendBatchStub, StateAndDeviceChecks) {
  {
    verbs_stub::Provider stub;
    verbs::QueuePair qp = stub.queue_pair(kExtended, QpState::rtr);
    EXPECT_TRUE(refused(qp.batch().write(kSrc, kDst).complete(), Errc::bad_qp_state, 0));
  }
  {
    verbs_stub::Provider stub;
    stub.atomic_cap = IBV_ATOMIC_NONE;
    verbs::QueuePair qp = stub.queue_pair(kExtended);
    EXPECT_EQ(qp.send_ops() & (IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP), 0u);
    EXPECT_TRUE(refused(qp.batch().fetch_add(kResult, kTarget, 1).complete(), Errc::atomics_unsupported, 0));
  }
  {
    verbs_stub::Provider stub;
    verbs::QueuePair qp = stub.queue_pair({.type = QpType::uc, .extended = true});
    EXPECT_TRUE(refused(qp.batch().read(kSrc, kDst).complete(), Errc::wrong_qp_type, 0));
    EXPECT_TRUE(qp.batch().write(kSrc, kDst).complete().ok());
  }
}

// An adopted extended QP takes only the operations its creator says it was made with: the
// provider has no function for the others (rxe leaves them null).
TEST(SendBatchStub, AnAdoptedQpRefusesWhatItsSendOpsLack) {
  verbs_stub::Provider stub;
  stub.make_extended();
  stub.qp_ex.wr_rdma_read = nullptr;  // as a provider does for an operation not asked for
  verbs::QueuePair qp = verbs::QueuePair::adopt(std::shared_ptr<ibv_qp>(&stub.qp, [](ibv_qp*) {}), kExtended,
                                                caps(1), QpState::rts,
                                                IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND);
  EXPECT_EQ(qp.send_ops(), std::uint64_t{IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND});
  EXPECT_TRUE(refused(qp.batch().read(kSrc, kDst).complete(), Errc::qp_not_extended, 0));
  EXPECT_TRUE(refused(qp.batch().fetch_add(kResult, kTarget, 1).complete(), Errc::qp_not_extended, 0));
  EXPECT_TRUE(qp.batch().write(kSrc, kDst).send(kSrc).complete().ok());
  EXPECT_EQ(stub.ex_posted.size(), 2u);
  // Adopted as extended without its send_ops: every request refused, none reaching the provider.
  verbs::QueuePair bare =
      verbs::QueuePair::adopt(std::shared_ptr<ibv_qp>(&stub.qp, [](ibv_qp*) {}), kExtended, caps(1), QpState::rts);
  EXPECT_TRUE(refused(bare.batch().write(kSrc, kDst).complete(), Errc::qp_not_extended, 0));
  EXPECT_EQ(stub.ex_posted.size(), 2u);
}

// A QP without send SGEs refuses a one-slice request as post() does, not as "not extended".
TEST(SendBatchStub, NoSendSgeIsTooManySgeAsForPost) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair(kExtended, QpState::rts, caps(0));
  const PostResult direct = qp.post_write(kSrc, kDst);
  ASSERT_EQ(direct.error(), std::error_code(Errc::too_many_sge));
  EXPECT_TRUE(refused(qp.batch().write(kSrc, kDst).complete(), Errc::too_many_sge, 0));
  EXPECT_TRUE(qp.batch().local_inv(5).complete().ok()) << "no SGE needed";
}

TEST(SendBatchStub, AtomicWriteOnlyWhereTheDeviceReportsIt) {
  {
    verbs_stub::Provider stub;
    verbs::QueuePair qp = stub.queue_pair(kExtended);
    EXPECT_EQ(qp.send_ops() & IBV_QP_EX_WITH_ATOMIC_WRITE, 0u);
    EXPECT_TRUE(refused(qp.batch().atomic_write(kTarget, 1).complete(), Errc::atomic_write_unsupported, 0));
  }
  verbs_stub::Provider stub;
  stub.device_cap_flags_ex = 1ULL << 40;  // IB_UVERBS_DEVICE_ATOMIC_WRITE
  verbs::QueuePair qp = stub.queue_pair(kExtended);
  EXPECT_NE(qp.send_ops() & IBV_QP_EX_WITH_ATOMIC_WRITE, 0u);
  EXPECT_TRUE(refused(qp.batch().atomic_write(RemoteSlice{.addr = 0x3004, .length = 8, .rkey = 1}, 1).complete(),
                      Errc::atomic_misaligned, 0));
  ASSERT_TRUE(qp.batch().atomic_write(kTarget, 0x1122334455667788, {.wr_id = 4}).complete().ok());
  ASSERT_EQ(stub.ex_posted.size(), 1u);
  EXPECT_EQ(stub.ex_posted[0].opcode, IBV_WR_ATOMIC_WRITE);
  EXPECT_EQ(stub.ex_posted[0].compare_add, 0x1122334455667788u);
  EXPECT_EQ(stub.ex_posted[0].remote_addr, kTarget.addr);
  EXPECT_TRUE(stub.ex_posted[0].sges.empty());
}

// Flush: only where the device reports it and the build's headers have ibv_wr_flush (rdma-core
// 45); the refusal says which of the two is missing.
TEST(SendBatchStub, FlushOnlyWhereTheDeviceReportsItAndTheBuildHasIt) {
  {
    verbs_stub::Provider stub;
    verbs::QueuePair qp = stub.queue_pair(kExtended);
    EXPECT_EQ(qp.send_ops() & verbs::detail::qp_ex_with_flush, 0u);
    EXPECT_TRUE(refused(qp.batch().flush(kTarget).complete(), Errc::flush_unsupported, 0));
  }
  verbs_stub::Provider stub;
  stub.device_cap_flags_ex = 1ULL << 38;  // IB_UVERBS_DEVICE_FLUSH_GLOBAL
  verbs::QueuePair qp = stub.queue_pair(kExtended);
  EXPECT_TRUE(refused(qp.batch().flush(kTarget, verbs::FlushLevel::global, {.inline_data = true}).complete(),
                      Errc::inline_not_allowed, 0))
      << "the request's own error first, as for every operation";
  const std::string why = std::error_code(Errc::flush_unsupported).message();
  if (!verbs::built_with_flush) {
    EXPECT_NE(why.find("older than 45"), std::string::npos) << why;
    EXPECT_TRUE(refused(qp.batch().flush(kTarget).complete(), Errc::flush_unsupported, 0));
    EXPECT_TRUE(stub.ex_posted.empty());
    return;
  }
  EXPECT_NE(why.find("does not report flush"), std::string::npos) << why;
  ASSERT_TRUE(qp.batch()
                  .flush(kTarget, verbs::FlushLevel::global, {.wr_id = 4})
                  .flush_region(0x77, verbs::FlushLevel::persistent, {.wr_id = 5})
                  .complete()
                  .ok());
  ASSERT_EQ(stub.ex_posted.size(), 2u);
  const verbs_stub::ExWr& range = stub.ex_posted[0];
  EXPECT_EQ(range.opcode, static_cast<ibv_wr_opcode>(verbs::detail::wr_flush_op));
  EXPECT_EQ(range.remote_addr, kTarget.addr);
  EXPECT_EQ(range.rkey, kTarget.rkey);
  EXPECT_EQ(range.length, kTarget.length);
  EXPECT_EQ(range.flush_type, 1u) << "type: IBV_FLUSH_GLOBAL (ibv_placement_type)";
  EXPECT_EQ(range.flush_level, 0u) << "level: IBV_FLUSH_RANGE (ibv_selectivity_level)";
  EXPECT_EQ(stub.ex_posted[1].rkey, 0x77u);
  EXPECT_EQ(stub.ex_posted[1].flush_type, 2u) << "type: IBV_FLUSH_PERSISTENT";
  EXPECT_EQ(stub.ex_posted[1].flush_level, 1u) << "level: IBV_FLUSH_MR";
  EXPECT_TRUE(range.sges.empty());
}

TEST(SendBatchStub, NotExtendedOrEmptyQpRefusesWithoutTouchingTheProvider) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair();
  EXPECT_FALSE(qp.extended());
  EXPECT_EQ(qp.send_ops(), 0u);
  EXPECT_TRUE(refused(qp.batch().write(kSrc, kDst).complete(), Errc::qp_not_extended, 0));
  verbs::QueuePair moved = std::move(qp);
  EXPECT_TRUE(refused(qp.batch().write(kSrc, kDst).complete(), Errc::empty_object, 0));  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(stub.wr_starts, 0);
}

TEST(SendBatchStub, AbandonedBatchIsAbortedAndAClosedOneRefuses) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair(kExtended);
  {
    verbs::SendBatch b = qp.batch();
    b.write(kSrc, kDst);
    EXPECT_TRUE(stub.wr_open);
  }
  EXPECT_EQ(stub.wr_aborts, 1);
  EXPECT_FALSE(stub.wr_open);
  EXPECT_TRUE(stub.ex_posted.empty());

  verbs::SendBatch b = qp.batch();
  b.write(kSrc, kDst, {.wr_id = 1});
  ASSERT_TRUE(b.complete().ok());
  EXPECT_TRUE(refused(b.complete(), Errc::batch_closed, 1));
  b.write(kSrc, kDst, {.wr_id = 2});
  EXPECT_TRUE(refused(b.complete(), Errc::batch_closed, 1)) << "request 1, added after the close, is the one refused";
  EXPECT_EQ(stub.wr_completes, 1);
  EXPECT_EQ(ids(stub.ex_posted), (std::vector<std::uint64_t>{1}));
}

TEST(SendBatchStub, ProviderErrorAtCompleteIsItsErrno) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair(kExtended);
  stub.complete_rc = ENOMEM;
  const PostResult r = qp.batch().write(kSrc, kDst).write(kSrc, kDst).complete();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), std::error_code(ENOMEM, std::generic_category()));
  EXPECT_EQ(r.failed_index(), 0u);
  EXPECT_EQ(r.posted(), 0u);
}

// Off rxe, a multi-SGE request stays in the batch (ibv_wr_set_sge_list).
TEST(SendBatchStub, MultiSgeUsesTheSgeList) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair(kExtended, QpState::rts, caps(2));
  const LocalSlice two[] = {LocalSlice{0x1000, 100, 1}, LocalSlice{0x2000, 200, 2}};
  ASSERT_TRUE(qp.batch().write(std::span(two), RemoteSlice{.addr = 0x20000, .length = 4096, .rkey = 0x22}, {.wr_id = 1}).complete().ok());
  ASSERT_EQ(stub.ex_posted.size(), 1u);
  ASSERT_EQ(stub.ex_posted[0].sges.size(), 2u);
  EXPECT_EQ(stub.ex_posted[0].sges[1].length, 200u);
  EXPECT_EQ(stub.posted_sends, 0);
}

// On rxe (vendor 0xffffff), whose ibv_wr_set_sge_list miscounts unequal lengths, such a request
// goes through ibv_post_send between the parts of the batch, in order; equal lengths stay.
TEST(SendBatchStub, UnequalSgesOnRxeGoThroughPostSendInOrder) {
  verbs_stub::Provider stub;
  stub.vendor_id = 0xffffff;
  verbs::QueuePair qp = stub.queue_pair(kExtended, QpState::rts, caps(2, 64));
  const RemoteSlice dst{.addr = 0x20000, .length = 4096, .rkey = 0x22};
  const LocalSlice unequal[] = {LocalSlice{0x1000, 100, 1}, LocalSlice{0x2000, 200, 2}};
  const LocalSlice equal[] = {LocalSlice{0x1000, 100, 1}, LocalSlice{0x2000, 100, 2}};
  ASSERT_TRUE(qp.batch()
                  .write(kSrc, dst, {.wr_id = 1})
                  .write(std::span(unequal), dst, {.wr_id = 2})
                  .write(kSrc, dst, {.wr_id = 3})
                  .send(std::span(equal), {.wr_id = 4})
                  .complete()
                  .ok());
  EXPECT_EQ(stub.order, (std::vector<std::uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(stub.posted_sends, 1);
  EXPECT_EQ(stub.last_send.num_sge, 2);
  EXPECT_EQ(stub.last_send.sg_list[1].length, 200u);
  EXPECT_EQ(ids(stub.ex_posted), (std::vector<std::uint64_t>{1, 3, 4}));
  EXPECT_EQ(stub.wr_completes, 2);
  EXPECT_FALSE(stub.wr_open);

  // First in the batch: nothing to post before it.
  stub.order.clear();
  ASSERT_TRUE(qp.batch().write(std::span(unequal), dst, {.wr_id = 5}).write(kSrc, dst, {.wr_id = 6}).complete().ok());
  EXPECT_EQ(stub.order, (std::vector<std::uint64_t>{5, 6}));

  // Inline from several slices takes that path too (on every device).
  stub.order.clear();
  const LocalSlice small[] = {LocalSlice{0x1000, 16, 1}, LocalSlice{0x2000, 16, 2}};
  ASSERT_TRUE(qp.batch().send(std::span(small), {.wr_id = 7, .inline_data = true}).complete().ok());
  EXPECT_EQ(stub.order, (std::vector<std::uint64_t>{7}));
  EXPECT_EQ(stub.last_send.wr_id, 7u);
}

// A multi-SGE SendWr added to a batch carries its slices, whether the batch hands them to
// ibv_wr_set_sge_list or (rxe, unequal lengths) posts the request through ibv_post_send.
TEST(SendBatchStub, AnAddedMultiSgeRequestCarriesItsSlicesAfterTheCallersArrayIsReused) {
  const std::array<LocalSlice, 2> want{LocalSlice{0x1000, 100, 1}, LocalSlice{0x2000, 200, 2}};
  const RemoteSlice dst{.addr = 0x20000, .length = 4096, .rkey = 0x22};
  for (const std::uint32_t vendor : {0u, 0xffffffu}) {
    verbs_stub::Provider stub;
    stub.vendor_id = vendor;
    verbs::QueuePair qp = stub.queue_pair(kExtended, QpState::rts, caps(2));
    verbs_stub::SgeRecorder sges(stub);
    std::array<LocalSlice, 2> slices = want;
    const SendWr w = SendWr::write(slices, dst, {.wr_id = 1});
    slices.fill(LocalSlice{0xdead0000, 1, 0xbad});
    ASSERT_TRUE(qp.batch().add(w).complete().ok()) << vendor;
    if (vendor == 0) {
      ASSERT_EQ(stub.ex_posted.size(), 1u);
      EXPECT_TRUE(verbs_stub::same_sges(stub.ex_posted[0].sges, want)) << "through ibv_wr_set_sge_list";
    } else {
      ASSERT_EQ(sges.sends.size(), 1u) << "on rxe, unequal lengths go through ibv_post_send";
      EXPECT_TRUE(verbs_stub::same_sges(sges.sends[0], want)) << "through ibv_post_send (rxe)";
    }
  }
}

// A SendWr given more than max_wr_slices is refused; the batch's own span forms read the
// slices during the call and take as many as the QP has.
TEST(SendBatchStub, AKeptRequestOfMoreThanMaxWrSlicesIsRefusedTheSpanFormsTakeThem) {
  verbs_stub::Provider stub;
  verbs::QueuePair qp = stub.queue_pair(kExtended, QpState::rts, caps(6));
  const RemoteSlice dst{.addr = 0x20000, .length = 4096, .rkey = 0x22};
  std::array<LocalSlice, 6> six{};
  for (std::size_t i = 0; i < six.size(); ++i) six[i] = LocalSlice{0x1000 * (i + 1), 16, static_cast<std::uint32_t>(i)};
  EXPECT_TRUE(refused(qp.batch().write(kSrc, dst).add(SendWr::write(six, dst)).complete(), Errc::too_many_slices, 1));
  EXPECT_TRUE(stub.ex_posted.empty());
  ASSERT_TRUE(qp.batch().write(six, dst, {.wr_id = 1}).read(six, dst, {.wr_id = 2}).send(six, {.wr_id = 3}).complete().ok());
  ASSERT_EQ(stub.ex_posted.size(), 3u);
  for (const verbs_stub::ExWr& w : stub.ex_posted) EXPECT_TRUE(verbs_stub::same_sges(w.sges, six)) << w.wr_id;
}

// A check that fails after a split: what came before the refused request is posted, and the
// result says so.
TEST(SendBatchStub, RefusalAfterASplitPostsWhatCameBefore) {
  verbs_stub::Provider stub;
  stub.vendor_id = 0xffffff;
  verbs::QueuePair qp = stub.queue_pair(kExtended, QpState::rts, caps(2));
  const RemoteSlice dst{.addr = 0x20000, .length = 4096, .rkey = 0x22};
  const LocalSlice unequal[] = {LocalSlice{0x1000, 100, 1}, LocalSlice{0x2000, 200, 2}};
  const PostResult r = qp.batch()
                           .write(kSrc, dst, {.wr_id = 1})
                           .write(std::span(unequal), dst, {.wr_id = 2})
                           .write(kSrc, dst, {.wr_id = 3})
                           .fetch_add(kSrc, kTarget, 1, {.wr_id = 4})
                           .write(kSrc, dst, {.wr_id = 5})
                           .complete();
  EXPECT_TRUE(refused(r, Errc::atomic_length, 3, 3));
  EXPECT_EQ(stub.order, (std::vector<std::uint64_t>{1, 2, 3}));
  EXPECT_FALSE(stub.wr_open);
}

}  // namespace
