// Memory registration (ibv_reg_mr(3)) and the slices that work requests are built from.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>

#include <infiniband/verbs.h>

#include "verbs/error.hpp"
#include "verbs/flags.hpp"
#include "verbs/protection_domain.hpp"

namespace verbs {

/// Access rights of a memory region or queue pair (IBV_ACCESS_*). None is granted by default.
enum class Access : unsigned {
  local_write = IBV_ACCESS_LOCAL_WRITE,
  remote_write = IBV_ACCESS_REMOTE_WRITE,
  remote_read = IBV_ACCESS_REMOTE_READ,
  remote_atomic = IBV_ACCESS_REMOTE_ATOMIC,
  mw_bind = IBV_ACCESS_MW_BIND,
  zero_based = IBV_ACCESS_ZERO_BASED,
  on_demand = IBV_ACCESS_ON_DEMAND,
  relaxed_ordering = IBV_ACCESS_RELAXED_ORDERING,
  flush_global = 1u << 8,      ///< the target of SendBatch::flush at FlushLevel::global (IBV_ACCESS_FLUSH_GLOBAL, rdma-core 45)
  flush_persistent = 1u << 9,  ///< the target of a FlushLevel::persistent flush (IBV_ACCESS_FLUSH_PERSISTENT)
};

template <>
/// Makes Access a bitmask enum: Flags<Access> (AccessFlags) and its operators.
struct FlagTraits<Access> {
  static constexpr bool is_bitmask = true;  ///< Access is a set of bits
  /// Every defined Access bit.
  static constexpr unsigned all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                  IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
                                  IBV_ACCESS_ON_DEMAND | IBV_ACCESS_RELAXED_ORDERING | (1u << 8) | (1u << 9);
};
/// A set of Access rights, e.g. `Access::local_write | Access::remote_write`.
using AccessFlags = Flags<Access>;

/// How MemoryRegion::advise() prefetches.
struct Prefetch {
  /// Return once the pages are mapped for the device (IBV_ADVISE_MR_FLAG_FLUSH); false: the
  /// device may do it later, and the call returns at once.
  bool wait = true;
  /// Fault in pages that are not in memory; false: map for the device only those already
  /// there, faulting none (PREFETCH_NO_FAULT), so a prefetch never waits on the kernel's
  /// paging. Either way the device still faults on demand what it then touches.
  bool fault = true;
};

/// A local scatter/gather entry {addr, length, lkey}: a view into registered memory, cheap to
/// copy. Layout-identical to ibv_sge, so a span of slices is handed to the device as is.
class LocalSlice {
 public:
  /// An empty slice.
  constexpr LocalSlice() noexcept = default;
  /// A slice of registered memory; normally made by MemoryRegion::slice().
  constexpr LocalSlice(std::uint64_t addr, std::uint32_t length, std::uint32_t lkey) noexcept
      : sge_{addr, length, lkey} {}

  /// Start address, as the device knows it: the virtual address, or for a region registered at
  /// an IOVA (MemoryRegion's Iova constructor), the IOVA.
  [[nodiscard]] constexpr std::uint64_t addr() const noexcept { return sge_.addr; }
  /// Length in bytes.
  [[nodiscard]] constexpr std::uint32_t length() const noexcept { return sge_.length; }
  /// Local key of the region.
  [[nodiscard]] constexpr std::uint32_t lkey() const noexcept { return sge_.lkey; }
  /// The memory, as a pointer: addr() taken as a virtual address. Not for a slice of a region
  /// registered at an IOVA or of a dma-buf, whose addr() is no address of this process
  /// (MemoryRegion::bytes()).
  [[nodiscard]] std::byte* data() const noexcept { return reinterpret_cast<std::byte*>(sge_.addr); }  // NOLINT
  /// The memory, as bytes (as data(): not for a slice of a region at an IOVA or of a dma-buf).
  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return {data(), sge_.length}; }
  /// The C scatter/gather entry.
  [[nodiscard]] const ibv_sge& native() const noexcept { return sge_; }

 private:
  ibv_sge sge_{};
};
static_assert(sizeof(LocalSlice) == sizeof(ibv_sge) && std::is_standard_layout_v<LocalSlice>);

/// What a peer needs to address a region with RDMA: {addr, length, rkey}. A value type with a
/// fixed little-endian wire encoding (encode()/decode()).
struct RemoteSlice {
  std::uint64_t addr = 0;    ///< remote virtual address
  std::uint64_t length = 0;  ///< bytes from addr
  std::uint32_t rkey = 0;    ///< remote key

