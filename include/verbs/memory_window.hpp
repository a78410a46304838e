// MemoryWindow: ibv_alloc_mw(3), ibv_bind_mw(3), IBV_WR_BIND_MW and IBV_WR_LOCAL_INV (ibv_post_send(3)).
#pragma once

#include <cstdint>
#include <memory>

#include <infiniband/verbs.h>

#include "verbs/error.hpp"
#include "verbs/memory_region.hpp"
#include "verbs/protection_domain.hpp"
#include "verbs/queue_pair.hpp"
#include "verbs/work_request.hpp"

namespace verbs {

/// Memory window type (enum ibv_mw_type): type 1 is bound through ibv_bind_mw(3) and belongs
/// to the PD; type 2 is bound by a work request and belongs to the QP it was bound through.
enum class MwType : std::uint8_t { type1 = IBV_MW_TYPE_1, type2 = IBV_MW_TYPE_2 };

/// A memory window: remote access to part of a MemoryRegion under an rkey of its own, granted and
/// taken back with a work request each, without registering anything again. Move-only; keeps
/// its PD alive, and, once bound, the region and (type 2) the QP it was bound through: they are
/// released after the window is deallocated, so neither waits on a window still bound to it
/// (a region under a bound window cannot be deregistered, and on rxe a QP destroyed with a
/// bound type 2 window stalls for about 51 s).
///
/// The device must have memory windows (Device::attributes(): IBV_DEVICE_MEM_WINDOW, and
/// IBV_DEVICE_MEM_WINDOW_TYPE_2A or _2B for type 2); rxe 6.1 has type 1 and type 2B, and takes
/// LOCAL_INV on RC QPs only (so a type 2 window bound through a UC QP is taken back by
/// destroying it).
///
/// Threads: unlike the posts of a QP, bind() and invalidate() change the window (its rkey,
/// range and holds): one thread at a time per window, and not beside remote() or rkey().
class MemoryWindow {
 public:
  /// ibv_alloc_mw(3). Throws Error (EOPNOTSUPP, EINVAL where the device has no such windows;
  /// Errc::empty_object for a moved-from PD).
  explicit MemoryWindow(const ProtectionDomain& pd, MwType type = MwType::type2,
                        SourceLocation where = SourceLocation::current());

  ///@{
  /// Move-only: the moved-from window is empty, and refuses to bind (Errc::empty_object).
  MemoryWindow(MemoryWindow&& o) noexcept { swap(o); }
  MemoryWindow& operator=(MemoryWindow&& o) noexcept {
    MemoryWindow(std::move(o)).swap(*this);
    return *this;
  }
  ///@}
  MemoryWindow(const MemoryWindow&) = delete;
  MemoryWindow& operator=(const MemoryWindow&) = delete;
  /// Deallocates the window (ibv_dealloc_mw(3)), then lets go of its region and QP.
  ~MemoryWindow() = default;
  /// Exchanges two MemoryWindows.
  void swap(MemoryWindow& o) noexcept {
    qp_.swap(o.qp_);
    mr_.swap(o.mr_);
    mw_.swap(o.mw_);
    std::swap(range_, o.range_);
    std::swap(type_, o.type_);
    std::swap(bound_, o.bound_);
  }

  /// Binds the window to `range` of `mr` (a LocalSlice of it, e.g. mr.slice(offset, len)),
  /// granting the peer `access` through it: any of remote_read, remote_write and remote_atomic,
  /// which the region must allow (registered with Access::mw_bind, and with local_write for
  /// remote_write or remote_atomic). The window, the region and `qp` must share one PD. Posts
  /// the bind on `qp` (RC or UC, in RTS): type 1 through ibv_bind_mw(3) (a bind again moves
  /// it; a zero-length range closes it), type 2 as an IBV_WR_BIND_MW request under the next
  /// rkey, once the window is free (never bound, or taken back: invalidate(), or the peer's
  /// send_inv and then invalidated_by_peer()). The bind takes effect in order with the QP's
  /// other requests, and its completion (opcode bind_mw, when signaled) says it did; hand
  /// remote() to the peer after that, or after a request posted behind it. Checks before
  /// posting (PostResult): mw_bind_not_allowed (the rights, the PDs, a type 2 window still
  /// bound or a zero-length range), local_out_of_bounds for a slice outside `mr`, and the QP's
  /// own (empty_object, wrong_qp_type on UD, bad_qp_state, inline_not_allowed).
  /// A bind whose completion fails (flushed, on a QP that went to ERR) leaves the window
  /// unusable: destroy it. A rebind lets go of the previous QP and region (which may then be
  /// destroyed here, if nothing else holds them).
  PostResult bind(const QueuePair& qp, const MemoryRegion& mr, LocalSlice range, AccessFlags access,
                  const PostOptions& options = {}) noexcept;
  /// Type 2: takes the window back (IBV_WR_LOCAL_INV on `qp`, which must be the RC QP it is
  /// bound through): once it completes, the peer's requests with its rkey fail with
  /// REM_ACCESS_ERR, and the window may be bound again. Refused (mw_bind_not_allowed) for a
  /// window that is not bound, and Errc::bad_argument for another QP or a type 1 window (bind it
  /// to a zero-length range instead). On rxe 6.1 a LOCAL_INV of a window that is not bound
  /// reaches a kernel path that drops a null QP reference: after the peer's send_inv, call
  /// invalidated_by_peer(), not invalidate().
  PostResult invalidate(const QueuePair& qp, const PostOptions& options = {}) noexcept;
  /// Type 2: records that the peer took the window back (its SendWr::send_inv arrived: the
  /// receive's Completion::invalidated_rkey() is rkey()), so that it may be bound again.
  void invalidated_by_peer() noexcept { bound_ = false; }
  /// Whether a bind was posted and not taken back since (as far as this object knows).
  [[nodiscard]] bool bound() const noexcept { return bound_; }

  /// What the peer uses: the range bound last and the window's rkey (the new one after a type 2
  /// bind, which the library tracks, since providers need not update ibv_mw::rkey for it).
  [[nodiscard]] RemoteSlice remote() const noexcept { return range_; }
  /// The window's current rkey.
  [[nodiscard]] std::uint32_t rkey() const noexcept { return range_.rkey; }
  /// Type 1 or 2.
  [[nodiscard]] MwType type() const noexcept { return type_; }
  /// False for a moved-from (empty) window.
  [[nodiscard]] explicit operator bool() const noexcept { return mw_ != nullptr; }
  /// The C handle; null for a moved-from window.
  [[nodiscard]] ibv_mw* native_handle() const noexcept { return mw_.get(); }

 private:
  // Destroyed in reverse: the window is deallocated first, then the QP and region it was bound
  // to are let go.
  std::shared_ptr<ibv_qp> qp_;  // type 2: the QP bound through (kept while the window lives)
  std::shared_ptr<ibv_mr> mr_;  // the region bound to
  std::shared_ptr<ibv_mw> mw_;  // deleter holds the PD
  RemoteSlice range_{};
  MwType type_ = MwType::type2;
  bool bound_ = false;
};

/// Exchanges two MemoryWindows.
inline void swap(MemoryWindow& a, MemoryWindow& b) noexcept { a.swap(b); }

}  // namespace verbs
