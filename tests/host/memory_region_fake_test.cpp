// MemoryRegion's registration paths that rxe refuses (ibv_rereg_mr, ibv_reg_dmabuf_mr, implicit
// on-demand regions), run against fake registration calls: this executable defines
// ibv_reg_mr_iova2, ibv_rereg_mr, ibv_reg_dmabuf_mr and ibv_dereg_mr itself, so the library's
// calls land here instead of in libibverbs. The device tests run the same paths for real where a
// device has them; these check what the wrapper does with each answer, success or failure.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <infiniband/verbs.h>

#include <verbs/memory_region.hpp>
#include <verbs/protection_domain.hpp>

#include "support/expect.hpp"
#include "support/stub_provider.hpp"

namespace {

/// What the fake registration calls saw, and what they answer.
struct Fake {
  int regs = 0, deregs = 0, rereg_calls = 0, dmabuf_regs = 0;
  std::uint32_t next_key = 0x100;
  // The last registration's arguments.
  void* addr = nullptr;
  std::size_t length = 0;
  std::uint64_t iova = 0, offset = 0;
  int fd = -1;
  unsigned access = 0;
  // The last ibv_rereg_mr's arguments, and its answer: `rereg_rc` with `rereg_errno`.
  int rereg_flags = 0;
  ibv_pd* rereg_pd = nullptr;
  int rereg_rc = 0, rereg_errno = 0;
};
Fake fake;

ibv_mr* new_mr(ibv_pd* pd, void* addr, std::size_t length) {
  auto* mr = new ibv_mr{};  // NOLINT(cppcoreguidelines-owning-memory): freed by ibv_dereg_mr below
  mr->context = pd->context;
  mr->pd = pd;
  mr->addr = addr;
  mr->length = length;
  mr->lkey = fake.next_key++;
  mr->rkey = fake.next_key++;
  return mr;
}

}  // namespace

// The fakes. ibv_reg_mr is a macro in <infiniband/verbs.h>: the parentheses define the function.
extern "C" {
ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, std::size_t length, std::uint64_t iova, unsigned access) {
  ++fake.regs;
  fake.addr = addr;
  fake.length = length;
  fake.iova = iova;
  fake.access = access;
  return new_mr(pd, addr, length);
}
ibv_mr*(ibv_reg_mr)(ibv_pd* pd, void* addr, std::size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<std::uintptr_t>(addr), static_cast<unsigned>(access));  // NOLINT
}
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, std::uint64_t offset, std::size_t length, std::uint64_t iova, int fd, int access) {
  ++fake.dmabuf_regs;
  fake.offset = offset;
  fake.length = length;
  fake.iova = iova;
  fake.fd = fd;
  fake.access = static_cast<unsigned>(access);
  return new_mr(pd, reinterpret_cast<void*>(iova), length);  // NOLINT: as libibverbs sets addr
}
// As libibverbs: on success the MR's pd, addr and length follow the change, and the keys are
// the device's (new ones here).
int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, std::size_t length, int access) {
  ++fake.rereg_calls;
  fake.rereg_flags = flags;
  fake.rereg_pd = pd;
  fake.access = static_cast<unsigned>(access);
  if (fake.rereg_rc != 0 && fake.rereg_rc != IBV_REREG_MR_ERR_DO_FORK_OLD) {
    errno = fake.rereg_errno;
    return fake.rereg_rc;
  }
  if ((flags & IBV_REREG_MR_CHANGE_PD) != 0) mr->pd = pd;
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) != 0) {
    mr->addr = addr;
    mr->length = length;
  }
  mr->lkey = fake.next_key++;
  mr->rkey = fake.next_key++;
  errno = fake.rereg_errno;
  return fake.rereg_rc;
}
int ibv_dereg_mr(ibv_mr* mr) {
  ++fake.deregs;
  delete mr;  // NOLINT(cppcoreguidelines-owning-memory)
  return 0;
}
}

namespace {

using verbs::Access;
using verbs::Errc;
using verbs::MemoryRegion;
using verbs::test::contains;

class FakeRegistration : public ::testing::Test {
 protected:
  void SetUp() override { fake = Fake{}; }
  /// A protection domain on the stub's context; `released` counts its deallocations.
  verbs::ProtectionDomain make_pd(int& released) {
    auto* raw = new ibv_pd{&stub.vctx.context, 1};  // NOLINT(cppcoreguidelines-owning-memory)
    return verbs::ProtectionDomain::adopt(std::shared_ptr<ibv_pd>(raw, [&released](ibv_pd* p) {
      ++released;
      delete p;  // NOLINT(cppcoreguidelines-owning-memory)
    }));
  }
  template <typename F>
  std::optional<verbs::Error> thrown(F&& f) {
    try {
      f();
    } catch (const verbs::Error& e) {
      return e;
    }
    ADD_FAILURE() << "expected a verbs::Error";
    return std::nullopt;
  }

