// The extended QP API on a device: SendBatch's requests land with their data checked, a
// refused batch posts nothing and leaves the QP usable, multi-SGE requests of unequal lengths
// arrive whole (rxe's ibv_wr_set_sge_list miscounts them), UD through ibv_wr_set_ud_addr, a
// batch longer than the send queue, zero-length requests, a UC QP made with the extended API, and
// atomic write and flush where the device reports them.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::Access;
using verbs::Completion;
using verbs::Errc;
using verbs::LocalSlice;
using verbs::QpState;
using verbs::QpType;
using verbs::SendWr;
using verbs::WcOpcode;

/// The bytes the slices name, one after the other.
std::vector<std::byte> gathered(std::span<const LocalSlice> slices) {
  std::vector<std::byte> v;
  for (const LocalSlice& s : slices) {
    const auto* p = reinterpret_cast<const std::byte*>(s.addr());  // NOLINT
    v.insert(v.end(), p, p + s.length());
  }
  return v;
}

class ExtendedQp : public RegionsTest<64 * 1024> {
 protected:
  void SetUp() override {
    RegionsTest::SetUp();
    if (IsSkipped()) return;
    p.emplace(*dev, *pd, verbs::QpOptions{.max_send_sge = 4, .max_recv_sge = 4, .access = all_access, .extended = true});
  }
  std::optional<QpPair> p;
};

TEST_F(ExtendedQp, ABatchOfEveryKindLandsInOrderWithItsData) {
  ASSERT_TRUE(p->a.extended());
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(16384, 4096), 20)));
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(20480, 4096), 21)));
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(24576, 64), 22)));
  std::uint64_t& counter = *reinterpret_cast<std::uint64_t*>(dst->data() + 32768);  // NOLINT
  counter = 40;
  const verbs::RemoteSlice remote = dst->remote();
  ASSERT_TRUE(posted(p->a.batch()
                         .write(src->slice(0, 4096), remote.slice(0, 4096), {.wr_id = 1})
                         .write_imm(src->slice(4096, 512), remote.slice(4096, 512), 0xabcd, {.wr_id = 2})
                         .read(src->slice(8192, 4096), remote.slice(0, 4096), {.wr_id = 3})
                         .send(src->slice(12288, 3000), {.wr_id = 4})
                         .send_imm(src->slice(0, 64), 0x1234, {.wr_id = 5})
                         .fetch_add(src->slice(40960, 8), remote.slice(32768, 8), 2, {.wr_id = 6})
                         .compare_swap(src->slice(40968, 8), remote.slice(32768, 8), 42, 7, {.wr_id = 7})
                         .complete()));
  const std::vector<Completion> a = collect(p->cq_a, 7);
  ASSERT_EQ(a.size(), 7u);
  const WcOpcode ops[] = {WcOpcode::rdma_write, WcOpcode::rdma_write, WcOpcode::rdma_read, WcOpcode::send,
                          WcOpcode::send,       WcOpcode::fetch_add,  WcOpcode::comp_swap};
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(completed(a[i], ops[i], i + 1)) << describe(a[i]);
  EXPECT_TRUE(same_bytes(dst->bytes().first(4096), src->bytes().first(4096)));
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(4096, 512), src->bytes().subspan(4096, 512)));
  EXPECT_TRUE(same_bytes(src->bytes().subspan(8192, 4096), src->bytes().first(4096))) << "the read saw the write";
  const std::vector<Completion> b = collect(p->cq_b, 3);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_TRUE(completed(b[0], WcOpcode::recv_rdma_with_imm, 20)) << describe(b[0]);
  EXPECT_EQ(b[0].imm_data(), 0xabcdu);
  EXPECT_TRUE(completed(b[1], WcOpcode::recv, 21));
  EXPECT_EQ(b[1].byte_len(), 3000u);
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(20480, 3000), src->bytes().subspan(12288, 3000)));
  EXPECT_TRUE(completed(b[2], WcOpcode::recv, 22));
  EXPECT_EQ(b[2].imm_data(), 0x1234u);
  std::uint64_t old_add = 0, old_cas = 0;
  std::memcpy(&old_add, src->data() + 40960, 8);
  std::memcpy(&old_cas, src->data() + 40968, 8);
  EXPECT_EQ(old_add, 40u);
  EXPECT_EQ(old_cas, 42u);
  EXPECT_EQ(counter, 7u) << "the swap happened after the add, in posting order";
}

