// rping's 16-byte advertisement (examples/rping_wire.hpp): every 16 bytes decode, decoding
// then encoding gives the same bytes, and encoding then decoding the same buffer.
#include <algorithm>

#include "check.hpp"
#include "rping_wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  if (size != sizeof(rping::Advert)) return -1;
  const auto in = fuzz::input(data, size).first<sizeof(rping::Advert)>();
  const verbs::RemoteSlice r = rping::decode_advert(in);
  FUZZ_CHECK(r.length <= UINT32_MAX);
  const auto again = rping::encode_advert(r.addr, r.rkey, static_cast<std::uint32_t>(r.length));
  FUZZ_CHECK(std::equal(again.begin(), again.end(), in.begin(), in.end()));

  const auto addr = fuzz::take(in, 0, 8);
  const auto rkey = static_cast<std::uint32_t>(fuzz::take(in, 8, 4));
  const auto len = static_cast<std::uint32_t>(fuzz::take(in, 12, 4));
  FUZZ_CHECK(rping::decode_advert(rping::encode_advert(addr, rkey, len)) == (verbs::RemoteSlice{addr, len, rkey}));
  return 0;
}
