// MemoryWindow on a device: type 2 bound by a work request and type 1 by ibv_bind_mw, remote
// access through the window's rkey, local invalidate and send with invalidate, the rkey the
// wrapper tracks, a window closed by a zero-length bind (type 1) or by deallocating it (type 2),
// a read-only window bound through a batch, the checks before posting, and teardown in any order
// without rxe's 51 s stall.
#include <chrono>
#include <optional>
#include <type_traits>
#include <vector>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::Access;
using verbs::Completion;
using verbs::Errc;
using verbs::MemoryRegion;
using verbs::MemoryWindow;
using verbs::MwType;
using verbs::QpState;
using verbs::SendWr;
using verbs::WcOpcode;
using verbs::WcStatus;

static_assert(std::is_nothrow_move_constructible_v<MemoryWindow> && std::is_nothrow_move_assignable_v<MemoryWindow>);
static_assert(std::is_nothrow_swappable_v<MemoryWindow>);
static_assert(!std::is_copy_constructible_v<MemoryWindow> && !std::is_copy_assignable_v<MemoryWindow>);

constexpr auto kWindowRights = Access::remote_read | Access::remote_write;

// In a test's own body: GTEST_SKIP returns from the function it is in, so a helper that skipped
// would let the test go on.
#define VERBS_NEED_TYPE2() \
  if (!type2) GTEST_SKIP() << dev->name() << " has no type 2 memory windows"

class Window : public RegionsTest<64 * 1024> {
 protected:
  void SetUp() override {
    RegionsTest::SetUp();
    if (IsSkipped()) return;
    const auto caps = dev->attributes().orig_attr.device_cap_flags;
    if ((caps & IBV_DEVICE_MEM_WINDOW) == 0) GTEST_SKIP() << dev->name() << " has no memory windows";
    type2 = (caps & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
    // The responder's region: what the windows open, registered for binding.
    target.emplace(MemoryRegion::allocate(*pd, 64 * 1024, all_access | Access::mw_bind));
  }
  /// Binds `w` to target[offset, offset + len) through `qp`, and waits for the bind's completion on `cq`.
  void bind(MemoryWindow& w, verbs::QueuePair& qp, const verbs::CompletionQueue& cq, std::size_t offset, std::size_t len,
            verbs::AccessFlags access = kWindowRights) {
    ASSERT_TRUE(posted(w.bind(qp, *target, target->slice(offset, len), access, {.wr_id = 77})));
    const Completion c = expect_completion(cq);
    EXPECT_TRUE(completed(c, WcOpcode::bind_mw, 77)) << describe(c);
  }
  /// A write by a through `remote` must fail with REM_ACCESS_ERR: the window is closed.
  void expect_refused(QpPair& p, const verbs::RemoteSlice& remote, std::uint64_t wr_id) const {
    ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 64), remote, {.wr_id = wr_id})));
    const Completion c = expect_completion(p.cq_a);
    EXPECT_EQ(c.status(), WcStatus::rem_access_err) << describe(c);
  }
  /// A type 1 window, or empty with `why` where the device has none.
  std::optional<MemoryWindow> type1_window(std::string& why) const {
    try {
      return MemoryWindow(*pd, MwType::type1);
    } catch (const verbs::Error& e) {
      why = dev->name() + " has no type 1 memory windows: " + e.what();
      return std::nullopt;
    }
  }
  /// After `old` was closed (its window bound to nothing, or gone): a write of new bytes through
  /// it fails REM_ACCESS_ERR and changes nothing in the target.
  void expect_closed(QpPair& p, const verbs::RemoteSlice& old) const {
    const std::vector<std::byte> before(target->bytes().begin(), target->bytes().end());
    fill_pattern(src->bytes().first(64), 9);
    expect_refused(p, old, 2);
    EXPECT_TRUE(same_bytes(target->bytes(), before));
  }
  /// a sends to b with invalidate of `w` (bound through b); returns b's receive completion.
  Completion peer_invalidates(QpPair& p, const MemoryWindow& w) const {
    EXPECT_TRUE(posted(p.b.post_recv(dst->slice(0, 256), 9)));
    EXPECT_TRUE(posted(p.a.post(SendWr::send_inv(src->slice(0, 32), w.rkey(), {.wr_id = 6}))));
    EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::send, 6));
    const Completion r = expect_completion(p.cq_b);
    EXPECT_TRUE(completed(r, WcOpcode::recv, 9));
    return r;
  }
  std::optional<MemoryRegion> target;
  bool type2 = false;
};

