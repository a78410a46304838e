#include "verbs/address_handle.hpp"

namespace verbs {

AddressHandle::AddressHandle(const ProtectionDomain& pd, const AhOptions& o, SourceLocation where) {
  detail::require_not_empty(pd.native_handle() != nullptr, "AddressHandle: the ProtectionDomain", where);
  ibv_ah_attr a{};
  a.dlid = o.dlid;
  a.sl = o.sl;
  a.port_num = o.port;
  if (!o.dgid.is_zero()) {
    a.is_global = 1;
    a.grh.dgid = o.dgid.native();
    a.grh.sgid_index = o.sgid_index;
    a.grh.hop_limit = o.hop_limit;
    a.grh.traffic_class = o.traffic_class;
  }
  ibv_ah* ah = detail::check_ptr(ibv_create_ah(pd.native_handle(), &a), "ibv_create_ah", where);
  ah_ = std::shared_ptr<ibv_ah>(ah, [pd = pd.shared_handle()](ibv_ah* h) { ibv_destroy_ah(h); });
}

AddressHandle AddressHandle::reply_to(const ProtectionDomain& pd, const Completion& wc, const void* grh,
                                      std::uint8_t port) {
  ibv_wc copy = wc.native();
  ibv_ah* ah = detail::check_ptr(
      ibv_create_ah_from_wc(pd.native_handle(), &copy, static_cast<ibv_grh*>(const_cast<void*>(grh)), port),  // NOLINT
      "ibv_create_ah_from_wc");
  return AddressHandle(std::shared_ptr<ibv_ah>(ah, [pd = pd.shared_handle()](ibv_ah* h) { ibv_destroy_ah(h); }));
}

}  // namespace verbs
