// Shared setup for tests that need an RDMA device (a NIC, or SoftRoCE via scripts/rxe-vm).
// Without a device every such test skips, saying why.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <verbs/verbs.hpp>

#include "support/expect.hpp"

namespace verbs::test {

using namespace std::chrono_literals;

/// Every right a test region or queue pair may need; tests that check a missing right build
/// their own set.
inline constexpr AccessFlags all_access =
    Access::local_write | Access::remote_write | Access::remote_read | Access::remote_atomic;

/// Opens $VERBS_TEST_DEVICE, or the first device. Empty (with `why` set) when there is none.
std::optional<Device> open_test_device(std::string& why);

/// Base fixture: opens the device and a protection domain, or skips the test.
class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override;

  std::optional<Device> dev;
  std::optional<ProtectionDomain> pd;
};

/// Fills `bytes` with a pattern derived from `seed` (never all equal bytes).
void fill_pattern(std::span<std::byte> bytes, unsigned seed);

/// DeviceTest plus two regions of `Size` bytes with every access right: `src` holds a pattern,
/// `dst` is zero.
template <std::size_t Size>
class RegionsTest : public DeviceTest {
 protected:
  static constexpr std::size_t kRegion = Size;
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    src.emplace(MemoryRegion::allocate(*pd, Size, all_access));
    dst.emplace(MemoryRegion::allocate(*pd, Size, all_access));
    fill_pattern(src->bytes(), 1);
  }
  std::optional<MemoryRegion> src, dst;
};

/// Waits for exactly one completion on `cq`, failing the test (not hanging) after `timeout`.
Completion expect_completion(const CompletionQueue& cq, std::chrono::milliseconds timeout = 10s);
/// Waits until `n` completions have arrived on `cq` (or the timeout passes) and returns them.
std::vector<Completion> collect(const CompletionQueue& cq, std::size_t n, std::chrono::milliseconds timeout = 10s);
/// Fails the test if any completion arrives on `cq` within `wait` (evidence that nothing was posted).
void expect_no_completion(const CompletionQueue& cq, std::chrono::milliseconds wait = 300ms);

/// A completion in one line, for failure messages.
std::string describe(const Completion& c);
/// Success when `c` succeeded with this opcode and wr_id.
::testing::AssertionResult completed(const Completion& c, WcOpcode opcode, std::uint64_t wr_id);
/// Success when the post went through; otherwise says why and at which request.
::testing::AssertionResult posted(const PostResult& r);
/// Success when the post was refused by the library's own check `why` at request `index`, with nothing posted.
::testing::AssertionResult rejected(const PostResult& r, Errc why, std::uint32_t index = 0);
/// Byte-for-byte equality that names the first difference and how many bytes differ.
::testing::AssertionResult same_bytes(std::span<const std::byte> got, std::span<const std::byte> want);
/// Success when every byte of `got` is `value`.
::testing::AssertionResult all_bytes(std::span<const std::byte> got, std::byte value);

/// Runs `f` and returns the verbs::Error it threw, or empty (and a test failure) if it threw none.
template <typename F>
std::optional<Error> thrown_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a verbs::Error, but nothing was thrown";
  return std::nullopt;
}
using verbs::test::contains;

/// Two queue pairs of the same type on one device, connected to each other, each with its own
/// CQ. The defaults fail fast: ack_timeout 12 (17 ms), retry counts 3 (rxe treats 7 as forever).
struct QpPair {
  QpPair(const Device& dev, const ProtectionDomain& pd, QpOptions options = {}, TransportOptions connect = fast(),
         CqOptions cq_options = {.depth = 1024});
  static TransportOptions fast() { return TransportOptions{.ack_timeout = 12, .retry_count = 3, .rnr_retry_count = 3}; }

  CompletionQueue cq_a, cq_b;
  QueuePair a, b;
};

/// The pattern fill_pattern writes, as a vector.
std::vector<std::byte> pattern(std::size_t size, unsigned seed);

/// SoftRoCE: where a test asserts what rxe does instead of what a NIC may do.
bool is_rxe(const Device& dev);
/// "rxe0 on Linux 6.1.0-57-amd64": for the message of an assertion about one platform's
/// behaviour, so that a kernel that changes it says which one did.
std::string platform(const Device& dev);
/// The running kernel is Linux MAJOR.MINOR or newer: for what one kernel's rxe does and an
/// older one's does not (false when uname's release does not parse). Only 6.1, 6.12 and 7.2 were
/// measured: a threshold between two of them is a guess, and a kernel in between that behaves
/// otherwise fails the test, which names it (platform()).
bool linux_at_least(int major, int minor);
/// The release of rdma-core whose libibverbs this process loaded (44 for libibverbs.so.1.14.44.0),
/// 0 when it cannot tell.
int rdma_core_version();

}  // namespace verbs::test