TEST_F(Window, Type2BindOpensTheRangeUnderANewRkey) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access});
  MemoryWindow w(*pd, MwType::type2);
  EXPECT_EQ(w.type(), MwType::type2);
  const std::uint32_t before = w.rkey();
  bind(w, p.b, p.cq_b, 4096, 8192);
  EXPECT_NE(w.rkey(), before);
  EXPECT_NE(w.rkey(), target->rkey());
  EXPECT_EQ(w.remote().addr, reinterpret_cast<std::uint64_t>(target->data() + 4096));  // NOLINT
  EXPECT_EQ(w.remote().length, 8192u);
  fill_pattern(src->bytes().first(8192), 3);
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8192), w.remote(), {.wr_id = 1})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 1));
  EXPECT_TRUE(same_bytes(target->bytes().subspan(4096, 8192), src->bytes().first(8192)));
  EXPECT_TRUE(all_bytes(target->bytes().first(4096), std::byte{0}));
  // And read back through it.
  ASSERT_TRUE(posted(p.a.post_read(dst->slice(0, 8192), w.remote(), {.wr_id = 2})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_read, 2));
  EXPECT_TRUE(same_bytes(dst->bytes().first(8192), src->bytes().first(8192)));
}

// A window on a region registered at an IOVA opens the IOVA range it is bound to.
TEST_F(Window, AWindowOnARegionAtAnIovaOpensThatIovaRange) {
  VERBS_NEED_TYPE2();
  verbs::Buffer memory(64 * 1024);
  MemoryRegion zero_based(*pd, memory.span(), all_access | Access::mw_bind, verbs::Iova{0});
  QpPair p(*dev, *pd, {.access = all_access});
  MemoryWindow w(*pd, MwType::type2);
  ASSERT_TRUE(posted(w.bind(p.b, zero_based, zero_based.slice(4096, 8192), kWindowRights, {.wr_id = 77})));
  const Completion c = expect_completion(p.cq_b);
  ASSERT_TRUE(completed(c, WcOpcode::bind_mw, 77)) << describe(c);
  EXPECT_EQ(w.remote().addr, 4096u);
  fill_pattern(src->bytes().first(8192), 8);
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 8192), w.remote(), {.wr_id = 1})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 1));
  EXPECT_TRUE(same_bytes(memory.span().subspan(4096, 8192), src->bytes().first(8192)));
  EXPECT_TRUE(all_bytes(memory.span().first(4096), std::byte{0}));
  // Past the IOVA range's end is still outside the region.
  MemoryWindow w2(*pd, MwType::type2);
  EXPECT_TRUE(rejected(w2.bind(p.b, zero_based, verbs::LocalSlice{memory.span().size() - 4, 8, zero_based.lkey()},
                               kWindowRights),
                       Errc::local_out_of_bounds));
  ASSERT_TRUE(posted(w.invalidate(p.b, {.wr_id = 78})));
  EXPECT_TRUE(completed(expect_completion(p.cq_b), WcOpcode::local_inv, 78));
}

TEST_F(Window, ABindAfterAnInvalidateChangesTheRkeyAndTheOldOneStopsWorking) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access});
  MemoryWindow w(*pd);
  bind(w, p.b, p.cq_b, 0, 4096);
  const verbs::RemoteSlice first = w.remote();
  ASSERT_TRUE(posted(w.invalidate(p.b, {.wr_id = 78})));
  EXPECT_TRUE(completed(expect_completion(p.cq_b), WcOpcode::local_inv, 78));
  bind(w, p.b, p.cq_b, 8192, 4096);
  EXPECT_NE(w.rkey(), first.rkey);
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 64), w.remote(), {.wr_id = 3})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 3));
  expect_refused(p, first, 4);
}

