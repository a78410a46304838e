// Unreliable datagrams: sends through an AddressHandle arrive after the 40-byte GRH, and a
// reply goes back through AddressHandle::reply_to; a privileged Q_Key; relaxed-ordering regions.
#include <array>
#include <type_traits>
#include <vector>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::Completion;
using verbs::Errc;
using verbs::QpType;
using verbs::SendWr;
using verbs::WcOpcode;

static_assert(std::is_nothrow_move_constructible_v<verbs::AddressHandle> &&
              std::is_nothrow_move_assignable_v<verbs::AddressHandle>);
static_assert(std::is_nothrow_swappable_v<verbs::AddressHandle>);

constexpr std::uint32_t kGrh = 40;

class UnreliableDatagram : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    p.emplace(*dev, *pd, verbs::QpOptions{.type = QpType::ud});
    src.emplace(verbs::MemoryRegion::allocate(*pd, 16 * 1024, verbs::Access::local_write));
    dst.emplace(verbs::MemoryRegion::allocate(*pd, 16 * 1024, verbs::Access::local_write));
    fill_pattern(src->bytes(), 1);
  }
  /// An address handle from a's port to b.
  [[nodiscard]] verbs::AddressHandle ah_to_b() const {
    const verbs::Endpoint b = p->b.endpoint();
    return verbs::AddressHandle(
        *pd, {.dgid = b.gid, .dlid = b.lid, .sgid_index = static_cast<std::uint8_t>(p->a.gid_index())});
  }

  std::optional<QpPair> p;
  std::optional<verbs::MemoryRegion> src, dst;
};

// Attributes read back after the modifies (rdma-core tests/test_qp.py): a UD QP's own Q_Key
// (not the default), its port and P_Key index, and the send PSN moving with a send.
TEST_F(UnreliableDatagram, QueryReadsBackTheQkeyPortAndSendPsn) {
  QpPair q(*dev, *pd, verbs::QpOptions{.type = QpType::ud, .qkey = 0x2468ace0});
  const verbs::QpAttributes a = q.a.query();
  EXPECT_EQ(a.state, verbs::QpState::rts);
  EXPECT_EQ(a.qkey, 0x2468ace0u);
  EXPECT_EQ(a.port, 1);
  EXPECT_EQ(a.pkey_index, 0);
  EXPECT_EQ(a.sq_psn, q.a.endpoint().psn);
  EXPECT_EQ(q.b.endpoint().qkey, 0x2468ace0u);
  const verbs::AddressHandle ah(
      *pd, {.dgid = q.b.endpoint().gid, .dlid = q.b.endpoint().lid, .sgid_index = static_cast<std::uint8_t>(q.a.gid_index())});
  ASSERT_TRUE(posted(q.b.post_recv(dst->slice(0, kGrh + 64), 1)));
  ASSERT_TRUE(posted(q.a.post(SendWr::send(src->slice(0, 64), {.wr_id = 2}).to(ah, q.b.qp_num(), 0x2468ace0))));
  EXPECT_TRUE(completed(expect_completion(q.cq_a), WcOpcode::send, 2));
  EXPECT_TRUE(completed(expect_completion(q.cq_b), WcOpcode::recv, 1));
  EXPECT_EQ(q.a.query().sq_psn, (q.a.endpoint().psn + 1) & 0xffffffu);
}

// rdma-core tests/test_qp.py test_create_ud_qp_with_privileged_qkey: the privileged Q_Key
// 0x80000000 (its high bit set: newer kernels let only CAP_NET_RAW set one; the tests run as
// root) is taken at INIT and read back, on a QP made with ibv_create_qp and with ibv_create_qp_ex.
TEST_F(UnreliableDatagram, APrivilegedQkeyIsTakenAndReadBack) {
  verbs::CompletionQueue cq(*dev);
  for (const bool extended : {false, true}) {
    SCOPED_TRACE(extended ? "extended" : "plain");
    verbs::QueuePair qp(*pd, cq, {.type = QpType::ud, .qkey = 0x80000000, .extended = extended});
    qp.to_init();
    EXPECT_EQ(qp.query().qkey, 0x80000000u);
    EXPECT_EQ(qp.endpoint().qkey, 0x80000000u);
  }
}

