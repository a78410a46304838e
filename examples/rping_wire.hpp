// rping's wire format (rdma-core's rping, examples/rping.cpp): the 16-byte advertisement of a
// buffer, {addr u64, rkey u32, size u32}, big-endian. Shared with tests/fuzz, since the bytes
// come from the peer.
#pragma once

#include <endian.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include <verbs/memory_region.hpp>

namespace rping {

/// The advertisement as it lies in memory (the fields big-endian).
struct Advert {
  std::uint64_t addr;
  std::uint32_t rkey;
  std::uint32_t size;
};
static_assert(sizeof(Advert) == 16);

/// The wire form of a buffer at `addr` with `rkey`, `size` bytes long.
inline std::array<std::byte, sizeof(Advert)> encode_advert(std::uint64_t addr, std::uint32_t rkey, std::uint32_t size) {
  const Advert a{htobe64(addr), htobe32(rkey), htobe32(size)};
  std::array<std::byte, sizeof(Advert)> out;
  std::memcpy(out.data(), &a, sizeof a);
  return out;
}

/// The buffer a peer's advertisement describes: {addr, size, rkey} as a RemoteSlice. Every 16
/// bytes decode; what the slice may be used for is checked where it is used.
inline verbs::RemoteSlice decode_advert(std::span<const std::byte, sizeof(Advert)> wire) {
  Advert a{};
  std::memcpy(&a, wire.data(), sizeof a);
  return {be64toh(a.addr), be32toh(a.size), be32toh(a.rkey)};
}

}  // namespace rping
