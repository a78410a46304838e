// Host-side costs a user pays per operation, with Google Benchmark: building and checking work
// requests, posting them through a provider stub (tests/support/stub_provider.hpp, no device),
// slice bounds checks, Flags<Access> operations, and decoding completions.
//
//   build/bench/micro/verbs_micro                              all of them
//   build/bench/micro/verbs_micro --benchmark_min_time=0.01    a quick run
//   build/bench/micro/verbs_micro --benchmark_filter=Post      some of them
//
// The stub's post_send does nothing and its poll_cq copies prepared completions, so the post
// and poll figures are the library's part of a verb plus one indirect call.
#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <system_error>

#include <infiniband/verbs.h>

#include <verbs/verbs.hpp>

#include "support/stub_provider.hpp"

namespace {

using verbs::LocalSlice;
using verbs::PostOptions;
using verbs::RemoteSlice;
using verbs::SendWr;

// Inputs the optimiser cannot see through, so each iteration builds and checks for real.
template <typename T>
T opaque(T v) {
  benchmark::DoNotOptimize(v);
  return v;
}

int post_send_nothing(ibv_qp*, ibv_send_wr*, ibv_send_wr**) { return 0; }

struct Stub {
  verbs_stub::Provider provider;
  verbs::QueuePair qp = provider.queue_pair({}, verbs::QpState::rts,
                                            {.max_send_wr = 128, .max_recv_wr = 128, .max_send_sge = 4,
                                             .max_recv_sge = 1, .max_inline_data = 64});
  verbs::CompletionQueue cq = provider.completion_queue();
  Stub() { provider.vctx.context.ops.post_send = &post_send_nothing; }
};

const LocalSlice kSrc{0x10000, 4096, 0x1234};
const RemoteSlice kDst{.addr = 0x7f0000, .length = 1 << 20, .rkey = 0x5678};
const LocalSlice kResult{0x20000, 8, 0x1234};
const RemoteSlice kTarget{.addr = 0x7f1000, .length = 8, .rkey = 0x5678};

// ---- building and checking work requests ----

void SendWrWrite(benchmark::State& state) {
  const LocalSlice src = opaque(kSrc);
  const RemoteSlice dst = opaque(kDst);
  std::uint64_t id = 0;
  for (auto _ : state) {
    SendWr w = SendWr::write(src, dst, {.wr_id = id++});
    benchmark::DoNotOptimize(w);
  }
}
BENCHMARK(SendWrWrite);

void SendWrWriteTooLargeForTheRemote(benchmark::State& state) {
  const LocalSlice src = opaque(kSrc);
  const RemoteSlice dst = opaque(RemoteSlice{kDst.addr, 16, kDst.rkey});
  for (auto _ : state) {
    SendWr w = SendWr::write(src, dst);
    benchmark::DoNotOptimize(w.error());
  }
}
BENCHMARK(SendWrWriteTooLargeForTheRemote);

void SendWrRead(benchmark::State& state) {
  const LocalSlice dst = opaque(kSrc);
  const RemoteSlice src = opaque(kDst);
  for (auto _ : state) {
    SendWr w = SendWr::read(dst, src, {.wr_id = 7});
    benchmark::DoNotOptimize(w);
  }
}
BENCHMARK(SendWrRead);

void SendWrFetchAdd(benchmark::State& state) {
  const LocalSlice result = opaque(kResult);
  const RemoteSlice target = opaque(kTarget);
  for (auto _ : state) {
    SendWr w = SendWr::fetch_add(result, target, 1, {.wr_id = 8});
    benchmark::DoNotOptimize(w);
  }
}
BENCHMARK(SendWrFetchAdd);

void SendWrWriteFourSges(benchmark::State& state) {
  const std::array<LocalSlice, 4> src{kSrc, kSrc, kSrc, kSrc};
  const RemoteSlice dst = opaque(kDst);
  benchmark::DoNotOptimize(src.data());
  for (auto _ : state) {
    SendWr w = SendWr::write(src, dst);
    benchmark::DoNotOptimize(w);
  }
}
BENCHMARK(SendWrWriteFourSges);

// ---- posting through the stub QP (checks, linking, one indirect call) ----

void PostWrite(benchmark::State& state) {
  Stub stub;
  const LocalSlice src = opaque(kSrc);
  const RemoteSlice dst = opaque(kDst);
  std::uint64_t id = 0;
  for (auto _ : state) benchmark::DoNotOptimize(stub.qp.post_write(src, dst, {.wr_id = id++}).ok());
}
BENCHMARK(PostWrite);

void PostWriteInline(benchmark::State& state) {
  Stub stub;
  const LocalSlice src = opaque(LocalSlice{kSrc.addr(), 64, kSrc.lkey()});
  const RemoteSlice dst = opaque(kDst);
  for (auto _ : state) benchmark::DoNotOptimize(stub.qp.post_write(src, dst, {.inline_data = opaque(true)}).ok());
}
BENCHMARK(PostWriteInline);

void PostFetchAdd(benchmark::State& state) {
  Stub stub;
  const LocalSlice result = opaque(kResult);
  const RemoteSlice target = opaque(kTarget);
  for (auto _ : state) benchmark::DoNotOptimize(stub.qp.post_fetch_add(result, target, 1).ok());
}
BENCHMARK(PostFetchAdd);

void PostRejected(benchmark::State& state) {
  Stub stub;
  const LocalSlice src = opaque(kSrc);
  const RemoteSlice dst = opaque(RemoteSlice{kDst.addr, 16, kDst.rkey});
  for (auto _ : state) benchmark::DoNotOptimize(stub.qp.post_write(src, dst).error());
}
BENCHMARK(PostRejected);

void PostChain(benchmark::State& state) {
  Stub stub;
  const auto n = static_cast<std::size_t>(state.range(0));
  std::array<SendWr, 16> chain{
      SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst),
      SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst),
      SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst),
      SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst), SendWr::write(kSrc, kDst)};
  for (auto _ : state) benchmark::DoNotOptimize(stub.qp.post(std::span(chain).first(n)).ok());
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
}
BENCHMARK(PostChain)->Arg(1)->Arg(4)->Arg(16);

