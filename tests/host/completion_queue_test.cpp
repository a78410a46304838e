// CompletionQueue::adopt on a provider stub (stub_provider.hpp): an adopted CQ polls through
// the provider it was created by, reports its errors, and is destroyed by its own deleter.
#include <gtest/gtest.h>

#include <array>
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
