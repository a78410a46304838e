// Async events on a real device (Device::async_fd, poll_async_events, AsyncEvent::concerns):
// each event SoftRoCE can be made to raise, and a probe of those it cannot (docs/async-events.md
// lists them and how that was established).
#include <poll.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"


namespace {

using namespace verbs::test;
using verbs::AsyncEvent;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

/// Waits up to `timeout` for an event of `type` on `dev`, through async_fd() and
/// poll_async_events() as an event loop would; the events seen before it go to `others`.
std::optional<AsyncEvent> await_event(const verbs::Device& dev, ibv_event_type type, std::chrono::milliseconds timeout,
                                      std::vector<AsyncEvent>* others = nullptr) {
  const auto deadline = Clock::now() + timeout;
  std::array<AsyncEvent, 8> out{};
  for (;;) {
    for (const AsyncEvent& e : dev.poll_async_events(out)) {
      if (e.type == type) return e;
      if (others != nullptr) others->push_back(e);
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return std::nullopt;
    pollfd p{dev.async_fd(), POLLIN, 0};
    (void)::poll(&p, 1, static_cast<int>(left));
  }
}

std::string names(const std::vector<AsyncEvent>& events) {
  std::string s;
  for (const AsyncEvent& e : events) s += std::string(s.empty() ? "" : ", ") + std::string(e.type_name());
  return s.empty() ? "none" : s;
}

class AsyncEvents : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    std::array<AsyncEvent, 64> out{};
    (void)dev->poll_async_events(out);  // whatever earlier tests left
  }
};