  /// Bytes of the wire form: magic "VR", version 1, a zero byte, rkey u32, addr u64, length u64.
  static constexpr std::size_t wire_size = 24;
  /// The encoded form.
  using Wire = std::array<std::byte, wire_size>;

  /// The wire form, to send to the peer.
  [[nodiscard]] Wire encode() const noexcept;
  ///@{
  /// Parses encode()'s output. Throws Error(Errc::bad_encoding) saying what is wrong: a size
  /// other than wire_size, wrong magic or version, a non-zero reserved byte, addr + length
  /// wrapping around.
  [[nodiscard]] static RemoteSlice decode(std::span<const std::byte> wire, SourceLocation where = SourceLocation::current());
  [[nodiscard]] static std::optional<RemoteSlice> decode(std::span<const std::byte> wire, std::error_code& ec) noexcept;
  ///@}

  /// The part [offset, offset + len). Throws Error(Errc::remote_out_of_bounds) if it does not fit.
  [[nodiscard]] RemoteSlice slice(std::uint64_t offset, std::uint64_t len,
                                  SourceLocation where = SourceLocation::current()) const;
  /// The part from offset to the end.
  [[nodiscard]] RemoteSlice slice(std::uint64_t offset,
                                  SourceLocation where = SourceLocation::current()) const {
    return slice(offset, offset <= length ? length - offset : std::numeric_limits<std::uint64_t>::max(), where);
  }
  /// As slice(), empty instead of throwing.
  [[nodiscard]] constexpr std::optional<RemoteSlice> try_slice(std::uint64_t offset, std::uint64_t len) const noexcept {
    if (offset > length || len > length - offset) return std::nullopt;
    return RemoteSlice{addr + offset, len, rkey};
  }
  /// Equal when address, length and key are.
  friend constexpr bool operator==(const RemoteSlice&, const RemoteSlice&) = default;
};