TEST_F(ExtendedQp, ARefusedBatchPostsNothingAndTheNextOneGoes) {
  const verbs::RemoteSlice remote = dst->remote();
  const verbs::PostResult r = p->a.batch()
                                  .write(src->slice(0, 64), remote.slice(0, 64), {.wr_id = 1})
                                  .write(src->slice(0, 128), remote.slice(0, 64), {.wr_id = 2})
                                  .write(src->slice(0, 64), remote.slice(64, 64), {.wr_id = 3})
                                  .complete();
  EXPECT_TRUE(rejected(r, Errc::remote_too_small, 1));
  expect_no_completion(p->cq_a);
  EXPECT_TRUE(all_bytes(dst->bytes().first(256), std::byte{0}));
  // The provider's lock was released by the abort: a batch and a plain post both go.
  ASSERT_TRUE(posted(p->a.batch().write(src->slice(0, 64), remote.slice(0, 64), {.wr_id = 4}).complete()));
  ASSERT_TRUE(posted(p->a.post_write(src->slice(64, 64), remote.slice(64, 64), {.wr_id = 5})));
  const std::vector<Completion> c = collect(p->cq_a, 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_TRUE(completed(c[0], WcOpcode::rdma_write, 4));
  EXPECT_TRUE(completed(c[1], WcOpcode::rdma_write, 5));
  EXPECT_TRUE(same_bytes(dst->bytes().first(128), src->bytes().first(128)));
  // An abandoned batch (never completed) posts nothing either.
  {
    verbs::SendBatch b = p->a.batch();
    b.write(src->slice(0, 64), remote.slice(1024, 64), {.wr_id = 6});
  }
  expect_no_completion(p->cq_a);
  EXPECT_TRUE(all_bytes(dst->bytes().subspan(1024, 64), std::byte{0}));
}

// rxe's ibv_wr_set_sge_list (rdma-core before 64) takes num_sge times the first SGE's length:
// 100 + 200 would deliver 200 bytes and report success, 200 + 100 fails the request. Through
// SendBatch both arrive whole, writes and sends, and equal lengths too.
TEST_F(ExtendedQp, UnequalSgeLengthsArriveWhole) {
  const LocalSlice up[] = {src->slice(0, 100), src->slice(1000, 200)};
  const LocalSlice down[] = {src->slice(2000, 200), src->slice(3000, 100)};
  const LocalSlice same[] = {src->slice(4000, 150), src->slice(5000, 150)};
  const std::vector<std::byte> want_up = gathered(up), want_down = gathered(down), want_same = gathered(same);
  const verbs::RemoteSlice remote = dst->remote();
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(32768, 1024), 31)));
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(36864, 1024), 32)));
  ASSERT_TRUE(posted(p->a.batch()
                         .write(src->slice(8000, 8), remote.slice(7000, 8), {.wr_id = 1})
                         .write(std::span(up), remote.slice(0, 300), {.wr_id = 2})
                         .write(std::span(down), remote.slice(4096, 300), {.wr_id = 3})
                         .write(std::span(same), remote.slice(8192, 300), {.wr_id = 4})
                         .send(std::span(up), {.wr_id = 5})
                         .send(std::span(down), {.wr_id = 6})
                         .complete()));
  const std::vector<Completion> a = collect(p->cq_a, 6);
  ASSERT_EQ(a.size(), 6u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(completed(a[i], WcOpcode::rdma_write, i + 1)) << describe(a[i]);
  EXPECT_TRUE(completed(a[4], WcOpcode::send, 5)) << describe(a[4]);
  EXPECT_TRUE(completed(a[5], WcOpcode::send, 6)) << describe(a[5]);
  EXPECT_TRUE(same_bytes(dst->bytes().first(300), want_up));
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(4096, 300), want_down));
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(8192, 300), want_same));
  const std::vector<Completion> b = collect(p->cq_b, 2);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_TRUE(completed(b[0], WcOpcode::recv, 31));
  EXPECT_EQ(b[0].byte_len(), 300u);
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(32768, 300), want_up));
  EXPECT_TRUE(completed(b[1], WcOpcode::recv, 32));
  EXPECT_EQ(b[1].byte_len(), 300u);
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(36864, 300), want_down));
}

