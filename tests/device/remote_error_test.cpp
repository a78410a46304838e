// Remote errors: requests the responder refuses complete with the right status and wr_id,
// the rest of the chain is flushed, and the pair recovers after reset() and connect().
#include <vector>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::Access;
using verbs::Completion;
using verbs::QpState;
using verbs::RemoteSlice;
using verbs::SendWr;
using verbs::WcOpcode;
using verbs::WcStatus;

class RemoteError : public RegionsTest<16 * 1024> {
 protected:
  [[nodiscard]] QpPair pair(verbs::AccessFlags qp_access = all_access,
                            verbs::TransportOptions connect = QpPair::fast()) const {
    return QpPair(*dev, *pd, {.access = qp_access}, connect);
  }
  /// dst's remote view with an rkey that opens nothing.
  [[nodiscard]] RemoteSlice bad_rkey() const {
    RemoteSlice r = dst->remote();
    r.rkey ^= 0xff;
    return r;
  }

};

/// Success when `c` failed with `status` and carries `wr_id`.
::testing::AssertionResult failed_with(const Completion& c, WcStatus status, std::uint64_t wr_id) {
  if (c.status() == status && c.wr_id() == wr_id) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected status " << static_cast<int>(status) << " ("
                                       << make_error_code(status).message() << ") with wr_id=" << wr_id << ", got "
                                       << describe(c);
}

TEST_F(RemoteError, BadRkeyIsReportedAsRemoteAccessErrorWithItsWrId) {
  QpPair p = pair();
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 100), bad_rkey(), {.wr_id = 61})));
  const Completion c = expect_completion(p.cq_a);
  EXPECT_TRUE(failed_with(c, WcStatus::rem_access_err, 61));
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.error_code(), make_error_code(WcStatus::rem_access_err));
  EXPECT_STREQ(c.error_code().category().name(), "ibv_wc_status");
  EXPECT_EQ(c.qp_num(), p.a.qp_num());
  const auto e = thrown_error([&] { c.throw_if_failed(); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), make_error_code(WcStatus::rem_access_err));
  EXPECT_TRUE(contains(e->what(), "wr_id=61"));
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));
  EXPECT_EQ(p.a.query_state(), QpState::err);
}

TEST_F(RemoteError, WriteBeyondTheRemoteRegionIsRejected) {
  for (const std::uint64_t past : {90u, 1u}) {
    SCOPED_TRACE(testing::Message() << past << " bytes past the end");
    QpPair p = pair();
    // Built by hand: RemoteSlice::slice would refuse it, and post() would refuse a write that
    // does not fit the slice.
    const RemoteSlice beyond{dst->remote().addr + kRegion - 100 + past, 100, dst->rkey()};
    ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 100), beyond, {.wr_id = 62 + past})));
    EXPECT_TRUE(failed_with(expect_completion(p.cq_a), WcStatus::rem_access_err, 62 + past));
    EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0})) << "part of the refused write landed";
  }
}

TEST_F(RemoteError, ReadWithoutRemoteReadAccessOnTheRegionIsRejected) {
  const verbs::MemoryRegion no_read =
      verbs::MemoryRegion::allocate(*pd, 4096, Access::local_write | Access::remote_write | Access::remote_atomic);
  fill_pattern(no_read.bytes(), 7);
  QpPair p = pair();
  ASSERT_TRUE(posted(p.a.post_read(dst->slice(0, 256), no_read.remote(), {.wr_id = 63})));
  EXPECT_TRUE(failed_with(expect_completion(p.cq_a), WcStatus::rem_access_err, 63));
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0})) << "data came back from a region without remote read";
}

TEST_F(RemoteError, AtomicWithoutRemoteAtomicAccessOnTheRegionIsRejected) {
  const verbs::MemoryRegion no_atomic =
      verbs::MemoryRegion::allocate(*pd, 4096, Access::local_write | Access::remote_write | Access::remote_read);
  QpPair p = pair();
  ASSERT_TRUE(posted(p.a.post_fetch_add(dst->slice(0, 8), no_atomic.remote().slice(0, 8), 5, {.wr_id = 64})));
  EXPECT_TRUE(failed_with(expect_completion(p.cq_a), WcStatus::rem_access_err, 64));
  EXPECT_TRUE(all_bytes(no_atomic.bytes(), std::byte{0}));
}

