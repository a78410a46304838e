// What the rdma_cm device tests (cm_test.cpp, cm_datagram_test.cpp) share: the test address, a
// fixture that skips without a device there, and small helpers.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <verbs/cm.hpp>

#include "fixture.hpp"

namespace verbs::test {

/// $VERBS_TEST_ADDR, else 192.0.2.1 (the VM's).
inline std::string test_addr() {
  const char* a = std::getenv("VERBS_TEST_ADDR");
  return a != nullptr && *a != '\0' ? a : "192.0.2.1";
}

/// Skips unless librdmacm can use an RDMA device at the test address.
class CmFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      device.emplace(cm::device_for(test_addr()));
    } catch (const Error& e) {
      GTEST_SKIP() << "no RDMA device at " << test_addr() << " (set VERBS_TEST_ADDR): " << e.what();
    }
  }
  std::optional<Device> device;
};

/// The bytes of `s`.
inline std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

/// The ConnectError `f` threw, or empty (and a test failure) if it threw none.
template <typename F>
std::optional<cm::ConnectError> connect_error(F&& f) {
  return thrown_by<cm::ConnectError>(std::forward<F>(f));
}

/// Calls what it is given and keeps the longest time a call took: a step() of an event loop
/// must never wait for an event.
struct StepClock {
  std::chrono::steady_clock::duration longest{};
  template <typename F>
  auto operator()(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = f();
    longest = std::max(longest, std::chrono::steady_clock::now() - t0);
    return r;
  }
};

}  // namespace verbs::test
