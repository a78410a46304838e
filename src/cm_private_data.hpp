// rdma_cm private data as cm::Connection frames it (not installed): a 4-byte path MTU tag when
// this side takes a smaller MTU than the peer would assume, then the exposed slice's 24-byte wire
// form, when there is one, then the caller's bytes. The peer's private data is untrusted input;
// tests/fuzz/cm_private_data.cpp fuzzes parse_cm_private_data.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

#include "verbs/device.hpp"
#include "verbs/memory_region.hpp"

namespace verbs::detail {

/// The path MTU tag: magic "VM", version 1, the ibv_mtu value (1..5). Sent only by a side whose
/// path MTU is below what rdma_cm gives the peer (the client's active MTU, the route's), so that
/// private data reaches a non-verbs peer unchanged whenever both sides agree.
inline constexpr std::size_t mtu_tag_size = 4;

inline std::array<std::byte, mtu_tag_size> encode_mtu_tag(Mtu m) noexcept {
  return {std::byte{'V'}, std::byte{'M'}, std::byte{1}, static_cast<std::byte>(m)};
}

inline std::optional<Mtu> decode_mtu_tag(std::span<const std::byte> d) noexcept {
  if (d.size() < mtu_tag_size || d[0] != std::byte{'V'} || d[1] != std::byte{'M'} || d[2] != std::byte{1}) return {};
  const auto m = static_cast<std::uint8_t>(d[3]);
  if (m < static_cast<std::uint8_t>(Mtu::mtu256) || m > static_cast<std::uint8_t>(Mtu::mtu4096)) return {};
  return static_cast<Mtu>(m);
}

/// The private data to send: `expose` encoded (if any), then `user`. The caller checks the size
/// against rdma_cm's limit.
inline std::vector<std::byte> frame_cm_private_data(const std::optional<RemoteSlice>& expose,
                                                 std::span<const std::byte> user,
                                                 std::optional<Mtu> mtu_tag = std::nullopt) {
  std::vector<std::byte> out;
  if (mtu_tag) {
    const auto t = encode_mtu_tag(*mtu_tag);
    out.assign(t.begin(), t.end());
  }
  if (expose) {
    const RemoteSlice::Wire w = expose->encode();
    out.insert(out.end(), w.begin(), w.end());
  }
  out.insert(out.end(), user.begin(), user.end());
  return out;
}

/// True when the peer could not tell `user` from an exposed slice or a path MTU tag: no slice
/// is exposed, and the bytes begin with a valid slice's wire form, or with a valid tag (the
/// framing has no "present" flags, so that private data without `expose` reaches any rdma_cm
/// peer unchanged). Such data is refused.
/// The peer sees the field zero-padded to its full size (rdma_cm's 56, 196 or 148 bytes), so
/// bytes shorter than a slice's wire form may still read as one there ("VR", 1 and zeros).
inline bool cm_private_data_ambiguous(const std::optional<RemoteSlice>& expose, std::span<const std::byte> user) {
  std::error_code ec;
  if (expose) return false;
  if (decode_mtu_tag(user)) return true;
  RemoteSlice::Wire padded{};
  std::copy_n(user.begin(), std::min(user.size(), padded.size()), padded.begin());
  return RemoteSlice::decode(padded, ec).has_value();
}

/// The peer's private data, split: a path MTU tag (when the first 4 bytes decode as one), an
/// exposed slice (when the next 24 bytes decode as one) and the rest, which is all of it when
/// neither does.
struct CmPeerPrivateData {
  std::optional<Mtu> path_mtu;  ///< the largest the peer takes, when it said so (a tag)
  std::optional<RemoteSlice> remote;
  std::vector<std::byte> rest;
};

inline CmPeerPrivateData parse_cm_private_data(std::vector<std::byte> data) {
  CmPeerPrivateData out;
  std::error_code ec;
  if ((out.path_mtu = decode_mtu_tag(data))) data.erase(data.begin(), data.begin() + mtu_tag_size);
  if (data.size() >= RemoteSlice::wire_size) {
    if (auto r = RemoteSlice::decode(std::span(data).first(RemoteSlice::wire_size), ec)) {
      out.remote = r;
      data.erase(data.begin(), data.begin() + RemoteSlice::wire_size);
    }
  }
  out.rest = std::move(data);
  return out;
}

}  // namespace verbs::detail
