// What a fuzz target checks: a property that fails aborts, so libFuzzer keeps the input as a
// crash (not only memory errors and undefined behaviour, which the sanitizers catch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#define FUZZ_CHECK(cond)                                                                      \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond);       \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

namespace fuzz {

/// The fuzzer's input as bytes.
inline std::span<const std::byte> input(const unsigned char* data, std::size_t size) {
  return std::as_bytes(std::span(data, size));
}

/// Little-endian bytes [at, at + n) of `in` as a number, zero beyond its end.
inline std::uint64_t take(std::span<const std::byte> in, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    if (at + static_cast<std::size_t>(i) < in.size())
      v |= static_cast<std::uint64_t>(in[at + static_cast<std::size_t>(i)]) << (8 * i);
  return v;
}

}  // namespace fuzz