// Far more requests in one batch than the send queue holds: the provider refuses the batch at
// ibv_wr_complete with nothing posted, and the QP goes on. (rxe's ring is larger than the
// max_send_wr it grants: 17 requests in a "16-deep" queue go. 64 times the depth cannot.)
TEST_F(ExtendedQp, ABatchFarLongerThanTheSendQueueIsRefusedWhole) {
  QpPair q(*dev, *pd, {.max_send_wr = 16, .access = all_access, .extended = true});
  const std::uint32_t n = q.a.max_send_wr() * 64;
  ASSERT_LE(n * 8, kRegion);
  const verbs::RemoteSlice remote = dst->remote();
  verbs::SendBatch b = q.a.batch();
  for (std::uint32_t i = 0; i < n; ++i)
    b.write(src->slice(i * 8, 8), remote.slice(i * 8, 8), {.wr_id = i, .signaled = false});
  const verbs::PostResult r = b.complete();
  ASSERT_FALSE(r.ok()) << n << " requests in a " << q.a.max_send_wr() << "-deep send queue";
  EXPECT_EQ(r.error().category(), std::generic_category()) << r.error().message();
  EXPECT_EQ(r.failed_index(), 0u);
  EXPECT_EQ(r.posted(), 0u);
  expect_no_completion(q.cq_a);
  EXPECT_TRUE(all_bytes(dst->bytes().first(std::size_t{8} * n), std::byte{0}));
  ASSERT_TRUE(posted(q.a.batch().write(src->slice(0, 8), remote.slice(0, 8), {.wr_id = 99}).complete()));
  EXPECT_TRUE(completed(expect_completion(q.cq_a), WcOpcode::rdma_write, 99));
}

TEST_F(ExtendedQp, UdSendsGoThroughTheBatchWithTheirAddress) {
  QpPair u(*dev, *pd, {.type = QpType::ud, .extended = true});
  const verbs::Endpoint peer = u.b.endpoint();
  const verbs::AddressHandle ah(*pd, {.dgid = peer.gid, .dlid = peer.lid,
                                      .sgid_index = static_cast<std::uint8_t>(u.a.gid_index())});
  ASSERT_TRUE(posted(u.b.post_recv(dst->slice(0, 40 + 1024), 1)));
  ASSERT_TRUE(posted(u.b.post_recv(dst->slice(2048, 40 + 1024), 2)));
  ASSERT_TRUE(posted(u.a.batch()
                         .add(SendWr::send(src->slice(0, 500), {.wr_id = 3}).to(ah, peer.qp_num, peer.qkey))
                         .add(SendWr::send_imm(src->slice(500, 20), 77, {.wr_id = 4}).to(ah, peer.qp_num, peer.qkey))
                         .complete()));
  const std::vector<Completion> a = collect(u.cq_a, 2);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_TRUE(completed(a[0], WcOpcode::send, 3));
  EXPECT_TRUE(completed(a[1], WcOpcode::send, 4));
  const std::vector<Completion> b = collect(u.cq_b, 2);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].byte_len(), 540u);
  EXPECT_EQ(b[0].src_qp(), u.a.qp_num());
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(40, 500), src->bytes().first(500)));
  EXPECT_EQ(b[1].imm_data(), 77u);
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(2048 + 40, 20), src->bytes().subspan(500, 20)));
  EXPECT_TRUE(rejected(u.a.batch().send(src->slice(0, 8)).complete(), Errc::ud_needs_address));
}

