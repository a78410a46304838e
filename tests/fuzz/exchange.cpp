// A RemoteSlice exchanged in a message (what cm::Connection::exchange() did, and what a program
// that hands slices over by send does): the peer sends one wire form into a zeroed 24-byte
// receive slot (a shorter send leaves zeros; a longer one fails the receive), decoded with the
// throwing form. It returns a slice that re-encodes to the
// slot, or throws verbs::Error(bad_encoding), never anything else.
#include <algorithm>
#include <array>

#include <verbs/memory_region.hpp>

#include "check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  constexpr std::size_t n = verbs::RemoteSlice::wire_size;
  if (size > n) return -1;  // the receive would fail with a length error: nothing to decode
  std::array<std::byte, 2 * n> region{};  // [0, n) what we sent, [n, 2n) the peer's message
  std::copy_n(fuzz::input(data, size).begin(), size, region.begin() + n);
  const std::span<const std::byte> slot = std::span(region).subspan(n, n);
  try {
    const verbs::RemoteSlice peer = verbs::RemoteSlice::decode(slot);
    const verbs::RemoteSlice::Wire w = peer.encode();
    FUZZ_CHECK(std::equal(w.begin(), w.end(), slot.begin(), slot.end()));
  } catch (const verbs::Error& e) {
    FUZZ_CHECK(e.code() == verbs::Errc::bad_encoding);
    FUZZ_CHECK(std::string_view(e.what()).find("RemoteSlice::decode: ") != std::string_view::npos);
  }
  return 0;
}
