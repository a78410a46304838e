// verbs::Endpoint::decode on a peer's bytes: it agrees with its throwing form, anything it
// accepts re-encodes to the same bytes, and decode(encode(x)) == x for any valid endpoint.
#include <algorithm>

#include <verbs/queue_pair.hpp>

#include "check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const auto in = fuzz::input(data, size);
  std::error_code ec;
  const std::optional<verbs::Endpoint> e = verbs::Endpoint::decode(in, ec);
  FUZZ_CHECK(e.has_value() == !ec);
  FUZZ_CHECK(e || ec == verbs::Errc::bad_encoding);
  bool threw = false;
  try {
    FUZZ_CHECK(verbs::Endpoint::decode(in) == e);
  } catch (const verbs::Error& err) {
    threw = true;
    FUZZ_CHECK(err.code() == verbs::Errc::bad_encoding);
  }
  FUZZ_CHECK(threw == !e);
  if (e) {
    const verbs::Endpoint::Wire w = e->encode();
    FUZZ_CHECK(std::equal(w.begin(), w.end(), in.begin(), in.end()));
  }

  // The input's bytes as the fields of an endpoint (24-bit qp_num and psn, a valid MTU).
  verbs::Endpoint x;
  x.qp_num = static_cast<std::uint32_t>(fuzz::take(in, 0, 3));
  x.psn = static_cast<std::uint32_t>(fuzz::take(in, 3, 3));
  x.qkey = static_cast<std::uint32_t>(fuzz::take(in, 6, 4));
  x.lid = static_cast<std::uint16_t>(fuzz::take(in, 10, 2));
  x.mtu = static_cast<verbs::Mtu>(1 + fuzz::take(in, 12, 1) % 5);
  for (std::size_t i = 0; i < 16; ++i) x.gid.raw[i] = static_cast<std::uint8_t>(fuzz::take(in, 13 + i, 1));
  const verbs::Endpoint::Wire w = x.encode();
  FUZZ_CHECK(verbs::Endpoint::decode(w, ec) == x);
  return 0;
}
