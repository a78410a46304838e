// AddressHandle: ibv_create_ah(3), ibv_create_ah_from_wc(3), for UD sends.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include <infiniband/verbs.h>

#include "verbs/completion_queue.hpp"
#include "verbs/device.hpp"
#include "verbs/protection_domain.hpp"

namespace verbs {

struct Endpoint;
class QueuePair;

/// Where UD sends through an AddressHandle go (ibv_ah_attr).
struct AhOptions {
  Gid dgid{};                      ///< destination GID (RoCE needs one: is_global is set when non-zero)
  std::uint16_t dlid = 0;        ///< destination LID (InfiniBand)
  /// Local GID index (GidEntry::index, QueuePair::gid_index()); default: Device::choose_gid's
  /// pick for the port, as a QP makes. 0..255 (ibv_ah_attr holds 8 bits).
  std::optional<std::uint32_t> sgid_index = std::nullopt;
  std::uint8_t port = 1;            ///< local port
  std::uint8_t hop_limit = 64;      ///< GRH hop limit (IP TTL on RoCE v2)
  std::uint8_t traffic_class = 0;   ///< GRH traffic class (DSCP and ECN on RoCE v2)
  std::uint8_t service_level = 0;   ///< service level (InfiniBand; PCP on RoCE), as TransportOptions::service_level
};

/// An address handle for UD sends. Move-only; keeps its protection domain alive.
class AddressHandle {
 public:
  /// ibv_create_ah(3). Throws Error (EINVAL, e.g. a RoCE AH without a GID, or a source GID of
  /// another family than the destination: the message says which).
  AddressHandle(const ProtectionDomain& pd, const AhOptions& options, SourceLocation where = SourceLocation::current());
  /// An AH from `local`'s port and GID to the peer `remote` (an Endpoint it sent): the usual
  /// way to address a UD peer. `options` gives the rest (hop limit, traffic class, service level); its
  /// dgid, dlid, sgid_index and port are taken from the two endpoints.
  AddressHandle(const ProtectionDomain& pd, const QueuePair& local, const Endpoint& remote,
                const AhOptions& options = {}, SourceLocation where = SourceLocation::current());
  /// ibv_create_ah_from_wc(3): an AH that answers the sender of a UD receive. `grh` is the first
  /// 40 bytes of the receive buffer.
  [[nodiscard]] static AddressHandle reply_to(const ProtectionDomain& pd, const Completion& wc, const void* grh,
                                              std::uint8_t port = 1);
  /// ibv_create_ah(3) with attributes made elsewhere: rdma_cm's (rdma_ud_param::ah_attr of a
  /// UD peer or multicast group, as cm::Datagram uses), or ibv_init_ah_from_wc(3)'s. Throws
  /// Error with the errno.
  [[nodiscard]] static AddressHandle from_attributes(const ProtectionDomain& pd, const ibv_ah_attr& attr,
                                                     SourceLocation where = SourceLocation::current());

  ///@{
  /// Move-only: the moved-from object is empty.
  AddressHandle(AddressHandle&&) noexcept = default;
  AddressHandle& operator=(AddressHandle&&) noexcept = default;
  ///@}
  AddressHandle(const AddressHandle&) = delete;
  AddressHandle& operator=(const AddressHandle&) = delete;
  ~AddressHandle() = default;
  /// Exchanges two AddressHandles.
  void swap(AddressHandle& o) noexcept { ah_.swap(o.ah_); }

  /// False for a moved-from (empty) AH; a send addressed with one is refused (Errc::empty_object).
  [[nodiscard]] explicit operator bool() const noexcept { return ah_ != nullptr; }
  /// The C handle.
  [[nodiscard]] ibv_ah* native_handle() const noexcept { return ah_.get(); }

 private:
  explicit AddressHandle(std::shared_ptr<ibv_ah> ah) noexcept : ah_(std::move(ah)) {}
  std::shared_ptr<ibv_ah> ah_;
};

/// Exchanges two AddressHandles.
inline void swap(AddressHandle& a, AddressHandle& b) noexcept { a.swap(b); }

}  // namespace verbs
