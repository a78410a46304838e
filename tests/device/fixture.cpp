#include "fixture.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <limits.h>
#include <link.h>
#include <sys/utsname.h>

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

Completion expect_completion(const CompletionQueue& cq, std::chrono::milliseconds timeout) {
  Completion c;
  const auto got = cq.wait(std::span(&c, 1), timeout);
  EXPECT_EQ(got.size(), 1u) << "no completion within " << timeout.count() << " ms";
  return c;
}

std::vector<Completion> collect(const CompletionQueue& cq, std::size_t n, std::chrono::milliseconds timeout) {
  std::vector<Completion> out(n);
  std::size_t have = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (have < n) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    have += cq.wait(std::span(out).subspan(have), left).size();
  }
  EXPECT_EQ(have, n) << "only " << have << " of " << n << " completions within " << timeout.count() << " ms";
  out.resize(have);
  return out;
}

void expect_no_completion(const CompletionQueue& cq, std::chrono::milliseconds wait) {
  std::array<Completion, 8> buf;
  for (const Completion& c : cq.wait(buf, wait)) ADD_FAILURE() << "unexpected completion: " << describe(c);
}

std::string describe(const Completion& c) {
  std::ostringstream s;
  s << "wr_id=" << c.wr_id() << " status=" << static_cast<int>(c.status()) << " ("
    << ibv_wc_status_str(static_cast<ibv_wc_status>(c.status())) << ")";
  if (c.ok()) s << " opcode=" << to_string(c.opcode()) << " byte_len=" << c.byte_len();
  s << " qp_num=" << c.qp_num() << " vendor_err=" << c.vendor_err();
  return s.str();
}

::testing::AssertionResult completed(const Completion& c, WcOpcode opcode, std::uint64_t wr_id) {
  if (c.ok() && c.opcode() == opcode && c.wr_id() == wr_id) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected a successful " << to_string(opcode) << " with wr_id=" << wr_id
                                       << ", got " << describe(c);
}

::testing::AssertionResult posted(const PostResult& r) {
  if (r.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "post failed at request " << r.failed_index() << ": " << r.error() << " ("
                                       << r.error().message() << "), " << r.posted() << " posted";
}

::testing::AssertionResult rejected(const PostResult& r, Errc why, std::uint32_t index) {
  if (r.error() == make_error_code(why) && r.failed_index() == index && r.posted() == 0)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected rejection '" << make_error_code(why).message() << "' at request "
                                       << index << ", got " << (r.ok() ? "success" : r.error().message())
                                       << " at request " << r.failed_index() << " with " << r.posted() << " posted";
}

::testing::AssertionResult same_bytes(std::span<const std::byte> got, std::span<const std::byte> want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << ", expected " << want.size();
  const auto [g, w] = std::mismatch(got.begin(), got.end(), want.begin());
  if (g == got.end()) return ::testing::AssertionSuccess();
  const auto first = static_cast<std::size_t>(g - got.begin());
  std::size_t differ = 0;
  for (std::size_t i = first; i < got.size(); ++i) differ += got[i] != want[i] ? 1 : 0;
  return ::testing::AssertionFailure() << differ << " of " << got.size() << " bytes differ; the first at offset "
                                       << first << ": got " << static_cast<int>(*g) << ", expected "
                                       << static_cast<int>(*w);
}

::testing::AssertionResult all_bytes(std::span<const std::byte> got, std::byte value) {
  const auto it = std::find_if(got.begin(), got.end(), [value](std::byte b) { return b != value; });
  if (it == got.end()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "byte at offset " << (it - got.begin()) << " is " << static_cast<int>(*it)
                                       << ", expected every byte to be " << static_cast<int>(value);
}

QpPair::QpPair(const Device& dev, const ProtectionDomain& pd, QpOptions options, TransportOptions connect,
               CqOptions cq_options)
    : cq_a(dev, cq_options), cq_b(dev, cq_options), a(pd, cq_a, options), b(pd, cq_b, options) {
  if (options.type == QpType::ud) {
    a.activate();
    b.activate();
  } else {
    a.connect(b.endpoint(), connect);
    b.connect(a.endpoint(), connect);
  }
}

// Eight bytes a step, each word a hash (splitmix64) of the seed and the word's offset, so no
// two words of a buffer are alike and a piece that lands in the wrong place shows. The tests
// compile at -O0, where a byte at a time through span::operator[] took seconds over the rails
// tests' buffers of up to 32 MiB in the VM (Rails 10 s at -O2, 17 s at -O0, 55 s under ASan).
void fill_pattern(std::span<std::byte> bytes, unsigned seed) {
  std::byte* p = bytes.data();
  const std::size_t n = bytes.size();
  std::uint64_t x = (std::uint64_t{seed} << 32) + 1;
  for (std::size_t i = 0; i < n; i += 8) {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(p + i, &z, std::min<std::size_t>(8, n - i));
  }
}

bool is_rxe(const Device& dev) { return dev.name().rfind("rxe", 0) == 0; }

std::string platform(const Device& dev) {
  utsname u{};
  return dev.name() + " on Linux " + (::uname(&u) == 0 ? u.release : "?");
}

bool linux_at_least(int major, int minor) {
  utsname u{};
  int ma = 0, mi = 0;
  if (::uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &ma, &mi) != 2) return false;
  return ma > major || (ma == major && mi >= minor);
}

int rdma_core_version() {
  std::string path;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        if (info->dlpi_name == nullptr || std::strstr(info->dlpi_name, "/libibverbs.so") == nullptr) return 0;
        *static_cast<std::string*>(out) = info->dlpi_name;
        return 1;
      },
      &path);
  if (path.empty()) return 0;
  char real[PATH_MAX];
  if (::realpath(path.c_str(), real) == nullptr) return 0;
  int abi = 0, minor = 0, release = 0;
  const char* name = std::strrchr(real, '/');
  return std::sscanf(name, "/libibverbs.so.%d.%d.%d", &abi, &minor, &release) == 3 ? release : 0;
}

std::vector<std::byte> pattern(std::size_t size, unsigned seed) {
  std::vector<std::byte> v(size);
  fill_pattern(v, seed);
  return v;
}

}  // namespace verbs::test
