// CompletionQueue::adopt on a provider stub (stub_provider.hpp): an adopted CQ polls through
// the provider it was created by, reports its errors, and is destroyed by its own deleter.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cerrno>
#include <memory>
#include <span>
#include <system_error>
#include <vector>

#include <infiniband/verbs.h>

#include <verbs/completion_queue.hpp>

#include "support/expect.hpp"
#include "support/stub_provider.hpp"

namespace {

using verbs::Completion;
using verbs::CompletionQueue;

TEST(CompletionQueueAdopt, PollsThroughTheAdoptedCq) {
  verbs_stub::Provider stub;
  stub.completion.wr_id = 42;
  stub.completion.opcode = IBV_WC_RDMA_WRITE;
  stub.completion.qp_num = 0x123;
  CompletionQueue cq = stub.completion_queue();
  EXPECT_EQ(cq.native_handle(), &stub.cq);

  std::array<Completion, 4> out{};
  std::error_code ec = make_error_code(std::errc::io_error);
  EXPECT_TRUE(cq.poll(out, ec).empty());
  EXPECT_FALSE(ec) << "cleared when nothing is ready";

  stub.ready = 3;
  const std::span<Completion> got = cq.poll(out, ec);
  EXPECT_FALSE(ec);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got.data(), out.data());
  EXPECT_EQ(got[2].wr_id(), 42u);
  EXPECT_EQ(got[2].opcode(), verbs::WcOpcode::rdma_write);
  EXPECT_EQ(got[2].qp_num(), 0x123u);
  ASSERT_TRUE(cq.poll_one().has_value());
}

TEST(CompletionQueueAdopt, ProviderFailureIsAnErrorCodeOrAnException) {
  verbs_stub::Provider stub;
  CompletionQueue cq = stub.completion_queue();
  stub.poll_rc = -EIO;
  std::array<Completion, 2> out{};
  std::error_code ec;
  EXPECT_TRUE(cq.poll(out, ec).empty());
  EXPECT_EQ(ec, std::error_code(EIO, std::generic_category()));
  EXPECT_THROW((void)cq.poll(out), verbs::Error);
}

TEST(CompletionQueueAdopt, WithoutAChannelThereIsNothingToWaitOn) {
  verbs_stub::Provider stub;
  CompletionQueue cq = stub.completion_queue();
  EXPECT_FALSE(cq.has_channel());
  EXPECT_EQ(cq.fd(), -1);
  EXPECT_EQ(cq.capacity(), stub.cq.cqe);
  EXPECT_EQ(cq.consume_events(), 0);
  EXPECT_THROW(cq.req_notify(), verbs::Error);
}

TEST(CompletionQueueAdopt, TheDeleterRunsWhenTheLastOwnerGoes) {
  verbs_stub::Provider stub;
  int deleted = 0;
  auto handle = std::shared_ptr<ibv_cq>(&stub.cq, [&deleted](ibv_cq*) { ++deleted; });
  {
    CompletionQueue cq = CompletionQueue::adopt(handle);
    handle.reset();
    CompletionQueue moved = std::move(cq);
    EXPECT_EQ(deleted, 0);
    EXPECT_EQ(moved.shared_handle().use_count(), 1);
  }
  EXPECT_EQ(deleted, 1);
}

TEST(CompletionQueueAdopt, NoCqIsABadArgument) {
  const auto e = verbs::test::thrown_by([] { (void)CompletionQueue::adopt(nullptr); });
  ASSERT_TRUE(e.has_value()) << "adopted nothing";
  EXPECT_EQ(e->code(), std::error_code(verbs::Errc::bad_argument));
}

}  // namespace

// Arming reports only completions that arrive after it. One that lands between the last empty
// poll and the arm raises no event: arm_and_poll (and wait(), built on it) must return it.
struct StubWithChannel {
  verbs_stub::Provider stub;
  ibv_comp_channel channel{};
  int fds[2] = {-1, -1};
  StubWithChannel() {
    EXPECT_EQ(::pipe(fds), 0);
    channel.context = &stub.vctx.context;
    channel.fd = fds[0];  // never written: no event will ever come
    stub.cq.channel = &channel;
  }
  ~StubWithChannel() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  StubWithChannel(const StubWithChannel&) = delete;
  StubWithChannel& operator=(const StubWithChannel&) = delete;
};

