// Shared setup for tests that need an RDMA device (a NIC, or SoftRoCE via scripts/rxe-vm).
// Without a device every such test skips, saying why.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <verbs/verbs.hpp>

namespace verbs::test {

using namespace std::chrono_literals;

/// Opens $VERBS_TEST_DEVICE, or the first device. Empty (with `why` set) when there is none.
std::optional<Device> open_test_device(std::string& why);

/// Base fixture: opens the device and a protection domain, or skips the test.
class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override;

  std::optional<Device> dev;
  std::optional<ProtectionDomain> pd;
};

/// Waits for exactly one completion on `cq`, failing the test (not hanging) after `timeout`.
Completion expect_completion(CompletionQueue& cq, std::chrono::milliseconds timeout = 10s);
/// Waits until `n` completions have arrived on `cq` (or the timeout passes) and returns them.
std::vector<Completion> collect(CompletionQueue& cq, std::size_t n, std::chrono::milliseconds timeout = 10s);

/// Two queue pairs of the same type on one device, connected to each other, each with its own
/// CQ. The defaults fail fast: timeout 12 (17 ms), retry 3 (rxe treats 7 as forever).
struct QpPair {
  QpPair(const Device& dev, const ProtectionDomain& pd, QpOptions options = {}, ConnectOptions connect = fast());
  static ConnectOptions fast() { return ConnectOptions{.timeout = 12, .retry_cnt = 3, .rnr_retry = 3}; }

  CompletionQueue cq_a, cq_b;
  QueuePair a, b;
};

/// Fills `bytes` with a pattern derived from `seed` (never all equal bytes).
void fill_pattern(std::span<std::byte> bytes, unsigned seed);

}  // namespace verbs::test
