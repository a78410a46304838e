// The device-free parts of memory_region.hpp and queue_pair.hpp: RemoteSlice (wire form and
// bounds), Buffer, LocalSlice's layout, and Endpoint's wire form.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <verbs/memory_region.hpp>
#include <verbs/queue_pair.hpp>

#include "support/expect.hpp"

namespace {

using verbs::Buffer;
using verbs::Endpoint;
using verbs::Errc;
using verbs::LocalSlice;
using verbs::RemoteSlice;

constexpr std::uint64_t kMax64 = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint32_t kMax32 = std::numeric_limits<std::uint32_t>::max();

using verbs::test::contains;
using verbs::test::thrown_by;

constexpr std::byte b(unsigned v) { return static_cast<std::byte>(v); }

// ---- RemoteSlice wire form ----

static_assert(std::is_aggregate_v<RemoteSlice>);
static_assert(RemoteSlice::wire_size == 24);

// A temporary container would be freed at the end of the statement while the device keeps
// its address: only lvalues and borrowed ranges (views of someone else's memory) register.
// An IOVA is named (Iova{...}): a bare integer after the access is no IOVA.
static_assert(std::is_constructible_v<verbs::MemoryRegion, const verbs::ProtectionDomain&, std::span<std::byte>,
                                      verbs::AccessFlags, verbs::Iova>);
static_assert(!std::is_constructible_v<verbs::MemoryRegion, const verbs::ProtectionDomain&, std::span<std::byte>,
                                       verbs::AccessFlags, std::uint64_t>);
static_assert(!std::is_constructible_v<verbs::MemoryRegion, const verbs::ProtectionDomain&, std::vector<int>>);
static_assert(!std::is_constructible_v<verbs::MemoryRegion, const verbs::ProtectionDomain&, std::vector<int>&&>);
static_assert(!std::is_constructible_v<verbs::MemoryRegion, const verbs::ProtectionDomain&, std::array<int, 4>>);
static_assert(std::is_constructible_v<verbs::MemoryRegion, const verbs::ProtectionDomain&, std::vector<int>&>);
static_assert(std::is_constructible_v<verbs::MemoryRegion, const verbs::ProtectionDomain&, std::array<int, 4>&>);
static_assert(std::is_constructible_v<verbs::MemoryRegion, const verbs::ProtectionDomain&, std::span<int>>);
static_assert(!std::is_constructible_v<verbs::MemoryRegion, const verbs::ProtectionDomain&, const std::vector<int>&>,
              "read-only memory cannot be registered for the device to write");

TEST(RemoteSlice, EncodeDecodeRoundTrips) {
  const RemoteSlice cases[] = {
      {},
      {.addr = 0x1000, .length = 4096, .rkey = 0x1234},
      {.addr = 0x0123456789abcdef, .length = 0x10, .rkey = 0xfedcba98},
      {.addr = 0, .length = kMax64, .rkey = kMax32},
      {.addr = kMax64, .length = 0, .rkey = kMax32},
      {.addr = kMax64 - 100, .length = 100, .rkey = 1},
  };
  for (const RemoteSlice& r : cases) {
    const RemoteSlice::Wire w = r.encode();
    EXPECT_EQ(RemoteSlice::decode(w), r) << "addr " << r.addr << " length " << r.length << " rkey " << r.rkey;
  }
}

TEST(RemoteSlice, EncodingIsLittleEndianWithMagicAndVersion) {
  const RemoteSlice r{.addr = 0x0807060504030201, .length = 0x1817161514131211, .rkey = 0xa4a3a2a1};
  // clang-format off
  const RemoteSlice::Wire expected = {
      b('V'),  b('R'),  b(1),    b(0),    b(0xa1), b(0xa2), b(0xa3), b(0xa4),  // magic, version, reserved, rkey
      b(0x01), b(0x02), b(0x03), b(0x04), b(0x05), b(0x06), b(0x07), b(0x08),  // addr
      b(0x11), b(0x12), b(0x13), b(0x14), b(0x15), b(0x16), b(0x17), b(0x18),  // length
  };
  // clang-format on
  EXPECT_EQ(r.encode(), expected);
}

// Decodes `wire`, which must be rejected, and returns the message of the Error.
std::string rejection_of_remote(std::span<const std::byte> wire) {
  const auto e = thrown_by([&] { (void)RemoteSlice::decode(wire); });
  if (!e) {
    ADD_FAILURE() << "RemoteSlice::decode accepted malformed input";
    return {};
  }
  EXPECT_EQ(e->code(), Errc::bad_encoding);
  return e->what();
}

const RemoteSlice kSample{.addr = 0x10000, .length = 256, .rkey = 0x42};

TEST(RemoteSlice, DecodeRejectsShorterInput) {
  const RemoteSlice::Wire w = kSample.encode();
  EXPECT_TRUE(contains(rejection_of_remote(std::span(w).first(23)), "size 23, expected 24"));
  EXPECT_TRUE(contains(rejection_of_remote({}), "size 0, expected 24"));
}

TEST(RemoteSlice, DecodeRejectsLongerInput) {
  const RemoteSlice::Wire w = kSample.encode();
  std::vector<std::byte> longer(w.begin(), w.end());
  longer.push_back(std::byte{0});
  EXPECT_TRUE(contains(rejection_of_remote(longer), "size 25, expected 24"));
}

TEST(RemoteSlice, DecodeRejectsWrongMagic) {
  for (const std::size_t at : {0u, 1u}) {
    RemoteSlice::Wire w = kSample.encode();
    w[at] = b('X');
    EXPECT_TRUE(contains(rejection_of_remote(w), "bad magic")) << "byte " << at;
  }
  RemoteSlice::Wire endpoint_magic = kSample.encode();
  endpoint_magic[1] = b('E');
  EXPECT_TRUE(contains(rejection_of_remote(endpoint_magic), "bad magic")) << "an Endpoint is not a RemoteSlice";
}

TEST(RemoteSlice, DecodeRejectsWrongVersion) {
  for (const unsigned v : {0u, 2u, 255u}) {
    RemoteSlice::Wire w = kSample.encode();
    w[2] = b(v);
    EXPECT_TRUE(contains(rejection_of_remote(w), "unsupported version " + std::to_string(v)));
  }
}

TEST(RemoteSlice, DecodeRejectsNonZeroReservedByte) {
  RemoteSlice::Wire w = kSample.encode();
  w[3] = b(1);
  EXPECT_TRUE(contains(rejection_of_remote(w), "reserved byte not zero"));
}

TEST(RemoteSlice, DecodeRejectsAddressPlusLengthWrapping) {
  EXPECT_TRUE(contains(rejection_of_remote(RemoteSlice{.addr = kMax64 - 10, .length = 11}.encode()), "wraps"));
  EXPECT_TRUE(contains(rejection_of_remote(RemoteSlice{.addr = 1, .length = kMax64}.encode()), "wraps"));
  EXPECT_TRUE(contains(rejection_of_remote(RemoteSlice{.addr = kMax64, .length = kMax64}.encode()), "wraps"));
  // The largest that does not wrap.
  const RemoteSlice last{.addr = kMax64 - 10, .length = 10, .rkey = 3};
  EXPECT_EQ(RemoteSlice::decode(last.encode()), last);
}

TEST(RemoteSlice, DecodeErrorCodeFormReportsBadEncoding) {
  RemoteSlice::Wire w = kSample.encode();
  w[0] = b('X');
  std::error_code ec;
  EXPECT_EQ(RemoteSlice::decode(w, ec), std::nullopt);
  EXPECT_EQ(ec, Errc::bad_encoding);

  ec = std::make_error_code(std::errc::io_error);
  EXPECT_EQ(RemoteSlice::decode(std::span(w).first(10), ec), std::nullopt);
  EXPECT_EQ(ec, Errc::bad_encoding);

  ec = std::make_error_code(std::errc::io_error);
  EXPECT_EQ(RemoteSlice::decode(RemoteSlice{.addr = kMax64, .length = 1}.encode(), ec), std::nullopt);
  EXPECT_EQ(ec, Errc::bad_encoding);
}

TEST(RemoteSlice, DecodeErrorCodeFormClearsCodeOnSuccess) {
  std::error_code ec = std::make_error_code(std::errc::io_error);
  EXPECT_EQ(RemoteSlice::decode(kSample.encode(), ec), kSample);
  EXPECT_FALSE(ec) << ec.message();
}

// ---- RemoteSlice bounds ----

const RemoteSlice kRegion{.addr = 0x10000, .length = 100, .rkey = 7};

std::error_code slice_error(std::uint64_t offset, std::uint64_t len) {
  const auto e = thrown_by([&] { (void)kRegion.slice(offset, len); });
  return e ? e->code() : std::error_code{};
}

TEST(RemoteSlice, SliceInsideKeepsKeyAndShiftsAddress) {
  EXPECT_EQ(kRegion.slice(10, 20), (RemoteSlice{.addr = 0x1000a, .length = 20, .rkey = 7}));
  EXPECT_EQ(kRegion.slice(0, 100), kRegion);
}

TEST(RemoteSlice, SliceEndingExactlyAtTheEndIsAccepted) {
  EXPECT_EQ(kRegion.slice(80, 20), (RemoteSlice{.addr = 0x10050, .length = 20, .rkey = 7}));
  EXPECT_EQ(kRegion.slice(100, 0), (RemoteSlice{.addr = 0x10064, .length = 0, .rkey = 7}));
}

TEST(RemoteSlice, SliceOneBytePastTheEndIsRejected) {
  EXPECT_EQ(slice_error(81, 20), Errc::remote_out_of_bounds);
  EXPECT_EQ(slice_error(0, 101), Errc::remote_out_of_bounds);
}

TEST(RemoteSlice, SliceStartingPastTheEndIsRejected) {
  EXPECT_EQ(slice_error(101, 0), Errc::remote_out_of_bounds);
  EXPECT_EQ(slice_error(1000, 1), Errc::remote_out_of_bounds);
}

TEST(RemoteSlice, SliceWithOverflowingOffsetPlusLengthIsRejected) {
  // offset + len wraps around to a small number: a naive `offset + len <= length` would pass.
  EXPECT_EQ(slice_error(kMax64, 2), Errc::remote_out_of_bounds);
  EXPECT_EQ(slice_error(1, kMax64), Errc::remote_out_of_bounds);
  EXPECT_EQ(slice_error(kMax64, kMax64), Errc::remote_out_of_bounds);
}

TEST(RemoteSlice, SliceErrorNamesTheRangeAndTheCaller) {
  int line = 0;
  const auto e = thrown_by([&] {
    line = __LINE__ + 1;
    (void)kRegion.slice(81, 20);
  });
  ASSERT_TRUE(e);
  EXPECT_TRUE(contains(e->what(), "[81, +20)"));
  EXPECT_TRUE(contains(e->what(), "100 bytes"));
  EXPECT_EQ(e->where().line(), static_cast<unsigned>(line));
}

TEST(RemoteSlice, SliceFromOffsetRunsToTheEnd) {
  EXPECT_EQ(kRegion.slice(30), (RemoteSlice{.addr = 0x1001e, .length = 70, .rkey = 7}));
  EXPECT_EQ(kRegion.slice(100), (RemoteSlice{.addr = 0x10064, .length = 0, .rkey = 7}));
  const auto e = thrown_by([] { (void)kRegion.slice(101); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), Errc::remote_out_of_bounds);
}

static_assert(RemoteSlice{.addr = 16, .length = 8, .rkey = 1}.try_slice(8, 0) == RemoteSlice{24, 0, 1});
static_assert(!RemoteSlice{.addr = 16, .length = 8, .rkey = 1}.try_slice(8, 1));

TEST(RemoteSlice, TrySliceMatchesSliceWithoutThrowing) {
  EXPECT_EQ(kRegion.try_slice(10, 20), kRegion.slice(10, 20));
  EXPECT_EQ(kRegion.try_slice(80, 20), kRegion.slice(80, 20));
  EXPECT_EQ(kRegion.try_slice(100, 0), kRegion.slice(100, 0));
  EXPECT_EQ(kRegion.try_slice(81, 20), std::nullopt);
  EXPECT_EQ(kRegion.try_slice(101, 0), std::nullopt);
  EXPECT_EQ(kRegion.try_slice(kMax64, 2), std::nullopt);
  EXPECT_EQ(kRegion.try_slice(1, kMax64), std::nullopt);
}

// ---- Buffer ----

std::size_t page_size() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

TEST(Buffer, DefaultIsEmpty) {
  const Buffer buf;
  EXPECT_EQ(buf.data(), nullptr);
  EXPECT_EQ(buf.size(), 0u);
  EXPECT_TRUE(buf.span().empty());
}

TEST(Buffer, IsPageAlignedWithTheRequestedSize) {
  for (const std::size_t size : {std::size_t{1}, std::size_t{100}, page_size(), page_size() + 1, 5 * page_size()}) {
    const Buffer buf(size);
    ASSERT_NE(buf.data(), nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buf.data()) % page_size(), 0u) << size;
    EXPECT_EQ(buf.size(), size);
    EXPECT_EQ(buf.span().data(), buf.data());
    EXPECT_EQ(buf.span().size(), size);
  }
}

