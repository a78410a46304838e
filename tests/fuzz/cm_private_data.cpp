// rdma_cm private data as cm::Connection parses the peer's (src/cm_private_data.hpp): an
// exposed slice is taken only when the first 24 bytes decode as one and then re-encode to
// them; nothing is lost or invented; and the framing round-trips what a peer sends.
#include <algorithm>

#include "cm_private_data.hpp"
#include "check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const auto in = fuzz::input(data, size);
  constexpr std::size_t n = verbs::RemoteSlice::wire_size;

  // The peer's bytes, as rdma_cm delivers them.
  const verbs::detail::CmPeerPrivateData got =
      verbs::detail::parse_cm_private_data(std::vector<std::byte>(in.begin(), in.end()));
  if (got.remote) {
    FUZZ_CHECK(size >= n);
    const verbs::RemoteSlice::Wire w = got.remote->encode();
    FUZZ_CHECK(std::equal(w.begin(), w.end(), in.begin(), in.begin() + n));
    FUZZ_CHECK(std::equal(got.rest.begin(), got.rest.end(), in.begin() + n, in.end()));
  } else {
    std::error_code ec;
    FUZZ_CHECK(size < n || !verbs::RemoteSlice::decode(in.first(n), ec));
    FUZZ_CHECK(std::equal(got.rest.begin(), got.rest.end(), in.begin(), in.end()));
  }

  // What a peer frames arrives as it was meant: with the first byte choosing an exposed slice
  // (from the next 24 bytes) and the rest as the user's bytes.
  if (size == 0) return 0;
  const bool expose = (data[0] & 1) != 0;
  std::optional<verbs::RemoteSlice> slice;
  std::span<const std::byte> user = in.subspan(1);
  if (expose) {
    verbs::RemoteSlice x{fuzz::take(in, 1, 8), fuzz::take(in, 9, 8) & 0xffffffffffffu,
                         static_cast<std::uint32_t>(fuzz::take(in, 17, 4))};
    x.addr &= 0xffffffffffffu;  // a user-space address: addr + length cannot wrap
    slice = x;
    user = in.subspan(std::min(size, std::size_t{21}));
  }
  const verbs::detail::CmPeerPrivateData back =
      verbs::detail::parse_cm_private_data(verbs::detail::frame_cm_private_data(slice, user));
  // Without an exposed slice, user bytes that begin with a valid slice's wire form would be read
  // as one (the framing has no "slice present" flag): cm refuses to send them.
  std::error_code ec;
  const bool ambiguous = !slice && user.size() >= n && verbs::RemoteSlice::decode(user.first(n), ec);
  FUZZ_CHECK(ambiguous == verbs::detail::cm_private_data_ambiguous(slice, user));
  if (!ambiguous) {
    FUZZ_CHECK(back.remote == slice);
    FUZZ_CHECK(std::equal(back.rest.begin(), back.rest.end(), user.begin(), user.end()));
  }
  return 0;
}
