// QueuePair: every RC operation between two QPs on one device, checked byte for byte; UC;
// inline data; chains; the checks that refuse a request before anything is posted; capacities
// over the device's limits; what query() and data_in_order() read.
#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::Access;
using verbs::Errc;
using verbs::LocalSlice;
using verbs::QpOptions;
using verbs::QpState;
using verbs::QpType;
using verbs::RemoteSlice;
using verbs::SendWr;
using verbs::WcOpcode;

static_assert(std::is_nothrow_move_constructible_v<verbs::QueuePair> &&
              std::is_nothrow_move_assignable_v<verbs::QueuePair>);
static_assert(std::is_nothrow_swappable_v<verbs::QueuePair>);
static_assert(!std::is_copy_constructible_v<verbs::QueuePair> && !std::is_copy_assignable_v<verbs::QueuePair>);

class QueuePair : public RegionsTest<64 * 1024> {
 protected:
  /// RC with every remote right and 4 SGEs each way, unless `o` says otherwise.
  static QpOptions rc(QpOptions o = {}) {
    if (o.access.empty()) o.access = all_access;
    o.max_send_sge = std::max(o.max_send_sge, 4u);
    o.max_recv_sge = std::max(o.max_recv_sge, 4u);
    return o;
  }
  [[nodiscard]] std::span<std::byte> s(std::size_t offset, std::size_t len) const {
    return src->bytes().subspan(offset, len);
  }
  [[nodiscard]] std::span<std::byte> d(std::size_t offset, std::size_t len) const {
    return dst->bytes().subspan(offset, len);
  }
  [[nodiscard]] std::uint64_t word(const verbs::MemoryRegion& mr, std::size_t offset) const {
    std::uint64_t v = 0;
    std::memcpy(&v, mr.data() + offset, sizeof v);
    return v;
  }
  void set_word(const verbs::MemoryRegion& mr, std::size_t offset, std::uint64_t v) const {
    std::memcpy(mr.data() + offset, &v, sizeof v);
  }

};

/// net.ipv4.ip_default_ttl: the hop limit of a route that sets none.
int ipv4_default_ttl() {
  std::ifstream f("/proc/sys/net/ipv4/ip_default_ttl");
  int ttl = 0;
  f >> ttl;
  return ttl;
}

/// The bytes of several slices, one after the other.
std::vector<std::byte> concat(std::span<const LocalSlice> slices) {
  std::vector<std::byte> out;
  for (const LocalSlice& x : slices) out.insert(out.end(), x.bytes().begin(), x.bytes().end());
  return out;
}

TEST_F(QueuePair, StartsInResetAndItsEndpointDescribesIt) {
  verbs::CompletionQueue cq(*dev);
  verbs::QueuePair qp(*pd, cq, rc());
  EXPECT_EQ(qp.state(), QpState::reset);
  EXPECT_EQ(qp.query_state(), QpState::reset);
  EXPECT_EQ(qp.type(), QpType::rc);
  const verbs::Endpoint e = qp.endpoint();
  EXPECT_EQ(e.qp_num, qp.native_handle()->qp_num);
  EXPECT_EQ(e.qp_num, qp.qp_num());
  EXPECT_LE(e.psn, 0xffffffu);
  EXPECT_EQ(e.mtu, dev->port(1).active_mtu);
  if (dev->port(1).is_ethernet()) { EXPECT_EQ(e.gid, dev->choose_gid(1).entry.gid); }
  EXPECT_GE(qp.max_send_sge(), 4u);
  EXPECT_GE(qp.max_recv_sge(), 4u);
  EXPECT_GE(qp.max_send_wr(), 128u);
  EXPECT_EQ(verbs::Endpoint::decode(e.encode()), e);
}

TEST_F(QueuePair, ConnectBringsBothSidesToRts) {
  QpPair p(*dev, *pd, rc());
  EXPECT_EQ(p.a.state(), QpState::rts);
  EXPECT_EQ(p.a.query_state(), QpState::rts);
  EXPECT_EQ(p.b.query_state(), QpState::rts);
}

TEST_F(QueuePair, QueryReportsWhatConnectSetOnEachSide) {
  const verbs::TransportOptions asked{.path_mtu = verbs::Mtu::mtu1024, .initiator_depth = 2, .responder_resources = 3,
                               .min_rnr_timer = 12, .ack_timeout = 15, .retry_count = 5, .rnr_retry_count = 4,
                               .traffic_class = 0x20, .hop_limit = 32};
  QpPair p(*dev, *pd, rc({.max_send_wr = 64, .max_recv_wr = 32, .access = Access::remote_read | Access::remote_write}),
           asked);
  for (const auto& [me, peer] : {std::pair{&p.a, &p.b}, std::pair{&p.b, &p.a}}) {
    const verbs::QpAttributes q = me->query();
    EXPECT_EQ(q.state, QpState::rts);
    EXPECT_FALSE(q.sq_draining);
    EXPECT_EQ(q.dest_qp_num, peer->qp_num());
    EXPECT_EQ(q.sq_psn, me->endpoint().psn) << "nothing was sent yet";
    EXPECT_EQ(q.rq_psn, peer->endpoint().psn);
    EXPECT_EQ(q.access, Access::remote_read | Access::remote_write);
    EXPECT_EQ(q.port, 1);
    const verbs::TransportOptions t = q.transport();
    EXPECT_EQ(t.path_mtu, verbs::Mtu::mtu1024);
    EXPECT_EQ(t.initiator_depth, 2);
    EXPECT_GE(t.responder_resources, 3) << "rxe rounds it up to a power of two: 4";
    EXPECT_EQ(t.min_rnr_timer, 12);
    EXPECT_EQ(t.ack_timeout, 15);
    EXPECT_EQ(t.retry_count, 5);
    EXPECT_EQ(t.rnr_retry_count, 4);
    EXPECT_EQ(t.service_level, 0);
    if (dev->port(1).is_ethernet()) {
      EXPECT_TRUE(q.address.global);
      EXPECT_EQ(q.address.dgid, peer->endpoint().gid);
      EXPECT_EQ(q.address.sgid_index, me->gid_index());
      // Linux sets a RoCE QP's hop limit from the route to the peer when RTR is set
      // (ib_resolve_eth_dmac), whatever was asked: the IPv4 default TTL for an IPv4 peer.
      if (peer->endpoint().gid.is_ipv4_mapped()) {
        EXPECT_EQ(q.address.hop_limit, ipv4_default_ttl());
      }
      EXPECT_EQ(q.address.traffic_class, 0x20);
    }
    // rxe reports its queues' real size (64 asked: 127), where creation granted what was asked.
    EXPECT_GE(q.max_send_wr, me->max_send_wr());
    EXPECT_GE(q.max_recv_wr, me->max_recv_wr());
    EXPECT_EQ(q.max_send_sge, me->max_send_sge());
    EXPECT_EQ(q.max_recv_sge, me->max_recv_sge());
    EXPECT_EQ(q.max_inline_data, me->max_inline_data());
  }
  // The send PSN moves with what is sent: one single-packet write.
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8), dst->remote().slice(0, 8), {.wr_id = 1})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 1));
  EXPECT_EQ(p.a.query().sq_psn, (p.a.endpoint().psn + 1) & 0xffffffu);
  p.a.to_error();
  EXPECT_EQ(p.a.query().state, QpState::err);
}

