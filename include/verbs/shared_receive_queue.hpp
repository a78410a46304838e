// SharedReceiveQueue: ibv_create_srq(3), ibv_post_srq_recv(3), ibv_modify_srq(3).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include <infiniband/verbs.h>

#include "verbs/protection_domain.hpp"
#include "verbs/work_request.hpp"

namespace verbs {

/// Sizes of a SharedReceiveQueue (ibv_srq_init_attr).
struct SrqOptions {
  std::uint32_t max_wr = 256;  ///< receives it can hold (devices round up)
  std::uint32_t max_sge = 1;   ///< scatter/gather entries per receive
  std::uint32_t limit = 0;     ///< armed at creation when not 0 (with ibv_modify_srq, as arm() does)
  void* context = nullptr;     ///< srq_context: AsyncEvent::context() of the events this SRQ raises
};

/// A receive queue shared by several QPs (wc.qp_num tells them apart). Move-only; keeps its
/// protection domain alive and is kept alive by the QPs that use it.
class SharedReceiveQueue {
 public:
  /// ibv_create_srq(3). Throws Error (EINVAL for sizes over the device's max_srq_wr/max_srq_sge).
  explicit SharedReceiveQueue(const ProtectionDomain& pd, SrqOptions options = {}, SourceLocation where = SourceLocation::current());

  ///@{
  /// Move-only: the moved-from object is empty, and refuses posts with Errc::empty_object.
  SharedReceiveQueue(SharedReceiveQueue&& o) noexcept
      : srq_(std::move(o.srq_)), max_wr_(std::exchange(o.max_wr_, 0)), max_sge_(std::exchange(o.max_sge_, 0)) {}
  SharedReceiveQueue& operator=(SharedReceiveQueue&& o) noexcept {
    SharedReceiveQueue(std::move(o)).swap(*this);
    return *this;
  }
  ///@}
  SharedReceiveQueue(const SharedReceiveQueue&) = delete;
  SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;
  ~SharedReceiveQueue() = default;
  /// Exchanges two SharedReceiveQueues.
  void swap(SharedReceiveQueue& o) noexcept {
    srq_.swap(o.srq_);
    std::swap(max_wr_, o.max_wr_);
    std::swap(max_sge_, o.max_sge_);
  }

  /// Posts receives (ibv_post_srq_recv(3)). The buffers must stay valid until completed.
  /// Fails with Errc::too_many_slices (a RecvWr given more than max_wr_slices),
  /// Errc::too_many_sge, or the errno of ibv_post_srq_recv (ENOMEM when full).
  /// An SRQ does not know the type of the QPs it serves: for UD QPs, each receive needs room
  /// for the 40-byte GRH before the payload, which is not checked here (QueuePair::post_recv
  /// checks it, Errc::ud_recv_too_small).
  ///@{
  PostResult post_recv(std::span<RecvWr> wrs) noexcept {
    if (!srq_) [[unlikely]] return PostResult::rejected(Errc::empty_object, 0);
    return RecvWr::post_chain(wrs, max_sge_, 0, [this](ibv_recv_wr* wr, ibv_recv_wr** bad) {
      return ibv_post_srq_recv(srq_.get(), wr, bad);
    });
  }
  PostResult post_recv(LocalSlice dst, std::uint64_t wr_id = 0) noexcept {
    RecvWr wr(dst, wr_id);
    return post_recv(std::span(&wr, 1));
  }
  ///@}

  /// Arms the limit event: IBV_EVENT_SRQ_LIMIT_REACHED (Device::wait_async_event) fires once
  /// fewer than `limit` receives remain, and the limit resets to 0.
  void arm(std::uint32_t limit);
  /// The current limit (ibv_query_srq(3)); 0 once the event has fired.
  [[nodiscard]] std::uint32_t limit() const;
  /// Resizes the SRQ (ibv_modify_srq(3) with IBV_SRQ_MAX_WR) to hold at least `max_wr`
  /// receives; the receives posted stay posted, and max_wr() says what the device granted
  /// (ibv_query_srq). Not while another thread posts to it. Throws Error: EOPNOTSUPP when the
  /// device does not resize SRQs (no IBV_DEVICE_SRQ_RESIZE), EINVAL for 0, for more than the
  /// device's max_srq_wr, or for fewer than the limit armed (or the receives posted, as the
  /// device decides).
  void resize(std::uint32_t max_wr, SourceLocation where = SourceLocation::current());
  /// Receives the SRQ can hold, as granted (at creation, or by the last resize()).
  [[nodiscard]] std::uint32_t max_wr() const noexcept { return max_wr_; }
  /// Scatter/gather entries per receive, as granted.
  [[nodiscard]] std::uint32_t max_sge() const noexcept { return max_sge_; }

  /// False for a moved-from (empty) SRQ, which refuses posts, arm(), limit() and resize().
  [[nodiscard]] explicit operator bool() const noexcept { return srq_ != nullptr; }
  /// The C handle.
  [[nodiscard]] ibv_srq* native_handle() const noexcept { return srq_.get(); }
  /// Shared ownership of the SRQ, for the QPs that use it.
  [[nodiscard]] const std::shared_ptr<ibv_srq>& shared_handle() const noexcept { return srq_; }

 private:
  std::shared_ptr<ibv_srq> srq_;
  std::uint32_t max_wr_ = 0;
  std::uint32_t max_sge_ = 0;
};

/// Exchanges two SharedReceiveQueues.
inline void swap(SharedReceiveQueue& a, SharedReceiveQueue& b) noexcept { a.swap(b); }

}  // namespace verbs
