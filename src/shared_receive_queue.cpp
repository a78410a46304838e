#include "verbs/shared_receive_queue.hpp"

#include <string>

namespace verbs {

SharedReceiveQueue::SharedReceiveQueue(const ProtectionDomain& pd, SrqOptions o, SourceLocation where) {
  detail::require_not_empty(pd.native_handle() != nullptr, "SharedReceiveQueue: the ProtectionDomain", where);
  ibv_srq_init_attr init{};
  init.attr.max_wr = o.max_wr;
  init.attr.max_sge = o.max_sge;
  // srq_limit is ignored at creation (ibv_create_srq(3)); armed below, the portable way.
  init.srq_context = o.context;
  ibv_srq* srq = detail::check_ptr(ibv_create_srq(pd.native_handle(), &init), "ibv_create_srq", where);
  srq_ = std::shared_ptr<ibv_srq>(srq, [pd = pd.shared_handle()](ibv_srq* s) { ibv_destroy_srq(s); });
  max_wr_ = init.attr.max_wr;
  max_sge_ = init.attr.max_sge;
  if (o.limit != 0) {
    ibv_srq_attr a{};
    a.srq_limit = o.limit;
    detail::check_rc(ibv_modify_srq(srq, &a, IBV_SRQ_LIMIT), "ibv_modify_srq(IBV_SRQ_LIMIT)", where);
  }
}

void SharedReceiveQueue::arm(std::uint32_t limit) {
  detail::require_not_empty(srq_ != nullptr, "SharedReceiveQueue::arm: the SharedReceiveQueue", SourceLocation::current());
  ibv_srq_attr a{};
  a.srq_limit = limit;
  detail::check_rc(ibv_modify_srq(srq_.get(), &a, IBV_SRQ_LIMIT), "ibv_modify_srq(IBV_SRQ_LIMIT)");
}

std::uint32_t SharedReceiveQueue::limit() const {
  detail::require_not_empty(srq_ != nullptr, "SharedReceiveQueue::limit: the SharedReceiveQueue", SourceLocation::current());
  ibv_srq_attr a{};
  detail::check_rc(ibv_query_srq(srq_.get(), &a), "ibv_query_srq");
  return a.srq_limit;
}

void SharedReceiveQueue::resize(std::uint32_t max_wr, SourceLocation where) {
  detail::require_not_empty(srq_ != nullptr, "SharedReceiveQueue::resize: the SharedReceiveQueue", where);
  if (max_wr == 0) detail::throw_errno(EINVAL, "SharedReceiveQueue::resize: 0 receives", where);
  ibv_device_attr dev{};
  detail::check_rc(ibv_query_device(srq_->context, &dev), "ibv_query_device", where);
  if ((dev.device_cap_flags & IBV_DEVICE_SRQ_RESIZE) == 0)
    detail::throw_errno(EOPNOTSUPP, "SharedReceiveQueue::resize: the device does not resize SRQs (no IBV_DEVICE_SRQ_RESIZE)", where);
  if (max_wr > static_cast<std::uint32_t>(dev.max_srq_wr))
    detail::throw_errno(EINVAL,
                        "SharedReceiveQueue::resize: " + std::to_string(max_wr) +
                            " receives, over the device's max_srq_wr of " + std::to_string(dev.max_srq_wr),
                        where);
  ibv_srq_attr a{};
  a.max_wr = max_wr;
  detail::check_rc(ibv_modify_srq(srq_.get(), &a, IBV_SRQ_MAX_WR),
                   "ibv_modify_srq(IBV_SRQ_MAX_WR = " + std::to_string(max_wr) + ")", where);
  ibv_srq_attr now{};
  detail::check_rc(ibv_query_srq(srq_.get(), &now), "ibv_query_srq", where);
  max_wr_ = now.max_wr;
}

}  // namespace verbs
