// Value semantics of every public type: handles are move-only with nothrow move and swap; the
// small values handed to posting calls are trivially copyable.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <verbs/verbs.hpp>

namespace {

// Instantiating this checks T, and a failure names T in the compiler's instantiation trace.
template <typename T>
struct MoveOnlyHandle {
  static_assert(std::is_nothrow_move_constructible_v<T>, "moving a handle must not throw");
  static_assert(std::is_nothrow_move_assignable_v<T>, "move-assigning a handle must not throw");
  static_assert(!std::is_copy_constructible_v<T>, "a handle must not be copyable");
  static_assert(!std::is_copy_assignable_v<T>, "a handle must not be copy-assignable");
  static_assert(std::is_nothrow_swappable_v<T>, "swapping handles must not throw");
  static_assert(std::is_nothrow_destructible_v<T>, "destructors never throw");
  static constexpr bool checked = true;
};

static_assert(MoveOnlyHandle<verbs::Device>::checked);
static_assert(MoveOnlyHandle<verbs::ProtectionDomain>::checked);
static_assert(MoveOnlyHandle<verbs::MemoryRegion>::checked);
static_assert(MoveOnlyHandle<verbs::CompletionQueue>::checked);
static_assert(MoveOnlyHandle<verbs::QueuePair>::checked);
static_assert(MoveOnlyHandle<verbs::SharedReceiveQueue>::checked);
static_assert(MoveOnlyHandle<verbs::AddressHandle>::checked);
static_assert(MoveOnlyHandle<verbs::Buffer>::checked);

// One vocabulary for options: the address handle's service level has TransportOptions' name.
template <typename T>
concept NamesTheServiceLevel = requires { T{.service_level = std::uint8_t{3}}; };
static_assert(NamesTheServiceLevel<verbs::TransportOptions>);
static_assert(NamesTheServiceLevel<verbs::AhOptions>);

// Values passed to and returned from the data path: copied freely, no ownership.
static_assert(std::is_trivially_copyable_v<verbs::LocalSlice>);
static_assert(std::is_trivially_copyable_v<verbs::RemoteSlice>);
static_assert(std::is_trivially_copyable_v<verbs::Endpoint>);
static_assert(std::is_trivially_copyable_v<verbs::PostOptions>);
static_assert(std::is_trivially_copyable_v<verbs::PostResult>);
static_assert(std::is_trivially_copyable_v<verbs::Completion>);
static_assert(sizeof(verbs::PostResult) == 8, "a PostResult fits in a register");

TEST(Handles, SwapExchangesOwnershipWithoutCopying) {
  verbs::Buffer a(64);
  verbs::Buffer b(128);
  std::byte* const pa = a.data();
  std::byte* const pb = b.data();
  using std::swap;
  swap(a, b);  // what generic code does; must pick verbs::swap and exchange, not copy
  EXPECT_EQ(a.data(), pb);
  EXPECT_EQ(a.size(), 128u);
  EXPECT_EQ(b.data(), pa);
  EXPECT_EQ(b.size(), 64u);
}

TEST(Handles, MovedFromBufferCanBeReassigned) {
  verbs::Buffer a(64);
  verbs::Buffer b(std::move(a));
  a = verbs::Buffer(32);  // NOLINT(bugprone-use-after-move): reassigning a moved-from handle is allowed
  EXPECT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a.data(), b.data());
  EXPECT_EQ(b.size(), 64u);
}

}  // namespace
