#include "verbs/protection_domain.hpp"

namespace verbs {

ProtectionDomain::ProtectionDomain(const Device& device, SourceLocation where) {
  detail::require_not_empty(device.native_handle() != nullptr, "ProtectionDomain: the Device", where);
  ibv_pd* pd = detail::check_ptr(ibv_alloc_pd(device.native_handle()), "ibv_alloc_pd", where);
  pd_ = std::shared_ptr<ibv_pd>(pd, [ctx = device.shared_handle()](ibv_pd* p) { ibv_dealloc_pd(p); });
}

}  // namespace verbs
