// Work-request builders (work_request.hpp): what they put into ibv_send_wr / ibv_recv_wr, and the
// checks they record at build time. Slices are plain values here, so no device is needed.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include <infiniband/verbs.h>

#include <verbs/completion_queue.hpp>
#include <verbs/work_request.hpp>

namespace {

using verbs::Errc;
using verbs::LocalSlice;
using verbs::PostOptions;
using verbs::RecvWr;
using verbs::RemoteSlice;
using verbs::SendWr;

constexpr std::uint32_t kMax32 = std::numeric_limits<std::uint32_t>::max();

const LocalSlice kLocal{0x1000, 64, 0x11};
const RemoteSlice kRemote{.addr = 0x20000, .length = 128, .rkey = 0x22};
const RemoteSlice kTarget{.addr = 0x30008, .length = 8, .rkey = 0x33};  // an atomic target
const LocalSlice kResult{0x4000, 8, 0x44};                              // an atomic result

// The check a request failed at build time, as an error_code (which gtest prints readably).
std::error_code build_error(const SendWr& w) { return w.error(); }

std::array<std::uint8_t, 4> bytes_of(std::uint32_t v) {
  std::array<std::uint8_t, 4> out{};
  std::memcpy(out.data(), &v, sizeof v);
  return out;
}

// ---- opcodes, ids, addresses ----

TEST(SendWr, WriteFillsOpcodeRemoteAddressAndKey) {
  const SendWr w = SendWr::write(kLocal, kRemote, {.wr_id = 7});
  EXPECT_EQ(w.native().opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(w.native().wr_id, 7u);
  EXPECT_EQ(w.wr_id(), 7u);
  EXPECT_EQ(w.native().wr.rdma.remote_addr, kRemote.addr);
  EXPECT_EQ(w.native().wr.rdma.rkey, kRemote.rkey);
  EXPECT_EQ(w.native().num_sge, 1);
  EXPECT_EQ(w.native().next, nullptr);
  EXPECT_EQ(w.total_length(), 64u);
  EXPECT_EQ(build_error(w), Errc{});
  ASSERT_EQ(w.sges().size(), 1u);
  EXPECT_EQ(w.sges()[0].addr, kLocal.addr());
  EXPECT_EQ(w.sges()[0].length, kLocal.length());
  EXPECT_EQ(w.sges()[0].lkey, kLocal.lkey());
}

TEST(SendWr, ReadFillsOpcodeRemoteAddressAndKey) {
  const SendWr w = SendWr::read(kLocal, kRemote, {.wr_id = 8});
  EXPECT_EQ(w.native().opcode, IBV_WR_RDMA_READ);
  EXPECT_EQ(w.wr_id(), 8u);
  EXPECT_EQ(w.native().wr.rdma.remote_addr, kRemote.addr);
  EXPECT_EQ(w.native().wr.rdma.rkey, kRemote.rkey);
  EXPECT_EQ(w.native().num_sge, 1);
  EXPECT_EQ(w.total_length(), 64u);
  EXPECT_EQ(build_error(w), Errc{});
}

TEST(SendWr, SendHasNoRemoteAddress) {
  const SendWr w = SendWr::send(kLocal, {.wr_id = 9});
  EXPECT_EQ(w.native().opcode, IBV_WR_SEND);
  EXPECT_EQ(w.wr_id(), 9u);
  EXPECT_EQ(w.native().wr.rdma.remote_addr, 0u);
  EXPECT_EQ(w.native().wr.rdma.rkey, 0u);
  EXPECT_EQ(w.native().num_sge, 1);
  EXPECT_EQ(w.total_length(), 64u);
  EXPECT_EQ(build_error(w), Errc{});
}

TEST(SendWr, SendImmCarriesImmediateInNetworkByteOrder) {
  const SendWr w = SendWr::send_imm(kLocal, 0x01020304);
  EXPECT_EQ(w.native().opcode, IBV_WR_SEND_WITH_IMM);
  EXPECT_EQ(bytes_of(w.native().imm_data), (std::array<std::uint8_t, 4>{1, 2, 3, 4}));
}

TEST(SendWr, WriteImmCarriesImmediateInNetworkByteOrderAndRemote) {
  const SendWr w = SendWr::write_imm(kLocal, kRemote, 0xa1b2c3d4);
  EXPECT_EQ(w.native().opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
  EXPECT_EQ(bytes_of(w.native().imm_data), (std::array<std::uint8_t, 4>{0xa1, 0xb2, 0xc3, 0xd4}));
  EXPECT_EQ(w.native().wr.rdma.remote_addr, kRemote.addr);
  EXPECT_EQ(w.native().wr.rdma.rkey, kRemote.rkey);
  EXPECT_EQ(build_error(w), Errc{});
}

TEST(SendWr, ImmediateSurvivesTheTripToACompletion) {
  // What the sender puts in the WQE arrives unchanged in the receiver's ibv_wc.
  const SendWr w = SendWr::write_imm(std::span<const LocalSlice>{}, kRemote, 0xcafe0001);
  ibv_wc wc{};
  wc.wc_flags = IBV_WC_WITH_IMM;
  wc.imm_data = w.native().imm_data;
  EXPECT_EQ(verbs::Completion(wc).imm_data(), 0xcafe0001u);
}

// ---- PostOptions -> send_flags ----

TEST(SendWr, DefaultOptionsAskForACompletionOnly) {
  EXPECT_EQ(SendWr::send(kLocal).native().send_flags, unsigned{IBV_SEND_SIGNALED});
  EXPECT_EQ(SendWr::send(kLocal).wr_id(), 0u);
}

TEST(SendWr, EachOptionSetsItsFlag) {
  EXPECT_EQ(SendWr::send(kLocal, {.signaled = false}).native().send_flags, 0u);
  EXPECT_EQ(SendWr::send(kLocal, {.signaled = false, .inline_data = true}).native().send_flags,
            unsigned{IBV_SEND_INLINE});
  EXPECT_EQ(SendWr::read(kLocal, kRemote, {.signaled = false, .fence = true}).native().send_flags,
            unsigned{IBV_SEND_FENCE});
  EXPECT_EQ(SendWr::send(kLocal, {.signaled = false, .solicited = true}).native().send_flags,
            unsigned{IBV_SEND_SOLICITED});
}

TEST(SendWr, OptionsCombine) {
  const PostOptions all{.wr_id = 1, .signaled = true, .inline_data = true, .fence = true, .solicited = true};
  EXPECT_EQ(SendWr::write_imm(kLocal, kRemote, 5, all).native().send_flags,
            unsigned{IBV_SEND_SIGNALED | IBV_SEND_INLINE | IBV_SEND_FENCE | IBV_SEND_SOLICITED});
}

// ---- scatter/gather lists ----

const std::array<LocalSlice, 3> kSlices{LocalSlice{0x1000, 10, 1}, LocalSlice{0x2000, 20, 2},
                                        LocalSlice{0x3000, 30, 3}};

// `w` carries copies of kSlices (sges()), whatever becomes of the array it was built from; its
// sg_list is set when it is posted.
void expect_carries_slices(const SendWr& w) {
  ASSERT_EQ(w.native().num_sge, 3);
  EXPECT_EQ(w.native().sg_list, nullptr) << "set when posting, to the request's own entries";
  ASSERT_EQ(w.sges().size(), 3u);
  for (std::size_t i = 0; i < kSlices.size(); ++i) {
    EXPECT_EQ(w.sges()[i].addr, kSlices[i].addr()) << i;
    EXPECT_EQ(w.sges()[i].length, kSlices[i].length()) << i;
    EXPECT_EQ(w.sges()[i].lkey, kSlices[i].lkey()) << i;
  }
  EXPECT_EQ(w.total_length(), 60u);
  EXPECT_EQ(build_error(w), Errc{});
}

TEST(SendWr, SpanFormsCopyTheCallersSlices) {
  std::array<LocalSlice, 3> slices = kSlices;
  const SendWr write = SendWr::write(slices, kRemote);
  const SendWr write_imm = SendWr::write_imm(slices, kRemote, 1);
  const SendWr read = SendWr::read(slices, kRemote);
  const SendWr send = SendWr::send(slices);
  const SendWr send_imm = SendWr::send_imm(slices, 1);
  slices.fill(LocalSlice{0xdead0000, 1, 0xbad});  // the caller's array, reused
  for (const auto& [name, w] : {std::pair{"write", &write}, std::pair{"write_imm", &write_imm},
                                std::pair{"read", &read}, std::pair{"send", &send}, std::pair{"send_imm", &send_imm}}) {
    SCOPED_TRACE(name);
    expect_carries_slices(*w);
    const SendWr copy = *w;  // a copy carries its own
    expect_carries_slices(copy);
    EXPECT_NE(copy.sges().data(), w->sges().data());
  }
}

TEST(SendWr, HoldsUpToMaxWrSlicesAndRefusesMore) {
  static_assert(verbs::max_wr_slices == 4);
  const std::array<LocalSlice, 5> five{kSlices[0], kSlices[1], kSlices[2], LocalSlice{0x4000, 40, 4},
                                       LocalSlice{0x5000, 50, 5}};
  const std::span<const LocalSlice> four = std::span(five).first(4);
  const RemoteSlice big{.addr = 0x20000, .length = 4096, .rkey = 2};
  EXPECT_EQ(build_error(SendWr::write(four, big)), Errc{});
  EXPECT_EQ(SendWr::write(four, big).sges().size(), 4u);
  EXPECT_EQ(SendWr::write(four, big).sges()[3].lkey, 4u);
  EXPECT_EQ(build_error(SendWr::write(five, big)), Errc::too_many_slices);
  EXPECT_EQ(build_error(SendWr::write_imm(five, big, 1)), Errc::too_many_slices);
  EXPECT_EQ(build_error(SendWr::read(five, big)), Errc::too_many_slices);
  EXPECT_EQ(build_error(SendWr::send(five)), Errc::too_many_slices);
  EXPECT_EQ(build_error(SendWr::send_imm(five, 1)), Errc::too_many_slices);
  // Refused as a whole: nothing copied, the number given kept, and this check comes first.
  const SendWr refused = SendWr::write(five, RemoteSlice{.addr = 0x20000, .length = 1, .rkey = 2});
  EXPECT_EQ(build_error(refused), Errc::too_many_slices) << "before remote_too_small";
  EXPECT_TRUE(refused.sges().empty());
  EXPECT_EQ(refused.native().num_sge, 5);
  EXPECT_EQ(refused.total_length(), 150u);
  const std::string why = std::error_code(Errc::too_many_slices).message();
  EXPECT_NE(why.find("at most 4 slices"), std::string::npos) << why;
  EXPECT_NE(why.find("QueuePair::post_write"), std::string::npos) << why << ": what to do instead";
}

TEST(SendWr, EmptySpanWriteImmCarriesNoSge) {
  const RemoteSlice nothing{.addr = 0x5000, .length = 0, .rkey = 9};
  const SendWr w = SendWr::write_imm(std::span<const LocalSlice>{}, nothing, 77);
  EXPECT_EQ(w.native().opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
  EXPECT_EQ(w.native().num_sge, 0);
  EXPECT_EQ(w.total_length(), 0u);
  EXPECT_EQ(build_error(w), Errc{}) << "nothing is written, so a zero-length remote slice is enough";
}

TEST(SendWr, TotalLengthDoesNotWrapAt32Bits) {
  const std::array<LocalSlice, 2> big{LocalSlice{0x1000, kMax32, 1}, LocalSlice{0x2000, kMax32, 1}};
  const SendWr w = SendWr::write(big, RemoteSlice{.addr = 0, .length = std::uint64_t{1} << 32, .rkey = 1});
  EXPECT_EQ(w.total_length(), 2 * std::uint64_t{kMax32});
  EXPECT_EQ(build_error(w), Errc::remote_too_small);
}

// ---- remote size checks ----

TEST(SendWr, WriteLargerThanRemoteSliceIsRejected) {
  EXPECT_EQ(build_error(SendWr::write(LocalSlice{0x1000, 129, 1}, kRemote)), Errc::remote_too_small);
  EXPECT_EQ(build_error(SendWr::write_imm(LocalSlice{0x1000, 129, 1}, kRemote, 0)), Errc::remote_too_small);
  EXPECT_EQ(build_error(SendWr::write(kSlices, RemoteSlice{.addr = 0x20000, .length = 59, .rkey = 2})),
            Errc::remote_too_small);
}

TEST(SendWr, WriteExactlyFillingRemoteSliceIsAccepted) {
  EXPECT_EQ(build_error(SendWr::write(LocalSlice{0x1000, 128, 1}, kRemote)), Errc{});
  EXPECT_EQ(build_error(SendWr::write(kSlices, RemoteSlice{.addr = 0x20000, .length = 60, .rkey = 2})), Errc{});
}

TEST(SendWr, ReadLargerThanRemoteSliceIsRejected) {
  EXPECT_EQ(build_error(SendWr::read(LocalSlice{0x1000, 129, 1}, kRemote)), Errc::remote_too_small);
  EXPECT_EQ(build_error(SendWr::read(kSlices, RemoteSlice{.addr = 0x20000, .length = 59, .rkey = 2})),
            Errc::remote_too_small);
  EXPECT_EQ(build_error(SendWr::read(LocalSlice{0x1000, 128, 1}, kRemote)), Errc{});
}

// ---- atomics ----

TEST(SendWr, FetchAddFillsAtomicFields) {
  const SendWr w = SendWr::fetch_add(kResult, kTarget, 0x0102030405060708, {.wr_id = 3});
  EXPECT_EQ(w.native().opcode, IBV_WR_ATOMIC_FETCH_AND_ADD);
  EXPECT_EQ(w.wr_id(), 3u);
  EXPECT_EQ(w.native().wr.atomic.remote_addr, kTarget.addr);
  EXPECT_EQ(w.native().wr.atomic.rkey, kTarget.rkey);
  EXPECT_EQ(w.native().wr.atomic.compare_add, 0x0102030405060708u);
  EXPECT_EQ(w.native().num_sge, 1);
  EXPECT_EQ(w.total_length(), 8u);
  EXPECT_EQ(build_error(w), Errc{});
}

TEST(SendWr, CompareSwapFillsAtomicFields) {
  const SendWr w = SendWr::compare_swap(kResult, kTarget, 11, 22, {.wr_id = 4});
  EXPECT_EQ(w.native().opcode, IBV_WR_ATOMIC_CMP_AND_SWP);
  EXPECT_EQ(w.native().wr.atomic.remote_addr, kTarget.addr);
  EXPECT_EQ(w.native().wr.atomic.rkey, kTarget.rkey);
  EXPECT_EQ(w.native().wr.atomic.compare_add, 11u);
  EXPECT_EQ(w.native().wr.atomic.swap, 22u);
  EXPECT_EQ(build_error(w), Errc{});
}

TEST(SendWr, AtomicOnMisalignedTargetIsRejected) {
  for (const std::uint64_t addr : {0x30001u, 0x30004u, 0x30007u}) {
    const RemoteSlice target{.addr = addr, .length = 8, .rkey = 1};
    EXPECT_EQ(build_error(SendWr::fetch_add(kResult, target, 1)), Errc::atomic_misaligned) << addr;
    EXPECT_EQ(build_error(SendWr::compare_swap(kResult, target, 1, 2)), Errc::atomic_misaligned) << addr;
  }
}

TEST(SendWr, AtomicWithResultNotEightBytesIsRejected) {
  for (const std::uint32_t len : {0u, 4u, 7u, 9u, 16u}) {
    const LocalSlice result{0x4000, len, 1};
    EXPECT_EQ(build_error(SendWr::fetch_add(result, kTarget, 1)), Errc::atomic_length) << len;
    EXPECT_EQ(build_error(SendWr::compare_swap(result, kTarget, 1, 2)), Errc::atomic_length) << len;
  }
}

TEST(SendWr, AtomicWithTargetNotEightBytesIsRejected) {
  for (const std::uint64_t len : {0u, 4u, 16u, 4096u}) {
    const RemoteSlice target{.addr = 0x30008, .length = len, .rkey = 1};
    EXPECT_EQ(build_error(SendWr::fetch_add(kResult, target, 1)), Errc::atomic_length) << len;
    EXPECT_EQ(build_error(SendWr::compare_swap(kResult, target, 1, 2)), Errc::atomic_length) << len;
  }
}

// ---- receives ----

TEST(RecvWr, SingleSliceFormHasOneSgeAndTheId) {
  const RecvWr w(kLocal, 55);
  EXPECT_EQ(w.wr_id(), 55u);
  EXPECT_EQ(w.native().wr_id, 55u);
  EXPECT_EQ(w.native().num_sge, 1);
  EXPECT_EQ(w.native().next, nullptr);
  ASSERT_EQ(w.sges().size(), 1u);
  EXPECT_EQ(w.sges()[0].addr, kLocal.addr());
  EXPECT_EQ(w.sges()[0].lkey, kLocal.lkey());
}

TEST(RecvWr, SpanFormCopiesTheCallersSlices) {
  std::array<LocalSlice, 3> slices = kSlices;
  const RecvWr w(std::span<const LocalSlice>(slices), 56);
  slices.fill(LocalSlice{0xdead0000, 1, 0xbad});  // the caller's array, reused
  EXPECT_EQ(w.wr_id(), 56u);
  EXPECT_EQ(w.error(), Errc{});
  ASSERT_EQ(w.native().num_sge, 3);
  EXPECT_EQ(w.native().sg_list, nullptr) << "set when posting, to the request's own entries";
  for (const RecvWr& r : {w, RecvWr(w)}) {  // and a copy carries its own
    ASSERT_EQ(r.sges().size(), 3u);
    for (std::size_t i = 0; i < kSlices.size(); ++i) {
      EXPECT_EQ(r.sges()[i].addr, kSlices[i].addr()) << i;
      EXPECT_EQ(r.sges()[i].length, kSlices[i].length()) << i;
      EXPECT_EQ(r.sges()[i].lkey, kSlices[i].lkey()) << i;
    }
  }
}

TEST(RecvWr, HoldsUpToMaxWrSlicesAndRefusesMore) {
  const std::array<LocalSlice, 5> five{kSlices[0], kSlices[1], kSlices[2], LocalSlice{0x4000, 40, 4},
                                       LocalSlice{0x5000, 50, 5}};
  const RecvWr four(std::span<const LocalSlice>(five).first(4), 1);
  EXPECT_EQ(four.error(), Errc{});
  EXPECT_EQ(four.sges().size(), 4u);
  const RecvWr refused(std::span<const LocalSlice>(five), 2);
  EXPECT_EQ(refused.error(), Errc::too_many_slices);
  EXPECT_TRUE(refused.sges().empty());
  EXPECT_EQ(refused.native().num_sge, 5);
  EXPECT_EQ(RecvWr(kLocal).error(), Errc{});
  EXPECT_EQ(RecvWr().error(), Errc{});
}

TEST(RecvWr, EmptySpanReceivesNoPayload) {
  const RecvWr w(std::span<const LocalSlice>{}, 57);
  EXPECT_EQ(w.native().num_sge, 0);
  EXPECT_EQ(w.wr_id(), 57u);
}

}  // namespace