TEST(Buffer, IsZeroFilledEvenOnReusedMemory) {
  const std::size_t size = 3 * page_size() + 100;
  // Freed memory comes back for the next allocation of the same size (glibc's malloc, below its
  // mmap threshold): the test needs that to have happened, and checks it did.
  bool reused = false;
  for (int attempt = 0; attempt < 16 && !reused; ++attempt) {
    const std::byte* dirty_at = nullptr;
    {
      Buffer dirty(size);
      std::memset(dirty.data(), 0xab, dirty.size());
      dirty_at = dirty.data();
    }
    const Buffer buf(size);
    if (buf.data() != dirty_at) continue;
    reused = true;
    const auto bytes = buf.span();
    EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](std::byte x) { return x == std::byte{0}; }));
  }
  ASSERT_TRUE(reused) << "no Buffer got the memory of the one freed before it in 16 tries: the allocator (a "
                         "sanitizer's quarantine?) does not reuse it, and the test shows nothing";
}

TEST(Buffer, SizeTooLargeToRoundUpThrowsBadAlloc) {
  // Rounding up to whole pages must not wrap around to a tiny allocation that claims a huge size.
  constexpr std::size_t kMaxSize = std::numeric_limits<std::size_t>::max();
  EXPECT_THROW(Buffer{kMaxSize}, std::bad_alloc);
  EXPECT_THROW(Buffer{kMaxSize - page_size() + 2}, std::bad_alloc);
  EXPECT_THROW(Buffer{kMaxSize - page_size() + 1}, std::bad_alloc);
}