// The device fails these in the bind's completion (a bound type 2 window: MW_BIND_ERR, status
// 6, measured on rxe) and moves the QP to ERR; the window refuses them before posting.
TEST_F(Window, BindingABoundOrToNothingType2WindowIsRejectedBeforePosting) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access});
  MemoryWindow w(*pd);
  EXPECT_TRUE(rejected(w.bind(p.b, *target, target->slice(0, 0), kWindowRights), Errc::mw_bind_not_allowed));
  EXPECT_FALSE(w.bound());
  bind(w, p.b, p.cq_b, 0, 4096);
  EXPECT_TRUE(w.bound());
  const std::uint32_t rkey = w.rkey();
  EXPECT_TRUE(rejected(w.bind(p.b, *target, target->slice(8192, 4096), kWindowRights), Errc::mw_bind_not_allowed));
  expect_no_completion(p.cq_b, 50ms);
  EXPECT_EQ(w.rkey(), rkey);
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 64), w.remote(), {.wr_id = 10})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 10)) << "the window still works";
  EXPECT_EQ(p.b.query_state(), QpState::rts);
}

TEST_F(Window, InvalidatingAWindowThatIsNotBoundOrThroughAnotherQpIsRejected) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access});
  MemoryWindow w(*pd);
  EXPECT_TRUE(rejected(w.invalidate(p.b), Errc::mw_bind_not_allowed)) << "never bound";
  bind(w, p.b, p.cq_b, 0, 4096);
  EXPECT_TRUE(rejected(w.invalidate(p.a), Errc::bad_argument)) << "bound through b, not a";
  ASSERT_TRUE(posted(w.invalidate(p.b, {.wr_id = 78})));
  EXPECT_TRUE(completed(expect_completion(p.cq_b), WcOpcode::local_inv, 78));
  EXPECT_TRUE(rejected(w.invalidate(p.b), Errc::mw_bind_not_allowed)) << "already taken back";
  expect_no_completion(p.cq_b, 50ms);
  EXPECT_EQ(p.b.query_state(), QpState::rts);
}

TEST_F(Window, WindowsAreForRcAndUcQpsOfTheirOwnPd) {
  VERBS_NEED_TYPE2();
  MemoryWindow w(*pd);
  QpPair ud(*dev, *pd, {.type = verbs::QpType::ud});
  EXPECT_TRUE(rejected(w.bind(ud.a, *target, target->slice(0, 64), kWindowRights), Errc::wrong_qp_type));
  const verbs::ProtectionDomain other(*dev);
  QpPair p(*dev, other, {.access = all_access});
  EXPECT_TRUE(rejected(w.bind(p.b, *target, target->slice(0, 64), kWindowRights), Errc::mw_bind_not_allowed))
      << "a QP of another PD";
  const MemoryRegion foreign = MemoryRegion::allocate(other, 4096, all_access | Access::mw_bind);
  MemoryWindow w2(other);
  EXPECT_TRUE(rejected(w2.bind(p.b, *target, target->slice(0, 64), kWindowRights), Errc::mw_bind_not_allowed))
      << "a region of another PD";
  expect_no_completion(p.cq_b, 50ms);
  verbs::ProtectionDomain gone(*dev);
  const verbs::ProtectionDomain moved(std::move(gone));
  const auto e = thrown_error([&] { MemoryWindow x(gone); });  // NOLINT(bugprone-use-after-move): the point
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), Errc::empty_object) << e->what();
}

TEST_F(Window, LocalInvalidateTakesTheWindowBack) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access});
  MemoryWindow w(*pd);
  bind(w, p.b, p.cq_b, 0, 4096);
  ASSERT_TRUE(posted(w.invalidate(p.b, {.wr_id = 78})));
  EXPECT_TRUE(completed(expect_completion(p.cq_b), WcOpcode::local_inv, 78));
  expect_refused(p, w.remote(), 5);
  EXPECT_TRUE(all_bytes(target->bytes().first(64), std::byte{0}));
}