// The core's out-of-band recipe, as a protocol that fixes its PSNs does it (rdma-core's
// pingpong tools exchange theirs): each QP starts from the PSN its options give, across the
// 24-bit wrap, and a receiver brought to INIT first keeps the receives it posted there when it
// connects (connect() from INIT), so the peer may send the moment it is connected.
TEST_F(QueuePair, AGivenPsnIsTheFirstSentAndWrapsAndConnectFromInitKeepsTheReceives) {
  verbs::CompletionQueue cq_a(*dev), cq_b(*dev);
  verbs::QueuePair a(*pd, cq_a, rc({.psn = 0xfffffe}));
  verbs::QueuePair b(*pd, cq_b, rc({.psn = 0}));
  ASSERT_EQ(a.endpoint().psn, 0xfffffeu);
  ASSERT_EQ(b.endpoint().psn, 0u);
  b.to_init();
  for (std::uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(posted(b.post_recv(dst->slice(i * 1024, 1024), 10 + i)));
  b.connect(a.endpoint(), QpPair::fast());
  EXPECT_EQ(b.query().rq_psn, 0xfffffeu);
  a.connect(b.endpoint(), QpPair::fast());
  EXPECT_EQ(a.query().sq_psn, 0xfffffeu);
  EXPECT_EQ(a.query().rq_psn, 0u);
  for (std::uint64_t i = 0; i < 3; ++i) {  // PSNs 0xfffffe, 0xffffff, then 0
    ASSERT_TRUE(posted(a.post_send(src->slice(i * 100, 100), {.wr_id = i})));
    EXPECT_TRUE(completed(expect_completion(cq_a), WcOpcode::send, i));
    EXPECT_TRUE(completed(expect_completion(cq_b), WcOpcode::recv, 10 + i));
    EXPECT_TRUE(same_bytes(d(i * 1024, 100), s(i * 100, 100))) << "message " << i;
  }
  EXPECT_EQ(a.query().sq_psn, 1u) << "three single-packet sends from 0xfffffe";
}

TEST_F(QueuePair, QueryOfAFreshQpSaysResetAndAMovedFromOneRefuses) {
  verbs::CompletionQueue cq(*dev);
  verbs::QueuePair qp(*pd, cq, rc());
  EXPECT_EQ(qp.query().state, QpState::reset);
  EXPECT_GE(qp.query().max_send_wr, 128u);
  verbs::QueuePair moved(std::move(qp));
  const auto e = thrown_error([&] { (void)qp.query(); });  // NOLINT(bugprone-use-after-move): the point
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), Errc::empty_object) << e->what();
}

TEST_F(QueuePair, RdmaWriteLandsByteForByte) {
  QpPair p(*dev, *pd, rc());
  ASSERT_TRUE(posted(p.a.post_write(src->slice(10, 3000), dst->remote().slice(100), {.wr_id = 1})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 1));
  EXPECT_TRUE(same_bytes(d(100, 3000), s(10, 3000)));
  EXPECT_TRUE(all_bytes(d(0, 100), std::byte{0})) << "bytes before the target were touched";
  EXPECT_TRUE(all_bytes(d(3100, 100), std::byte{0})) << "bytes after the target were touched";
  expect_no_completion(p.cq_b, 50ms);  // a plain write consumes no receive and completes nothing there
}

TEST_F(QueuePair, WriteWithImmediateDeliversTheImmInHostOrderToAZeroSgeReceive) {
  QpPair p(*dev, *pd, rc());
  ASSERT_TRUE(posted(p.b.post_recv(std::span<const LocalSlice>{}, 77)));
  constexpr std::uint32_t imm = 0x12345678;
  ASSERT_TRUE(posted(p.a.post_write_imm(src->slice(0, 2000), dst->remote().slice(64), imm, {.wr_id = 2})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 2));
  const verbs::Completion r = expect_completion(p.cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv_rdma_with_imm, 77));
  ASSERT_TRUE(r.imm_data());
  EXPECT_EQ(*r.imm_data(), imm);
  EXPECT_EQ(r.native().imm_data, htonl(imm)) << "the raw field is in network order";
  EXPECT_EQ(r.byte_len(), 2000u);
  EXPECT_EQ(r.qp_num(), p.b.qp_num());
  EXPECT_TRUE(same_bytes(d(64, 2000), s(0, 2000)));
}

