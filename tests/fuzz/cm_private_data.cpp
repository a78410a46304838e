// rdma_cm private data as cm::Connection parses the peer's (src/cm_private_data.hpp): a path MTU
// tag is taken only when the first 4 bytes are one, and an exposed slice only when the next 24
// bytes decode as one and then re-encode to them; nothing is lost or invented; and the framing
// round-trips what a peer sends.
#include <algorithm>

#include "cm_private_data.hpp"
#include "check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const auto in = fuzz::input(data, size);
  constexpr std::size_t n = verbs::RemoteSlice::wire_size;

  // The peer's bytes, as rdma_cm delivers them.
  const verbs::detail::CmPeerPrivateData got =
      verbs::detail::parse_cm_private_data(std::vector<std::byte>(in.begin(), in.end()));
  std::span<const std::byte> body = in;
  if (got.path_mtu) {
    FUZZ_CHECK(size >= verbs::detail::mtu_tag_size);
    const auto t = verbs::detail::encode_mtu_tag(*got.path_mtu);
    FUZZ_CHECK(std::equal(t.begin(), t.end(), in.begin()));
    const auto m = static_cast<unsigned>(*got.path_mtu);
    FUZZ_CHECK(m >= 1 && m <= 5);
    body = in.subspan(verbs::detail::mtu_tag_size);
  } else {
    FUZZ_CHECK(!verbs::detail::decode_mtu_tag(in));
  }
  if (got.remote) {
    FUZZ_CHECK(body.size() >= n);
    const verbs::RemoteSlice::Wire w = got.remote->encode();
    FUZZ_CHECK(std::equal(w.begin(), w.end(), body.begin(), body.begin() + n));
    FUZZ_CHECK(std::equal(got.rest.begin(), got.rest.end(), body.begin() + n, body.end()));
  } else {
    std::error_code ec;
    FUZZ_CHECK(body.size() < n || !verbs::RemoteSlice::decode(body.first(n), ec));
    FUZZ_CHECK(std::equal(got.rest.begin(), got.rest.end(), body.begin(), body.end()));
  }

  // What a peer frames arrives as it was meant: with the first byte choosing an exposed slice
  // (from the next 24 bytes) and a path MTU tag (its value from bits 2..4), and the rest as the
  // user's bytes.
  if (size == 0) return 0;
  const bool expose = (data[0] & 1) != 0;
  std::optional<verbs::Mtu> tag;
  if ((data[0] & 2) != 0) tag = static_cast<verbs::Mtu>(1 + ((data[0] >> 2) & 7) % 5);
  std::optional<verbs::RemoteSlice> slice;
  std::span<const std::byte> user = in.subspan(1);
  if (expose) {
    verbs::RemoteSlice x{fuzz::take(in, 1, 8), fuzz::take(in, 9, 8) & 0xffffffffffffu,
                         static_cast<std::uint32_t>(fuzz::take(in, 17, 4))};
    x.addr &= 0xffffffffffffu;  // a user-space address: addr + length cannot wrap
    slice = x;
    user = in.subspan(std::min(size, std::size_t{21}));
  }
  // The peer sees the field zero-padded to its size (56 bytes for a connect).
  const auto padded = [](std::vector<std::byte> v) {
    if (v.size() < 56) v.resize(56);
    return v;
  };
  const verbs::detail::CmPeerPrivateData back =
      verbs::detail::parse_cm_private_data(padded(verbs::detail::frame_cm_private_data(slice, user, tag)));
  const bool ambiguous = verbs::detail::cm_private_data_ambiguous(slice, user);
  if (!ambiguous) {
    // What cm sends arrives as it was meant, padding and all.
    FUZZ_CHECK(back.path_mtu == tag);
    FUZZ_CHECK(back.remote == slice);
    FUZZ_CHECK(back.rest.size() >= user.size());
    FUZZ_CHECK(std::equal(user.begin(), user.end(), back.rest.begin()));
  } else {
    // Refused only where a peer would misread the bytes sent alone: as a tag or a slice.
    FUZZ_CHECK(!slice);
    const verbs::detail::CmPeerPrivateData alone =
        verbs::detail::parse_cm_private_data(padded(verbs::detail::frame_cm_private_data(std::nullopt, user)));
    FUZZ_CHECK(alone.path_mtu.has_value() || alone.remote.has_value());
  }
  return 0;
}
