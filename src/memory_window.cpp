#include "verbs/memory_window.hpp"

#include "detail.hpp"

namespace verbs {

namespace {

constexpr unsigned kWindowRights = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

/// Whether a window with `access` may be bound to `range` of `mr`: the rights a window can
/// grant, which the region allows, inside the region, all in the window's PD.
Errc bind_check(const ibv_mw* mw, const QueuePair& qp, const MemoryRegion& mr, LocalSlice range,
                AccessFlags access) noexcept {
  if (!mr) return Errc::empty_object;
  if (mr.native_handle()->pd != mw->pd || qp.native_handle()->pd != mw->pd) return Errc::mw_bind_not_allowed;
  const unsigned want = access.value();
  const unsigned has = mr.access().value();
  if ((want & ~kWindowRights) != 0 || (has & IBV_ACCESS_MW_BIND) == 0) return Errc::mw_bind_not_allowed;
  if ((want & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0 && (has & IBV_ACCESS_LOCAL_WRITE) == 0)
    return Errc::mw_bind_not_allowed;
  const std::uint64_t base = mr.iova();
  if (range.lkey() != mr.lkey() || range.addr() < base || range.addr() - base > mr.size() ||
      range.length() > mr.size() - (range.addr() - base))
    return Errc::local_out_of_bounds;
  return Errc{};
}

}  // namespace

MemoryWindow::MemoryWindow(const ProtectionDomain& pd, MwType type, SourceLocation where) : type_(type) {
  detail::require_not_empty(static_cast<bool>(pd), "MemoryWindow: the ProtectionDomain", where);
  ibv_mw* mw = detail::check_ptr(ibv_alloc_mw(pd.native_handle(), static_cast<ibv_mw_type>(type)), "ibv_alloc_mw", where);
  mw_ = std::shared_ptr<ibv_mw>(mw, [pd = pd.shared_handle()](ibv_mw* w) { ibv_dealloc_mw(w); });
  range_.rkey = mw->rkey;
}

PostResult MemoryWindow::bind(const QueuePair& qp, const MemoryRegion& mr, LocalSlice range, AccessFlags access,
                              const PostOptions& o) noexcept {
  if (!mw_ || !qp) return PostResult::rejected(Errc::empty_object, 0);
  if (const Errc e = bind_check(mw_.get(), qp, mr, range, access); e != Errc{}) return PostResult::rejected(e, 0);
  // A type 2 window is bound only when free (o10-37.2.30), and never to nothing (o10-37.2.40):
  // the device would fail the bind in its completion and move the QP to ERR.
  if (type_ == MwType::type2 && (bound_ || range.length() == 0)) return PostResult::rejected(Errc::mw_bind_not_allowed, 0);
  ibv_mw_bind_info info{};
  info.mr = mr.native_handle();
  info.addr = range.addr();
  info.length = range.length();
  info.mw_access_flags = access.value();
  std::uint32_t rkey = 0;
  if (type_ == MwType::type1) {
    // ibv_bind_mw is no post: the QP's checks by hand (the state, and a type that binds).
    if (qp.type() == QpType::ud) return PostResult::rejected(Errc::wrong_qp_type, 0);
    if (qp.state() != QpState::rts) return PostResult::rejected(Errc::bad_qp_state, 0);
    if (o.inline_data) return PostResult::rejected(Errc::inline_not_allowed, 0);
    ibv_mw_bind b{};
    b.wr_id = o.wr_id;
    b.send_flags = (o.signaled ? unsigned{IBV_SEND_SIGNALED} : 0u) | (o.fence ? unsigned{IBV_SEND_FENCE} : 0u);
    b.bind_info = info;
    if (const int rc = ibv_bind_mw(qp.native_handle(), mw_.get(), &b); rc != 0)
      return PostResult::device_error(detail::rc_to_errno(rc), 0);
    rkey = mw_->rkey;  // the provider's new rkey
  } else {
    rkey = ibv_inc_rkey(range_.rkey);  // a type 2 bind names its new rkey itself
    if (qp.extended() && (qp.send_ops() & IBV_QP_EX_WITH_BIND_MW) != 0) {
      // An extended QP binds through its own API (ibv_wr_bind_mw).
      SendBatch b = qp.batch();
      b.bind_mw_(mw_.get(), rkey, info, o);
      if (const PostResult r = b.complete(); !r) return r;
    } else {
      SendWr w(IBV_WR_BIND_MW, std::span<const LocalSlice>{}, o);
      w.wr_.bind_mw.mw = mw_.get();
      w.wr_.bind_mw.rkey = rkey;
      w.wr_.bind_mw.bind_info = info;
      w.no_inline_(o);
      if (const PostResult r = qp.post(w); !r) return r;
    }
    // The provider names the window by ibv_mw::rkey in the next bind (rxe's kernel then
    // refuses a stale one with MW_BIND_ERR), and no provider need update it for type 2.
    mw_->rkey = rkey;
    qp_ = qp.shared_handle();
  }
  mr_ = mr.shared_handle();
  range_ = RemoteSlice{range.addr(), range.length(), rkey};
  bound_ = range.length() != 0;
  return {};
}

PostResult MemoryWindow::invalidate(const QueuePair& qp, const PostOptions& o) noexcept {
  if (!mw_) return PostResult::rejected(Errc::empty_object, 0);
  if (type_ != MwType::type2) return PostResult::rejected(Errc::bad_argument, 0);  // type 1: bind to nothing
  if (!bound_) return PostResult::rejected(Errc::mw_bind_not_allowed, 0);
  if (qp.native_handle() != qp_.get()) return PostResult::rejected(qp ? Errc::bad_argument : Errc::empty_object, 0);
  const PostResult r = qp.post(SendWr::local_inv(range_.rkey, o));
  if (r) bound_ = false;
  return r;
}

}  // namespace verbs