TEST_F(QueuePair, RdmaReadFetchesTheRemoteBytes) {
  QpPair p(*dev, *pd, rc());
  fill_pattern(dst->bytes(), 2);
  const std::vector<std::byte> before(dst->bytes().begin(), dst->bytes().end());
  ASSERT_TRUE(posted(p.a.post_read(src->slice(1000, 5000), dst->remote().slice(7), {.wr_id = 3})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_read, 3));
  EXPECT_TRUE(same_bytes(s(1000, 5000), std::span(before).subspan(7, 5000)));
  EXPECT_TRUE(same_bytes(dst->bytes(), before)) << "a read changed the remote memory";
}

TEST_F(QueuePair, SendLandsInThePostedReceive) {
  QpPair p(*dev, *pd, rc());
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(512, 4096), 9)));
  ASSERT_TRUE(posted(p.a.post_send(src->slice(3, 1500), {.wr_id = 4})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::send, 4));
  const verbs::Completion r = expect_completion(p.cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv, 9));
  EXPECT_EQ(r.byte_len(), 1500u);
  EXPECT_FALSE(r.imm_data());
  EXPECT_EQ(r.qp_num(), p.b.qp_num());
  EXPECT_TRUE(same_bytes(d(512, 1500), s(3, 1500)));
  EXPECT_TRUE(all_bytes(d(2012, 100), std::byte{0})) << "the receive wrote past the message";
}

// The default RNR budget (TransportOptions::min_rnr_timer and rnr_retry_count) lets a receiver be
// seconds late with its receive: with 0.64 ms and 6 retries it had ~4 ms, less than one large
// ibv_reg_mr on a NIC takes. The library's defaults, all of them.
verbs::TransportOptions default_rnr() { return {}; }

TEST_F(QueuePair, ASendSurvivesAReceiverTwoSecondsLateWithTheDefaultRnrBudget) {
  QpPair p(*dev, *pd, rc(), default_rnr());
  ASSERT_TRUE(posted(p.a.post_send(src->slice(0, 100), {.wr_id = 1})));
  std::this_thread::sleep_for(2s);
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(0, 4096), 2)));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::send, 1));
  EXPECT_TRUE(completed(expect_completion(p.cq_b), WcOpcode::recv, 2));
  EXPECT_TRUE(same_bytes(d(0, 100), s(0, 100)));
}

TEST_F(QueuePair, TheDefaultRnrBudgetStillEnds) {
  const verbs::FailureBound bound = verbs::failure_bound(default_rnr());
  ASSERT_TRUE(bound.rnr && bound.total);
  QpPair p(*dev, *pd, rc(), default_rnr());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(posted(p.a.post_send(src->slice(0, 100), {.wr_id = 1})));
  const verbs::Completion c = expect_completion(p.cq_a, *bound.total + 10s);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  EXPECT_EQ(c.status(), verbs::WcStatus::rnr_retry_exc_err) << describe(c);
  // Each RNR wait lasts at least the timer, so all 6 at least bound.rnr (less its rounding up);
  // rxe's timers fire a little late (3.06 s here), which the total leaves room for.
  EXPECT_GE(took, *bound.rnr - 1ms) << "6 x 491.52 ms";
  EXPECT_LE(took, *bound.total) << "failure_bound's figure";
  std::printf("no receive ever: RNR_RETRY_EXC_ERR after %lld ms (failure_bound: rnr %lld ms, total %lld ms)\n",
              static_cast<long long>(took.count()), static_cast<long long>(bound.rnr->count()),
              static_cast<long long>(bound.total->count()));
}

// A peer whose QP went back to RESET drops every packet without a word: only the ACK timeout
// and retry_count end the request.
TEST_F(QueuePair, ARequestToAPeerThatStopsAnsweringFailsWithinFailureBound) {
  const verbs::TransportOptions o = QpPair::fast();
  const verbs::FailureBound bound = verbs::failure_bound(o);
  ASSERT_TRUE(bound.transport && bound.total);
  QpPair p(*dev, *pd, rc(), o);
  p.b.reset();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 64), dst->remote().slice(0, 64), {.wr_id = 3})));
  const verbs::Completion c = expect_completion(p.cq_a, *bound.total + 10s);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  EXPECT_EQ(c.status(), verbs::WcStatus::retry_exc_err) << describe(c);
  EXPECT_LE(took, *bound.transport) << "failure_bound's figure";
  // At least retry_count + 1 timeouts of Tr (a quarter of the bound), within a timer tick each.
  EXPECT_GE(took, *bound.transport / 4 - (o.retry_count + 1) * 10ms);
  std::printf("silent peer: RETRY_EXC_ERR after %lld ms (failure_bound: transport %lld ms)\n",
              static_cast<long long>(took.count()), static_cast<long long>(bound.transport->count()));
}