TEST(CompletionQueueArm, ArmAndPollReturnsACompletionThatLandedWhileArming) {
  StubWithChannel s;
  s.stub.completion.wr_id = 7;
  s.stub.ready_on_arm = 1;
  CompletionQueue cq = s.stub.completion_queue();
  std::array<Completion, 2> out{};
  EXPECT_TRUE(cq.poll(out).empty());
  const auto got = cq.arm_and_poll(out);
  EXPECT_EQ(s.stub.armed, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id(), 7u);
}

TEST(CompletionQueueArm, WaitDoesNotSleepOnACompletionThatLandedWhileArming) {
  StubWithChannel s;
  s.stub.ready_on_arm = 1;
  CompletionQueue cq = s.stub.completion_queue();
  std::array<Completion, 2> out{};
  const auto start = std::chrono::steady_clock::now();
  const auto got = cq.wait(out, std::chrono::seconds(30));
  EXPECT_EQ(got.size(), 1u) << "the completion that raised no event was waited for";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(CompletionQueueArm, ArmAndPollWithoutAChannelIsRefused) {
  verbs_stub::Provider stub;
  CompletionQueue cq = stub.completion_queue();
  std::array<Completion, 2> out{};
  std::error_code ec;
  EXPECT_TRUE(cq.arm_and_poll(out, ec).empty());
  EXPECT_EQ(ec, verbs::Errc::bad_argument);
  EXPECT_EQ(stub.armed, 0);
  EXPECT_THROW((void)cq.arm_and_poll(out), verbs::Error);
}

TEST(CompletionQueueAdopt, MovedFromCompletionQueueRefusesToPoll) {
  verbs_stub::Provider stub;
  stub.ready = 1;
  CompletionQueue cq = stub.completion_queue();
  CompletionQueue moved(std::move(cq));
  EXPECT_FALSE(static_cast<bool>(cq));  // NOLINT(bugprone-use-after-move): what this test is about
  EXPECT_EQ(cq.native_handle(), nullptr);
  EXPECT_FALSE(cq.has_channel());
  EXPECT_EQ(cq.capacity(), 0);
  std::array<Completion, 2> out{};
  std::error_code ec;
  EXPECT_TRUE(cq.poll(out, ec).empty());
  EXPECT_EQ(ec, verbs::Errc::empty_object);
  EXPECT_THROW((void)cq.poll(out), verbs::Error);
  EXPECT_TRUE(cq.wait(out, std::chrono::milliseconds(1), ec).empty());
  EXPECT_EQ(ec, verbs::Errc::empty_object);
  EXPECT_THROW(cq.req_notify(), verbs::Error);
  EXPECT_EQ(moved.poll(out).size(), 1u);
  cq = std::move(moved);
  EXPECT_EQ(cq.poll(out).size(), 1u);
  EXPECT_EQ(moved.poll(out, ec).size(), 0u);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(ec, verbs::Errc::empty_object);
}

TEST(CompletionQueueAdopt, AdoptingMakesTheChannelNonBlocking) {
  StubWithChannel s;
  ASSERT_EQ(::fcntl(s.fds[0], F_GETFL) & O_NONBLOCK, 0);
  CompletionQueue cq = s.stub.completion_queue();
  EXPECT_NE(::fcntl(s.fds[0], F_GETFL) & O_NONBLOCK, 0) << "consume_events() would block on the channel";
  EXPECT_EQ(cq.consume_events(), 0);
}

TEST(CompletionQueueArm, WaitingForeverWaits) {
  // milliseconds::max() overflowed steady_clock's now() + timeout, and wait() returned at once.
  StubWithChannel s;
  s.stub.ready_on_arm = 1;  // the completion comes only once the wait has gone as far as arming
  CompletionQueue cq = s.stub.completion_queue();
  std::array<Completion, 2> out{};
  EXPECT_EQ(cq.wait(out, std::chrono::milliseconds::max()).size(), 1u);
  EXPECT_EQ(s.stub.armed, 1);
}

TEST(WcOpcode, NamesAreTheEnumeratorsSpelling) {
  EXPECT_EQ(verbs::to_string(verbs::WcOpcode::rdma_write), "rdma_write");
  EXPECT_EQ(verbs::to_string(verbs::WcOpcode::recv_rdma_with_imm), "recv_rdma_with_imm");
  EXPECT_EQ(verbs::to_string(verbs::WcOpcode::fetch_add), "fetch_add");
}

namespace {

// ---- The extended CQ's pass (CompletionQueue::start_poll) through ibv_start_poll, ibv_next_poll
// and ibv_end_poll, on the stub's extended CQ (rxe's CQs take ibv_poll_cq instead: last test).

ibv_wc ex_wc(std::uint64_t wr_id, ibv_wc_opcode op, std::uint32_t len, unsigned flags = 0, std::uint32_t imm_be = 0,
             ibv_wc_status status = IBV_WC_SUCCESS) {
  ibv_wc w{};
  w.wr_id = wr_id;
  w.status = status;
  w.opcode = op;
  w.byte_len = len;
  w.wc_flags = flags;
  w.imm_data = imm_be;
  w.qp_num = 0x42;
  w.src_qp = 0x77;
  w.vendor_err = status == IBV_WC_SUCCESS ? 0 : 0x99;
  return w;
}

TEST(CompletionPoll, APassReadsEachReadyCompletionWithTheFieldsAskedAndEndsOnce) {
  verbs_stub::Provider p;
  p.ex_ready = {ex_wc(1, IBV_WC_RECV, 100, IBV_WC_WITH_IMM, htonl(0xabcd)), ex_wc(2, IBV_WC_RDMA_WRITE, 0),
                ex_wc(3, IBV_WC_SEND, 0, 0, 0, IBV_WC_REM_ACCESS_ERR)};
  CompletionQueue cq = p.extended_cq(verbs::WcField::byte_len | verbs::WcField::imm);  // no qp_num
  std::vector<verbs::ExCompletion> got;
  {
    auto pass = cq.start_poll();
    for (const verbs::ExCompletion& c : pass) got.push_back(c);
    EXPECT_EQ(pass.count(), 3u);
    EXPECT_FALSE(pass.error());
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].wr_id(), 1u);
  EXPECT_EQ(got[0].opcode(), verbs::WcOpcode::recv);
  EXPECT_EQ(got[0].byte_len(), 100u);
  EXPECT_EQ(got[0].imm_data(), 0xabcdu) << "in host byte order";
  EXPECT_EQ(got[0].qp_num(), std::nullopt) << "a field the CQ was not made with";
  EXPECT_EQ(got[1].imm_data(), std::nullopt) << "no IBV_WC_WITH_IMM";
  EXPECT_EQ(got[1].opcode(), verbs::WcOpcode::rdma_write);
  EXPECT_FALSE(got[2].ok());
  EXPECT_EQ(got[2].status(), verbs::WcStatus::rem_access_err);
  EXPECT_EQ(got[2].vendor_err(), 0x99u);
  EXPECT_EQ(p.ex_starts, 1);
  EXPECT_EQ(p.ex_nexts, 3) << "two completions and the ENOENT that ends the pass";
  EXPECT_EQ(p.ex_ends, 1);
  EXPECT_EQ(p.ex_misuse, 0);
}

TEST(CompletionPoll, NothingReadyIsAnEmptyPassWithoutEndPoll) {
  verbs_stub::Provider p;
  CompletionQueue cq = p.extended_cq(verbs::WcField::qp_num);
  {
    auto pass = cq.start_poll();
    EXPECT_EQ(pass.begin(), pass.end());
    EXPECT_EQ(pass.count(), 0u);
    EXPECT_FALSE(pass.error());
  }
  EXPECT_EQ(p.ex_starts, 1);
  EXPECT_EQ(p.ex_ends, 0) << "ibv_end_poll after a start_poll that found nothing (ENOENT)";
  EXPECT_EQ(p.ex_misuse, 0);
}

TEST(CompletionPoll, AStartPollFailureIsThePassesErrorWithoutEndPoll) {
  verbs_stub::Provider p;
  p.ex_ready = {ex_wc(1, IBV_WC_SEND, 0)};
  p.ex_start_rc = EIO;
  CompletionQueue cq = p.extended_cq(verbs::WcField::qp_num);
  {
    auto pass = cq.start_poll();
    EXPECT_EQ(pass.begin(), pass.end());
    EXPECT_EQ(pass.error(), std::error_code(EIO, std::generic_category()));
  }
  EXPECT_EQ(p.ex_ends, 0);
  EXPECT_EQ(p.ex_ready.size(), 1u) << "nothing was read";
}

TEST(CompletionPoll, ANextPollFailureEndsThePassWithItsErrorAndEndPoll) {
  verbs_stub::Provider p;
  p.ex_ready = {ex_wc(1, IBV_WC_SEND, 0), ex_wc(2, IBV_WC_SEND, 0), ex_wc(3, IBV_WC_SEND, 0)};
  p.ex_fail_next = 1;  // the first next_poll of the pass
  p.ex_next_rc = EINVAL;
  CompletionQueue cq = p.extended_cq(verbs::WcField::qp_num);
  std::vector<std::uint64_t> ids;
  {
    auto pass = cq.start_poll();
    for (const verbs::ExCompletion& c : pass) ids.push_back(c.wr_id());
    EXPECT_EQ(pass.error(), std::error_code(EINVAL, std::generic_category()));
    EXPECT_EQ(p.ex_ends, 1) << "ended when the error ended it";
  }
  EXPECT_EQ(ids, std::vector<std::uint64_t>{1});
  EXPECT_EQ(p.ex_ends, 1) << "not a second time when the pass goes";
  EXPECT_EQ(p.ex_misuse, 0);
}

TEST(CompletionPoll, LeavingThePassEarlyEndsItAndTheRestWaitsForTheNext) {
  verbs_stub::Provider p;
  p.ex_ready = {ex_wc(1, IBV_WC_SEND, 0), ex_wc(2, IBV_WC_SEND, 0), ex_wc(3, IBV_WC_SEND, 0)};
  CompletionQueue cq = p.extended_cq(verbs::WcField::qp_num);
  {
    auto pass = cq.start_poll();
    for (const verbs::ExCompletion& c : pass) {
      EXPECT_EQ(c.wr_id(), 1u);
      EXPECT_EQ(c.qp_num(), 0x42u);
      break;
    }
    EXPECT_EQ(p.ex_ends, 0) << "the pass is still open";
  }
  EXPECT_EQ(p.ex_ends, 1) << "destroying the pass ends it";
  std::vector<std::uint64_t> rest;
  for (const verbs::ExCompletion& c : cq.start_poll()) rest.push_back(c.wr_id());
  EXPECT_EQ(rest, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(p.ex_ends, 2);
  EXPECT_EQ(p.ex_misuse, 0);
}

TEST(CompletionPoll, OnRxeThePassReadsThroughPollCq) {
  verbs_stub::Provider p;
  p.vendor_id = 0xffffff;  // rxe: its ibv_next_poll overruns (see CompletionQueue::start_poll)
  p.completion = ex_wc(9, IBV_WC_RECV, 64);
  p.ready = 1;  // every ibv_poll_cq gives one: the loop stops itself
  p.ex_ready = {ex_wc(1, IBV_WC_SEND, 0)};
  CompletionQueue cq = p.extended_cq(verbs::WcField::byte_len);
  int n = 0;
  for (const verbs::ExCompletion& c : cq.start_poll()) {
    EXPECT_EQ(c.wr_id(), 9u);
    EXPECT_EQ(c.byte_len(), 64u);
    if (++n == 2) break;
  }
  EXPECT_EQ(n, 2);
  EXPECT_EQ(p.ex_starts, 0);
  EXPECT_EQ(p.ex_ends, 0);
}

TEST(CompletionPoll, AdoptingAnExtendedCqNeedsItsOwnHandles) {
  verbs_stub::Provider p;
  const auto e = verbs::test::thrown_by([&] {
    (void)CompletionQueue::adopt(std::shared_ptr<ibv_cq>(&p.cq, [](ibv_cq*) {}), &p.cq_ex, verbs::WcField::qp_num);
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), verbs::Errc::bad_argument) << e->what();
  const auto none = verbs::test::thrown_by(
      [&] { (void)CompletionQueue::adopt(std::shared_ptr<ibv_cq>(ibv_cq_ex_to_cq(&p.cq_ex), [](ibv_cq*) {}), nullptr, {}); });
  ASSERT_TRUE(none);
  EXPECT_EQ(none->code(), verbs::Errc::bad_argument);
}

}  // namespace