// SRQ_LIMIT_REACHED names its SRQ (and no other), through the fd an event loop polls.
TEST_F(AsyncEvents, SrqLimitReachedConcernsItsSrq) {
  int marker = 0;
  verbs::SharedReceiveQueue srq(*pd, {.max_wr = 16, .limit = 2, .context = &marker});
  const verbs::SharedReceiveQueue other(*pd, {.max_wr = 16});
  QpPair p(*dev, *pd, {.access = all_access});
  verbs::CompletionQueue scq(*dev);
  verbs::QueuePair server(*pd, scq, verbs::QpOptions{.srq = &srq, .access = all_access});
  p.a.reset();
  p.a.connect(server.endpoint(), QpPair::fast());
  server.connect(p.a.endpoint(), QpPair::fast());
  auto buf = verbs::MemoryRegion::allocate(*pd, 4096, all_access);
  for (std::uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(posted(srq.post_recv(buf.slice(i * 64, 64), i)));
  ASSERT_TRUE(posted(p.a.post_send(buf.slice(2048, 16), {.wr_id = 1})));
  (void)collect(scq, 1);
  const auto t0 = Clock::now();
  ASSERT_TRUE(posted(p.a.post_send(buf.slice(2048, 16), {.wr_id = 2})));  // 1 left: below 2
  std::vector<AsyncEvent> before;
  const auto ev = await_event(*dev, IBV_EVENT_SRQ_LIMIT_REACHED, 5s, &before);
  ASSERT_TRUE(ev) << "no SRQ_LIMIT_REACHED within 5 s (seen: " << names(before) << ")";
  std::printf("SRQ_LIMIT_REACHED %.2f ms after the send that crossed the limit was posted\n", ms_since(t0));
  EXPECT_TRUE(ev->is_srq_event());
  EXPECT_FALSE(ev->is_fatal());
  EXPECT_TRUE(ev->concerns(srq));
  EXPECT_FALSE(ev->concerns(other));
  EXPECT_FALSE(ev->concerns(server));
  EXPECT_EQ(ev->context(), &marker);
}

// A CQ that overruns raises CQ_ERR for that CQ (rxe: the QP stays RTS, completions are lost).
TEST_F(AsyncEvents, CqOverrunRaisesCqErrForThatCq) {
  verbs::CompletionQueue small(*dev, {.depth = 1});
  verbs::CompletionQueue big(*dev, {.depth = 1024});
  const int cqe = small.native_handle()->cqe;
  verbs::QueuePair a(*pd, small, big, verbs::QpOptions{.max_send_wr = 256, .access = all_access});
  verbs::QueuePair b(*pd, big, verbs::QpOptions{.access = all_access});
  a.connect(b.endpoint(), QpPair::fast());
  b.connect(a.endpoint(), QpPair::fast());
  auto buf = verbs::MemoryRegion::allocate(*pd, 4096, all_access);
  const auto t0 = Clock::now();
  for (int i = 0; i < cqe + 4; ++i)
    ASSERT_TRUE(posted(a.post_write(buf.slice(0, 8), buf.remote().slice(64, 8), {.wr_id = std::uint64_t(i), .signaled = true})));
  std::vector<AsyncEvent> before;
  const auto ev = await_event(*dev, IBV_EVENT_CQ_ERR, 5s, &before);
  ASSERT_TRUE(ev) << "no CQ_ERR within 5 s after " << cqe + 4 << " completions into a CQ of " << cqe
                  << " (seen: " << names(before) << ")";
  std::printf("CQ_ERR %.2f ms after posting %d signaled writes into a CQ of %d\n", ms_since(t0), cqe + 4, cqe);
  EXPECT_TRUE(ev->is_cq_event());
  EXPECT_TRUE(ev->is_fatal());
  EXPECT_TRUE(ev->concerns(small));
  EXPECT_FALSE(ev->concerns(big));
  EXPECT_FALSE(ev->concerns(a));
}

/// Whether this rxe raises QP_LAST_WQE_REACHED: rxe of Linux 6.1 does not, even after a packet
/// reaches the QP (docs/async-events.md); 6.12 does (measured for issue 28).
bool rxe_raises_last_wqe_reached(const verbs::Device&) { return linux_at_least(6, 12); }

// A QP on an SRQ that goes to ERR raises LAST_WQE_REACHED (IB spec o10-37): the consumer may
// then destroy it, knowing the SRQ holds no WQE of it any more.
TEST_F(AsyncEvents, AnSrqQpGoingToErrRaisesLastWqeReached) {
  verbs::SharedReceiveQueue srq(*pd, {.max_wr = 16});
  verbs::CompletionQueue scq(*dev);
  QpPair p(*dev, *pd, {.access = all_access});
  verbs::QueuePair server(*pd, scq, verbs::QpOptions{.srq = &srq, .access = all_access});
  p.a.reset();
  p.a.connect(server.endpoint(), QpPair::fast());
  server.connect(p.a.endpoint(), QpPair::fast());
  auto buf = verbs::MemoryRegion::allocate(*pd, 4096, all_access);
  for (std::uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(posted(srq.post_recv(buf.slice(i * 64, 64), i)));
  ASSERT_TRUE(posted(p.a.post_send(buf.slice(2048, 16), {.wr_id = 1})));
  (void)collect(scq, 1);
  const auto t0 = Clock::now();
  server.to_error();
  std::vector<AsyncEvent> before;
  auto ev = await_event(*dev, IBV_EVENT_QP_LAST_WQE_REACHED, 2s, &before);
  if (!ev) {
    // rxe may raise it only when a packet reaches the QP in ERR (its responder runs then).
    (void)p.a.post_send(buf.slice(2048, 16), {.wr_id = 2});
    ev = await_event(*dev, IBV_EVENT_QP_LAST_WQE_REACHED, 2s, &before);
  }
  if (is_rxe(*dev) && !rxe_raises_last_wqe_reached(*dev)) {
    // What rxe of Linux 6.1 does, asserted so that a kernel that changes it is noticed.
    EXPECT_FALSE(ev) << platform(*dev) << " raised QP_LAST_WQE_REACHED, which rxe of Linux 6.1 did not: "
                     << "add this kernel to rxe_raises_last_wqe_reached()";
    return;
  }
  ASSERT_TRUE(ev) << "no QP_LAST_WQE_REACHED within 4 s (seen: " << names(before) << ")";
  std::printf("QP_LAST_WQE_REACHED %.2f ms after to_error()\n", ms_since(t0));
  EXPECT_TRUE(ev->is_qp_event());
  EXPECT_FALSE(ev->is_fatal());
  EXPECT_TRUE(ev->concerns(server));
  EXPECT_EQ(ev->qp_num(), server.qp_num());
  EXPECT_FALSE(ev->concerns(p.a));
}

// The responder's side of a remote access error and of an invalid request: the IB spec gives
// the responder's QP QP_ACCESS_ERR ("local access violation work queue error") and QP_REQ_ERR
// ("invalid request local work queue error"). rxe raises fewer, by kernel (below).
TEST_F(AsyncEvents, ResponderErrorsRaiseQpAccessErrAndQpReqErr) {
  struct Case {
    const char* what;
    verbs::AccessFlags responder_access;
    bool bad_rkey;
    ibv_event_type expected;
  };
  const Case cases[] = {
      {"write with a wrong rkey", all_access, true, IBV_EVENT_QP_ACCESS_ERR},
      {"write to a QP without remote write", verbs::Access::local_write, false, IBV_EVENT_QP_REQ_ERR},
  };
  std::string missing, raised;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    verbs::CompletionQueue cq(*dev);
    verbs::QueuePair a(*pd, cq, verbs::QpOptions{.access = all_access});
    verbs::QueuePair b(*pd, cq, verbs::QpOptions{.access = c.responder_access});
    a.connect(b.endpoint(), QpPair::fast());
    b.connect(a.endpoint(), QpPair::fast());
    auto buf = verbs::MemoryRegion::allocate(*pd, 4096, all_access);
    verbs::RemoteSlice target = buf.remote().slice(64, 8);
    if (c.bad_rkey) target.rkey ^= 0x5a5a00;
    ASSERT_TRUE(posted(a.post_write(buf.slice(0, 8), target, {.wr_id = 1, .signaled = true})));
    const verbs::Completion wc = expect_completion(cq, 5s);
    EXPECT_FALSE(wc.ok()) << describe(wc);
    std::vector<AsyncEvent> seen;
    const auto ev = await_event(*dev, c.expected, 1s, &seen);
    if (ev) raised += std::string(raised.empty() ? "" : ", ") + std::string(ev->type_name());
    if (!ev) {
      missing += std::string(missing.empty() ? "" : "; ") + std::string(AsyncEvent{.type = c.expected}.type_name()) +
                 " for a " + c.what + " (completion " + describe(wc) + "; events: " + names(seen) + ")";
      continue;
    }
    EXPECT_TRUE(ev->is_fatal());
    EXPECT_TRUE(ev->concerns(b)) << "the responder's QP";
    EXPECT_FALSE(ev->concerns(a));
  }
  if (is_rxe(*dev)) {
    // What rxe raises, by kernel (asserted, so that a kernel that changes it is noticed): neither
    // up to Linux 6.12 (the responder's QP just goes to ERR; docs/async-events.md); on 7.2
    // QP_ACCESS_ERR for the wrong rkey, still no QP_REQ_ERR for the write the QP's rights refuse.
    const std::string expected = linux_at_least(7, 0) ? "QP_ACCESS_ERR" : "";
    EXPECT_EQ(raised, expected) << platform(*dev) << " raised [" << raised << "]";
    return;
  }
  EXPECT_TRUE(missing.empty()) << missing;
}

/// The netdev under an rxe device (sysfs parent), empty for another device.
std::string parent_netdev(const std::string& dev) {
  std::ifstream f("/sys/class/infiniband/" + dev + "/parent");
  std::string n;
  std::getline(f, n);
  return n;
}

bool in_rxe_vm() {
  char host[64] = {};
  (void)::gethostname(host, sizeof host - 1);
  return std::string(host) == "rxe-vm" && ::access("/run/rxe-vm", F_OK) == 0;
}

/// Brings `netdev` up again when it goes, and waits for the port and its GID (as scripts/rxe-vm
/// made them), even when the test failed: the tests after it need the device.
struct LinkRestorer {
  const verbs::Device& dev;
  std::string netdev;
  ~LinkRestorer() {
    const std::string up = "ip link set " + netdev + " up";
    if (std::system(up.c_str()) != 0) ADD_FAILURE() << up << " failed";
    const auto deadline = Clock::now() + 30s;
    for (;;) {
      try {
        if (dev.port().active() && !dev.choose_gid().entry.gid.is_zero()) return;
      } catch (const verbs::Error&) {
      }
      if (Clock::now() >= deadline) {
        ADD_FAILURE() << "port 1 of " << dev.name() << " not active with a GID 30 s after " << up;
        return;
      }
      std::this_thread::sleep_for(50ms);
    }
  }
};

// PORT_ERR when the netdev under the port goes down, PORT_ACTIVE when it comes up (rxe: from
// the netdev's events). Only in the scripts/rxe-vm VM: it takes the test device's link down.
TEST_F(AsyncEvents, LinkDownRaisesPortErrAndLinkUpPortActive) {
  if (!in_rxe_vm()) GTEST_SKIP() << "takes the device's netdev down: runs only in the scripts/rxe-vm VM";
  const std::string netdev = parent_netdev(dev->name());
  if (netdev.empty()) GTEST_SKIP() << dev->name() << " has no parent netdev (not rxe)";
  ASSERT_TRUE(dev->port().active());
  std::vector<AsyncEvent> seen;
  {
    const LinkRestorer restore{*dev, netdev};
    const auto t0 = Clock::now();
    ASSERT_EQ(std::system(("ip link set " + netdev + " down").c_str()), 0);
    const auto down = await_event(*dev, IBV_EVENT_PORT_ERR, 5s, &seen);
    ASSERT_TRUE(down) << "no PORT_ERR within 5 s of ip link set " << netdev << " down (seen: " << names(seen) << ")";
    std::printf("PORT_ERR %.2f ms after ip link set %s down\n", ms_since(t0), netdev.c_str());
    EXPECT_TRUE(down->is_port_event());
    EXPECT_EQ(down->port(), 1);
    EXPECT_FALSE(down->is_fatal());
    EXPECT_FALSE(dev->port().active());
    const auto t1 = Clock::now();
    ASSERT_EQ(std::system(("ip link set " + netdev + " up").c_str()), 0);
    const auto up = await_event(*dev, IBV_EVENT_PORT_ACTIVE, 5s, &seen);
    ASSERT_TRUE(up) << "no PORT_ACTIVE within 5 s of ip link set " << netdev << " up (seen: " << names(seen) << ")";
    std::printf("PORT_ACTIVE %.2f ms after ip link set %s up\n", ms_since(t1), netdev.c_str());
    EXPECT_EQ(up->port(), 1);
  }
  std::array<AsyncEvent, 16> rest{};
  for (const AsyncEvent& e : dev->poll_async_events(rest)) seen.push_back(e);
  std::printf("other events meanwhile: %s\n", names(seen).c_str());
}

}  // namespace
