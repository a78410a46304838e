// ProtectionDomain: ibv_alloc_pd(3).
#pragma once

#include <memory>

#include <infiniband/verbs.h>

#include "verbs/device.hpp"

namespace verbs {

/// A protection domain. Move-only; keeps its device context alive, and is kept alive by every
/// memory region, queue pair, SRQ and address handle made from it.
class ProtectionDomain {
 public:
  /// ibv_alloc_pd(3). Throws Error (ENOMEM).
  explicit ProtectionDomain(const Device& device, SourceLocation where = SourceLocation::current());
  /// Wraps a PD held elsewhere, sharing its ownership (e.g. another ProtectionDomain's
  /// shared_handle(), so that an object keeps the PD alive however the original is moved or
  /// destroyed). `pd`'s deleter deallocates it and must keep alive what it uses (the device
  /// context). Throws Error(Errc::bad_argument) for a null `pd`.
  [[nodiscard]] static ProtectionDomain adopt(std::shared_ptr<ibv_pd> pd, SourceLocation where = SourceLocation::current());

  ///@{
  /// Move-only: the moved-from object is empty.
  ProtectionDomain(ProtectionDomain&&) noexcept = default;
  ProtectionDomain& operator=(ProtectionDomain&&) noexcept = default;
  ///@}
  ProtectionDomain(const ProtectionDomain&) = delete;
  ProtectionDomain& operator=(const ProtectionDomain&) = delete;
  ~ProtectionDomain() = default;
  /// Exchanges two ProtectionDomains.
  void swap(ProtectionDomain& o) noexcept { pd_.swap(o.pd_); }

  /// False for a moved-from (empty) PD, from which nothing can be made (Errc::empty_object).
  [[nodiscard]] explicit operator bool() const noexcept { return pd_ != nullptr; }
  /// The C handle.
  [[nodiscard]] ibv_pd* native_handle() const noexcept { return pd_.get(); }
  /// Shared ownership of the PD, for objects made from it.
  [[nodiscard]] const std::shared_ptr<ibv_pd>& shared_handle() const noexcept { return pd_; }

 private:
  ProtectionDomain() = default;
  std::shared_ptr<ibv_pd> pd_;
};

/// Exchanges two ProtectionDomains.
inline void swap(ProtectionDomain& a, ProtectionDomain& b) noexcept { a.swap(b); }

}  // namespace verbs