TEST_F(Window, SendWithInvalidateTakesThePeersWindowAndSaysWhich) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access});
  MemoryWindow w(*pd);
  bind(w, p.b, p.cq_b, 0, 4096);
  EXPECT_EQ(peer_invalidates(p, w).invalidated_rkey(), w.rkey());
  expect_refused(p, w.remote(), 7);
}

TEST_F(Window, AfterThePeersInvalidateTheWindowBindsAgain) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access});
  MemoryWindow w(*pd);
  bind(w, p.b, p.cq_b, 0, 4096);
  ASSERT_EQ(peer_invalidates(p, w).invalidated_rkey(), w.rkey());
  w.invalidated_by_peer();
  EXPECT_FALSE(w.bound());
  bind(w, p.b, p.cq_b, 8192, 4096);
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 64), w.remote(), {.wr_id = 11})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 11));
}

// On an extended QP a type 2 bind goes through ibv_wr_bind_mw: the same window, rkey and access.
TEST_F(Window, Type2BindOnAnExtendedQpGoesThroughIbvWrBindMw) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access, .extended = true});
  ASSERT_NE(p.b.send_ops() & IBV_QP_EX_WITH_BIND_MW, 0u);
  MemoryWindow w(*pd);
  const std::uint32_t before = w.rkey();
  bind(w, p.b, p.cq_b, 4096, 8192);
  EXPECT_NE(w.rkey(), before);
  EXPECT_EQ(w.remote().length, 8192u);
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 64), w.remote().slice(8192 - 64, 64), {.wr_id = 3})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 3));
  EXPECT_TRUE(same_bytes(target->bytes().subspan(4096 + 8192 - 64, 64), src->bytes().first(64)));
  // Refused before posting as on the plain path: bound already.
  EXPECT_TRUE(rejected(w.bind(p.b, *target, target->slice(0, 64), kWindowRights), Errc::mw_bind_not_allowed));
  ASSERT_TRUE(posted(w.invalidate(p.b, {.wr_id = 78})));
  EXPECT_TRUE(completed(expect_completion(p.cq_b), WcOpcode::local_inv, 78));
  bind(w, p.b, p.cq_b, 0, 4096);  // and again, under a new rkey
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 64), w.remote().slice(0, 64), {.wr_id = 4})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 4));
}

// The same two invalidations posted through the extended API (SendBatch) on extended QPs.
TEST_F(Window, SendWithInvalidateAndLocalInvalidateThroughABatch) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access, .extended = true});
  ASSERT_NE(p.a.send_ops() & IBV_QP_EX_WITH_SEND_WITH_INV, 0u);
  MemoryWindow w(*pd);
  bind(w, p.b, p.cq_b, 0, 4096);
  ASSERT_TRUE(posted(p.b.post_recv(dst->slice(0, 256), 9)));
  ASSERT_TRUE(posted(p.a.batch().send_inv(src->slice(0, 32), w.rkey(), {.wr_id = 6}).complete()));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::send, 6));
  const Completion r = expect_completion(p.cq_b);
  ASSERT_TRUE(completed(r, WcOpcode::recv, 9));
  EXPECT_EQ(r.invalidated_rkey(), w.rkey());
  w.invalidated_by_peer();
  expect_refused(p, w.remote(), 7);

  // Once more (the failed write moved a's QP to ERR: a fresh pair), taken back by b itself.
  QpPair q(*dev, *pd, {.access = all_access, .extended = true});
  MemoryWindow v(*pd);
  bind(v, q.b, q.cq_b, 0, 4096);
  ASSERT_TRUE(posted(q.b.batch().local_inv(v.rkey(), {.wr_id = 78}).complete()));
  EXPECT_TRUE(completed(expect_completion(q.cq_b), WcOpcode::local_inv, 78));
  v.invalidated_by_peer();  // taken back outside the wrapper: tell it, as after the peer's invalidate
  expect_refused(q, v.remote(), 5);
  EXPECT_TRUE(all_bytes(target->bytes().first(64), std::byte{0}));
}

