#include "fixture.hpp"

#include <cstdlib>

namespace verbs::test {

std::optional<Device> open_test_device(std::string& why) {
  try {
    if (const char* name = std::getenv("VERBS_TEST_DEVICE"); name != nullptr && *name != '\0')
      return Device::open(name);
    return Device::open_first();
  } catch (const Error& e) {
    why = e.what();
    return std::nullopt;
  }
}

void DeviceTest::SetUp() {
  std::string why;
  dev = open_test_device(why);
  if (!dev) GTEST_SKIP() << "no RDMA device: " << why;
  pd.emplace(*dev);
}

Completion expect_completion(CompletionQueue& cq, std::chrono::milliseconds timeout) {
  Completion c;
  const auto got = cq.wait(std::span(&c, 1), timeout);
  EXPECT_EQ(got.size(), 1u) << "no completion within " << timeout.count() << " ms";
  return c;
}

std::vector<Completion> collect(CompletionQueue& cq, std::size_t n, std::chrono::milliseconds timeout) {
  std::vector<Completion> out(n);
  std::size_t have = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (have < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    have += cq.wait(std::span(out).subspan(have), left).size();
  }
  EXPECT_EQ(have, n) << "only " << have << " of " << n << " completions within " << timeout.count() << " ms";
  out.resize(have);
  return out;
}

QpPair::QpPair(const Device& dev, const ProtectionDomain& pd, QpOptions options, ConnectOptions connect)
    : cq_a(dev, {.depth = 1024}), cq_b(dev, {.depth = 1024}), a(pd, cq_a, options), b(pd, cq_b, options) {
  if (options.type == QpType::ud) {
    a.activate();
    b.activate();
  } else {
    a.connect(b.endpoint(), connect);
    b.connect(a.endpoint(), connect);
  }
}

void fill_pattern(std::span<std::byte> bytes, unsigned seed) {
  unsigned x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    x = x * 1103515245u + 12345u;
    bytes[i] = static_cast<std::byte>((x >> 16) ^ i);
  }
}

}  // namespace verbs::test
