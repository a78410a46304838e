// Counterparts of rdma-core's tests/ groups the other files do not cover: zero-length write,
// read and send (test_qp.py), a CQ at the device's max_cqe and a completion vector out of range
// (test_cq.py), a full receive queue on the device (test_qp.py's rq overflow), the extended port
// count (test_device.py).
#include <vector>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::Completion;
using verbs::WcOpcode;

class VerbsSuite : public RegionsTest<16 * 1024> {};

TEST_F(VerbsSuite, ZeroLengthWriteReadAndSendComplete) {
  QpPair p(*dev, *pd, {.access = all_access});
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(0, 64), 30)));
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 0), dst->remote().slice(0, 0), {.wr_id = 1})));
  ASSERT_TRUE(posted(p.a.post_read(src->slice(100, 0), dst->remote().slice(0, 0), {.wr_id = 2})));
  ASSERT_TRUE(posted(p.a.post_send(src->slice(0, 0), {.wr_id = 3})));
  const std::vector<Completion> a = collect(p.cq_a, 3);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_TRUE(completed(a[0], WcOpcode::rdma_write, 1)) << describe(a[0]);
  EXPECT_TRUE(completed(a[1], WcOpcode::rdma_read, 2)) << describe(a[1]);
  EXPECT_TRUE(completed(a[2], WcOpcode::send, 3)) << describe(a[2]);
  const Completion r = expect_completion(p.cq_b);
  EXPECT_TRUE(completed(r, WcOpcode::recv, 30)) << describe(r);
  EXPECT_EQ(r.byte_len(), 0u);
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));
}

TEST_F(VerbsSuite, ACqOfTheDevicesMaxCqeAndACompletionVectorOutOfRange) {
  const int max_cqe = dev->attributes().orig_attr.max_cqe;
  verbs::CompletionQueue big(*dev, {.depth = max_cqe});
  EXPECT_GE(big.capacity(), max_cqe);
  const int vectors = dev->native_handle()->num_comp_vectors;
  const auto e = thrown_error([&] { verbs::CompletionQueue cq(*dev, {.with_channel = true, .comp_vector = vectors}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::errc::invalid_argument) << e->what();
  verbs::CompletionQueue last(*dev, {.with_channel = true, .comp_vector = vectors - 1});  // the last one is fine
}

// rdma-core tests/test_device.py DeviceTest.test_phys_port_cnt_ex: the 32-bit port count of
// ibv_query_device_ex agrees with the 8-bit one (which stops at 255), and port_count() is the
// latter. rxe has one port.
TEST_F(VerbsSuite, TheExtendedPortCountAgreesWithTheEightBitOne) {
  const ibv_device_attr_ex& a = dev->attributes();
  EXPECT_GE(a.phys_port_cnt_ex, 1u);
  if (a.phys_port_cnt_ex > 255) {
    EXPECT_EQ(a.orig_attr.phys_port_cnt, 255);
  } else {
    EXPECT_EQ(a.phys_port_cnt_ex, a.orig_attr.phys_port_cnt);
  }
  EXPECT_EQ(dev->port_count(), a.orig_attr.phys_port_cnt);
  if (is_rxe(*dev)) { EXPECT_EQ(a.phys_port_cnt_ex, 1u) << platform(*dev); }
}

// More receives than the queue holds: the device refuses the one too many (ibv_post_recv's
// ENOMEM), the ones before it posted, and they all complete.
TEST_F(VerbsSuite, AFullReceiveQueueRefusesTheOneTooMany) {
  QpPair p(*dev, *pd, {.max_recv_wr = 16, .access = all_access});
  const std::uint32_t room = p.b.max_recv_wr();
  std::vector<verbs::RecvWr> wrs;
  // rxe's ring holds more than it grants (as for sends): go far over it.
  const std::uint32_t n = room * 64;
  for (std::uint32_t i = 0; i < n; ++i) wrs.emplace_back(dst->slice(0, 8), i);
  const verbs::PostResult r = p.b.post_recv(wrs);
  ASSERT_FALSE(r.ok()) << n << " receives in a " << room << "-deep queue";
  EXPECT_EQ(r.error(), std::error_code(ENOMEM, std::generic_category())) << r.error().message();
  EXPECT_GE(r.posted(), room);
  EXPECT_LT(r.posted(), n);
  EXPECT_EQ(r.failed_index(), r.posted());
  // Those posted are there: moved to ERR, the QP flushes each of them.
  const std::uint32_t got = r.posted();
  p.b.to_error();
  const std::vector<Completion> b = collect(p.cq_b, got);
  ASSERT_EQ(b.size(), got);
  for (std::uint32_t i = 0; i < got; ++i) {
    EXPECT_EQ(b[i].wr_id(), i);
    EXPECT_EQ(b[i].status(), verbs::WcStatus::wr_flush_err) << describe(b[i]);
  }
  expect_no_completion(p.cq_b);
}

}  // namespace