// Both kinds of retry in one request: a receiver that posts nothing, with fewer transport
// retries than RNR retries and an ACK timeout shorter than the RNR wait. By the specification
// the RNR retries run out (RNR_RETRY_EXC_ERR); rxe counts each RNR wait that outlasts the ACK
// timer as a transport retry too and gives up sooner (RETRY_EXC_ERR). Either way within the total.
TEST_F(QueuePair, ASendThatMeetsRnrFailsWithinTheTotalBoundWhicheverRetriesRunOutFirst) {
  verbs::TransportOptions o = QpPair::fast();
  o.retry_count = 1;
  o.rnr_retry_count = 6;  // and min_rnr_timer 31, 491.52 ms
  const verbs::FailureBound bound = verbs::failure_bound(o);
  ASSERT_TRUE(bound.total);
  QpPair p(*dev, *pd, rc(), o);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(posted(p.a.post_send(src->slice(0, 100), {.wr_id = 4})));
  const verbs::Completion c = expect_completion(p.cq_a, *bound.total + 10s);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  EXPECT_TRUE(c.status() == verbs::WcStatus::rnr_retry_exc_err || c.status() == verbs::WcStatus::retry_exc_err)
      << describe(c);
  EXPECT_LE(took, *bound.total) << "failure_bound's figure";
  std::printf("RNR with retry_count 1, rnr_retry_count 6: %s after %lld ms (failure_bound: rnr %lld ms, total %lld ms)\n",
              describe(c).c_str(), static_cast<long long>(took.count()), static_cast<long long>(bound.rnr->count()),
              static_cast<long long>(bound.total->count()));
}

TEST_F(QueuePair, SendWithImmediateCarriesTheImmediate) {
  QpPair p(*dev, *pd, rc());
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(0, 1024), 10)));
  ASSERT_TRUE(posted(p.a.post_send_imm(src->slice(0, 700), 0xdeadbeef, {.wr_id = 5})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::send, 5));
  const verbs::Completion r = expect_completion(p.cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv, 10));
  ASSERT_TRUE(r.imm_data());
  EXPECT_EQ(*r.imm_data(), 0xdeadbeefu);
  EXPECT_EQ(r.byte_len(), 700u);
  EXPECT_TRUE(same_bytes(d(0, 700), s(0, 700)));
}

TEST_F(QueuePair, FetchAddReturnsTheOldValueAndAddsRemotely) {
  QpPair p(*dev, *pd, rc());
  set_word(*dst, 64, 1000);
  set_word(*src, 128, 0xffffffffffffffff);
  ASSERT_TRUE(posted(p.a.post_fetch_add(src->slice(128, 8), dst->remote().slice(64, 8), 42, {.wr_id = 6})));
  const verbs::Completion c = expect_completion(p.cq_a);
  EXPECT_TRUE(completed(c, WcOpcode::fetch_add, 6));
  EXPECT_EQ(word(*src, 128), 1000u) << "the old value";
  EXPECT_EQ(word(*dst, 64), 1042u) << "the remote value";

  ASSERT_TRUE(posted(p.a.post_fetch_add(src->slice(136, 8), dst->remote().slice(64, 8), 0x100000000, {.wr_id = 7})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::fetch_add, 7));
  EXPECT_EQ(word(*src, 136), 1042u);
  EXPECT_EQ(word(*dst, 64), 0x100000000u + 1042u) << "the add is 64 bits wide";
  EXPECT_TRUE(all_bytes(d(56, 8), std::byte{0}));
  EXPECT_TRUE(all_bytes(d(72, 8), std::byte{0}));
}

TEST_F(QueuePair, CompareSwapReturnsTheOldValueAndSwapsOnlyOnAMatch) {
  QpPair p(*dev, *pd, rc());
  set_word(*dst, 0, 0xaaaa5555aaaa5555);
  ASSERT_TRUE(posted(p.a.post_compare_swap(src->slice(0, 8), dst->remote().slice(0, 8), 0xaaaa5555aaaa5555,
                                           0x0123456789abcdef, {.wr_id = 8})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::comp_swap, 8));
  EXPECT_EQ(word(*src, 0), 0xaaaa5555aaaa5555u);
  EXPECT_EQ(word(*dst, 0), 0x0123456789abcdefu) << "matched: swapped";

  ASSERT_TRUE(posted(
      p.a.post_compare_swap(src->slice(8, 8), dst->remote().slice(0, 8), 0xaaaa5555aaaa5555, 7, {.wr_id = 9})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::comp_swap, 9));
  EXPECT_EQ(word(*src, 8), 0x0123456789abcdefu) << "the old value comes back even without a swap";
  EXPECT_EQ(word(*dst, 0), 0x0123456789abcdefu) << "no match: unchanged";
}

// rdma-core tests/test_atomic.py AtomicTest.test_atomic_invalid_lkey: a fetch-and-add whose
// result slice has a bad lkey fails on the requester's side (LOC_PROT_ERR), its result slice
// unwritten. rxe (Linux 6.1, 6.12 and 7.2 alike, unlike a write's bad lkey) checks the lkey only
// when the old value comes back: the responder has already added, and that is asserted there.
TEST_F(QueuePair, AFetchAddWithABadResultLkeyFailsLocally) {
  QpPair p(*dev, *pd, rc());
  set_word(*dst, 64, 1000);
  set_word(*src, 128, 7);
  const LocalSlice r = src->slice(128, 8);
  ASSERT_TRUE(posted(p.a.post_fetch_add(LocalSlice{r.addr(), 8, r.lkey() ^ 0x5a00}, dst->remote().slice(64, 8), 42,
                                        {.wr_id = 10})));
  const verbs::Completion c = expect_completion(p.cq_a);
  EXPECT_EQ(c.wr_id(), 10u);
  EXPECT_EQ(c.status(), verbs::WcStatus::loc_prot_err) << platform(*dev) << ": " << describe(c);
  EXPECT_EQ(word(*src, 128), 7u) << "the old value landed through a bad lkey";
  if (is_rxe(*dev)) { EXPECT_EQ(word(*dst, 64), 1042u) << platform(*dev) << ": the responder added after all"; }
  EXPECT_EQ(p.a.query_state(), QpState::err);
}

