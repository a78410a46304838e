// Typed bit flags over an enum class, in the manner of Vulkan-Hpp's vk::Flags.
#pragma once

#include <type_traits>

namespace verbs {

/// Specialise for an enum class E with `static constexpr bool is_bitmask = true` and
/// `static constexpr std::underlying_type_t<E> all` (every defined bit) to enable Flags<E>.
template <typename E>
struct FlagTraits {
  static constexpr bool is_bitmask = false;
};

template <typename E>
concept BitmaskEnum = std::is_enum_v<E> && FlagTraits<E>::is_bitmask;

/// A set of E values. `~` flips only E's defined bits, so `~Access::remote_read` is meaningful.
template <BitmaskEnum E>
class Flags {
 public:
  using Mask = std::underlying_type_t<E>;

  constexpr Flags() noexcept = default;
  constexpr Flags(E bit) noexcept : mask_(static_cast<Mask>(bit)) {}  // NOLINT: implicit by design
  constexpr explicit Flags(Mask mask) noexcept : mask_(mask & FlagTraits<E>::all) {}

  [[nodiscard]] constexpr Mask value() const noexcept { return mask_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return mask_ == 0; }
  [[nodiscard]] constexpr bool contains(Flags other) const noexcept {
    return (mask_ & other.mask_) == other.mask_;
  }
  constexpr explicit operator bool() const noexcept { return mask_ != 0; }

  friend constexpr bool operator==(Flags, Flags) noexcept = default;
  friend constexpr Flags operator|(Flags a, Flags b) noexcept { return Flags(Mask(a.mask_ | b.mask_)); }
  friend constexpr Flags operator&(Flags a, Flags b) noexcept { return Flags(Mask(a.mask_ & b.mask_)); }
  friend constexpr Flags operator^(Flags a, Flags b) noexcept { return Flags(Mask(a.mask_ ^ b.mask_)); }
  friend constexpr Flags operator~(Flags a) noexcept { return Flags(Mask(~a.mask_)); }
  constexpr Flags& operator|=(Flags b) noexcept { return *this = *this | b; }
  constexpr Flags& operator&=(Flags b) noexcept { return *this = *this & b; }
  constexpr Flags& operator^=(Flags b) noexcept { return *this = *this ^ b; }

 private:
  Mask mask_ = 0;
};

template <BitmaskEnum E>
constexpr Flags<E> operator|(E a, E b) noexcept { return Flags<E>(a) | b; }
template <BitmaskEnum E>
constexpr Flags<E> operator&(E a, E b) noexcept { return Flags<E>(a) & b; }
template <BitmaskEnum E>
constexpr Flags<E> operator^(E a, E b) noexcept { return Flags<E>(a) ^ b; }
template <BitmaskEnum E>
constexpr Flags<E> operator~(E a) noexcept { return ~Flags<E>(a); }

}  // namespace verbs