// rdma-core tests/test_relaxed_ordering.py RoTestCase.test_ro_ud_traffic: UD sends between
// regions registered with Access::relaxed_ordering (an optional right: a device that does not
// reorder registers them all the same) arrive whole and in order.
TEST_F(UnreliableDatagram, SendsBetweenRelaxedOrderingRegionsArriveByteForByte) {
  const verbs::AccessFlags ro = verbs::Access::local_write | verbs::Access::relaxed_ordering;
  const verbs::MemoryRegion out = verbs::MemoryRegion::allocate(*pd, 4096, ro);
  const verbs::MemoryRegion in = verbs::MemoryRegion::allocate(*pd, 4096, ro);
  EXPECT_EQ(out.access(), ro);
  fill_pattern(out.bytes(), 6);
  const verbs::AddressHandle ah = ah_to_b();
  for (std::uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(posted(p->b.post_recv(in.slice(i * 1024, kGrh + 900), 40 + i)));
    SendWr w = SendWr::send(out.slice(i * 900, 900), {.wr_id = i});
    ASSERT_TRUE(posted(p->a.post(w.to(ah, p->b.qp_num(), p->b.endpoint().qkey))));
  }
  EXPECT_EQ(collect(p->cq_a, 3).size(), 3u);
  const std::vector<Completion> r = collect(p->cq_b, 3);
  ASSERT_EQ(r.size(), 3u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(completed(r[i], WcOpcode::recv, 40 + i));
    EXPECT_EQ(r[i].byte_len(), kGrh + 900);
    EXPECT_TRUE(same_bytes(in.bytes().subspan(i * 1024 + kGrh, 900), out.bytes().subspan(i * 900, 900)));
  }
}

TEST_F(UnreliableDatagram, SendArrivesAfterTheFortyByteGrh) {
  ASSERT_EQ(p->a.query_state(), verbs::QpState::rts);
  ASSERT_EQ(p->a.type(), QpType::ud);
  const verbs::AddressHandle ah = ah_to_b();
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(0, kGrh + 1024), 1)));
  SendWr w = SendWr::send(src->slice(0, 300), {.wr_id = 2});
  w.to(ah, p->b.qp_num(), p->b.endpoint().qkey);
  ASSERT_TRUE(posted(p->a.post(w)));
  EXPECT_TRUE(completed(expect_completion(p->cq_a), WcOpcode::send, 2));
  const Completion r = expect_completion(p->cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv, 1));
  EXPECT_EQ(r.byte_len(), 300 + kGrh) << "byte_len counts the GRH";
  EXPECT_TRUE(r.has_grh());
  EXPECT_EQ(r.src_qp(), p->a.qp_num());
  EXPECT_EQ(r.qp_num(), p->b.qp_num());
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(kGrh, 300), src->bytes().first(300)));
  EXPECT_TRUE(all_bytes(dst->bytes().subspan(kGrh + 300, 100), std::byte{0}));
}

// rdma-core's tests/test_cq_events.py for UD: the receiver sleeps on its completion channel.
TEST_F(UnreliableDatagram, AReceiverSleepingOnItsChannelWakesForTheDatagram) {
  QpPair q(*dev, *pd, verbs::QpOptions{.type = QpType::ud}, QpPair::fast(), {.depth = 64, .with_channel = true});
  const verbs::Endpoint b = q.b.endpoint();
  const verbs::AddressHandle ah(*pd, {.dgid = b.gid, .dlid = b.lid, .sgid_index = static_cast<std::uint8_t>(q.a.gid_index())});
  ASSERT_TRUE(posted(q.b.post_recv(dst->slice(0, kGrh + 256), 5)));
  std::array<Completion, 1> buf{};
  EXPECT_TRUE(q.cq_b.wait(buf, 100ms).empty()) << "nothing sent yet";
  SendWr w = SendWr::send(src->slice(0, 200), {.wr_id = 6});
  w.to(ah, b.qp_num, b.qkey);
  ASSERT_TRUE(posted(q.a.post(w)));
  const auto got = q.cq_b.wait(buf, 10s);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(completed(got[0], WcOpcode::recv, 5));
  EXPECT_EQ(got[0].byte_len(), 200 + kGrh);
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(kGrh, 200), src->bytes().first(200)));
  EXPECT_EQ(q.cq_a.wait(buf, 10s).size(), 1u);
}