TEST_F(QueuePair, WriteGathersThreeUnequalSlices) {
  QpPair p(*dev, *pd, rc());
  const std::array<LocalSlice, 3> parts{src->slice(0, 100), src->slice(1000, 2000), src->slice(5001, 37)};
  const std::vector<std::byte> want = concat(parts);
  ASSERT_EQ(want.size(), 2137u);
  ASSERT_TRUE(posted(p.a.post_write(parts, dst->remote().slice(300, 2137), {.wr_id = 11})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 11));
  EXPECT_TRUE(same_bytes(d(300, 2137), want));
  EXPECT_EQ(dst->bytes()[299], std::byte{0});
  EXPECT_EQ(dst->bytes()[300 + 2137], std::byte{0});
}

TEST_F(QueuePair, ReadScattersIntoThreeUnequalSlices) {
  QpPair p(*dev, *pd, rc());
  fill_pattern(dst->bytes(), 3);
  std::fill(src->bytes().begin(), src->bytes().end(), std::byte{0});
  const std::array<LocalSlice, 3> parts{src->slice(0, 300), src->slice(700, 17), src->slice(2000, 1500)};
  ASSERT_TRUE(posted(p.a.post_read(parts, dst->remote().slice(10, 1817), {.wr_id = 12})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_read, 12));
  EXPECT_TRUE(same_bytes(s(0, 300), d(10, 300)));
  EXPECT_TRUE(same_bytes(s(700, 17), d(310, 17)));
  EXPECT_TRUE(same_bytes(s(2000, 1500), d(327, 1500)));
  EXPECT_TRUE(all_bytes(s(300, 400), std::byte{0}));
  EXPECT_TRUE(all_bytes(s(717, 1283), std::byte{0}));
  EXPECT_TRUE(all_bytes(s(3500, 100), std::byte{0}));
}

TEST_F(QueuePair, SendGathersUnequalSlicesAndTheReceiveScattersThem) {
  QpPair p(*dev, *pd, rc());
  const std::array<LocalSlice, 3> out{src->slice(0, 200), src->slice(300, 100), src->slice(600, 51)};
  const std::vector<std::byte> want = concat(out);
  const std::array<LocalSlice, 2> in{dst->slice(0, 10), dst->slice(100, 500)};
  ASSERT_TRUE(posted(p.b.post_recv(in, 13)));
  ASSERT_TRUE(posted(p.a.post_send(out, {.wr_id = 14})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::send, 14));
  const verbs::Completion r = expect_completion(p.cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv, 13));
  EXPECT_EQ(r.byte_len(), 351u);
  EXPECT_TRUE(same_bytes(d(0, 10), std::span(want).first(10)));
  EXPECT_TRUE(same_bytes(d(100, 341), std::span(want).subspan(10)));
  EXPECT_TRUE(all_bytes(d(10, 90), std::byte{0}));
  EXPECT_TRUE(all_bytes(d(441, 200), std::byte{0}));
}

TEST_F(QueuePair, ChainOfSixteenWithOnlyTheLastSignaledCompletesOnce) {
  QpPair p(*dev, *pd, rc());
  std::vector<SendWr> chain;
  for (std::uint64_t i = 0; i < 16; ++i)
    chain.push_back(SendWr::write(src->slice(i * 1000, 1000), dst->remote().slice(i * 1000 + 1),
                                  {.wr_id = 100 + i, .signaled = i == 15}));
  ASSERT_TRUE(posted(p.a.post(chain)));
  const auto got = collect(p.cq_a, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(completed(got[0], WcOpcode::rdma_write, 115));
  expect_no_completion(p.cq_a);
  EXPECT_TRUE(same_bytes(d(1, 16000), s(0, 16000)));
  EXPECT_EQ(dst->bytes()[0], std::byte{0});
}

TEST_F(QueuePair, InlineSendIsCopiedAtPostTime) {
  QpPair p(*dev, *pd, rc({.max_inline_data = 256}));
  ASSERT_GE(p.a.max_inline_data(), 256u);
  const std::vector<std::byte> sent(s(0, 200).begin(), s(0, 200).end());
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(0, 1024), 15)));
  ASSERT_TRUE(posted(p.a.post_send(src->slice(0, 200), {.wr_id = 16, .inline_data = true})));
  fill_pattern(s(0, 200), 99);  // overwrite the source at once: the data already sits in the WQE
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::send, 16));
  const verbs::Completion r = expect_completion(p.cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv, 15));
  EXPECT_EQ(r.byte_len(), 200u);
  EXPECT_TRUE(same_bytes(d(0, 200), sent));
}

TEST_F(QueuePair, InlineWriteIsCopiedAtPostTime) {
  QpPair p(*dev, *pd, rc({.max_inline_data = 256}));
  const std::vector<std::byte> sent(s(1000, 256).begin(), s(1000, 256).end());
  // The CPU copies inline data into the WQE, so the lkey is not used: 0 must do.
  const LocalSlice no_key(reinterpret_cast<std::uint64_t>(src->data() + 1000), 256, 0);  // NOLINT
  ASSERT_TRUE(posted(p.a.post_write(no_key, dst->remote().slice(8), {.wr_id = 17, .inline_data = true})));
  std::fill(s(1000, 256).begin(), s(1000, 256).end(), std::byte{0xee});
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 17));
  EXPECT_TRUE(same_bytes(d(8, 256), sent));
}