// rdma-core tests/test_qpex.py test_qp_ex_rc_rdma_write_zero_size and
// test_qp_ex_rc_rdma_read_zero_size: a zero-length write and a zero-length read through the
// batch complete, and move no byte either way.
TEST_F(ExtendedQp, AZeroLengthWriteAndReadThroughABatchComplete) {
  fill_pattern(dst->bytes(), 2);
  const std::vector<std::byte> local = pattern(kRegion, 1), remote = pattern(kRegion, 2);
  ASSERT_TRUE(posted(p->a.batch()
                         .write(src->slice(0, 0), dst->remote().slice(0, 0), {.wr_id = 1})
                         .read(src->slice(100, 0), dst->remote().slice(200, 0), {.wr_id = 2})
                         .complete()));
  const std::vector<Completion> a = collect(p->cq_a, 2);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_TRUE(completed(a[0], WcOpcode::rdma_write, 1)) << describe(a[0]);
  EXPECT_TRUE(completed(a[1], WcOpcode::rdma_read, 2)) << describe(a[1]);
  EXPECT_TRUE(same_bytes(dst->bytes(), remote));
  EXPECT_TRUE(same_bytes(src->bytes(), local));
  expect_no_completion(p->cq_b, 50ms);
}

// rdma-core tests/test_qpex.py test_qp_ex_ud_zero_size: a zero-length UD send through the batch
// arrives as a receive of 40 bytes, the GRH alone.
TEST_F(ExtendedQp, AZeroLengthUdSendThroughABatchArrivesAsTheGrhAlone) {
  QpPair u(*dev, *pd, {.type = QpType::ud, .extended = true});
  const verbs::Endpoint peer = u.b.endpoint();
  const verbs::AddressHandle ah(*pd, u.a, peer);
  ASSERT_TRUE(posted(u.b.post_recv(dst->slice(0, 40 + 64), 1)));
  ASSERT_TRUE(posted(
      u.a.batch().add(SendWr::send(src->slice(0, 0), {.wr_id = 2}).to(ah, peer.qp_num, peer.qkey)).complete()));
  EXPECT_TRUE(completed(expect_completion(u.cq_a), WcOpcode::send, 2));
  const Completion r = expect_completion(u.cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv, 1));
  EXPECT_EQ(r.byte_len(), 40u);
  EXPECT_EQ(r.src_qp(), u.a.qp_num());
  EXPECT_TRUE(all_bytes(dst->bytes().subspan(40, 64), std::byte{0}));
}

// rdma-core tests/test_qp.py test_create_uc_qp_ex_no_attr: a UC QP made with ibv_create_qp_ex
// starts in RESET, with UC's send operations only, and its batch refuses to post there.
TEST_F(ExtendedQp, AnExtendedUcQpStartsInResetWithUcOperationsOnly) {
  verbs::CompletionQueue cq(*dev);
  const verbs::QueuePair qp(*pd, cq, {.type = QpType::uc, .access = Access::remote_write, .extended = true});
  ASSERT_TRUE(qp.extended());
  EXPECT_EQ(qp.type(), QpType::uc);
  EXPECT_EQ(qp.state(), QpState::reset);
  EXPECT_EQ(qp.query_state(), QpState::reset);
  EXPECT_NE(qp.send_ops() & IBV_QP_EX_WITH_RDMA_WRITE, 0u);
  EXPECT_EQ(qp.send_ops() & (std::uint64_t{IBV_QP_EX_WITH_RDMA_READ} | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD), 0u);
  EXPECT_TRUE(rejected(qp.batch().write(src->slice(0, 8), dst->remote().slice(0, 8)).complete(), Errc::bad_qp_state));
  expect_no_completion(cq, 50ms);
}