TEST_F(UnreliableDatagram, ReplyGoesBackThroughAnAddressHandleMadeFromTheCompletion) {
  const verbs::AddressHandle ah = ah_to_b();
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(0, kGrh + 512), 3)));
  ASSERT_TRUE(posted(p->a.post_recv(dst->slice(4096, kGrh + 512), 4)));
  SendWr ask = SendWr::send(src->slice(0, 64), {.wr_id = 5});
  ask.to(ah, p->b.qp_num(), p->b.endpoint().qkey);
  ASSERT_TRUE(posted(p->a.post(ask)));
  EXPECT_TRUE(completed(expect_completion(p->cq_a), WcOpcode::send, 5));
  const Completion got = expect_completion(p->cq_b);
  ASSERT_TRUE(completed(got, WcOpcode::recv, 3));

  const verbs::AddressHandle back = verbs::AddressHandle::reply_to(*pd, got, dst->data());
  ASSERT_NE(back.native_handle(), nullptr);
  SendWr answer = SendWr::send(src->slice(1000, 500), {.wr_id = 6});
  answer.to(back, got.src_qp(), p->a.endpoint().qkey);
  ASSERT_TRUE(posted(p->b.post(answer)));
  EXPECT_TRUE(completed(expect_completion(p->cq_b), WcOpcode::send, 6));
  const Completion reply = expect_completion(p->cq_a);
  ASSERT_TRUE(completed(reply, WcOpcode::recv, 4));
  EXPECT_EQ(reply.byte_len(), 500 + kGrh);
  EXPECT_EQ(reply.src_qp(), p->b.qp_num());
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(4096 + kGrh, 500), src->bytes().subspan(1000, 500)));
}

TEST_F(UnreliableDatagram, SendWithImmediateCarriesTheImmediate) {
  const verbs::AddressHandle ah = ah_to_b();
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(0, kGrh + 128), 7)));
  SendWr w = SendWr::send_imm(src->slice(0, 128), 0xcafe0001, {.wr_id = 8});
  ASSERT_TRUE(posted(p->a.post(w.to(ah, p->b.qp_num(), p->b.endpoint().qkey))));
  EXPECT_TRUE(completed(expect_completion(p->cq_a), WcOpcode::send, 8));
  const Completion r = expect_completion(p->cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv, 7));
  ASSERT_TRUE(r.imm_data());
  EXPECT_EQ(*r.imm_data(), 0xcafe0001u);
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(kGrh, 128), src->bytes().first(128)));
}

TEST_F(UnreliableDatagram, UnaddressedSendAndRdmaAreRejectedAsWrongQpType) {
  const verbs::RemoteSlice somewhere{reinterpret_cast<std::uint64_t>(dst->data()), 4096, dst->rkey()};  // NOLINT
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(0, kGrh + 128), 9)));
  EXPECT_TRUE(rejected(p->a.post_send(src->slice(0, 16), {.wr_id = 10}), Errc::ud_needs_address));
  EXPECT_TRUE(rejected(p->a.post_write(src->slice(0, 16), somewhere, {.wr_id = 11}), Errc::wrong_qp_type));
  EXPECT_TRUE(rejected(p->a.post_read(src->slice(0, 16), somewhere, {.wr_id = 12}), Errc::wrong_qp_type));
  expect_no_completion(p->cq_a);
  expect_no_completion(p->cq_b, 50ms);
}

TEST_F(UnreliableDatagram, SendWithAWrongQkeyIsSilentlyDropped) {
  const verbs::AddressHandle ah = ah_to_b();
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(0, kGrh + 128), 13)));
  SendWr wrong = SendWr::send(src->slice(0, 100), {.wr_id = 14});
  ASSERT_TRUE(posted(p->a.post(wrong.to(ah, p->b.qp_num(), p->b.endpoint().qkey + 1))));
  EXPECT_TRUE(completed(expect_completion(p->cq_a), WcOpcode::send, 14)) << "UD senders learn nothing";
  expect_no_completion(p->cq_b);

  SendWr right = SendWr::send(src->slice(200, 100), {.wr_id = 15});
  ASSERT_TRUE(posted(p->a.post(right.to(ah, p->b.qp_num(), p->b.endpoint().qkey))));
  EXPECT_TRUE(completed(expect_completion(p->cq_a), WcOpcode::send, 15));
  const Completion r = expect_completion(p->cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv, 13));
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(kGrh, 100), src->bytes().subspan(200, 100)));
}