TEST_F(QueuePair, InlineOverMaxInlineDataIsRejectedAndNothingIsPosted) {
  QpPair p(*dev, *pd, rc({.max_inline_data = 64}));
  const std::uint32_t too_big = p.a.max_inline_data() + 1;
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(0, 4096), 18)));
  const verbs::PostOptions inline_data{.wr_id = 19, .inline_data = true};
  EXPECT_TRUE(rejected(p.a.post_send(src->slice(0, too_big), inline_data), Errc::inline_too_large));
  EXPECT_TRUE(rejected(p.a.post_write(src->slice(0, too_big), dst->remote().slice(8192), inline_data),
                       Errc::inline_too_large));
  expect_no_completion(p.cq_a);
  expect_no_completion(p.cq_b, 50ms);
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));

  // The receive is still waiting, so the first send that does arrive is the next one.
  ASSERT_TRUE(posted(p.a.post_send(src->slice(5000, 10), {.wr_id = 21})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::send, 21));
  const verbs::Completion r = expect_completion(p.cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv, 18));
  EXPECT_EQ(r.byte_len(), 10u);
  EXPECT_TRUE(same_bytes(d(0, 10), s(5000, 10)));
}

TEST_F(QueuePair, InlineSizeOverTheDeviceLimitFailsAtCreation) {
  verbs::CompletionQueue cq(*dev);
  const auto e = thrown_error([&] { verbs::QueuePair qp(*pd, cq, rc({.max_inline_data = 1u << 20})); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::make_error_code(std::errc::invalid_argument));
  EXPECT_TRUE(e->context().starts_with("ibv_create_qp")) << e->context();
  // The message names the field and the limit, which is no device attribute: it was probed.
  EXPECT_TRUE(contains(e->context(), "max_inline_data 1048576")) << e->context();
  EXPECT_TRUE(contains(e->context(), "at most")) << e->context();
}

TEST_F(QueuePair, CapacityOverTheDeviceLimitSaysWhichAndTheLimit) {
  verbs::CompletionQueue cq(*dev);
  const auto max_sge = static_cast<std::uint32_t>(dev->attributes().orig_attr.max_sge);
  const auto e = thrown_error([&] { verbs::QueuePair qp(*pd, cq, rc({.max_send_sge = max_sge + 1})); });
  ASSERT_TRUE(e);
  EXPECT_TRUE(contains(e->context(), "max_send_sge " + std::to_string(max_sge + 1))) << e->context();
  EXPECT_TRUE(contains(e->context(), "max_sge " + std::to_string(max_sge))) << e->context();
}

// rdma-core tests/test_qp.py test_create_raw_qp_ex_with_illegal_caps_max_send_wr,
// _max_recv_wr and _max_recv_sge (which make UD QPs): a queue deeper than the device's
// max_qp_wr, or more receive SGEs than its max_sge, is refused (EINVAL) naming the field and the
// limit, for RC and UD, through ibv_create_qp and ibv_create_qp_ex alike.
TEST_F(QueuePair, QueueDepthsAndReceiveSgesOverTheDeviceLimitSayWhichAndTheLimit) {
  verbs::CompletionQueue cq(*dev);
  const auto max_wr = static_cast<std::uint32_t>(dev->attributes().orig_attr.max_qp_wr);
  const auto max_sge = static_cast<std::uint32_t>(dev->attributes().orig_attr.max_sge);
  const std::string wr_over = std::to_string(max_wr + 1), sge_over = std::to_string(max_sge + 1);
  const std::tuple<QpOptions, std::string, std::string> cases[] = {
      {{.max_send_wr = max_wr + 1}, "max_send_wr " + wr_over, "max_qp_wr " + std::to_string(max_wr)},
      {{.max_recv_wr = max_wr + 1}, "max_recv_wr " + wr_over, "max_qp_wr " + std::to_string(max_wr)},
      {{.max_recv_sge = max_sge + 1}, "max_recv_sge " + sge_over, "max_sge " + std::to_string(max_sge)},
  };
  for (const auto& [options, field, limit] : cases) {
    for (const QpType type : {QpType::rc, QpType::ud}) {
      for (const bool extended : {false, true}) {
        SCOPED_TRACE(field + ", " + std::string(verbs::to_string(type)) + (extended ? ", extended" : ""));
        QpOptions o = options;
        o.type = type;
        o.extended = extended;
        const auto e = thrown_error([&] { verbs::QueuePair qp(*pd, cq, o); });
        ASSERT_TRUE(e);
        EXPECT_EQ(e->code(), std::make_error_code(std::errc::invalid_argument)) << e->what();
        EXPECT_TRUE(contains(e->context(), "QpOptions::" + field + " exceeds the device's " + limit)) << e->context();
      }
    }
  }
}

// rdma-core tests/test_qp.py test_query_uc_qp and test_query_ud_qp: a fresh UC or UD QP reads
// back RESET and at least the capacities asked for.
TEST_F(QueuePair, QueryOfAFreshUcOrUdQpSaysResetAndAtLeastTheCapacitiesAsked) {
  verbs::CompletionQueue cq(*dev);
  for (const QpType type : {QpType::uc, QpType::ud}) {
    SCOPED_TRACE(verbs::to_string(type));
    const verbs::QueuePair qp(*pd, cq,
                              {.type = type, .max_send_wr = 40, .max_recv_wr = 50, .max_send_sge = 2, .max_recv_sge = 3,
                               .max_inline_data = 32});
    const verbs::QpAttributes q = qp.query();
    EXPECT_EQ(q.state, QpState::reset);
    EXPECT_GE(q.max_send_wr, 40u);
    EXPECT_GE(q.max_recv_wr, 50u);
    EXPECT_GE(q.max_send_sge, 2u);
    EXPECT_GE(q.max_recv_sge, 3u);
    EXPECT_GE(q.max_inline_data, 32u);
    EXPECT_EQ(q.max_recv_sge, qp.max_recv_sge()) << "what creation granted";
  }
}

// rdma-core tests/test_qp.py test_query_data_in_order: ibv_query_qp_data_in_order(3) on a QP in
// RTS. rxe's provider has no such query, so libibverbs' default answers 0 (not in order) for
// every opcode and flag: asserted there. Elsewhere 0 or 1; with RETURN_CAPS (1, rdma-core 46
// on) a set of WHOLE_MSG (1) and ALIGNED_128_BYTES (2).
TEST_F(QueuePair, DataInOrderAnswersForAnRcQpAndAMovedFromOneRefuses) {
  QpPair p(*dev, *pd, rc());
  for (const ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_SEND, IBV_WR_RDMA_READ}) {
    SCOPED_TRACE(testing::Message() << "opcode " << op);
    const int plain = p.a.data_in_order(op);
    const int caps = p.a.data_in_order(op, 1);
    if (is_rxe(*dev)) {
      EXPECT_EQ(plain, 0) << platform(*dev);
      EXPECT_EQ(caps, 0) << platform(*dev);
    } else {
      EXPECT_TRUE(plain == 0 || plain == 1) << plain;
      EXPECT_TRUE(caps >= 0 && caps <= 3) << caps;
    }
  }
  verbs::QueuePair moved(std::move(p.a));
  const auto e = thrown_error([&] { (void)p.a.data_in_order(IBV_WR_SEND); });  // NOLINT(bugprone-use-after-move)
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), Errc::empty_object) << e->what();
  EXPECT_TRUE(contains(e->what(), "data_in_order")) << e->what();
}