TEST_F(Window, Type1BindThroughIbvBindMwOpensTheRange) {
  QpPair p(*dev, *pd, {.access = all_access});
  std::string why;
  std::optional<MemoryWindow> w = type1_window(why);
  if (!w) GTEST_SKIP() << why;
  EXPECT_EQ(w->type(), MwType::type1);
  bind(*w, p.b, p.cq_b, 1024, 2048, Access::remote_write);
  fill_pattern(src->bytes().first(2048), 5);
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 2048), w->remote(), {.wr_id = 8})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 8));
  EXPECT_TRUE(same_bytes(target->bytes().subspan(1024, 2048), src->bytes().first(2048)));
  // Type 1 windows are taken back by a bind to nothing, not by LOCAL_INV.
  EXPECT_TRUE(rejected(w->invalidate(p.b), Errc::bad_argument));
}

// rdma-core tests/test_mr.py MWTest.test_invalidate_mw_type1: a type 1 window is taken back by
// a bind to a zero-length range; the peer's write through the rkey it had then fails.
TEST_F(Window, AType1WindowBoundToNothingRefusesItsOldRkey) {
  QpPair p(*dev, *pd, {.access = all_access});
  std::string why;
  std::optional<MemoryWindow> w = type1_window(why);
  if (!w) GTEST_SKIP() << why;
  bind(*w, p.b, p.cq_b, 0, 4096);
  const verbs::RemoteSlice old = w->remote();
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 64), old, {.wr_id = 1})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 1));
  bind(*w, p.b, p.cq_b, 0, 0);
  EXPECT_FALSE(w->bound());
  EXPECT_EQ(w->remote().length, 0u);
  expect_closed(p, old);
}

// rdma-core tests/test_mr.py MWTest.test_mw_type2_invalidate_dealloc: a bound type 2 window
// deallocated (destroyed) closes its range: the peer's write through its rkey then fails.
TEST_F(Window, ADeallocatedType2WindowRefusesItsRkey) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access});
  std::optional<MemoryWindow> w(std::in_place, *pd, MwType::type2);
  bind(*w, p.b, p.cq_b, 0, 4096);
  const verbs::RemoteSlice gone = w->remote();
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 64), gone, {.wr_id = 1})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 1));
  w.reset();
  expect_closed(p, gone);
}

// rdma-core tests/test_qpex.py test_qp_ex_rc_bind_mw: a type 2 window bound through the batch
// (ibv_wr_bind_mw) with remote_read only: the peer's read through it works, its write fails.
TEST_F(Window, AReadOnlyWindowBoundThroughABatchRefusesTheWrite) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access, .extended = true});
  ASSERT_NE(p.b.send_ops() & IBV_QP_EX_WITH_BIND_MW, 0u);
  fill_pattern(target->bytes(), 4);
  const std::vector<std::byte> before(target->bytes().begin(), target->bytes().end());
  MemoryWindow w(*pd);
  bind(w, p.b, p.cq_b, 4096, 4096, Access::remote_read);
  ASSERT_TRUE(posted(p.a.batch().read(dst->slice(0, 4096), w.remote(), {.wr_id = 1}).complete()));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_read, 1));
  EXPECT_TRUE(same_bytes(dst->bytes().first(4096), std::span(before).subspan(4096, 4096)));
  ASSERT_TRUE(posted(p.a.batch().write(src->slice(0, 64), w.remote().slice(0, 64), {.wr_id = 2}).complete()));
  const Completion c = expect_completion(p.cq_a);
  EXPECT_EQ(c.status(), WcStatus::rem_access_err) << describe(c);
  EXPECT_TRUE(same_bytes(target->bytes(), before));
}

