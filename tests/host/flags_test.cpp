// Flags<E> (flags.hpp) over Access: bit operators, `~` limited to the defined bits, constexpr use,
// and the rule that no access right is granted by default.
#include <gtest/gtest.h>

#include <infiniband/verbs.h>

#include <verbs/flags.hpp>
#include <verbs/memory_region.hpp>
#include <verbs/queue_pair.hpp>

namespace {

using verbs::Access;
using verbs::AccessFlags;

constexpr unsigned kDefinedBits = verbs::FlagTraits<Access>::all;

// The enumerators are the C macros, so value() can go to ibv_reg_mr and ibv_modify_qp as is.
static_assert(static_cast<unsigned>(Access::local_write) == IBV_ACCESS_LOCAL_WRITE);
static_assert(static_cast<unsigned>(Access::remote_write) == IBV_ACCESS_REMOTE_WRITE);
static_assert(static_cast<unsigned>(Access::remote_read) == IBV_ACCESS_REMOTE_READ);
static_assert(static_cast<unsigned>(Access::remote_atomic) == IBV_ACCESS_REMOTE_ATOMIC);
static_assert(static_cast<unsigned>(Access::mw_bind) == IBV_ACCESS_MW_BIND);
static_assert(static_cast<unsigned>(Access::zero_based) == IBV_ACCESS_ZERO_BASED);
static_assert(static_cast<unsigned>(Access::on_demand) == IBV_ACCESS_ON_DEMAND);
static_assert(static_cast<unsigned>(Access::relaxed_ordering) == IBV_ACCESS_RELAXED_ORDERING);

// Everything is usable in constant expressions.
static_assert((Access::remote_read | Access::remote_write).value() ==
              (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE));
static_assert((Access::local_write | Access::remote_write).contains(Access::remote_write));
static_assert(!(Access::local_write | Access::remote_write).contains(Access::remote_read));
static_assert(AccessFlags{}.empty());
static_assert((~AccessFlags{}).value() == kDefinedBits);
static_assert((~Access::remote_read).value() == (kDefinedBits & ~unsigned{IBV_ACCESS_REMOTE_READ}));
static_assert([] {
  AccessFlags f = Access::local_write;
  f |= Access::remote_read;
  f &= ~Access::local_write;
  f ^= Access::remote_atomic;
  return f;
}() == (Access::remote_read | Access::remote_atomic));

TEST(Flags, DefaultGrantsNoAccess) {
  const AccessFlags none;
  EXPECT_TRUE(none.empty());
  EXPECT_FALSE(static_cast<bool>(none));
  EXPECT_EQ(none.value(), 0u);
  for (const Access a : {Access::local_write, Access::remote_write, Access::remote_read, Access::remote_atomic})
    EXPECT_FALSE(none.contains(a)) << static_cast<unsigned>(a);
}

TEST(Flags, QpOptionsGrantNoRemoteAccessByDefault) {
  const verbs::QpOptions options;
  EXPECT_TRUE(options.access.empty()) << options.access.value();
}

TEST(Flags, SingleBitConvertsToFlagsWithThatBit) {
  const AccessFlags f = Access::remote_atomic;
  EXPECT_EQ(f.value(), unsigned{IBV_ACCESS_REMOTE_ATOMIC});
  EXPECT_FALSE(f.empty());
  EXPECT_TRUE(static_cast<bool>(f));
}

TEST(Flags, OrCombinesBits) {
  const AccessFlags f = Access::local_write | Access::remote_read;
  EXPECT_EQ(f.value(), unsigned{IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ});
  EXPECT_EQ((f | Access::remote_write).value(),
            unsigned{IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE});
  EXPECT_EQ(f | f, f);
}

TEST(Flags, AndKeepsOnlyCommonBits) {
  const AccessFlags a = Access::local_write | Access::remote_read | Access::remote_write;
  const AccessFlags b = Access::remote_read | Access::remote_atomic;
  EXPECT_EQ(a & b, AccessFlags(Access::remote_read));
  EXPECT_TRUE((Access::local_write & Access::remote_read).empty());
}

TEST(Flags, XorTogglesBits) {
  const AccessFlags a = Access::local_write | Access::remote_read;
  EXPECT_EQ(a ^ Access::remote_read, AccessFlags(Access::local_write));
  EXPECT_EQ(a ^ Access::remote_write, Access::local_write | Access::remote_read | Access::remote_write);
  EXPECT_TRUE((a ^ a).empty());
  EXPECT_EQ((Access::mw_bind ^ Access::zero_based).value(), unsigned{IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED});
}

TEST(Flags, NotFlipsOnlyDefinedBits) {
  const AccessFlags not_read = ~AccessFlags(Access::remote_read);
  EXPECT_EQ(not_read.value(), kDefinedBits & ~unsigned{IBV_ACCESS_REMOTE_READ});
  EXPECT_EQ(not_read.value() & ~kDefinedBits, 0u) << "bits outside Access were set";
  EXPECT_FALSE(not_read.contains(Access::remote_read));
  EXPECT_TRUE(not_read.contains(Access::remote_write | Access::local_write | Access::relaxed_ordering));
  EXPECT_EQ(~not_read, AccessFlags(Access::remote_read));
  EXPECT_EQ((~AccessFlags{}).value(), kDefinedBits);
}

TEST(Flags, MaskConstructorDropsUndefinedBits) {
  EXPECT_EQ(AccessFlags(~0u).value(), kDefinedBits);
  // IBV_ACCESS_HUGETLB is a real verbs bit, but not one that Access defines.
  EXPECT_TRUE(AccessFlags(unsigned{IBV_ACCESS_HUGETLB}).empty());
  EXPECT_EQ(AccessFlags(unsigned{IBV_ACCESS_REMOTE_READ | IBV_ACCESS_HUGETLB}), AccessFlags(Access::remote_read));
}

TEST(Flags, ContainsRequiresEveryBit) {
  const AccessFlags f = Access::local_write | Access::remote_write;
  EXPECT_TRUE(f.contains(Access::local_write));
  EXPECT_TRUE(f.contains(Access::local_write | Access::remote_write));
  EXPECT_FALSE(f.contains(Access::local_write | Access::remote_read));
  EXPECT_TRUE(f.contains(AccessFlags{})) << "every set contains the empty set";
}

TEST(Flags, CompoundAssignmentMatchesBinaryOperators) {
  AccessFlags f = Access::local_write;
  f |= Access::remote_write;
  EXPECT_EQ(f, Access::local_write | Access::remote_write);
  f &= Access::remote_write | Access::remote_read;
  EXPECT_EQ(f, AccessFlags(Access::remote_write));
  f ^= Access::remote_write | Access::remote_atomic;
  EXPECT_EQ(f, AccessFlags(Access::remote_atomic));
}

TEST(Flags, EqualityComparesTheWholeMask) {
  EXPECT_EQ(Access::remote_read | Access::local_write, Access::local_write | Access::remote_read);
  EXPECT_NE(AccessFlags(Access::remote_read), AccessFlags(Access::remote_write));
  EXPECT_NE(AccessFlags(Access::remote_read), Access::remote_read | Access::local_write);
  EXPECT_NE(AccessFlags{}, AccessFlags(Access::local_write));
  EXPECT_TRUE(AccessFlags(Access::remote_read) == Access::remote_read);
}

}  // namespace