TEST_F(QueuePair, FourMebibyteWriteLandsIntact) {
  constexpr std::size_t size = std::size_t{4} << 20;
  const verbs::MemoryRegion big_src = verbs::MemoryRegion::allocate(*pd, size, all_access);
  const verbs::MemoryRegion big_dst = verbs::MemoryRegion::allocate(*pd, size, all_access);
  fill_pattern(big_src.bytes(), 4);
  QpPair p(*dev, *pd, rc());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(posted(p.a.post_write(big_src.slice(), big_dst.remote(), {.wr_id = 22})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a, 30s), WcOpcode::rdma_write, 22));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  EXPECT_TRUE(same_bytes(big_dst.bytes(), big_src.bytes()));
  std::cout << "[          ] 4 MiB write took " << ms.count() << " ms\n";
}

TEST_F(QueuePair, UcWriteLands) {
  QpPair p(*dev, *pd, {.type = QpType::uc, .access = Access::local_write | Access::remote_write});
  EXPECT_EQ(p.a.type(), QpType::uc);
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 3000), dst->remote().slice(5), {.wr_id = 23})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 23));
  // UC has no acknowledgements: the sender's completion does not prove arrival, so wait for the bytes.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (d(5, 3000).back() != s(0, 3000).back() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(same_bytes(d(5, 3000), s(0, 3000)));
}

TEST_F(QueuePair, UcReadAndAtomicsAreRejectedAsWrongQpType) {
  QpPair p(*dev, *pd, {.type = QpType::uc, .access = Access::local_write | Access::remote_write});
  fill_pattern(dst->bytes(), 5);
  const std::vector<std::byte> before(src->bytes().begin(), src->bytes().end());
  EXPECT_TRUE(rejected(p.a.post_read(src->slice(0, 100), dst->remote(), {.wr_id = 24}), Errc::wrong_qp_type));
  EXPECT_TRUE(
      rejected(p.a.post_fetch_add(src->slice(0, 8), dst->remote().slice(0, 8), 1, {.wr_id = 25}), Errc::wrong_qp_type));
  EXPECT_TRUE(rejected(p.a.post_compare_swap(src->slice(0, 8), dst->remote().slice(0, 8), 0, 1, {.wr_id = 26}),
                       Errc::wrong_qp_type));
  expect_no_completion(p.cq_a);
  EXPECT_TRUE(same_bytes(src->bytes(), before));
}

TEST_F(QueuePair, RemoteSliceTooSmallIsRejectedAndNothingIsPosted) {
  QpPair p(*dev, *pd, rc());
  EXPECT_TRUE(rejected(p.a.post_write(src->slice(0, 100), dst->remote().slice(0, 99), {.wr_id = 27}),
                       Errc::remote_too_small));
  EXPECT_TRUE(rejected(p.a.post_write_imm(src->slice(0, 100), dst->remote().slice(0, 1), 5, {.wr_id = 28}),
                       Errc::remote_too_small));
  EXPECT_TRUE(
      rejected(p.a.post_read(dst->slice(0, 100), src->remote().slice(0, 50), {.wr_id = 29}), Errc::remote_too_small));
  expect_no_completion(p.cq_a);
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));
  // An exact fit is fine.
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 100), dst->remote().slice(0, 100), {.wr_id = 30})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 30));
}

TEST_F(QueuePair, MisalignedAtomicIsRejected) {
  QpPair p(*dev, *pd, rc());
  EXPECT_TRUE(rejected(p.a.post_fetch_add(src->slice(0, 8), dst->remote().slice(4, 8), 1, {.wr_id = 31}),
                       Errc::atomic_misaligned));
  EXPECT_TRUE(rejected(p.a.post_compare_swap(src->slice(0, 8), dst->remote().slice(12, 8), 0, 1, {.wr_id = 32}),
                       Errc::atomic_misaligned));
  expect_no_completion(p.cq_a);
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));
}

TEST_F(QueuePair, AtomicOnOtherThanEightBytesIsRejected) {
  QpPair p(*dev, *pd, rc());
  EXPECT_TRUE(rejected(p.a.post_fetch_add(src->slice(0, 8), dst->remote().slice(0, 4), 1, {.wr_id = 33}),
                       Errc::atomic_length));
  EXPECT_TRUE(rejected(p.a.post_fetch_add(src->slice(0, 16), dst->remote().slice(0, 8), 1, {.wr_id = 34}),
                       Errc::atomic_length));
  EXPECT_TRUE(rejected(p.a.post_compare_swap(src->slice(0, 4), dst->remote().slice(0, 8), 0, 1, {.wr_id = 35}),
                       Errc::atomic_length));
  expect_no_completion(p.cq_a);
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));
}