/// Page-aligned, zero-filled heap memory for registration; move-only.
class Buffer {
 public:
  /// No memory.
  Buffer() noexcept = default;
  /// Allocates `size` bytes (rounded up to whole pages). Throws std::bad_alloc.
  explicit Buffer(std::size_t size);
  ///@{
  /// Move-only: the moved-from Buffer is empty.
  Buffer(Buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer(std::move(o)).swap(*this);
    return *this;
  }
  ///@}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();
  /// Exchanges two Buffers.
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }

  /// The memory; null when empty.
  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  /// Bytes asked for; the allocation behind them is rounded up to whole pages.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// The memory as bytes.
  [[nodiscard]] std::span<std::byte> span() const noexcept { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// An I/O virtual address (ibv_reg_mr_iova2(3)): the address a region's first byte has for the
/// device, in local work requests and for the peer, in place of its virtual address. Iova{0}
/// gives zero-based addresses, which a peer can use without knowing this process's address space.
struct Iova {
  std::uint64_t address = 0;  ///< the IOVA of the region's first byte
};

/// A dma-buf (ibv_reg_dmabuf_mr(3)): `length` bytes from `offset` of the buffer behind the file
/// descriptor `fd`, as an exporter gives one (a GPU driver, udmabuf). The registration takes its
/// own reference to the buffer: the caller may close `fd` afterwards.
struct DmaBuf {
  int fd = -1;               ///< the dma-buf's file descriptor
  std::uint64_t offset = 0;  ///< where the region starts within the buffer
  std::size_t length = 0;    ///< bytes registered
};

/// What MemoryRegion::rereg changes (ibv_rereg_mr(3)); what is left empty stays as it is.
struct Rereg {
  const ProtectionDomain* pd = nullptr;        ///< a new protection domain (IBV_REREG_MR_CHANGE_PD)
  std::optional<std::span<std::byte>> memory{};  ///< new memory (IBV_REREG_MR_CHANGE_TRANSLATION)
  std::optional<AccessFlags> access{};           ///< new rights (IBV_REREG_MR_CHANGE_ACCESS)
};

namespace detail {
/// What a moved-from MemoryRegion points at: a region of no bytes, so that the accessors need
/// no null test (and compilers see no null pointer in code that offsets data()).
ibv_mr* empty_mr() noexcept;
}  // namespace detail

/// A registered memory region (ibv_reg_mr(3)). Move-only; keeps its protection domain alive.
/// Memory the caller gives must outlive the region and every memory window bound to it (a window
/// keeps the registration, and so the peer's access); memory the region allocated lives as long
/// as they do. Every work request that uses the region must have completed before it is
/// destroyed.
class MemoryRegion {
 public:
  /// Registers `memory` with `access` (no right by default). Remote write or atomic access
  /// requires local_write, and Access::zero_based is refused (slice() and remote() give virtual
  /// addresses): both checked here, Errc::bad_argument. Access::on_demand (pages are
  /// faulted in as the device touches them, not pinned) is refused before registering with
  /// EOPNOTSUPP where the device does not page on demand (Device::has_odp()). Throws Error from
  /// ibv_reg_mr (EINVAL, ENOMEM, EFAULT for read-only pages with local_write, EOPNOTSUPP).
  MemoryRegion(const ProtectionDomain& pd, std::span<std::byte> memory, AccessFlags access = {},
               SourceLocation where = SourceLocation::current());

  /// Registers `memory` at the I/O virtual address `iova` (ibv_reg_mr_iova2(3)): the region's
  /// bytes are addressed from iova.address on, by slice() and remote() and so by every work
  /// request, local and remote, not by their virtual address. `data()` and `bytes()` still give
  /// the memory; a LocalSlice's `bytes()` does not, and an inline send or write (the provider
  /// copies its payload from the slice's address) cannot take such a slice. Best with the same
  /// offset within a page as the memory (Iova{0} for page-aligned memory); some devices refuse
  /// other offsets. The same
  /// checks as above, and iova.address + size wrapping around 2^64 is refused before registering
  /// (Errc::bad_argument). Throws Error from ibv_reg_mr_iova2 (EINVAL, ENOMEM, EFAULT,
  /// EOPNOTSUPP).
  MemoryRegion(const ProtectionDomain& pd, std::span<std::byte> memory, AccessFlags access, Iova iova,
               SourceLocation where = SourceLocation::current());

  /// Registers a dma-buf (ibv_reg_dmabuf_mr(3)), e.g. GPU memory, addressed from `iova` by
  /// slice() and remote(). The region has no memory in this process: data() is null, bytes()
  /// empty, and only slice(offset, len) makes slices; as for a region at an Iova, a slice's
  /// addr() is no address here, so its bytes() are not the memory and an inline send or write
  /// (the provider copies from addr() as a pointer) cannot take it. The same checks of `access` as above;
  /// a negative fd and a zero length are refused before registering (Errc::bad_argument). Throws
  /// Error from ibv_reg_dmabuf_mr: EOPNOTSUPP where the device takes no dma-buf (rxe), EINVAL,
  /// EBADF, ENOMEM.
  MemoryRegion(const ProtectionDomain& pd, DmaBuf buf, AccessFlags access, Iova iova = Iova{0},
               SourceLocation where = SourceLocation::current());

  /// Registers any contiguous range of trivially copyable, non-const elements: an lvalue, or a
  /// borrowed range (e.g. a std::span<T>). A temporary container does not compile: it would be
  /// freed at the end of the statement while the device keeps its address.
  template <std::ranges::contiguous_range R>
    requires((std::is_lvalue_reference_v<R> || std::ranges::borrowed_range<R>) &&
             std::is_trivially_copyable_v<std::ranges::range_value_t<R>> &&
             !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>> &&
             !std::is_same_v<std::remove_cvref_t<R>, std::span<std::byte>>)
  MemoryRegion(const ProtectionDomain& pd, R&& range, AccessFlags access = {},
               SourceLocation where = SourceLocation::current())
      : MemoryRegion(pd, std::as_writable_bytes(std::span(std::ranges::data(range), std::ranges::size(range))),
                     access, where) {}

  /// Allocates a page-aligned zeroed buffer of `size` bytes owned by the region, and registers it.
  [[nodiscard]] static MemoryRegion allocate(const ProtectionDomain& pd, std::size_t size, AccessFlags access = {},
                                             SourceLocation where = SourceLocation::current());

  /// An implicit on-demand region (ibv_reg_mr(3) of the whole address space with
  /// IBV_ACCESS_ON_DEMAND): one key for all of the process's memory, whose pages the device
  /// faults in as it touches them. Slices are made from the memory itself (slice(span)), and
  /// remote() opens the whole address space to the peer with the rights of `access`
  /// (Access::on_demand is implied). data() is null, bytes() empty, size() SIZE_MAX. Refused
  /// before registering with EOPNOTSUPP where the device has no implicit ODP
  /// (Device::has_implicit_odp(); rxe has none); the checks of `access` as above. Throws Error
  /// from ibv_reg_mr.
  [[nodiscard]] static MemoryRegion implicit_on_demand(const ProtectionDomain& pd, AccessFlags access = {},
                                                       SourceLocation where = SourceLocation::current());

  /// Move-only: the moved-from region is empty.
  MemoryRegion(MemoryRegion&& o) noexcept
      : mr_(std::exchange(o.mr_, empty_handle_())),
        data_(std::exchange(o.data_, nullptr)),
        iova_(std::exchange(o.iova_, 0)),
        access_(std::exchange(o.access_, {})),
        kind_(std::exchange(o.kind_, Kind::memory)) {}
  /// Lets go of the old registration (and the buffer it owned, once nothing else holds it).
  MemoryRegion& operator=(MemoryRegion&& o) noexcept {
    MemoryRegion(std::move(o)).swap(*this);
    return *this;
  }
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;
  ~MemoryRegion() = default;
  /// Exchanges two MemoryRegions.
  void swap(MemoryRegion& o) noexcept {
    mr_.swap(o.mr_);
    std::swap(data_, o.data_);
    std::swap(iova_, o.iova_);
    std::swap(access_, o.access_);
    std::swap(kind_, o.kind_);
  }

  // A moved-from region is empty: no memory, size 0, keys 0, and slice() of anything but
  // nothing throws Error(Errc::empty_object).

  /// The registered memory (empty for a moved-from region, a dma-buf and an implicit on-demand
  /// region).
  [[nodiscard]] std::span<std::byte> bytes() const noexcept {
    return {data_, kind_ == Kind::memory ? size() : 0};
  }
  /// Start of the registered memory (null for a moved-from region, a dma-buf and an implicit
  /// on-demand region).
  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  /// Bytes registered (0 for a moved-from region, SIZE_MAX for an implicit on-demand region).
  [[nodiscard]] std::size_t size() const noexcept { return mr_->length; }
  /// Local key, for local slices.
  [[nodiscard]] std::uint32_t lkey() const noexcept { return mr_->lkey; }
  /// Remote key, for the peer (see remote()).
  [[nodiscard]] std::uint32_t rkey() const noexcept { return mr_->rkey; }
  /// False for a moved-from (empty) region.
  [[nodiscard]] explicit operator bool() const noexcept { return mr_.get() != detail::empty_mr(); }
  /// The region's rights: those it was registered with, or given by rereg() since.
  [[nodiscard]] AccessFlags access() const noexcept { return access_; }
  /// The address of the region's first byte for the device and the peer: its virtual address
  /// (data()), or the IOVA it was registered at (0 for a moved-from region).
  [[nodiscard]] std::uint64_t iova() const noexcept { return iova_; }

  /// A local slice [offset, offset + len). Throws Error(Errc::local_out_of_bounds) when it does
  /// not fit in the region, Error(Errc::length_overflow) when len >= 2^32.
  [[nodiscard]] LocalSlice slice(std::size_t offset, std::size_t len,
                                 SourceLocation where = SourceLocation::current()) const {
    if (offset > size() || len > size() - offset) [[unlikely]]
      detail::throw_slice_error(*this ? Errc::local_out_of_bounds : Errc::empty_object, offset, len, size(), where);
    if (len > std::numeric_limits<std::uint32_t>::max()) [[unlikely]]
      detail::throw_slice_error(Errc::length_overflow, offset, len, size(), where);
    return {iova_ + offset, static_cast<std::uint32_t>(len), lkey()};
  }
  /// The local slice of `memory`, which must lie within the region's (any memory of the process
  /// for an implicit on-demand region). Throws Error(Errc::local_out_of_bounds) when it does
  /// not, Error(Errc::length_overflow) when it has 2^32 bytes or more, and Error(Errc::bad_argument)
  /// for a dma-buf region, whose memory is not the process's.
  [[nodiscard]] LocalSlice slice(std::span<const std::byte> memory, SourceLocation where = SourceLocation::current()) const {
    const auto addr = reinterpret_cast<std::uintptr_t>(memory.data());  // NOLINT
    const auto base = reinterpret_cast<std::uintptr_t>(data_);          // NOLINT
    if (kind_ == Kind::dmabuf || addr < base || addr - base > size() || memory.size() > size() - (addr - base))
        [[unlikely]]
      throw_memory_slice_error_(memory, where);
    return slice(addr - base, memory.size(), where);
  }
  /// The whole region as one local slice.
  [[nodiscard]] LocalSlice slice(SourceLocation where = SourceLocation::current()) const {
    return slice(0, size(), where);
  }
  /// As slice(), empty instead of throwing.
  [[nodiscard]] std::optional<LocalSlice> try_slice(std::size_t offset, std::size_t len) const noexcept {
    if (offset > size() || len > size() - offset || len > std::numeric_limits<std::uint32_t>::max()) return std::nullopt;
    return LocalSlice{iova_ + offset, static_cast<std::uint32_t>(len), lkey()};
  }
  /// What the peer needs to read, write or use atomics on this region (from iova()). The rkey
  /// only opens what `access()` grants.
  [[nodiscard]] RemoteSlice remote() const noexcept { return {iova_, size(), rkey()}; }

  /// ibv_advise_mr(3) on slices of this region, registered with Access::on_demand: map their
  /// pages for the device before it needs them, so the first operations on them do not wait for
  /// page faults (for writing where the region has Access::local_write: PREFETCH_WRITE, else
  /// PREFETCH; `how.fault` false: PREFETCH_NO_FAULT). No slices: nothing is done. Throws
  /// Error(Errc::bad_argument) for a region without Access::on_demand (checked here) or a slice
  /// of another region (another lkey), and Error with the provider's errno (EOPNOTSUPP, said so,
  /// where the provider or the kernel driver has no advise: rxe before rdma-core 59).
  void advise(std::span<const LocalSlice> slices, Prefetch how = {}, SourceLocation where = SourceLocation::current()) const;

  /// Changes the registration in place (ibv_rereg_mr(3)): its protection domain, its memory, its
  /// rights, or several at once. The keys may change (lkey() and rkey() give the new ones), so
  /// slices and remote() made before, and what the peer was given, are stale; no work request
  /// may use the region meanwhile. New memory is addressed from its virtual address (also for
  /// a region registered at an Iova). A buffer the region allocated (allocate()) stays until the
  /// region is destroyed, whatever memory it then covers. Refused before the call, the region
  /// unchanged: nothing to change, a moved-from region, a dma-buf or implicit on-demand region,
  /// a moved-from protection domain or one of another device context, empty memory, and the
  /// checks of `access` as at registration (Errc::bad_argument, Errc::empty_object,
  /// EOPNOTSUPP); and EBUSY while anything else holds the registration (a memory window bound to
  /// the region, a shared_handle()): the window would go on granting the old range through the
  /// new translation. Throws Error with the provider's errno, naming the change: with
  /// EOPNOTSUPP (the device cannot change this; rxe of Linux 6.1 changes nothing) the region is
  /// unchanged; after any other failure of the command the device leaves the registration
  /// undefined (IBV_REREG_MR_ERR_CMD), so the region is left empty, its registration released,
  /// and the message says so.
  void rereg(const Rereg& change, SourceLocation where = SourceLocation::current());

  /// The C handle; null for a moved-from region.
  [[nodiscard]] ibv_mr* native_handle() const noexcept { return *this ? mr_.get() : nullptr; }
  /// The C handle with shared ownership (null for a moved-from region): holding it keeps the
  /// registration (and its PD) alive, as a memory window bound to the region does.
  [[nodiscard]] std::shared_ptr<ibv_mr> shared_handle() const noexcept { return *this ? mr_ : nullptr; }

 private:
  // What the registration's bytes are: the process's memory (also at an IOVA), the whole address
  // space (implicit on-demand), or a dma-buf.
  enum class Kind : std::uint8_t { memory, implicit, dmabuf };
  struct Deleter;
  MemoryRegion() noexcept = default;  // empty, for implicit_on_demand to fill
  // slice(span)'s refusal: memory outside the region, or a dma-buf region (cold).
  [[noreturn]] void throw_memory_slice_error_(std::span<const std::byte> memory, SourceLocation where) const;
  MemoryRegion(Buffer buffer, const ProtectionDomain& pd, AccessFlags access, SourceLocation where);
  // Both public constructors: iova empty registers at the memory's own address (ibv_reg_mr).
  MemoryRegion(const ProtectionDomain& pd, std::span<std::byte> memory, AccessFlags access,
               std::optional<std::uint64_t> iova, SourceLocation where);
  // Owns nothing: aliases the static empty region without a control block.
  static std::shared_ptr<ibv_mr> empty_handle_() noexcept { return {std::shared_ptr<void>(), detail::empty_mr()}; }

  // The registration; its deleter (Deleter) holds the protection domain and the memory the region
  // owns (allocate()), so both live as long as the registration, which a memory window shares.
  std::shared_ptr<ibv_mr> mr_ = empty_handle_();
  std::byte* data_ = nullptr;    // the process's memory, if the registration is of it
  std::uint64_t iova_ = 0;       // the first byte's address in work requests (ibv_mr has no field for it)
  AccessFlags access_;
  Kind kind_ = Kind::memory;
};

/// Exchanges two MemoryRegions.
inline void swap(MemoryRegion& a, MemoryRegion& b) noexcept { a.swap(b); }
/// Exchanges two Buffers.
inline void swap(Buffer& a, Buffer& b) noexcept { a.swap(b); }

}  // namespace verbs