// ---- polling through the stub CQ ----

void PollBatch(benchmark::State& state) {
  Stub stub;
  stub.provider.ready = static_cast<int>(state.range(0));
  std::array<verbs::Completion, 16> out{};
  std::error_code ec;
  for (auto _ : state) benchmark::DoNotOptimize(stub.cq.poll(out, ec).size());
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(PollBatch)->Arg(0)->Arg(1)->Arg(16);

// ---- slice bounds checks ----

void RemoteSliceSlice(benchmark::State& state) {
  const RemoteSlice r = opaque(kDst);
  std::uint64_t off = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(r.slice(off, 64));
    off = (off + 64) & 0xffff;
  }
}
BENCHMARK(RemoteSliceSlice);

void RemoteSliceTrySlice(benchmark::State& state) {
  const RemoteSlice r = opaque(kDst);
  std::uint64_t off = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(r.try_slice(off, 64));
    off = (off + 64) & 0xffff;
  }
}
BENCHMARK(RemoteSliceTrySlice);

void RemoteSliceTrySliceOutOfBounds(benchmark::State& state) {
  const RemoteSlice r = opaque(kDst);
  const std::uint64_t off = opaque(kDst.length - 8);
  for (auto _ : state) benchmark::DoNotOptimize(r.try_slice(off, 64));
}
BENCHMARK(RemoteSliceTrySliceOutOfBounds);

void RemoteSliceEncodeDecode(benchmark::State& state) {
  const RemoteSlice r = opaque(kDst);
  std::error_code ec;
  for (auto _ : state) {
    const RemoteSlice::Wire wire = r.encode();
    benchmark::DoNotOptimize(RemoteSlice::decode(wire, ec));
  }
}
BENCHMARK(RemoteSliceEncodeDecode);

// ---- Flags<Access> ----

void AccessFlagsCombineAndTest(benchmark::State& state) {
  verbs::AccessFlags a = opaque(verbs::AccessFlags(verbs::Access::local_write));
  for (auto _ : state) {
    const verbs::AccessFlags b = a | verbs::Access::remote_write | verbs::Access::remote_read;
    benchmark::DoNotOptimize(b.contains(verbs::Access::remote_write));
    benchmark::DoNotOptimize(~b & verbs::Access::remote_atomic);
    a = opaque(a);
  }
}
BENCHMARK(AccessFlagsCombineAndTest);

// ---- decoding completions ----

ibv_wc completion(ibv_wc_status status) {
  ibv_wc wc{};
  wc.wr_id = 42;
  wc.status = status;
  wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
  wc.byte_len = 4096;
  wc.imm_data = htonl(7);
  wc.wc_flags = IBV_WC_WITH_IMM;
  wc.qp_num = 0x123;
  return wc;
}

void CompletionAccessors(benchmark::State& state) {
  const verbs::Completion c = opaque(verbs::Completion(completion(IBV_WC_SUCCESS)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.ok());
    benchmark::DoNotOptimize(c.wr_id());
    benchmark::DoNotOptimize(c.opcode());
    benchmark::DoNotOptimize(c.byte_len());
    benchmark::DoNotOptimize(c.imm_data());
  }
}
BENCHMARK(CompletionAccessors);

void CompletionErrorCodeOnSuccess(benchmark::State& state) {
  const verbs::Completion c = opaque(verbs::Completion(completion(IBV_WC_SUCCESS)));
  for (auto _ : state) benchmark::DoNotOptimize(c.error_code());
}
BENCHMARK(CompletionErrorCodeOnSuccess);

void CompletionErrorCodeOnFailure(benchmark::State& state) {
  const verbs::Completion c = opaque(verbs::Completion(completion(IBV_WC_REM_ACCESS_ERR)));
  for (auto _ : state) benchmark::DoNotOptimize(c.error_code());
}
BENCHMARK(CompletionErrorCodeOnFailure);

void CompletionErrorMessage(benchmark::State& state) {
  const verbs::Completion c = opaque(verbs::Completion(completion(IBV_WC_REM_ACCESS_ERR)));
  for (auto _ : state) benchmark::DoNotOptimize(c.error_code().message());
}
BENCHMARK(CompletionErrorMessage);

}  // namespace

BENCHMARK_MAIN();
