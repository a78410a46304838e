// rdma_cm private data as cm::Connection frames it (not installed): the exposed slice's 24-byte
// wire form first, when there is one, then the caller's bytes. The peer's private data is
// untrusted input; tests/fuzz/cm_private_data.cpp fuzzes parse_cm_private_data.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

#include "verbs/memory_region.hpp"

namespace verbs::detail {

/// The private data to send: `expose` encoded (if any), then `user`. The caller checks the size
/// against rdma_cm's limit.
inline std::vector<std::byte> frame_cm_private_data(const std::optional<RemoteSlice>& expose,
                                                 std::span<const std::byte> user) {
  std::vector<std::byte> out;
  if (expose) {
    const RemoteSlice::Wire w = expose->encode();
    out.assign(w.begin(), w.end());
  }
  out.insert(out.end(), user.begin(), user.end());
  return out;
}

/// True when the peer could not tell `user` from an exposed slice: no slice is exposed, and the
/// bytes begin with a valid slice's wire form (the framing has no "slice present" flag, so that
/// private data without `expose` reaches any rdma_cm peer unchanged). Such data is refused.
inline bool cm_private_data_ambiguous(const std::optional<RemoteSlice>& expose, std::span<const std::byte> user) {
  std::error_code ec;
  return !expose && user.size() >= RemoteSlice::wire_size && RemoteSlice::decode(user.first(RemoteSlice::wire_size), ec);
}

/// The peer's private data, split: an exposed slice (when the first 24 bytes decode as one)
/// and the rest, which is all of it when they do not.
struct CmPeerPrivateData {
  std::optional<RemoteSlice> remote;
  std::vector<std::byte> rest;
};

inline CmPeerPrivateData parse_cm_private_data(std::vector<std::byte> data) {
  CmPeerPrivateData out;
  std::error_code ec;
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
