#include "verbs/memory_region.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include "detail.hpp"

namespace verbs {
namespace {

using detail::get_le;
using detail::put_le;
constexpr std::byte kSliceMagic0{'V'}, kSliceMagic1{'R'}, kSliceVersion{1};

}  // namespace

ibv_mr* detail::empty_mr() noexcept {
  static ibv_mr empty{};
  return &empty;
}

Buffer::Buffer(std::size_t size) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  // Rounding up must not wrap around to a tiny allocation that claims `size` bytes.
  if (size > std::numeric_limits<std::size_t>::max() - (page - 1)) throw std::bad_alloc();
  const std::size_t rounded = size == 0 ? page : (size + page - 1) / page * page;
  void* p = std::aligned_alloc(page, rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  data_ = static_cast<std::byte*>(p);
  size_ = size;
}

Buffer::~Buffer() { std::free(data_); }  // NOLINT

// Deregisters; then the control block frees the buffer and lets go of the protection domain.
struct MemoryRegion::Deleter {
  std::shared_ptr<ibv_pd> pd;  // the registration's protection domain
  Buffer buffer;               // memory the region owns (allocate()), if any
  void operator()(ibv_mr* m) const noexcept { ibv_dereg_mr(m); }
};

namespace {

// The checks of a region's rights, before registering or re-registering on `context`.
void check_access(AccessFlags access, ibv_context* context, const char* what, SourceLocation where) {
  constexpr AccessFlags needs_local_write = Access::remote_write | Access::remote_atomic;
  if ((access & needs_local_write) && !(access & Access::local_write))
    detail::throw_error(make_error_code(Errc::bad_argument),
                        std::string(what) + ": remote_write and remote_atomic require local_write (ibv_reg_mr(3))",
                        where);
  if (access & Access::zero_based)
    detail::throw_error(make_error_code(Errc::bad_argument),
                        std::string(what) +
                            ": Access::zero_based is not supported: slice() and remote() address the region "
                            "from iova(), its virtual address unless registered at an Iova (for zero-based "
                            "addresses, register at Iova{0}: ibv_reg_mr_iova2(3))",
                        where);
  if (access & (Access::flush_global | Access::flush_persistent)) {
    const std::uint64_t caps = detail::device_attributes(context, where).device_cap_flags_ex;
    for (const auto& [right, cap, name] :
         {std::tuple{Access::flush_global, detail::device_flush_global, "GLOBAL"},
          std::tuple{Access::flush_persistent, detail::device_flush_persistent, "PERSISTENT"}})
      if ((access & right) && (caps & cap) == 0)
        detail::throw_errno(EOPNOTSUPP,
                            std::string(what) + ": Access::flush_" + (cap == detail::device_flush_global ? "global" : "persistent") +
                                " on a device that does not report that flush (device_cap_flags_ex lacks "
                                "IB_UVERBS_DEVICE_FLUSH_" + name + "; rxe has it from Linux 6.2)",
                            where);
  }
  if (access & Access::on_demand) {
    const ibv_device_attr_ex dev = detail::device_attributes(context, where);
    if ((dev.odp_caps.general_caps & IBV_ODP_SUPPORT) == 0)
      detail::throw_errno(EOPNOTSUPP,
                          std::string(what) +
                              ": Access::on_demand on a device that does not page on demand "
                              "(ibv_device_attr_ex::odp_caps.general_caps lacks IBV_ODP_SUPPORT)",
                          where);
  }
}

}  // namespace

MemoryRegion::MemoryRegion(const ProtectionDomain& pd, std::span<std::byte> memory, AccessFlags access,
                           SourceLocation where)
    : MemoryRegion(pd, memory, access, std::nullopt, where) {}

MemoryRegion::MemoryRegion(const ProtectionDomain& pd, std::span<std::byte> memory, AccessFlags access, Iova iova,
                           SourceLocation where)
    : MemoryRegion(pd, memory, access, iova.address, where) {}

MemoryRegion::MemoryRegion(const ProtectionDomain& pd, std::span<std::byte> memory, AccessFlags access,
                           std::optional<std::uint64_t> iova, SourceLocation where)
    : access_(access) {
  detail::require_not_empty(pd.native_handle() != nullptr, "MemoryRegion: the ProtectionDomain", where);
  check_access(access, pd.native_handle()->context, "MemoryRegion", where);
  if (iova && memory.size() > std::numeric_limits<std::uint64_t>::max() - *iova)
    detail::throw_error(make_error_code(Errc::bad_argument),
                        "MemoryRegion: IOVA " + std::to_string(*iova) + " + " + std::to_string(memory.size()) +
                            " bytes wraps around 2^64",
                        where);
  ibv_mr* mr = iova ? detail::check_ptr(ibv_reg_mr_iova2(pd.native_handle(), memory.data(), memory.size(), *iova,
                                                         access.value()),
                                        "ibv_reg_mr_iova2", where)
                    : detail::check_ptr(ibv_reg_mr(pd.native_handle(), memory.data(), memory.size(),
                                                   static_cast<int>(access.value())),
                                        "ibv_reg_mr", where);
  mr_ = std::shared_ptr<ibv_mr>(mr, Deleter{pd.shared_handle(), {}});
  data_ = memory.data();
  iova_ = iova ? *iova : reinterpret_cast<std::uint64_t>(memory.data());  // NOLINT
}

MemoryRegion::MemoryRegion(const ProtectionDomain& pd, DmaBuf buf, AccessFlags access, Iova iova, SourceLocation where)
    : access_(access), kind_(Kind::dmabuf) {
  detail::require_not_empty(pd.native_handle() != nullptr, "MemoryRegion: the ProtectionDomain", where);
  check_access(access, pd.native_handle()->context, "MemoryRegion (dma-buf)", where);
  if (buf.fd < 0)
    detail::throw_error(make_error_code(Errc::bad_argument),
                        "MemoryRegion: dma-buf file descriptor " + std::to_string(buf.fd) + " is not one", where);
  if (buf.length == 0)
    detail::throw_error(make_error_code(Errc::bad_argument), "MemoryRegion: a dma-buf region of 0 bytes", where);
  if (buf.length > std::numeric_limits<std::uint64_t>::max() - iova.address)
    detail::throw_error(make_error_code(Errc::bad_argument),
                        "MemoryRegion: IOVA " + std::to_string(iova.address) + " + " + std::to_string(buf.length) +
                            " bytes wraps around 2^64",
                        where);
  ibv_mr* mr = detail::check_ptr(ibv_reg_dmabuf_mr(pd.native_handle(), buf.offset, buf.length, iova.address, buf.fd,
                                                   static_cast<int>(access.value())),
                                 "ibv_reg_dmabuf_mr", where);
  mr_ = std::shared_ptr<ibv_mr>(mr, Deleter{pd.shared_handle(), {}});
  iova_ = iova.address;
}

MemoryRegion MemoryRegion::implicit_on_demand(const ProtectionDomain& pd, AccessFlags access, SourceLocation where) {
  detail::require_not_empty(pd.native_handle() != nullptr, "MemoryRegion::implicit_on_demand: the ProtectionDomain",
                            where);
  access |= Access::on_demand;
  check_access(access, pd.native_handle()->context, "MemoryRegion::implicit_on_demand", where);
  // Kept by the context's hub while a Device lives: check_access's query above is the same.
  const ibv_device_attr_ex dev = detail::device_attributes(pd.native_handle()->context, where);
  if ((dev.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT) == 0)
    detail::throw_errno(EOPNOTSUPP,
                        "MemoryRegion::implicit_on_demand: the device has no implicit on-demand paging "
                        "(ibv_device_attr_ex::odp_caps.general_caps lacks IBV_ODP_SUPPORT_IMPLICIT)",
                        where);
  ibv_mr* mr = detail::check_ptr(
      ibv_reg_mr(pd.native_handle(), nullptr, std::numeric_limits<std::size_t>::max(), static_cast<int>(access.value())),
      "ibv_reg_mr", where);
  MemoryRegion r;
  r.mr_ = std::shared_ptr<ibv_mr>(mr, Deleter{pd.shared_handle(), {}});
  r.access_ = access;
  r.kind_ = Kind::implicit;
  return r;
}

void MemoryRegion::throw_memory_slice_error_(std::span<const std::byte> memory, SourceLocation where) const {
  if (kind_ == Kind::dmabuf)
    detail::throw_error(make_error_code(Errc::bad_argument),
                        "MemoryRegion::slice: a dma-buf region has no memory in this process: slice it by offset",
                        where);
  const auto hex = [](const void* p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", p);
    return std::string(buf);
  };
  detail::throw_error(make_error_code(*this ? Errc::local_out_of_bounds : Errc::empty_object),
                      "MemoryRegion::slice: memory [" + hex(memory.data()) + ", +" + std::to_string(memory.size()) +
                          ") is not within the region [" + hex(data_) + ", +" + std::to_string(size()) + ")",
                      where);
}

MemoryRegion::MemoryRegion(Buffer buffer, const ProtectionDomain& pd, AccessFlags access, SourceLocation where)
    : MemoryRegion(pd, buffer.span(), access, where) {
  std::get_deleter<Deleter>(mr_)->buffer = std::move(buffer);
}

MemoryRegion MemoryRegion::allocate(const ProtectionDomain& pd, std::size_t size, AccessFlags access,
                                    SourceLocation where) {
  return MemoryRegion(Buffer(size), pd, access, where);
}

void MemoryRegion::advise(std::span<const LocalSlice> slices, Prefetch how, SourceLocation where) const {
  detail::require_not_empty(static_cast<bool>(*this), "MemoryRegion::advise: the MemoryRegion", where);
  if (!(access_ & Access::on_demand))
    detail::throw_error(make_error_code(Errc::bad_argument),
                        "MemoryRegion::advise: the region was not registered with Access::on_demand", where);
  if (slices.empty()) return;
  std::vector<ibv_sge> sges;
  sges.reserve(slices.size());
  for (const LocalSlice& s : slices) {
    if (s.lkey() != lkey())
      detail::throw_error(make_error_code(Errc::bad_argument),
                          "MemoryRegion::advise: a slice of another region (lkey " + std::to_string(s.lkey()) + ")", where);
    sges.push_back(s.native());
  }
  const auto advice = !how.fault                        ? IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT
                      : (access_ & Access::local_write) ? IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE
                                                        : IBV_ADVISE_MR_ADVICE_PREFETCH;
  const int rc = ibv_advise_mr(mr_->pd, advice, how.wait ? static_cast<std::uint32_t>(IBV_ADVISE_MR_FLAG_FLUSH) : 0u, sges.data(),
                               static_cast<std::uint32_t>(sges.size()));
  // No capability bit says whether advise works: a device that pages on demand may still lack
  // it in its provider or its kernel driver (rxe: rdma-core 59 and a kernel whose rxe pages on
  // demand), and the errno alone does not say that.
  if (detail::rc_to_errno(rc) == EOPNOTSUPP)
    detail::throw_errno(EOPNOTSUPP, "ibv_advise_mr (the device's provider or kernel driver does not implement it; for rxe: "
                            "rdma-core 59 or newer; the region still pages on demand without it)", where);
  detail::check_rc(rc, "ibv_advise_mr", where);
}

void MemoryRegion::rereg(const Rereg& change, SourceLocation where) {
  detail::require_not_empty(static_cast<bool>(*this), "MemoryRegion::rereg: the MemoryRegion", where);
  const auto refuse = [&](const std::string& why) {
    detail::throw_error(make_error_code(Errc::bad_argument), "MemoryRegion::rereg: " + why, where);
  };
  if (kind_ != Kind::memory)
    refuse(kind_ == Kind::dmabuf ? "a dma-buf region cannot be re-registered (ibv_rereg_mr(3))"
                                 : "an implicit on-demand region cannot be re-registered");
  if (change.pd == nullptr && !change.memory && !change.access) refuse("nothing to change");
  int flags = 0;
  ibv_pd* pd = nullptr;
  if (change.pd != nullptr) {
    detail::require_not_empty(change.pd->native_handle() != nullptr, "MemoryRegion::rereg: the ProtectionDomain",
                              where);
    pd = change.pd->native_handle();
    if (pd->context != mr_->context) refuse("the protection domain is on another device context");
    flags |= IBV_REREG_MR_CHANGE_PD;
  }
  void* addr = nullptr;
  std::size_t length = 0;
  if (change.memory) {
    if (change.memory->empty()) refuse("new memory of 0 bytes");
    addr = change.memory->data();
    length = change.memory->size();
    flags |= IBV_REREG_MR_CHANGE_TRANSLATION;
  }
  int access = 0;
  if (change.access) {
    check_access(*change.access, mr_->context, "MemoryRegion::rereg", where);
    access = static_cast<int>(change.access->value());
    flags |= IBV_REREG_MR_CHANGE_ACCESS;
  }
  if (mr_.use_count() > 1)
    detail::throw_errno(EBUSY,
                        "MemoryRegion::rereg: something else holds the registration (a memory window bound to the "
                        "region, or a shared_handle()): it would go on using the old range through the new one",
                        where);
  std::string what = "ibv_rereg_mr (";
  for (const auto& [flag, name] : {std::pair{IBV_REREG_MR_CHANGE_PD, "PD"}, std::pair{IBV_REREG_MR_CHANGE_TRANSLATION, "memory"},
                                   std::pair{IBV_REREG_MR_CHANGE_ACCESS, "rights"}})
    if ((flags & flag) != 0) what += std::string(what.back() == '(' ? "" : ", ") + name;
  what += ")";
  errno = 0;
  const int rc = ibv_rereg_mr(mr_.get(), flags, pd, addr, length, access);
  const int err = errno != 0 ? errno : EIO;
  if (rc == IBV_REREG_MR_ERR_INPUT)  // the registration is as it was
    detail::throw_errno(err, what + ": refused by libibverbs; the region is unchanged", where);
  if (rc == IBV_REREG_MR_ERR_DONT_FORK_NEW)
    detail::throw_errno(err, what + ": the new memory's fork protection (madvise) failed; the region is unchanged", where);
  if (rc != 0 && rc != IBV_REREG_MR_ERR_DO_FORK_OLD) {
    // The kernel refused the command (IBV_REREG_MR_ERR_CMD, CMD_AND_DO_FORK_NEW, or a code this
    // libibverbs does not list). EOPNOTSUPP comes before anything is changed (no such operation,
    // or not this change); after any other failure ibv_rereg_mr(3) says the MR "shouldn't be
    // used", so this region lets go of it. With CMD_AND_DO_FORK_NEW errno is the fork-protection
    // call's, not the command's: the region is let go of then too.
    if (rc == IBV_REREG_MR_ERR_CMD && err == EOPNOTSUPP)
      detail::throw_errno(err, what + ": the device cannot make this change; the region is unchanged", where);
    MemoryRegion().swap(*this);
    detail::throw_errno(err,
                        what + (rc != IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW
                                    ? ": the command failed"
                                    : ": the command failed, and so did undoing the new memory's fork protection") +
                            "; the registration is undefined (ibv_rereg_mr(3)), so the region let go of it and is "
                            "empty",
                        where);
  }
  // Done (IBV_REREG_MR_ERR_DO_FORK_OLD too: only the old pages' fork protection stayed on).
  // A buffer the region allocated stays with the registration (Deleter): the new memory may be
  // part of it.
  if (change.pd != nullptr) std::get_deleter<Deleter>(mr_)->pd = change.pd->shared_handle();
  if (change.memory) {
    data_ = change.memory->data();
    iova_ = reinterpret_cast<std::uint64_t>(data_);  // NOLINT
  }
  if (change.access) access_ = *change.access;
}

RemoteSlice::Wire RemoteSlice::encode() const noexcept {
  Wire w{};
  w[0] = kSliceMagic0;
  w[1] = kSliceMagic1;
  w[2] = kSliceVersion;
  w[3] = std::byte{0};
  put_le(&w[4], rkey, 4);
  put_le(&w[8], addr, 8);
  put_le(&w[16], length, 8);
  return w;
}

std::optional<RemoteSlice> RemoteSlice::decode(std::span<const std::byte> wire, std::error_code& ec) noexcept {
  ec = make_error_code(Errc::bad_encoding);
  if (wire.size() != wire_size || wire[0] != kSliceMagic0 || wire[1] != kSliceMagic1 || wire[2] != kSliceVersion ||
      wire[3] != std::byte{0})
    return std::nullopt;
  RemoteSlice r{get_le(&wire[8], 8), get_le(&wire[16], 8), static_cast<std::uint32_t>(get_le(&wire[4], 4))};
  if (r.length > UINT64_MAX - r.addr) return std::nullopt;
  ec.clear();
  return r;
}

RemoteSlice RemoteSlice::decode(std::span<const std::byte> wire, SourceLocation where) {
  std::error_code ec;
  if (auto r = decode(wire, ec)) return *r;
  std::string why;
  if (wire.size() != wire_size)
    why = "size " + std::to_string(wire.size()) + ", expected " + std::to_string(wire_size);
  else if (wire[0] != kSliceMagic0 || wire[1] != kSliceMagic1)
    why = "bad magic (not a verbs remote slice)";
  else if (wire[2] != kSliceVersion)
    why = "unsupported version " + std::to_string(static_cast<int>(wire[2]));
  else if (wire[3] != std::byte{0})
    why = "reserved byte not zero";
  else
    why = "addr + length wraps around";
  detail::throw_error(ec, "RemoteSlice::decode: " + why, where);
}

RemoteSlice RemoteSlice::slice(std::uint64_t offset, std::uint64_t len, SourceLocation where) const {
  if (auto r = try_slice(offset, len)) return *r;
  detail::throw_slice_error(Errc::remote_out_of_bounds, offset, len, length, where);
}

}  // namespace verbs