// Only the peer's GID: the source GID is the one a QP would choose (the default used to be
// index 0, the link-local fe80:: entry, which cannot reach an IPv4-mapped GID).
TEST_F(UnreliableDatagram, AnAddressHandleWithOnlyThePeersGidReachesIt) {
  const verbs::AddressHandle ah(*pd, verbs::AhOptions{.dgid = p->b.endpoint().gid, .dlid = p->b.endpoint().lid});
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(0, kGrh + 256), 20)));
  ASSERT_TRUE(posted(p->a.post(SendWr::send(src->slice(0, 200), {.wr_id = 21}).to(ah, p->b.qp_num(), p->b.endpoint().qkey))));
  EXPECT_TRUE(completed(expect_completion(p->cq_a), WcOpcode::send, 21));
  const Completion r = expect_completion(p->cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv, 20));
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(kGrh, 200), src->bytes().first(200)));
}

TEST_F(UnreliableDatagram, AnAddressHandleFromTheLocalQpAndThePeersEndpointReachesIt) {
  const verbs::AddressHandle ah(*pd, p->a, p->b.endpoint());
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(0, kGrh + 256), 22)));
  ASSERT_TRUE(posted(p->a.post(SendWr::send(src->slice(0, 100), {.wr_id = 23}).to(ah, p->b.qp_num(), p->b.endpoint().qkey))));
  EXPECT_TRUE(completed(expect_completion(p->cq_a), WcOpcode::send, 23));
  EXPECT_TRUE(completed(expect_completion(p->cq_b), WcOpcode::recv, 22));
  EXPECT_TRUE(same_bytes(dst->bytes().subspan(kGrh, 100), src->bytes().first(100)));
}

// A UD message over the MTU "completes" at the sender and is dropped by the receiver: refused.
TEST_F(UnreliableDatagram, AMessageOverTheMtuIsRefusedBeforePosting) {
  const verbs::AddressHandle ah(*pd, p->a, p->b.endpoint());
  const std::uint32_t mtu = verbs::mtu_bytes(p->a.endpoint().mtu);
  ASSERT_TRUE(posted(p->b.post_recv(dst->slice(0, kGrh + 2 * mtu), 24)));
  SendWr big = SendWr::send(src->slice(0, mtu + 1), {.wr_id = 25});
  EXPECT_TRUE(rejected(p->a.post(big.to(ah, p->b.qp_num(), p->b.endpoint().qkey)), Errc::ud_message_too_large));
  expect_no_completion(p->cq_a, 100ms);
  SendWr fits = SendWr::send(src->slice(0, mtu), {.wr_id = 26});
  ASSERT_TRUE(posted(p->a.post(fits.to(ah, p->b.qp_num(), p->b.endpoint().qkey))));
  EXPECT_TRUE(completed(expect_completion(p->cq_a), WcOpcode::send, 26));
  EXPECT_TRUE(completed(expect_completion(p->cq_b), WcOpcode::recv, 24));
}

TEST_F(UnreliableDatagram, AReceiveWithoutRoomForTheGrhIsRefused) {
  EXPECT_TRUE(rejected(p->b.post_recv(dst->slice(0, kGrh - 1), 27), Errc::ud_recv_too_small));
  std::array<verbs::RecvWr, 2> chain{verbs::RecvWr(dst->slice(0, kGrh), 28), verbs::RecvWr(dst->slice(100, 8), 29)};
  EXPECT_TRUE(rejected(p->b.post_recv(chain), Errc::ud_recv_too_small, 1)) << "none of the chain is posted";
  expect_no_completion(p->cq_b, 50ms);
  EXPECT_TRUE(posted(p->b.post_recv(dst->slice(0, kGrh), 30))) << "a GRH and no payload fits";
}

TEST_F(UnreliableDatagram, AnUnaddressedSendSaysHowToAddressIt) {
  EXPECT_TRUE(rejected(p->a.post_send(src->slice(0, 16), {.wr_id = 29}), Errc::ud_needs_address));
  EXPECT_TRUE(contains(std::error_code(Errc::ud_needs_address).message(), ".to(ah, qpn, qkey)"));
}

TEST_F(UnreliableDatagram, AddressHandleWithoutAGidIsRefusedOnRoce) {
  if (!dev->port(1).is_ethernet()) GTEST_SKIP() << "InfiniBand port: an AH without a GID is valid there";
  const auto e = thrown_error([&] { verbs::AddressHandle ah(*pd, verbs::AhOptions{}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::make_error_code(std::errc::invalid_argument));
  EXPECT_TRUE(e->context().starts_with("ibv_create_ah")) << e->context();
  EXPECT_TRUE(contains(e->context(), "dgid")) << "the message says what is missing: " << e->context();
}

}  // namespace