TEST(Buffer, MoveConstructionLeavesTheSourceEmpty) {
  Buffer a(100);
  std::byte* const data = a.data();
  const Buffer b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size(), 100u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(a.size(), 0u);       // NOLINT(bugprone-use-after-move)
}

TEST(Buffer, MoveAssignmentTakesTheSourceAndLeavesItEmpty) {
  Buffer a(100);
  Buffer b(200);
  std::byte* const data = a.data();
  b = std::move(a);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size(), 100u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.size(), 0u);       // NOLINT(bugprone-use-after-move)
}

TEST(Buffer, SwapExchangesMemoryAndSize) {
  Buffer a(100);
  Buffer b(3 * page_size());
  std::byte* const pa = a.data();
  std::byte* const pb = b.data();
  a.swap(b);
  EXPECT_EQ(a.data(), pb);
  EXPECT_EQ(a.size(), 3 * page_size());
  EXPECT_EQ(b.data(), pa);
  EXPECT_EQ(b.size(), 100u);
  swap(a, b);  // the free function, found by ADL
  EXPECT_EQ(a.data(), pa);
  EXPECT_EQ(b.data(), pb);
}

// ---- LocalSlice ----

// A span of LocalSlice is handed to the device as an array of ibv_sge.
static_assert(sizeof(LocalSlice) == sizeof(ibv_sge));
static_assert(alignof(LocalSlice) == alignof(ibv_sge));
static_assert(std::is_standard_layout_v<LocalSlice>);
static_assert(offsetof(ibv_sge, addr) == 0 && offsetof(ibv_sge, length) == 8 && offsetof(ibv_sge, lkey) == 12);
constexpr ibv_sge kAsSge = std::bit_cast<ibv_sge>(LocalSlice{0x1122334455667788, 0x99aabbcc, 0xddeeff00});
static_assert(kAsSge.addr == 0x1122334455667788 && kAsSge.length == 0x99aabbcc && kAsSge.lkey == 0xddeeff00);