TEST_F(RemoteError, ReadFromAQpWithoutRemoteReadAccessIsAnInvalidRequest) {
  QpPair p = pair(Access::local_write | Access::remote_write);
  ASSERT_TRUE(posted(p.a.post_read(dst->slice(0, 64), src->remote(), {.wr_id = 65})));
  EXPECT_TRUE(failed_with(expect_completion(p.cq_a), WcStatus::rem_inv_req_err, 65));
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));
}

// rdma-core's tests/test_atomic.py: an atomic with a bad rkey, and on a QP that grants no
// remote atomics.
TEST_F(RemoteError, AtomicWithABadRkeyIsARemoteAccessError) {
  QpPair p = pair();
  ASSERT_TRUE(posted(p.a.post_fetch_add(src->slice(0, 8), bad_rkey().slice(0, 8), 1, {.wr_id = 66})));
  EXPECT_TRUE(failed_with(expect_completion(p.cq_a), WcStatus::rem_access_err, 66));
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));
}

TEST_F(RemoteError, AtomicOnAQpWithoutRemoteAtomicAccessIsAnInvalidRequest) {
  QpPair p = pair(Access::local_write | Access::remote_write | Access::remote_read);
  ASSERT_TRUE(posted(p.a.post_compare_swap(src->slice(0, 8), dst->remote().slice(0, 8), 0, 5, {.wr_id = 67})));
  EXPECT_TRUE(failed_with(expect_completion(p.cq_a), WcStatus::rem_inv_req_err, 67));
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));
}

// tests/test_qp.py's bad lkey: the local side refuses its own SGE. The specification's status
// is LOC_PROT_ERR. rxe gives another, by kernel (asserted, so that a kernel that changes it is
// noticed): LOC_QP_OP_ERR on Linux 6.1; WR_FLUSH_ERR from 6.12 on (the requester moves the QP to
// ERR and flushes the request itself). Either way nothing lands and the QP is in ERR.
TEST_F(RemoteError, ABadLkeyFailsLocallyAndNothingLands) {
  QpPair p = pair();
  const verbs::LocalSlice s = src->slice(0, 64);
  const verbs::LocalSlice bad{s.addr(), s.length(), s.lkey() ^ 0x5a00};
  ASSERT_TRUE(posted(p.a.post_write(bad, dst->remote().slice(0, 64), {.wr_id = 68})));
  const Completion c = expect_completion(p.cq_a);
  if (!is_rxe(*dev))
    EXPECT_TRUE(failed_with(c, WcStatus::loc_prot_err, 68) || failed_with(c, WcStatus::loc_qp_op_err, 68)) << describe(c);
  else if (linux_at_least(6, 12))
    EXPECT_TRUE(failed_with(c, WcStatus::wr_flush_err, 68)) << platform(*dev) << ": " << describe(c);
  else
    EXPECT_TRUE(failed_with(c, WcStatus::loc_qp_op_err, 68)) << platform(*dev) << ": " << describe(c);
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));
  EXPECT_EQ(p.a.query_state(), QpState::err);
}

TEST_F(RemoteError, LaterRequestsInTheChainAreFlushed) {
  QpPair p = pair();
  std::vector<SendWr> chain{
      SendWr::write(src->slice(0, 100), dst->remote().slice(0, 100), {.wr_id = 70}),
      SendWr::write(src->slice(100, 100), bad_rkey().slice(100, 100), {.wr_id = 71}),
      SendWr::write(src->slice(200, 100), dst->remote().slice(200, 100), {.wr_id = 72}),
      SendWr::read(src->slice(1000, 100), dst->remote().slice(0, 100), {.wr_id = 73}),
      SendWr::send(src->slice(300, 10), {.wr_id = 74}),
  };
  ASSERT_TRUE(posted(p.a.post(chain)));
  const auto got = collect(p.cq_a, 5);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_TRUE(completed(got[0], WcOpcode::rdma_write, 70)) << "the request before the bad one executes";
  EXPECT_TRUE(failed_with(got[1], WcStatus::rem_access_err, 71));
  EXPECT_TRUE(failed_with(got[2], WcStatus::wr_flush_err, 72));
  EXPECT_TRUE(failed_with(got[3], WcStatus::wr_flush_err, 73));
  EXPECT_TRUE(failed_with(got[4], WcStatus::wr_flush_err, 74));
  EXPECT_TRUE(same_bytes(dst->bytes().first(100), src->bytes().first(100)));
  EXPECT_TRUE(all_bytes(dst->bytes().subspan(100), std::byte{0})) << "a flushed write landed";
  expect_no_completion(p.cq_a, 100ms);
  EXPECT_EQ(p.a.query_state(), QpState::err);
}

