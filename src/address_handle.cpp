#include "verbs/address_handle.hpp"

#include <string>

#include "detail.hpp"
#include "verbs/queue_pair.hpp"

namespace verbs {

AddressHandle::AddressHandle(const ProtectionDomain& pd, const AhOptions& o, SourceLocation where) {
  detail::require_not_empty(pd.native_handle() != nullptr, "AddressHandle: the ProtectionDomain", where);
  ibv_ah_attr a{};
  a.dlid = o.dlid;
  a.sl = o.service_level;
  a.port_num = o.port;
  std::string source;
  if (!o.dgid.is_zero()) {
    std::uint32_t index = 0;
    if (o.sgid_index) {
      index = *o.sgid_index;
      source = "sgid_index " + std::to_string(index);
    } else {
      ibv_context* ctx = pd.native_handle()->context;
      // On InfiniBand, GID 0 (the port's own); on RoCE, what a QP on this port would use.
      if (detail::query_port(ctx, o.port, where).is_ethernet()) {
        const GidChoice c = detail::choose_gid(ctx, o.port, where);
        index = c.entry.index;
        source = "sgid_index " + std::to_string(index) + " (chosen: " + c.entry.gid.to_string() + ")";
      } else {
        source = "sgid_index 0";
      }
    }
    if (index > 255)
      detail::throw_error(make_error_code(Errc::bad_argument),
                          "AddressHandle: sgid_index " + std::to_string(index) + " does not fit ibv_ah_attr (0..255)",
                          where);
    a.is_global = 1;
    a.grh.dgid = o.dgid.native();
    a.grh.sgid_index = static_cast<std::uint8_t>(index);
    a.grh.hop_limit = o.hop_limit;
    a.grh.traffic_class = o.traffic_class;
  }
  ibv_ah* ah = ibv_create_ah(pd.native_handle(), &a);
  if (ah == nullptr) {
    const int err = errno != 0 ? errno : EIO;
    std::string why = "ibv_create_ah";
    if (err == EINVAL)
      why += o.dgid.is_zero() ? " (no dgid: a RoCE port needs the peer's GID)"
                              : " (dgid " + o.dgid.to_string() + " from " + source +
                                    ": is the source GID of the same family and RoCE version as the peer's? "
                                    "Device::gid_table lists them)";
    detail::throw_errno(err, why, where);
  }
  ah_ = std::shared_ptr<ibv_ah>(ah, [pd = pd.shared_handle()](ibv_ah* h) { ibv_destroy_ah(h); });
}

AddressHandle::AddressHandle(const ProtectionDomain& pd, const QueuePair& local, const Endpoint& remote,
                             const AhOptions& options, SourceLocation where)
    : AddressHandle(pd,
                    AhOptions{.dgid = remote.gid,
                              .dlid = remote.lid,
                              .sgid_index = local.gid_index(),
                              .port = local.port(),
                              .hop_limit = options.hop_limit,
                              .traffic_class = options.traffic_class,
                              .service_level = options.service_level},
                    where) {}

AddressHandle AddressHandle::reply_to(const ProtectionDomain& pd, const Completion& wc, const void* grh,
                                      std::uint8_t port) {
  detail::require_not_empty(pd.native_handle() != nullptr, "AddressHandle::reply_to: the ProtectionDomain",
                            SourceLocation::current());
  ibv_wc copy = wc.native();
  ibv_ah* ah = detail::check_ptr(
      ibv_create_ah_from_wc(pd.native_handle(), &copy, static_cast<ibv_grh*>(const_cast<void*>(grh)), port),  // NOLINT
      "ibv_create_ah_from_wc");
  return AddressHandle(std::shared_ptr<ibv_ah>(ah, [pd = pd.shared_handle()](ibv_ah* h) { ibv_destroy_ah(h); }));
}

AddressHandle AddressHandle::from_attributes(const ProtectionDomain& pd, const ibv_ah_attr& attr, SourceLocation where) {
  detail::require_not_empty(pd.native_handle() != nullptr, "AddressHandle::from_attributes: the ProtectionDomain", where);
  ibv_ah_attr copy = attr;
  ibv_ah* ah = ibv_create_ah(pd.native_handle(), &copy);
  if (ah == nullptr) detail::throw_errno(errno != 0 ? errno : EIO, "ibv_create_ah", where);
  return AddressHandle(std::shared_ptr<ibv_ah>(ah, [pd = pd.shared_handle()](ibv_ah* h) { ibv_destroy_ah(h); }));
}

}  // namespace verbs