TEST(LocalSlice, DefaultIsEmpty) {
  const LocalSlice s;
  EXPECT_EQ(s.addr(), 0u);
  EXPECT_EQ(s.length(), 0u);
  EXPECT_EQ(s.lkey(), 0u);
  EXPECT_TRUE(s.bytes().empty());
}

TEST(LocalSlice, ViewsTheMemoryItNames) {
  std::array<std::byte, 32> mem{};
  const LocalSlice s{reinterpret_cast<std::uint64_t>(mem.data() + 8), 16, 0x77};
  EXPECT_EQ(s.data(), mem.data() + 8);
  EXPECT_EQ(s.bytes().data(), mem.data() + 8);
  EXPECT_EQ(s.bytes().size(), 16u);
  EXPECT_EQ(s.native().addr, reinterpret_cast<std::uint64_t>(mem.data() + 8));
  EXPECT_EQ(s.native().length, 16u);
  EXPECT_EQ(s.native().lkey, 0x77u);
}

// ---- Endpoint (queue_pair.hpp) ----

verbs::Gid gid_from_text(const char* text) {
  verbs::Gid g;
  EXPECT_EQ(::inet_pton(AF_INET6, text, g.raw.data()), 1) << text;
  return g;
}

static_assert(Endpoint::wire_size == 36);