TEST_F(Window, BindsTheRegionOrTheQpCannotTakeAreRejectedWithNothingPosted) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access});
  MemoryWindow w(*pd);
  const std::uint32_t rkey = w.rkey();
  // A region registered without mw_bind.
  EXPECT_TRUE(rejected(w.bind(p.b, *dst, dst->slice(0, 64), kWindowRights), Errc::mw_bind_not_allowed));
  // A right a window cannot grant, and a write right over a region without local write.
  EXPECT_TRUE(rejected(w.bind(p.b, *target, target->slice(0, 64), Access::local_write), Errc::mw_bind_not_allowed));
  const MemoryRegion read_only = MemoryRegion::allocate(*pd, 4096, Access::remote_read | Access::mw_bind);
  EXPECT_TRUE(rejected(w.bind(p.b, read_only, read_only.slice(0, 64), Access::remote_write), Errc::mw_bind_not_allowed));
  // A slice of another region; and of another region over the very same memory (same
  // addresses, another lkey: only the key tells them apart).
  EXPECT_TRUE(rejected(w.bind(p.b, *target, dst->slice(0, 64), kWindowRights), Errc::local_out_of_bounds));
  const MemoryRegion alias(*pd, target->bytes(), all_access | Access::mw_bind);
  EXPECT_TRUE(rejected(w.bind(p.b, *target, alias.slice(0, 64), kWindowRights), Errc::local_out_of_bounds));
  // A QP that is not in RTS.
  verbs::CompletionQueue cq(*dev);
  verbs::QueuePair fresh(*pd, cq, {.access = all_access});
  EXPECT_TRUE(rejected(w.bind(fresh, *target, target->slice(0, 64), kWindowRights), Errc::bad_qp_state));
  expect_no_completion(p.cq_b, 50ms);
  EXPECT_EQ(w.rkey(), rkey) << "a refused bind changes nothing";
  // A moved-from window (of a bound one).
  bind(w, p.b, p.cq_b, 0, 4096);
  const std::uint32_t bound_rkey = w.rkey();
  MemoryWindow moved(std::move(w));
  EXPECT_TRUE(rejected(w.bind(p.b, *target, target->slice(0, 64), kWindowRights), Errc::empty_object));  // NOLINT
  EXPECT_TRUE(rejected(w.invalidate(p.b), Errc::empty_object));  // NOLINT
  EXPECT_FALSE(w);  // NOLINT(bugprone-use-after-move): the point
  EXPECT_FALSE(w.bound());  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(moved);
  EXPECT_TRUE(moved.bound());
  EXPECT_EQ(moved.rkey(), bound_rkey);
}

// A QP destroyed with a type 2 window still bound to it stalls rxe for about 51 s, and a region
// under a bound window cannot be deregistered (EINVAL). The window keeps both until it is
// deallocated, so the user's teardown order does not matter.
TEST_F(Window, TearingDownTheQpAndTheRegionBeforeTheBoundWindowDoesNotStall) {
  VERBS_NEED_TYPE2();
  std::optional<QpPair> p(std::in_place, *dev, *pd, verbs::QpOptions{.access = all_access});
  std::optional<MemoryWindow> w(std::in_place, *pd);
  bind(*w, p->b, p->cq_b, 0, 4096);
  const auto t0 = std::chrono::steady_clock::now();
  p.reset();       // both QPs and CQs, the window still bound
  target.reset();  // the region under it
  w.reset();       // deallocates the window, then the QP and the region go
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 10s) << "teardown took "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
}


// A window bound to a region keeps the registration, and so the peer's access, after the region
// is destroyed: the memory the region owned (allocate()) must live as long, or the peer writes
// into freed heap. (Before the fix the buffer was freed with the region: ASan reported a
// heap-use-after-free reading it below.)
TEST_F(Window, ARegionsOwnMemoryLivesWhileAWindowBoundToItDoes) {
  VERBS_NEED_TYPE2();
  QpPair p(*dev, *pd, {.access = all_access});
  MemoryWindow w(*pd, MwType::type2);
  bind(w, p.b, p.cq_b, 0, 4096);
  const std::span<std::byte> memory = target->bytes().first(4096);
  target.reset();
  fill_pattern(src->bytes().first(4096), 8);
  ASSERT_TRUE(posted(p.a.post_write(src->slice(0, 4096), w.remote(), {.wr_id = 1})));
  EXPECT_TRUE(completed(expect_completion(p.cq_a), WcOpcode::rdma_write, 1));
  EXPECT_TRUE(same_bytes(memory, src->bytes().first(4096)));
}

}  // namespace
