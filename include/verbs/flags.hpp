// Typed bit flags over an enum class, in the manner of Vulkan-Hpp's vk::Flags.
#pragma once

#include <type_traits>

namespace verbs {

/// Specialise for an enum class E with `static constexpr bool is_bitmask = true` and
/// `static constexpr std::underlying_type_t<E> all` (every defined bit) to enable Flags<E>.
template <typename E>
struct FlagTraits {
  static constexpr bool is_bitmask = false;  ///< true in a specialisation: E is a set of bits
};

template <typename E>
/// An enum class whose FlagTraits enable Flags<E>.
concept BitmaskEnum = std::is_enum_v<E> && FlagTraits<E>::is_bitmask;

/// A set of E values. The complement flips only E's defined bits, so the complement of
/// Access::remote_read is every other access right, not a mask with unknown bits set.
template <BitmaskEnum E>
class Flags {
 public:
  /// The underlying integer type, as the C API takes it.
  using Mask = std::underlying_type_t<E>;

  /// The empty set.
  constexpr Flags() noexcept = default;
  /// The set of one value; implicit, so `Access::remote_write` converts.
  constexpr Flags(E bit) noexcept : mask_(static_cast<Mask>(bit)) {}  // NOLINT: implicit by design
  /// From a raw mask; bits outside FlagTraits<E>::all are dropped.
  constexpr explicit Flags(Mask mask) noexcept : mask_(mask & FlagTraits<E>::all) {}

  /// The raw mask, for the C API.
  [[nodiscard]] constexpr Mask value() const noexcept { return mask_; }
  /// True when no value is in the set.
  [[nodiscard]] constexpr bool empty() const noexcept { return mask_ == 0; }
  /// True when every value of `other` is in the set.
  [[nodiscard]] constexpr bool contains(Flags other) const noexcept {
    return (mask_ & other.mask_) == other.mask_;
  }
  /// True when any value is in the set.
  constexpr explicit operator bool() const noexcept { return mask_ != 0; }

  ///@{
  /// Equality, union, intersection, symmetric difference and complement (within E's defined bits).
  friend constexpr bool operator==(Flags, Flags) noexcept = default;
  friend constexpr Flags operator|(Flags a, Flags b) noexcept { return Flags(Mask(a.mask_ | b.mask_)); }
  friend constexpr Flags operator&(Flags a, Flags b) noexcept { return Flags(Mask(a.mask_ & b.mask_)); }
  friend constexpr Flags operator^(Flags a, Flags b) noexcept { return Flags(Mask(a.mask_ ^ b.mask_)); }
  friend constexpr Flags operator~(Flags a) noexcept { return Flags(Mask(~a.mask_)); }
  ///@}
  ///@{
  /// Union, intersection and symmetric difference in place.
  constexpr Flags& operator|=(Flags b) noexcept { return *this = *this | b; }
  constexpr Flags& operator&=(Flags b) noexcept { return *this = *this & b; }
  constexpr Flags& operator^=(Flags b) noexcept { return *this = *this ^ b; }
  ///@}

 private:
  Mask mask_ = 0;
};

template <BitmaskEnum E>
///@{
/// Set operations on two values of a bitmask enum give a Flags<E>.
constexpr Flags<E> operator|(E a, E b) noexcept { return Flags<E>(a) | b; }
template <BitmaskEnum E>
constexpr Flags<E> operator&(E a, E b) noexcept { return Flags<E>(a) & b; }
template <BitmaskEnum E>
constexpr Flags<E> operator^(E a, E b) noexcept { return Flags<E>(a) ^ b; }
template <BitmaskEnum E>
constexpr Flags<E> operator~(E a) noexcept { return ~Flags<E>(a); }
///@}

}  // namespace verbs
