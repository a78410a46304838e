// verbs-perf's handshake on the wire (perf::), shared by link.cpp and tests/fuzz: the peer's
// bytes are untrusted input.
//   TCP: frames of a 4-byte little-endian length and a body; the client's parameter block
//        (encode_params, 40 bytes) first, then each side's QPs and region (encode_side).
//   rdma_cm: the parameter block is the client's private data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <verbs/memory_region.hpp>
#include <verbs/queue_pair.hpp>

#include "perf.hpp"

namespace perf {

/// The longest frame body accepted.
inline constexpr std::uint32_t kMaxFrame = 1u << 20;

/// A frame's body length from its 4-byte header. Throws Failure above kMaxFrame.
inline std::uint32_t frame_length(const unsigned char (&len)[4]) {
  const std::uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<std::uint32_t>(len[3]) << 24);
  if (n > kMaxFrame) throw Failure("the peer sent a malformed message");
  return n;
}

/// One side of the TCP exchange: its QPs' endpoints and its region.
struct Side {
  std::vector<verbs::Endpoint> endpoints;
  verbs::RemoteSlice region;
};

/// The QP count (u32 little-endian), each endpoint's wire form, the region's wire form.
inline std::vector<std::byte> encode_side(std::span<const verbs::Endpoint> endpoints, const verbs::RemoteSlice& region) {
  std::vector<std::byte> out;
  const auto n = static_cast<std::uint32_t>(endpoints.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::byte>(n >> (8 * i)));
  for (const verbs::Endpoint& e : endpoints) {
    const verbs::Endpoint::Wire w = e.encode();
    out.insert(out.end(), w.begin(), w.end());
  }
  const verbs::RemoteSlice::Wire r = region.encode();
  out.insert(out.end(), r.begin(), r.end());
  return out;
}

/// Parses encode_side's output from a peer that must have `qps` QPs. Throws Failure, or
/// verbs::Error for an endpoint or region that does not decode.
inline Side decode_side(std::span<const std::byte> in, std::size_t qps) {
  if (in.size() < 4) throw Failure("the peer sent a malformed exchange");
  const std::uint32_t n = std::to_integer<std::uint32_t>(in[0]) | std::to_integer<std::uint32_t>(in[1]) << 8 |
                          std::to_integer<std::uint32_t>(in[2]) << 16 | std::to_integer<std::uint32_t>(in[3]) << 24;
  if (n != qps || in.size() != 4 + n * verbs::Endpoint::wire_size + verbs::RemoteSlice::wire_size)
    throw Failure("the peer sent a malformed exchange");
  Side s;
  for (std::uint32_t q = 0; q < n; ++q)
    s.endpoints.push_back(
        verbs::Endpoint::decode(in.subspan(4 + q * verbs::Endpoint::wire_size, verbs::Endpoint::wire_size)));
  s.region = verbs::RemoteSlice::decode(in.subspan(4 + n * verbs::Endpoint::wire_size));
  return s;
}

/// The client's parameters from its rdma_cm private data (as Connection::peer_private_data()
/// gives it) into `c`, as decode_params. Throws Failure, also when there are fewer than
/// kParamsWire bytes (the connection strips a leading exposed slice: 56 - 24 = 32 are left).
inline void decode_cm_params(std::span<const std::byte> peer_private_data, Config& c) {
  decode_params(peer_private_data, c);  // it checks the size, and reads only kParamsWire bytes
}

}  // namespace perf
