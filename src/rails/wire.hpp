// What the rails' two sides tell each other in the rdma_cm handshake's private data
// (docs/design/rails.md). The Group's request names the group and the slot, so that a Target
// drops a slot's older connection when it connects again (its client may have vanished without
// a word: a cut wire); the Target's answer says what it allows, so that a Group refuses a read
// the target would refuse, before posting anything.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace verbs::rails::internal {

inline constexpr std::uint8_t right_write = 1, right_read = 2;

/// A group's connection: which group (random per Group) and which slot of it.
struct Hello {
  std::uint64_t group = 0;
  std::uint16_t slot = 0;
  friend bool operator==(const Hello&, const Hello&) = default;
};

// "RL", version 1, then the fields, little-endian.
inline std::array<std::byte, 13> encode(const Hello& h) noexcept {
  std::array<std::byte, 13> b{std::byte{'R'}, std::byte{'L'}, std::byte{1}};
  for (int i = 0; i < 2; ++i) b[3 + i] = static_cast<std::byte>(h.slot >> (8 * i));
  for (int i = 0; i < 8; ++i) b[5 + i] = static_cast<std::byte>(h.group >> (8 * i));
  return b;
}
inline std::optional<Hello> decode_hello(std::span<const std::byte> b) noexcept {
  if (b.size() < 13 || b[0] != std::byte{'R'} || b[1] != std::byte{'L'} || b[2] != std::byte{1}) return std::nullopt;
  Hello h;
  for (int i = 0; i < 2; ++i) h.slot = static_cast<std::uint16_t>(h.slot | std::to_integer<unsigned>(b[3 + i]) << (8 * i));
  for (int i = 0; i < 8; ++i) h.group |= std::uint64_t{std::to_integer<unsigned>(b[5 + i])} << (8 * i);
  return h;
}
inline std::array<std::byte, 4> encode_rights(std::uint8_t rights) noexcept {
  return {std::byte{'R'}, std::byte{'L'}, std::byte{1}, std::byte{rights}};
}
inline std::optional<std::uint8_t> decode_rights(std::span<const std::byte> b) noexcept {
  if (b.size() < 4 || b[0] != std::byte{'R'} || b[1] != std::byte{'L'} || b[2] != std::byte{1}) return std::nullopt;
  return std::to_integer<std::uint8_t>(b[3]);
}

}  // namespace verbs::rails::internal