// rdma-core tests/test_qp.py test_create_uc_qp_ex_with_attr: that QP taken to INIT, RTR and RTS
// towards a peer, each state as the device reports it; then a write through its batch lands.
TEST_F(ExtendedQp, AnExtendedUcQpTakenToRtsWritesThroughItsBatch) {
  verbs::CompletionQueue cq_a(*dev), cq_b(*dev);
  const verbs::QpOptions uc{.type = QpType::uc, .access = Access::local_write | Access::remote_write, .extended = true};
  verbs::QueuePair a(*pd, cq_a, uc), b(*pd, cq_b, uc);
  a.to_init();
  EXPECT_EQ(a.query_state(), QpState::init);
  a.to_rtr(b.endpoint(), QpPair::fast());
  EXPECT_EQ(a.query_state(), QpState::rtr);
  a.to_rts(QpPair::fast());
  EXPECT_EQ(a.query_state(), QpState::rts);
  b.connect(a.endpoint(), QpPair::fast());
  ASSERT_TRUE(posted(a.batch().write(src->slice(0, 3000), dst->remote().slice(5, 3000), {.wr_id = 1}).complete()));
  EXPECT_TRUE(completed(expect_completion(cq_a), WcOpcode::rdma_write, 1));
  // UC has no acknowledgements: the sender's completion does not prove arrival, so wait for the bytes.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!std::ranges::equal(dst->bytes().subspan(5, 3000), src->bytes().first(3000)) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(5, 3000), src->bytes().first(3000)));
}

// Atomic write (IBA 1.5): only where the device reports IB_UVERBS_DEVICE_ATOMIC_WRITE
// (rxe from Linux 6.2; not 6.1): elsewhere refused before posting.
TEST_F(ExtendedQp, AtomicWriteWhereTheDeviceReportsIt) {
  const verbs::RemoteSlice target = dst->remote().slice(4096, 8);
  if ((p->a.send_ops() & IBV_QP_EX_WITH_ATOMIC_WRITE) == 0) {
    EXPECT_TRUE(rejected(p->a.batch().atomic_write(target, 5).complete(), Errc::atomic_write_unsupported));
    expect_no_completion(p->cq_a);
    GTEST_SKIP() << dev->name() << " does not report atomic write (IB_UVERBS_DEVICE_ATOMIC_WRITE; rxe has it from "
                 << "Linux 6.2): refused before posting, as checked";
  }
  ASSERT_TRUE(posted(p->a.batch().atomic_write(target, 0x0102030405060708, {.wr_id = 1}).complete()));
  EXPECT_TRUE(completed(expect_completion(p->cq_a), WcOpcode::atomic_write, 1));
  std::uint64_t got = 0;
  std::memcpy(&got, dst->data() + 4096, 8);
  EXPECT_EQ(got, 0x0102030405060708u);
}

// Flush (IBA 1.5; rdma-core tests/test_qpex.py test_qp_ex_rc_flush): writes, then a flush of
// their range and one of the whole region, both at the global level, into a region that
// grants it. Only where the device reports flush (rxe from Linux 6.2) and the build's rdma-core
// headers have ibv_wr_flush (45 on): elsewhere refused before posting, and the refusal says
// which is missing.
class Flush : public RegionsTest<64 * 1024> {
 protected:
  /// The device reports a global flush (IB_UVERBS_DEVICE_FLUSH_GLOBAL).
  [[nodiscard]] bool reports_flush() const { return (dev->attributes().device_cap_flags_ex & (1ULL << 38)) != 0; }
};