TEST(Endpoint, EncodeDecodeRoundTrips) {
  const Endpoint cases[] = {
      {},
      {.qp_num = 17,
       .psn = 0x123456,
       .qkey = 0,
       .gid = gid_from_text("::ffff:192.0.2.1"),
       .lid = 0,
       .mtu = verbs::Mtu::mtu1024},
      {.qp_num = 0xffffff,
       .psn = 0xffffff,
       .qkey = kMax32,
       .gid = gid_from_text("fe80::1:2:3:4"),
       .lid = 0xffff,
       .mtu = verbs::Mtu::mtu4096},
      {.qp_num = 1, .psn = 0, .qkey = 0x11111111, .gid = {}, .lid = 7, .mtu = verbs::Mtu::mtu256},
  };
  for (const Endpoint& e : cases) EXPECT_EQ(Endpoint::decode(e.encode()), e) << "qp_num " << e.qp_num;
}

TEST(Endpoint, EncodingIsLittleEndianWithMagicAndVersion) {
  Endpoint e{
      .qp_num = 0x0a0b0c, .psn = 0x0d0e0f, .qkey = 0x44434241, .gid = {}, .lid = 0x5251, .mtu = verbs::Mtu::mtu2048};
  for (std::size_t i = 0; i < 16; ++i) e.gid.raw[i] = static_cast<std::uint8_t>(0xf0 + i);
  // clang-format off
  const Endpoint::Wire expected = {
      b('V'),  b('E'),  b(1),    b(0),             // magic, version, reserved
      b(0x0c), b(0x0b), b(0x0a), b(0),             // qp_num
      b(0x0f), b(0x0e), b(0x0d), b(0),             // psn
      b(0x41), b(0x42), b(0x43), b(0x44),          // qkey
      b(0x51), b(0x52), b(IBV_MTU_2048), b(0),     // lid, mtu, reserved
      b(0xf0), b(0xf1), b(0xf2), b(0xf3), b(0xf4), b(0xf5), b(0xf6), b(0xf7),  // gid
      b(0xf8), b(0xf9), b(0xfa), b(0xfb), b(0xfc), b(0xfd), b(0xfe), b(0xff),
  };
  // clang-format on
  EXPECT_EQ(e.encode(), expected);
}

const Endpoint kPeer{.qp_num = 0x1234, .psn = 0xabcdef, .qkey = 0, .gid = {}, .lid = 3, .mtu = verbs::Mtu::mtu1024};

// Decodes `wire`, which must be rejected, and returns the message of the Error.
std::string rejection_of_endpoint(std::span<const std::byte> wire) {
  const auto e = thrown_by([&] { (void)Endpoint::decode(wire); });
  if (!e) {
    ADD_FAILURE() << "Endpoint::decode accepted malformed input";
    return {};
  }
  EXPECT_EQ(e->code(), Errc::bad_encoding);
  std::error_code ec = std::make_error_code(std::errc::io_error);
  EXPECT_EQ(Endpoint::decode(wire, ec), std::nullopt);
  EXPECT_EQ(ec, Errc::bad_encoding) << "the error_code form agrees";
  return e->what();
}