TEST_F(QueuePair, MoreSgesThanTheQpHasIsRejected) {
  QpPair p(*dev, *pd, rc());
  const std::vector<LocalSlice> send_sges(p.a.max_send_sge() + 1, src->slice(0, 8));
  EXPECT_TRUE(rejected(p.a.post_write(send_sges, dst->remote(), {.wr_id = 36}), Errc::too_many_sge));
  EXPECT_TRUE(rejected(p.a.post_send(send_sges, {.wr_id = 37}), Errc::too_many_sge));
  EXPECT_TRUE(rejected(p.a.post_read(std::vector<LocalSlice>(p.a.max_send_sge() + 1, dst->slice(0, 8)), src->remote(),
                                     {.wr_id = 38}),
                       Errc::too_many_sge));
  const std::vector<LocalSlice> recv_sges(p.b.max_recv_sge() + 1, dst->slice(0, 8));
  EXPECT_TRUE(rejected(p.b.post_recv(recv_sges, 39), Errc::too_many_sge));
  expect_no_completion(p.cq_a);
  expect_no_completion(p.cq_b, 50ms);
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));
  // Exactly max_send_sge is fine.
  const std::vector<LocalSlice> most(p.a.max_send_sge(), src->slice(0, 8));
  ASSERT_TRUE(posted(p.a.post_write(most, dst->remote(), {.wr_id = 40})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 40));
}

TEST_F(QueuePair, PostingSendsBeforeRtsIsRejectedWithBadQpState) {
  verbs::CompletionQueue cq(*dev, {.depth = 64});
  verbs::CompletionQueue peer_cq(*dev, {.depth = 64});
  verbs::QueuePair qp(*pd, cq, rc());
  verbs::QueuePair peer(*pd, peer_cq, rc());
  const auto try_all = [&](std::uint64_t id) {
    EXPECT_TRUE(rejected(qp.post_write(src->slice(0, 8), dst->remote(), {.wr_id = id}), Errc::bad_qp_state));
    EXPECT_TRUE(rejected(qp.post_send(src->slice(0, 8), {.wr_id = id + 1}), Errc::bad_qp_state));
    std::vector<SendWr> chain{SendWr::write(src->slice(0, 8), dst->remote(), {.wr_id = id + 2})};
    EXPECT_TRUE(rejected(qp.post(chain), Errc::bad_qp_state));
  };
  ASSERT_EQ(qp.query_state(), QpState::reset);
  try_all(41);
  EXPECT_TRUE(rejected(qp.post_recv(dst->slice(0, 8), 44), Errc::bad_qp_state)) << "no receives in RESET";
  qp.to_init();
  ASSERT_EQ(qp.query_state(), QpState::init);
  try_all(45);
  qp.to_rtr(peer.endpoint(), QpPair::fast());
  ASSERT_EQ(qp.query_state(), QpState::rtr);
  try_all(48);
  expect_no_completion(cq);
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0}));
}

TEST_F(QueuePair, BadRequestMidChainRejectsTheWholeChain) {
  QpPair p(*dev, *pd, rc());
  std::vector<SendWr> chain;
  for (std::uint64_t i = 0; i < 5; ++i)
    chain.push_back(SendWr::write(src->slice(i * 100, 100), dst->remote().slice(i * 100, i == 2 ? 50 : 100),
                                  {.wr_id = 200 + i}));
  EXPECT_TRUE(rejected(p.a.post(chain), Errc::remote_too_small, 2));

  chain[2] = SendWr::write(src->slice(200, 100), dst->remote().slice(200, 100), {.wr_id = 202});
  chain.push_back(SendWr::fetch_add(src->slice(1000, 8), dst->remote().slice(1001, 8), 1, {.wr_id = 205}));
  chain.push_back(SendWr::write(src->slice(600, 100), dst->remote().slice(600, 100), {.wr_id = 206}));
  EXPECT_TRUE(rejected(p.a.post(chain), Errc::atomic_misaligned, 5));

  expect_no_completion(p.cq_a);
  EXPECT_TRUE(all_bytes(dst->bytes(), std::byte{0})) << "part of a rejected chain was executed";

  // Fixed, the same chain goes through whole.
  chain[5] = SendWr::fetch_add(src->slice(1000, 8), dst->remote().slice(1000, 8), 1, {.wr_id = 205});
  ASSERT_TRUE(posted(p.a.post(chain)));
  const auto got = collect(p.cq_a, 7);
  ASSERT_EQ(got.size(), 7u);
  for (std::size_t i = 0; i < 7; ++i)
    EXPECT_TRUE(completed(got[i], i == 5 ? WcOpcode::fetch_add : WcOpcode::rdma_write, 200 + i));
  EXPECT_TRUE(same_bytes(d(0, 500), s(0, 500)));
  EXPECT_TRUE(same_bytes(d(600, 100), s(600, 100)));
  EXPECT_EQ(word(*dst, 1000), 1u);
  expect_no_completion(p.cq_a, 100ms);
}

TEST_F(QueuePair, MovedAndSwappedQueuePairsKeepWorking) {
  QpPair p(*dev, *pd, rc());
  const std::uint32_t qpn = p.a.qp_num();
  verbs::QueuePair moved(std::move(p.a));
  EXPECT_EQ(moved.qp_num(), qpn);
  EXPECT_EQ(moved.state(), QpState::rts);
  swap(moved, p.a);
  EXPECT_EQ(p.a.qp_num(), qpn);
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 64), dst->remote(), {.wr_id = 50})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 50));
  EXPECT_TRUE(same_bytes(d(0, 64), s(0, 64)));
}

}  // namespace