TEST_F(Flush, WhereTheDeviceReportsItAndTheBuildHasItWritesAreFlushed) {
  if (!reports_flush()) {
    // Refused before anything reaches the device: the right to be flushed, and the flush.
    const auto e = thrown_error([&] {
      (void)verbs::MemoryRegion::allocate(*pd, 4096, Access::local_write | Access::remote_write | Access::flush_global);
    });
    ASSERT_TRUE(e) << "registered with Access::flush_global where the device reports no flush";
    EXPECT_EQ(e->code(), std::make_error_code(std::errc::operation_not_supported)) << e->what();
    EXPECT_TRUE(contains(e->what(), "IB_UVERBS_DEVICE_FLUSH_GLOBAL")) << e->what();
    QpPair plain(*dev, *pd, {.access = Access::remote_write, .extended = true});
    EXPECT_TRUE(rejected(plain.a.batch().flush(dst->remote()).complete(), Errc::flush_unsupported));
    expect_no_completion(plain.cq_a);
    EXPECT_FALSE(is_rxe(*dev) && linux_at_least(6, 2)) << platform(*dev) << "'s rxe reports flush from Linux 6.2";
    GTEST_SKIP() << platform(*dev) << " does not report flush (IB_UVERBS_DEVICE_FLUSH_GLOBAL): refused, as checked";
  }
  auto target = verbs::MemoryRegion::allocate(*pd, 64 * 1024,
                                              Access::local_write | Access::remote_write | Access::flush_global);
  QpPair q(*dev, *pd, {.access = Access::remote_write | Access::flush_global, .extended = true});
  if (!verbs::built_with_flush) {
    const verbs::PostResult r = q.a.batch().flush(target.remote()).complete();
    EXPECT_TRUE(rejected(r, Errc::flush_unsupported));
    EXPECT_TRUE(contains(r.error().message(), "older than 45")) << r.error().message();
    expect_no_completion(q.cq_a);
    GTEST_SKIP() << "built against rdma-core headers without ibv_wr_flush (older than 45): refused, as checked";
  }
  ASSERT_NE(q.a.send_ops() & verbs::detail::qp_ex_with_flush, 0u) << "the device reports flush and the build has it";
  fill_pattern(src->bytes(), 21);
  ASSERT_TRUE(posted(q.a.batch()
                         .write(src->slice(0, 8192), target.remote().slice(4096, 8192), {.wr_id = 1})
                         .flush(target.remote().slice(4096, 8192), verbs::FlushLevel::global, {.wr_id = 2})
                         .flush_region(target.rkey(), verbs::FlushLevel::global, {.wr_id = 3})
                         .complete()));
  const std::vector<Completion> got = collect(q.cq_a, 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(completed(got[0], WcOpcode::rdma_write, 1)) << describe(got[0]);
  EXPECT_TRUE(completed(got[1], WcOpcode::flush, 2)) << describe(got[1]);
  EXPECT_TRUE(completed(got[2], WcOpcode::flush, 3)) << describe(got[2]);
  EXPECT_TRUE(same_bytes(target.bytes().subspan(4096, 8192), src->bytes().first(8192)));
}

// A flush beyond what the target region grants (test_qp_ex_rc_flush_type_violate): a
// persistent flush into a region registered for global flushes only fails at the responder,
// and the requester's QP goes to ERR.
TEST_F(Flush, BeyondTheRegionsRightsFailsAtTheResponder) {
  if (!reports_flush() || !verbs::built_with_flush)
    GTEST_SKIP() << platform(*dev) << (reports_flush() ? ": a build without ibv_wr_flush" : " does not report flush")
                 << " (WhereTheDeviceReportsItAndTheBuildHasItWritesAreFlushed checks the refusal)";
  auto target = verbs::MemoryRegion::allocate(*pd, 4096, Access::local_write | Access::remote_write | Access::flush_global);
  QpPair q(*dev, *pd, {.access = Access::remote_write | Access::flush_global | Access::flush_persistent, .extended = true});
  ASSERT_TRUE(posted(q.a.batch().flush(target.remote(), verbs::FlushLevel::persistent, {.wr_id = 1}).complete()));
  const Completion c = expect_completion(q.cq_a);
  EXPECT_EQ(c.wr_id(), 1u);
  EXPECT_EQ(c.status(), verbs::WcStatus::rem_access_err) << describe(c);
  EXPECT_EQ(q.a.refresh_state(), QpState::err);
}

}  // namespace