// Both decode()s report the caller's line, not the library's.
TEST(Endpoint, DecodeErrorsRecordTheCallersLine) {
  const Endpoint::Wire ew = kPeer.encode();
  const RemoteSlice::Wire rw = kSample.encode();
  std::vector<unsigned> lines;
  std::vector<verbs::Error> errors;
  for (const auto& e : {thrown_by([&] {
                          lines.push_back(__LINE__ + 1);
                          (void)Endpoint::decode(std::span(ew).first(3));
                        }),
                        thrown_by([&] {
                          lines.push_back(__LINE__ + 1);
                          (void)RemoteSlice::decode(std::span(rw).first(3));
                        })}) {
    ASSERT_TRUE(e);
    errors.push_back(*e);
  }
  ASSERT_EQ(lines.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(errors[i].where().line(), lines[i]);
    EXPECT_TRUE(contains(errors[i].where().file_name(), "memory_region_test.cpp")) << errors[i].where().file_name();
  }
}

TEST(Endpoint, DecodeRejectsWrongSize) {
  const Endpoint::Wire w = kPeer.encode();
  EXPECT_TRUE(contains(rejection_of_endpoint(std::span(w).first(35)), "wrong size"));
  std::vector<std::byte> longer(w.begin(), w.end());
  longer.push_back(std::byte{0});
  EXPECT_TRUE(contains(rejection_of_endpoint(longer), "wrong size"));
  // A RemoteSlice is not an Endpoint.
  EXPECT_TRUE(contains(rejection_of_endpoint(kSample.encode()), "wrong size"));
}

TEST(Endpoint, DecodeRejectsWrongMagic) {
  Endpoint::Wire w = kPeer.encode();
  w[1] = b('R');
  EXPECT_TRUE(contains(rejection_of_endpoint(w), "bad magic"));
}

TEST(Endpoint, DecodeRejectsWrongVersion) {
  Endpoint::Wire w = kPeer.encode();
  w[2] = b(2);
  EXPECT_TRUE(contains(rejection_of_endpoint(w), "unsupported version"));
}

TEST(Endpoint, DecodeRejectsNonZeroReservedBytes) {
  for (const std::size_t at : {3u, 19u}) {
    Endpoint::Wire w = kPeer.encode();
    w[at] = b(1);
    EXPECT_TRUE(contains(rejection_of_endpoint(w), "reserved byte not zero")) << "byte " << at;
  }
}

TEST(Endpoint, DecodeRejectsMtuOutsideTheEnum) {
  for (const unsigned mtu : {0u, 6u, 255u}) {
    Endpoint::Wire w = kPeer.encode();
    w[18] = b(mtu);
    EXPECT_TRUE(contains(rejection_of_endpoint(w), "MTU out of range")) << mtu;
  }
}

TEST(Endpoint, DecodeRejectsPsnWiderThan24Bits) {
  Endpoint::Wire w = kPeer.encode();
  w[11] = b(1);  // top byte of the little-endian PSN
  EXPECT_TRUE(contains(rejection_of_endpoint(w), "PSN wider than 24 bits"));
}

TEST(Endpoint, DecodeRejectsQpNumberWiderThan24Bits) {
  Endpoint::Wire w = kPeer.encode();
  w[7] = b(1);  // top byte of the little-endian QP number
  EXPECT_TRUE(contains(rejection_of_endpoint(w), "QP number wider than 24 bits"));
}

TEST(Endpoint, EncodeKeepsOnlyThe24BitsOfPsnAndQpNumber) {
  Endpoint e = kPeer;
  e.psn = 0x1abcdef;
  e.qp_num = 0xff123456;
  const Endpoint back = Endpoint::decode(e.encode());
  EXPECT_EQ(back.psn, 0xabcdefu);
  EXPECT_EQ(back.qp_num, 0x123456u);
}

TEST(Endpoint, DecodeErrorCodeFormClearsCodeOnSuccess) {
  std::error_code ec = std::make_error_code(std::errc::io_error);
  EXPECT_EQ(Endpoint::decode(kPeer.encode(), ec), kPeer);
  EXPECT_FALSE(ec) << ec.message();
}

}  // namespace