  verbs_stub::Provider stub;
  int pd_released = 0;
};

TEST_F(FakeRegistration, ReregOfThePdHoldsTheNewOneAndLetsGoOfTheOld) {
  int other_released = 0;
  std::optional<verbs::ProtectionDomain> pd(make_pd(pd_released));
  std::optional<verbs::ProtectionDomain> other(make_pd(other_released));
  std::optional<MemoryRegion> mr(MemoryRegion::allocate(*pd, 4096, Access::local_write));
  const std::uint32_t old_lkey = mr->lkey();
  pd.reset();
  EXPECT_EQ(pd_released, 0);  // the region holds it
  mr->rereg({.pd = &*other});
  EXPECT_EQ(fake.rereg_flags, IBV_REREG_MR_CHANGE_PD);
  EXPECT_EQ(fake.rereg_pd, other->native_handle());
  EXPECT_EQ(fake.access, 0u);  // libibverbs refuses rights without IBV_REREG_MR_CHANGE_ACCESS
  EXPECT_EQ(pd_released, 1);   // let go of once the region is in the other
  EXPECT_NE(mr->lkey(), old_lkey);
  EXPECT_EQ(mr->native_handle()->pd, other->native_handle());
  other.reset();
  EXPECT_EQ(other_released, 0);
  mr.reset();
  EXPECT_EQ(fake.deregs, 1);
  EXPECT_EQ(other_released, 1);
}

// The device test MemoryRegion.RelaxedOrderingRegionCarriesWritesAndReads cannot see the flag
// (rxe ignores it): this is where dropping it on the way to ibv_reg_mr fails.
TEST_F(FakeRegistration, ARelaxedOrderingRegionIsRegisteredWithTheFlag) {
  const auto pd = make_pd(pd_released);
  const auto mr = MemoryRegion::allocate(pd, 4096, Access::local_write | Access::remote_write | Access::relaxed_ordering);
  EXPECT_EQ(fake.regs, 1);
  EXPECT_EQ(fake.access,
            static_cast<unsigned>(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_RELAXED_ORDERING));
}

TEST_F(FakeRegistration, ReregOfTheMemoryAddressesTheNewMemoryFromItsAddress) {
  const auto pd = make_pd(pd_released);
  std::vector<std::byte> before(4096), after(8192);
  MemoryRegion mr(pd, std::span(before), Access::local_write, verbs::Iova{0});
  EXPECT_EQ(mr.iova(), 0u);
  mr.rereg({.memory = std::span(after), .access = Access::local_write | Access::remote_read});
  EXPECT_EQ(fake.rereg_flags, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS);
  EXPECT_EQ(fake.access, static_cast<unsigned>(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
  EXPECT_EQ(mr.data(), after.data());
  EXPECT_EQ(mr.size(), after.size());
  EXPECT_EQ(mr.iova(), reinterpret_cast<std::uint64_t>(after.data()));  // NOLINT
  EXPECT_EQ(mr.slice(std::span(after).subspan(10, 4)).addr(), reinterpret_cast<std::uint64_t>(after.data() + 10));  // NOLINT
  EXPECT_EQ(mr.remote(), (verbs::RemoteSlice{mr.iova(), 8192, mr.rkey()}));
  EXPECT_EQ(mr.access(), Access::local_write | Access::remote_read);
}

// IBV_REREG_MR_ERR_DO_FORK_OLD: the change is made; only the old pages' fork protection stayed.
TEST_F(FakeRegistration, ReregThatOnlyFailedToUnprotectTheOldPagesIsDone) {
  const auto pd = make_pd(pd_released);
  auto mr = MemoryRegion::allocate(pd, 4096, Access::local_write);
  fake.rereg_rc = IBV_REREG_MR_ERR_DO_FORK_OLD;
  fake.rereg_errno = ENOMEM;
  mr.rereg({.access = Access::local_write | Access::remote_write});
  EXPECT_EQ(mr.access(), Access::local_write | Access::remote_write);
}

// What the device refuses with EOPNOTSUPP, and input libibverbs refuses, leave the region as it
// was; any other failure of the command leaves the MR undefined (ibv_rereg_mr(3)): the region
// lets go of it and is empty.
TEST_F(FakeRegistration, AFailedReregLeavesTheRegionAsItWasOrEmpty) {
  const auto pd = make_pd(pd_released);
  auto mr = MemoryRegion::allocate(pd, 4096, Access::local_write);
  const std::uint32_t lkey = mr.lkey();
  for (const auto& [rc, err] : {std::pair{IBV_REREG_MR_ERR_CMD, EOPNOTSUPP}, std::pair{IBV_REREG_MR_ERR_INPUT, EINVAL},
                                std::pair{IBV_REREG_MR_ERR_DONT_FORK_NEW, ENOMEM}}) {
    fake.rereg_rc = rc;
    fake.rereg_errno = err;
    const auto e = thrown([&] { mr.rereg({.access = Access::local_write | Access::remote_read}); });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code(), std::error_code(err, std::generic_category())) << e->what();
    EXPECT_TRUE(contains(e->what(), "ibv_rereg_mr (rights)")) << e->what();
    EXPECT_TRUE(contains(e->what(), "the region is unchanged")) << e->what();
    EXPECT_TRUE(mr);
    EXPECT_EQ(mr.lkey(), lkey);
    EXPECT_EQ(mr.access(), Access::local_write);
  }
  EXPECT_EQ(fake.deregs, 0);
  for (const int rc : std::initializer_list<int>{IBV_REREG_MR_ERR_CMD, IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW, -7 /* unlisted */}) {
    auto other = MemoryRegion::allocate(pd, 4096, Access::local_write);
    const int deregs = fake.deregs;
    fake.rereg_rc = rc;
    fake.rereg_errno = EINVAL;
    const auto e = thrown([&] { other.rereg({.access = Access::local_write | Access::remote_read}); });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code(), std::errc::invalid_argument) << e->what();
    EXPECT_TRUE(contains(e->what(), "let go of it and is empty")) << e->what();
    EXPECT_FALSE(other);
    EXPECT_EQ(fake.deregs, deregs + 1);
    const auto use = thrown([&] { (void)other.slice(0, 8); });
    ASSERT_TRUE(use);
    EXPECT_EQ(use->code(), Errc::empty_object);
  }
}

// A window bound to the region (here a shared_handle(), as a window takes) would go on granting
// the old range through the new translation: refused before the call, the region unchanged.
TEST_F(FakeRegistration, ReregIsRefusedWhileSomethingElseHoldsTheRegistration) {
  const auto pd = make_pd(pd_released);
  auto mr = MemoryRegion::allocate(pd, 4096, Access::local_write);
  std::shared_ptr<ibv_mr> held = mr.shared_handle();
  const auto e = thrown([&] { mr.rereg({.access = Access::local_write | Access::remote_read}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::errc::device_or_resource_busy) << e->what();
  EXPECT_TRUE(contains(e->what(), "memory window")) << e->what();
  EXPECT_EQ(fake.rereg_calls, 0);
  held.reset();
  mr.rereg({.access = Access::local_write | Access::remote_read});
  EXPECT_EQ(fake.rereg_calls, 1);
}

// New memory within the buffer the region allocated: the buffer stays (it is the memory).
TEST_F(FakeRegistration, ReregOntoPartOfItsOwnBufferKeepsTheBuffer) {
  const auto pd = make_pd(pd_released);
  auto mr = MemoryRegion::allocate(pd, 8192, Access::local_write);
  const std::span<std::byte> part = mr.bytes().subspan(4096, 100);
  mr.rereg({.memory = part});
  EXPECT_EQ(mr.data(), part.data());
  EXPECT_EQ(mr.size(), 100u);
  std::fill(mr.bytes().begin(), mr.bytes().end(), std::byte{7});  // still the allocation (ASan, valgrind)
  EXPECT_EQ(mr.bytes()[99], std::byte{7});
  EXPECT_EQ(mr.slice(part).addr(), reinterpret_cast<std::uint64_t>(part.data()));  // NOLINT
}

// A region's own buffer lives as long as its registration, which a memory window shares
// (shared_handle()): destroying the region lets go of neither.
TEST_F(FakeRegistration, ARegionsBufferLivesAsLongAsItsRegistration) {
  const auto pd = make_pd(pd_released);
  std::optional<MemoryRegion> mr(MemoryRegion::allocate(pd, 4096, Access::local_write));
  const std::span<std::byte> bytes = mr->bytes();
  std::shared_ptr<ibv_mr> held = mr->shared_handle();
  mr.reset();
  EXPECT_EQ(fake.deregs, 0);
  bytes[4095] = std::byte{1};  // still the region's memory (ASan would report a freed buffer)
  held.reset();
  EXPECT_EQ(fake.deregs, 1);
}

TEST_F(FakeRegistration, ADmaBufRegionIsAddressedFromItsIovaAndHasNoMemoryHere) {
  const auto pd = make_pd(pd_released);
  MemoryRegion mr(pd, verbs::DmaBuf{.fd = 7, .offset = 4096, .length = 65536}, Access::local_write | Access::remote_read,
                  verbs::Iova{1u << 30});
  EXPECT_EQ(fake.dmabuf_regs, 1);
  EXPECT_EQ(fake.fd, 7);
  EXPECT_EQ(fake.offset, 4096u);
  EXPECT_EQ(fake.length, 65536u);
  EXPECT_EQ(fake.iova, 1u << 30);
  EXPECT_EQ(fake.access, static_cast<unsigned>(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
  EXPECT_EQ(mr.data(), nullptr);  // though libibverbs sets the MR's addr to the IOVA
  EXPECT_TRUE(mr.bytes().empty());
  EXPECT_EQ(mr.size(), 65536u);
  EXPECT_EQ(mr.iova(), 1u << 30);
  EXPECT_EQ(mr.slice(100, 8).addr(), (1u << 30) + 100);
  EXPECT_EQ(mr.remote(), (verbs::RemoteSlice{1u << 30, 65536, mr.rkey()}));
  std::vector<std::byte> here(64);
  const auto e = thrown([&] { (void)mr.slice(std::span(here)); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), Errc::bad_argument);
  const auto r = thrown([&] { mr.rereg({.access = Access::local_write}); });
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code(), Errc::bad_argument);
  EXPECT_TRUE(contains(r->what(), "dma-buf")) << r->what();
  EXPECT_EQ(fake.rereg_calls, 0);
  // Moved, it keeps what it is.
  MemoryRegion moved(std::move(mr));
  EXPECT_EQ(moved.data(), nullptr);
  EXPECT_TRUE(moved.bytes().empty());
  EXPECT_EQ(moved.iova(), 1u << 30);
  EXPECT_TRUE(mr.bytes().empty());  // NOLINT(bugprone-use-after-move)
}

TEST_F(FakeRegistration, AnImplicitOnDemandRegionIsRefusedWithoutTheCapabilityAndCoversEverythingWithIt) {
  const auto pd = make_pd(pd_released);
  stub.odp_general_caps = IBV_ODP_SUPPORT;
  const auto e = thrown([&] { (void)MemoryRegion::implicit_on_demand(pd, Access::local_write); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::errc::operation_not_supported);
  EXPECT_TRUE(contains(e->what(), "IBV_ODP_SUPPORT_IMPLICIT")) << e->what();
  EXPECT_EQ(fake.regs, 0);
  stub.odp_general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
  const auto mr = MemoryRegion::implicit_on_demand(pd, Access::local_write | Access::remote_write);
  EXPECT_EQ(fake.regs, 1);
  EXPECT_EQ(fake.addr, nullptr);
  EXPECT_EQ(fake.length, std::numeric_limits<std::size_t>::max());
  EXPECT_EQ(fake.access, static_cast<unsigned>(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ON_DEMAND));
  EXPECT_EQ(mr.access(), Access::local_write | Access::remote_write | Access::on_demand);
  EXPECT_EQ(mr.data(), nullptr);
  EXPECT_TRUE(mr.bytes().empty());
  std::vector<std::byte> anywhere(100);
  const verbs::LocalSlice s = mr.slice(std::span(anywhere).subspan(10, 20));
  EXPECT_EQ(s.addr(), reinterpret_cast<std::uint64_t>(anywhere.data() + 10));  // NOLINT
  EXPECT_EQ(s.length(), 20u);
  EXPECT_EQ(s.lkey(), mr.lkey());
  EXPECT_EQ(mr.remote(), (verbs::RemoteSlice{0, std::numeric_limits<std::uint64_t>::max(), mr.rkey()}));
  EXPECT_EQ(mr.remote().slice(s.addr(), 20).addr, s.addr());
  const auto r = thrown([&] { const_cast<MemoryRegion&>(mr).rereg({.access = Access::local_write}); });  // NOLINT
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code(), Errc::bad_argument);
  EXPECT_EQ(fake.rereg_calls, 0);
}

}  // namespace