TEST_F(RemoteError, ResponderReceivesAreFlushedAfterARemoteAccessError) {
  QpPair p = pair();
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(0, 64), 80)));
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(64, 64), 81)));
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8), bad_rkey(), {.wr_id = 82})));
  EXPECT_TRUE(failed_with(expect_completion(p.cq_a), WcStatus::rem_access_err, 82));
  const auto got = collect(p.cq_b, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(failed_with(got[0], WcStatus::wr_flush_err, 80));
  EXPECT_TRUE(failed_with(got[1], WcStatus::wr_flush_err, 81));
  EXPECT_EQ(p.b.query_state(), QpState::err);
}

TEST_F(RemoteError, SendLargerThanTheReceiveFailsOnBothSides) {
  QpPair p = pair();
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(0, 64), 83)));
  ASSERT_TRUE(posted(p.a.post_send(src->slice(0, 65), {.wr_id = 84})));
  EXPECT_TRUE(failed_with(expect_completion(p.cq_a), WcStatus::rem_op_err, 84));
  const Completion r = expect_completion(p.cq_b);
  EXPECT_EQ(r.wr_id(), 83u);
  EXPECT_FALSE(r.ok()) << describe(r);
}

TEST_F(RemoteError, SendWithoutAReceiveFailsWithRnrRetryExceeded) {
  verbs::TransportOptions no_rnr_retry = QpPair::fast();
  no_rnr_retry.rnr_retry_count = 0;
  QpPair p = pair(all_access, no_rnr_retry);
  ASSERT_TRUE(posted(p.a.post_send(src->slice(0, 32), {.wr_id = 85})));
  EXPECT_TRUE(failed_with(expect_completion(p.cq_a), WcStatus::rnr_retry_exc_err, 85));
}

TEST_F(RemoteError, ResetBothAndReconnectRestoresService) {
  QpPair p = pair();
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 100), bad_rkey(), {.wr_id = 90})));
  EXPECT_TRUE(failed_with(expect_completion(p.cq_a), WcStatus::rem_access_err, 90));
  ASSERT_EQ(p.a.query_state(), QpState::err);

  p.a.reset();
  p.b.reset();
  EXPECT_EQ(p.a.query_state(), QpState::reset);
  EXPECT_EQ(p.b.query_state(), QpState::reset);
  p.a.connect(p.b.endpoint(), QpPair::fast());
  p.b.connect(p.a.endpoint(), QpPair::fast());
  EXPECT_EQ(p.a.query_state(), QpState::rts);
  EXPECT_EQ(p.b.query_state(), QpState::rts);

  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 4096), dst->remote().slice(8), {.wr_id = 91})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 91));
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(8, 4096), src->bytes().first(4096)));
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(8192, 100), 92)));
  ASSERT_TRUE(posted(p.a.post_send(src->slice(5000, 100), {.wr_id = 93})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::send, 93));
  EXPECT_TRUE(completed(expect_completion(p.cq_b), WcOpcode::recv, 92));
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(8192, 100), src->bytes().subspan(5000, 100)));
}

TEST_F(RemoteError, ConnectFromErrorResetsFirst) {
  QpPair p = pair();
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 100), bad_rkey(), {.wr_id = 94})));
  EXPECT_TRUE(failed_with(expect_completion(p.cq_a), WcStatus::rem_access_err, 94));
  ASSERT_EQ(p.a.query_state(), QpState::err);
  ASSERT_EQ(p.b.query_state(), QpState::err);

  p.a.connect(p.b.endpoint(), QpPair::fast());
  p.b.connect(p.a.endpoint(), QpPair::fast());
  EXPECT_EQ(p.a.query_state(), QpState::rts);
  ASSERT_TRUE(posted(p.a.post_read(dst->slice(0, 2048), src->remote().slice(100), {.wr_id = 95})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_read, 95));
  EXPECT_TRUE(same_bytes(dst->bytes().first(2048), src->bytes().subspan(100, 2048)));
}

}  // namespace
