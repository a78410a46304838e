// verbs::RemoteSlice::decode on a peer's bytes: it agrees with its throwing form, anything it
// accepts re-encodes to the same bytes and does not wrap around, and decode(encode(x)) == x.
#include <algorithm>
#include <limits>

#include <verbs/memory_region.hpp>

#include "check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const auto in = fuzz::input(data, size);
  std::error_code ec;
  const std::optional<verbs::RemoteSlice> r = verbs::RemoteSlice::decode(in, ec);
  FUZZ_CHECK(r.has_value() == !ec);
  FUZZ_CHECK(r || ec == verbs::Errc::bad_encoding);
  bool threw = false;
  try {
    FUZZ_CHECK(verbs::RemoteSlice::decode(in) == r);
  } catch (const verbs::Error& err) {
    threw = true;
    FUZZ_CHECK(err.code() == verbs::Errc::bad_encoding);
  }
  FUZZ_CHECK(threw == !r);
  if (r) {
    const verbs::RemoteSlice::Wire w = r->encode();
    FUZZ_CHECK(std::equal(w.begin(), w.end(), in.begin(), in.end()));
    FUZZ_CHECK(r->length <= std::numeric_limits<std::uint64_t>::max() - r->addr);
    // Slicing what a peer sent stays inside it.
    const std::uint64_t off = r->length == std::numeric_limits<std::uint64_t>::max() ? 0 : r->addr % (r->length + 1);
    const auto s = r->try_slice(off, r->length - off);
    FUZZ_CHECK(s && s->addr == r->addr + off && s->length == r->length - off && s->rkey == r->rkey);
    if (r->length - off < std::numeric_limits<std::uint64_t>::max()) FUZZ_CHECK(!r->try_slice(off, r->length - off + 1));
  }

  verbs::RemoteSlice x{fuzz::take(in, 0, 8), fuzz::take(in, 8, 8), static_cast<std::uint32_t>(fuzz::take(in, 16, 4))};
  x.length = std::min(x.length, std::numeric_limits<std::uint64_t>::max() - x.addr);
  FUZZ_CHECK(verbs::RemoteSlice::decode(x.encode(), ec) == x);
  return 0;
}
