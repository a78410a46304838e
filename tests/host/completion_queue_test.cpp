// CompletionQueue::adopt on a provider stub (stub_provider.hpp): an adopted CQ polls through
// the provider it was created by, reports its errors, and is destroyed by its own deleter.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cerrno>
#include <memory>
#include <span>
#include <system_error>

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
