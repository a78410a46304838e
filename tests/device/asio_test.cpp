// verbs/asio.hpp: CQ, channel and connection waits, async_connect and async_accept, in C++20
// coroutines (asio::use_awaitable) and with other tokens (a callback, use_future); cancellation.
#include <verbs/asio.hpp>

#include <asio/experimental/as_tuple.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <array>
#include <future>
#include <thread>
#include <variant>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using namespace asio::experimental::awaitable_operators;
using verbs::Completion;
using verbs::WcOpcode;
namespace cm = verbs::cm;

std::string test_addr() {
  const char* a = std::getenv("VERBS_TEST_ADDR");
  return a != nullptr && *a != '\0' ? a : "192.0.2.1";
}

/// Runs `io` until `done` or 20 s: no test waits forever.
template <typename F>
bool run_until(asio::io_context& io, F&& done) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    io.run_for(50ms);
    if (io.stopped()) io.restart();
  }
  return done();
}

class Asio : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    src.emplace(verbs::MemoryRegion::allocate(*pd, 4096, all_access));
    dst.emplace(verbs::MemoryRegion::allocate(*pd, 4096, all_access));
    fill_pattern(src->bytes(), 5);
  }
  asio::io_context io;
  std::optional<verbs::MemoryRegion> src, dst;
};

TEST_F(Asio, ACoroutineAwaitsCompletionsReadyOrNot) {
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 64, .with_channel = true});
  verbs::asio::CqWaiter waiter(io.get_executor(), p.cq_a);
  std::vector<std::uint64_t> ids;
  bool done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    std::array<Completion, 4> wcs;
    // Not ready yet: the wait goes to sleep on the channel's fd, and the write is posted only
    // 100 ms later, by a timer.
    asio::steady_timer later(io, 100ms);
    bool posted_late = false;
    later.async_wait([&](std::error_code) {
      posted_late = p.a.post_write(src->slice(0, 64), dst->remote(), {.wr_id = 1}).ok();
    });
    for (std::size_t n = co_await waiter.async_wait(wcs, asio::use_awaitable); n > 0; n = 0)
      for (const Completion& c : std::span(wcs).first(n)) ids.push_back(c.wr_id());
    EXPECT_TRUE(posted_late) << "the wait returned before anything was posted";
    // Ready before the wait: it completes without sleeping.
    EXPECT_TRUE(p.a.post_write(src->slice(64, 64), dst->remote().slice(64), {.wr_id = 2}).ok());
    std::this_thread::sleep_for(200ms);  // (blocks the loop on purpose: the completion lands meanwhile)
    const std::size_t n = co_await waiter.async_wait(wcs, asio::use_awaitable);
    for (const Completion& c : std::span(wcs).first(n)) ids.push_back(c.wr_id());
    done = true;
  }, asio::detached);
  ASSERT_TRUE(run_until(io, [&] { return done; }));
  EXPECT_EQ(ids, (std::vector<std::uint64_t>{1, 2}));
  EXPECT_TRUE(same_bytes(dst->bytes().first(128), src->bytes().first(128)));
}

TEST_F(Asio, AWaitIsCancelledByATimerThroughItsCancellationSlot) {
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 64, .with_channel = true});
  verbs::asio::CqWaiter waiter(io.get_executor(), p.cq_a);
  std::optional<std::size_t> which;
  bool finished = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    std::array<Completion, 4> wcs;
    asio::steady_timer timer(io, 200ms);
    const auto r = co_await (waiter.async_wait(wcs, asio::use_awaitable) || timer.async_wait(asio::use_awaitable));
    which = r.index();
    // The waiter is usable again: a completion now comes through.
    EXPECT_TRUE(p.a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = 9}).ok());
    const std::size_t n = co_await waiter.async_wait(wcs, asio::use_awaitable);
    EXPECT_EQ(n, 1u);
    EXPECT_TRUE(completed(wcs[0], WcOpcode::rdma_write, 9));
    finished = true;
  }, asio::detached);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(run_until(io, [&] { return finished; }));
  ASSERT_TRUE(which.has_value());
  EXPECT_EQ(*which, 1u) << "the timer should have won";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

// A wait cancelled before it ran takes nothing, even with completions ready: `wait || timer`
// drops the loser's result, so what it had read would be lost. Cancelled at once through its
// slot, it completes with operation_aborted and the completion is the next wait's.
TEST_F(Asio, ACancelledWaitTakesNothingEvenWithCompletionsReady) {
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 64, .with_channel = true});
  verbs::asio::CqWaiter waiter(io.get_executor(), p.cq_a);
  std::array<Completion, 4> wcs;
  ASSERT_TRUE(p.a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = 77}).ok());
  std::this_thread::sleep_for(50ms);  // the completion is in the CQ
  asio::cancellation_signal cancel;
  std::optional<std::pair<std::error_code, std::size_t>> first, second;
  waiter.async_wait(wcs, asio::bind_cancellation_slot(cancel.slot(), [&](std::error_code ec, std::size_t n) {
                      first.emplace(ec, n);
                    }));
  cancel.emit(asio::cancellation_type::terminal);
  ASSERT_TRUE(run_until(io, [&] { return first.has_value(); }));
  EXPECT_EQ(first->first, asio::error::operation_aborted) << "a cancelled wait took " << first->second;
  waiter.async_wait(wcs, [&](std::error_code ec, std::size_t n) { second.emplace(ec, n); });
  ASSERT_TRUE(run_until(io, [&] { return second.has_value(); })) << "the completion was lost";
  EXPECT_FALSE(second->first);
  ASSERT_EQ(second->second, 1u);
  EXPECT_TRUE(completed(wcs[0], WcOpcode::rdma_write, 77));
}

TEST_F(Asio, AChannelWaiterSaysWhichCqFiredAndACallbackIsAToken) {
  verbs::CompletionChannel channel(*dev);
  int tag = 0;
  verbs::CompletionQueue cq(*dev, {.depth = 64, .channel = &channel, .context = &tag});
  verbs::QueuePair a(*pd, cq, {.access = all_access}), b(*pd, cq, {.access = all_access});
  a.connect(b.endpoint(), QpPair::fast());
  b.connect(a.endpoint(), QpPair::fast());
  verbs::asio::ChannelWaiter waiter(io.get_executor(), channel);
  std::array<Completion, 4> wcs;
  std::error_code ec;
  cq.drain_and_arm(wcs, [](std::span<Completion>) {}, ec);
  ASSERT_FALSE(ec);
  std::array<verbs::CqEvent, 4> events;
  std::optional<std::size_t> got;
  waiter.async_wait(events, [&](std::error_code e, std::size_t n) {
    EXPECT_FALSE(e) << e.message();
    got = n;
  });
  ASSERT_TRUE(a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = 3}).ok());
  ASSERT_TRUE(run_until(io, [&] { return got.has_value(); }));
  ASSERT_EQ(*got, 1u);
  EXPECT_TRUE(events[0].is(cq));
  EXPECT_EQ(events[0].context, &tag);
}

// A device's async events in a coroutine: the SRQ limit, raised by a send that leaves fewer
// receives than the limit.
TEST_F(Asio, ADeviceEventWaiterGivesTheSrqLimitEvent) {
  std::array<verbs::AsyncEvent, 16> stale{};
  (void)dev->poll_async_events(stale);  // whatever earlier tests left
  verbs::SharedReceiveQueue srq(*pd, {.max_wr = 16, .limit = 2});
  verbs::CompletionQueue scq(*dev), ccq(*dev);
  verbs::QueuePair client(*pd, ccq, {.access = all_access});
  verbs::QueuePair server(*pd, scq, verbs::QpOptions{.srq = &srq, .access = all_access});
  client.connect(server.endpoint(), QpPair::fast());
  server.connect(client.endpoint(), QpPair::fast());
  for (std::uint64_t i = 0; i < 2; ++i) ASSERT_TRUE(srq.post_recv(dst->slice(i * 64, 64), i).ok());
  verbs::asio::DeviceEventWaiter waiter(io.get_executor(), *dev);
  std::array<verbs::AsyncEvent, 8> events{};
  std::optional<verbs::AsyncEvent> limit;
  bool done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(client.post_send(src->slice(0, 16), {.wr_id = 1}).ok());  // 1 receive left: below 2
    while (!limit) {
      const std::size_t n = co_await waiter.async_wait(events, asio::use_awaitable);
      for (const verbs::AsyncEvent& e : std::span(events).first(n))
        if (e.type == IBV_EVENT_SRQ_LIMIT_REACHED) limit = e;
    }
    done = true;
  }, asio::detached);
  ASSERT_TRUE(run_until(io, [&] { return done; })) << "no SRQ_LIMIT_REACHED within 20 s";
  EXPECT_TRUE(limit->concerns(srq));
}

TEST_F(Asio, AsyncAcceptAndConnectInCoroutinesThenAMessageAndTheGoodbye) {
  cm::Listener listener(test_addr(), 0);
  std::optional<cm::Connection> server, client;
  bool closed_seen = false, server_done = false;
  std::vector<std::byte> got;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    std::optional<verbs::MemoryRegion> in;
    // Options as named variables: g++ 12 destroys a temporary with a destructor in a co_await
    // expression wrongly (a double free; GCC bug 100611).
    const cm::ConnectionOptions options{.before_handshake = [&](const cm::Handshake& h) {
      in.emplace(verbs::MemoryRegion::allocate(h.pd, 64, verbs::Access::local_write));
      h.qp.post_recv(in->slice(0, 64), 1).check();
    }};
    server = co_await verbs::asio::async_accept(io.get_executor(), listener, options, asio::use_awaitable);
    verbs::asio::CqWaiter rx(io.get_executor(), server->recv_cq());
    std::array<Completion, 2> wcs;
    const std::size_t n = co_await rx.async_wait(wcs, asio::use_awaitable);
    EXPECT_EQ(n, 1u);
    EXPECT_TRUE(wcs[0].ok());
    got.assign(in->bytes().begin(), in->bytes().begin() + wcs[0].byte_len());
    verbs::asio::ConnectionWaiter watch(io.get_executor(), *server);
    co_await watch.async_wait_closed(asio::use_awaitable);
    closed_seen = true;
    server_done = true;
  }, asio::detached);
  bool client_done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    const cm::ClientOptions options{.timeout = 10s};
    const std::string host = test_addr();
    client = co_await verbs::asio::async_connect(io.get_executor(), host, listener.port(), options, asio::use_awaitable);
    auto out = verbs::MemoryRegion::allocate(client->pd(), 64, verbs::Access::local_write);
    std::memcpy(out.data(), "hello, asio", 12);
    client->qp().post_send(out.slice(0, 12)).check();
    verbs::asio::CqWaiter tx(io.get_executor(), client->send_cq());
    std::array<Completion, 2> wcs;
    EXPECT_EQ(co_await tx.async_wait(wcs, asio::use_awaitable), 1u);
    EXPECT_TRUE(wcs[0].ok());
    client->disconnect();
    client_done = true;
  }, asio::detached);
  ASSERT_TRUE(run_until(io, [&] { return server_done && client_done; }));
  EXPECT_TRUE(closed_seen);
  ASSERT_EQ(got.size(), 12u);
  EXPECT_EQ(std::memcmp(got.data(), "hello, asio", 12), 0);
}

TEST_F(Asio, AsyncConnectToNoListenerFailsWithItsErrorAndUseFutureIsAToken) {
  std::uint16_t port = 0;
  {
    cm::Listener probe(test_addr(), 0);
    port = probe.port();
  }
  std::future<std::optional<cm::Connection>> f =
      verbs::asio::async_connect(io.get_executor(), test_addr(), port, {.timeout = 10s}, asio::use_future);
  ASSERT_TRUE(run_until(io, [&] { return f.wait_for(0s) == std::future_status::ready; }));
  try {
    (void)f.get();
    ADD_FAILURE() << "connected to no listener";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::errc::connection_refused) << e.what();
  }
}

// A listener that never answers: the connect phase ends at ClientOptions::timeout, by the
// operation's own timer (nothing else comes).
TEST_F(Asio, AsyncConnectToAServerThatNeverAnswersFailsAtItsTimeout) {
  cm::Listener listener(test_addr(), 0);  // requests queue; nobody accepts
  std::optional<std::error_code> ec;
  const auto t0 = std::chrono::steady_clock::now();
  const cm::ClientOptions options{.timeout = 2s};
  verbs::asio::async_connect(io.get_executor(), test_addr(), listener.port(), options,
                             [&](std::error_code e, std::optional<cm::Connection> c) {
                               EXPECT_FALSE(c.has_value());
                               ec = e;
                             });
  ASSERT_TRUE(run_until(io, [&] { return ec.has_value(); }));
  EXPECT_EQ(*ec, std::errc::timed_out) << ec->message();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 1900ms);
  EXPECT_LT(took, 5s);
}

TEST_F(Asio, AsyncConnectToASilentAddressFailsAtItsDeadline) {
  std::string addr = test_addr();
  addr = addr.substr(0, addr.rfind('.')) + ".77";
  std::optional<std::error_code> ec;
  const auto t0 = std::chrono::steady_clock::now();
  verbs::asio::async_connect(io.get_executor(), addr, 7471, {.timeout = 3s, .resolve_timeout = 1s},
                             [&](std::error_code e, std::optional<cm::Connection> c) {
                               EXPECT_FALSE(c.has_value());
                               ec = e;
                             });
  ASSERT_TRUE(run_until(io, [&] { return ec.has_value(); }));
  EXPECT_TRUE(*ec == std::errc::timed_out || *ec == std::errc::host_unreachable) << ec->message();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 5s);
}


// ---- deadlines: every wait takes one, and nothing needs a timer raced by hand ----

// A CQ wait with a timeout ends timed_out when nothing comes, and the waiter goes on: the next
// wait takes the completion. A deadline already past still hands over what is ready.
TEST_F(Asio, ACqWaitWithATimeoutEndsTimedOutAndTheWaiterGoesOn) {
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 64, .with_channel = true});
  verbs::asio::CqWaiter waiter(io.get_executor(), p.cq_a);
  bool done = false;
  std::chrono::steady_clock::duration took{};
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    std::array<Completion, 4> wcs;
    const auto t0 = std::chrono::steady_clock::now();
    const auto [ec, n] = co_await waiter.async_wait(wcs, 300ms, asio::experimental::as_tuple(asio::use_awaitable));
    took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(ec, std::errc::timed_out) << ec.message();
    EXPECT_EQ(n, 0u);
    EXPECT_TRUE(p.a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = 5}).ok());
    std::this_thread::sleep_for(100ms);  // the completion is in the CQ before the next wait
    const std::size_t got = co_await waiter.async_wait(wcs, std::chrono::steady_clock::now() - 1s, asio::use_awaitable);
    EXPECT_EQ(got, 1u) << "a deadline already past hands over what is ready";
    EXPECT_TRUE(completed(wcs[0], WcOpcode::rdma_write, 5));
    // And a wait that is woken before its deadline completes with what woke it.
    asio::steady_timer later(io, 100ms);
    later.async_wait([&](std::error_code) { (void)p.a.post_write(src->slice(8, 8), dst->remote().slice(8), {.wr_id = 6}); });
    EXPECT_EQ(co_await waiter.async_wait(wcs, 10s, asio::use_awaitable), 1u);
    EXPECT_TRUE(completed(wcs[0], WcOpcode::rdma_write, 6));
    done = true;
  }, asio::detached);
  ASSERT_TRUE(run_until(io, [&] { return done; }));
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 5s);
}

// The channel, device-event and connection waits end timed_out too; a connection whose wait
// timed out is still up, and a later wait sees its end.
TEST_F(Asio, ChannelDeviceAndConnectionWaitsEndTimedOutAtTheirDeadline) {
  verbs::CompletionChannel channel(*dev);
  verbs::CompletionQueue cq(*dev, {.depth = 64, .channel = &channel});
  verbs::asio::ChannelWaiter channel_waiter(io.get_executor(), channel);
  verbs::asio::DeviceEventWaiter device_waiter(io.get_executor(), *dev);
  cm::Listener listener(test_addr(), 0);
  std::optional<cm::Connection> server;
  std::thread accepting([&] { server.emplace(listener.accept(10s)); });
  cm::Connection client = cm::connect(test_addr(), listener.port(), {.timeout = 10s});
  accepting.join();
  ASSERT_TRUE(server.has_value());
  verbs::asio::ConnectionWaiter connection_waiter(io.get_executor(), *server);
  bool done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    std::array<verbs::CqEvent, 4> events;
    std::array<verbs::AsyncEvent, 4> async_events;
    const auto [e1, n1] = co_await channel_waiter.async_wait(events, 200ms, asio::experimental::as_tuple(asio::use_awaitable));
    EXPECT_EQ(e1, std::errc::timed_out) << e1.message();
    EXPECT_EQ(n1, 0u);
    const auto deadline = std::chrono::steady_clock::now() + 200ms;
    const auto [e2, n2] = co_await device_waiter.async_wait(async_events, deadline, asio::experimental::as_tuple(asio::use_awaitable));
    EXPECT_EQ(e2, std::errc::timed_out) << e2.message();
    EXPECT_GE(std::chrono::steady_clock::now(), deadline);
    const auto [e3] = co_await connection_waiter.async_wait_closed(200ms, asio::experimental::as_tuple(asio::use_awaitable));
    EXPECT_EQ(e3, std::errc::timed_out) << e3.message();
    EXPECT_TRUE(server->connected()) << "a wait that timed out ends nothing";
    client.disconnect();
    const auto [e4] = co_await connection_waiter.async_wait_closed(10s, asio::experimental::as_tuple(asio::use_awaitable));
    EXPECT_FALSE(e4) << e4.message();
    done = true;
  }, asio::detached);
  ASSERT_TRUE(run_until(io, [&] { return done; }));
}

// A waiter is one fd and one timer: copying it would share them between two waits.
static_assert(!std::is_copy_constructible_v<verbs::asio::CqWaiter> && std::is_nothrow_move_constructible_v<verbs::asio::CqWaiter>);
static_assert(!std::is_copy_assignable_v<verbs::asio::ChannelWaiter> && std::is_move_assignable_v<verbs::asio::ChannelWaiter>);
static_assert(!std::is_copy_constructible_v<verbs::asio::ConnectionWaiter>);
static_assert(!std::is_copy_constructible_v<verbs::asio::DeviceEventWaiter>);

// Every way to end a wait ends it, whether it sleeps on the fd or its first step is still
// queued: cancel() at once, the slot with a deadline set (cancelled, not timed out), the waiter
// destroyed (the operation holds the fd, which would otherwise sleep on); a timeout too long for
// the clock is no deadline, not one in the past; and an expiry from a wait that has ended does
// not end the next.
TEST_F(Asio, EveryWayToEndAWaitEndsItAndHugeTimeoutsAreNone) {
  QpPair p(*dev, *pd, {.access = all_access}, QpPair::fast(), {.depth = 64, .with_channel = true});
  std::array<Completion, 4> wcs;
  using Result = std::optional<std::pair<std::error_code, std::size_t>>;
  const auto keep = [](Result& r) { return [&r](std::error_code ec, std::size_t n) { r.emplace(ec, n); }; };
  {  // cancel() right after the initiation
    verbs::asio::CqWaiter waiter(io.get_executor(), p.cq_a);
    Result r;
    waiter.async_wait(wcs, keep(r));
    waiter.cancel();
    ASSERT_TRUE(run_until(io, [&] { return r.has_value(); })) << "cancel() before the wait slept was lost";
    EXPECT_EQ(r->first, asio::error::operation_aborted) << r->first.message();
  }
  {  // the slot, with a deadline set: cancelled, not timed out
    verbs::asio::CqWaiter waiter(io.get_executor(), p.cq_a);
    Result r;
    asio::cancellation_signal cancel;
    waiter.async_wait(wcs, 10s, asio::bind_cancellation_slot(cancel.slot(), keep(r)));
    io.run_for(100ms);
    cancel.emit(asio::cancellation_type::terminal);
    ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
    EXPECT_EQ(r->first, asio::error::operation_aborted) << r->first.message();
  }
  {  // the waiter destroyed while its wait sleeps, and while its first step is queued
    Result sleeping, queued;
    {
      verbs::asio::CqWaiter waiter(io.get_executor(), p.cq_a);
      waiter.async_wait(wcs, keep(sleeping));
      io.run_for(100ms);
    }
    ASSERT_TRUE(run_until(io, [&] { return sleeping.has_value(); })) << "a wait outlived its waiter";
    EXPECT_EQ(sleeping->first, asio::error::operation_aborted);
    {
      verbs::asio::CqWaiter waiter(io.get_executor(), p.cq_a);
      waiter.async_wait(wcs, keep(queued));
    }
    ASSERT_TRUE(run_until(io, [&] { return queued.has_value(); }));
    EXPECT_EQ(queued->first, asio::error::operation_aborted);
    io.restart();
    EXPECT_EQ(io.run_for(1s), 0u) << "work left behind: a destroyed waiter's operation is still pending";
  }
  verbs::asio::CqWaiter waiter(io.get_executor(), p.cq_a);
  for (const auto timeout : {std::chrono::nanoseconds::max(), std::chrono::duration_cast<std::chrono::nanoseconds>(24h)}) {
    Result r;
    asio::steady_timer later(io, 200ms);
    later.async_wait([&](std::error_code) { (void)p.a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = 1}); });
    waiter.async_wait(wcs, timeout, keep(r));
    ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
    EXPECT_FALSE(r->first) << r->first.message();
    EXPECT_EQ(r->second, 1u);
  }
  const auto huge_is_none = [&](auto huge) {  // more than nanoseconds hold
    Result r;
    asio::steady_timer later(io, 200ms);
    later.async_wait([&](std::error_code) { (void)p.a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = 2}); });
    waiter.async_wait(wcs, huge, keep(r));
    ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
    EXPECT_FALSE(r->first) << "a timeout of " << huge.count() << " units timed out: " << r->first.message();
  };
  huge_is_none(std::chrono::seconds::max());
  huge_is_none(std::chrono::hours::max() / 2);
  {  // a past deadline with a completion ready, then a wait whose completion comes 300 ms later
    ASSERT_TRUE(p.a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = 3}).ok());
    std::this_thread::sleep_for(100ms);
    Result first, second;
    waiter.async_wait(wcs, std::chrono::steady_clock::now() - 1s, keep(first));
    ASSERT_TRUE(run_until(io, [&] { return first.has_value(); }));
    EXPECT_EQ(first->second, 1u);
    asio::steady_timer later(io, 300ms);
    later.async_wait([&](std::error_code) { (void)p.a.post_write(src->slice(0, 8), dst->remote(), {.wr_id = 4}); });
    waiter.async_wait(wcs, 10s, keep(second));
    ASSERT_TRUE(run_until(io, [&] { return second.has_value(); }));
    EXPECT_FALSE(second->first) << "the first wait's expiry ended the second: " << second->first.message();
    EXPECT_EQ(second->second, 1u);
  }
}

// async_accept with a deadline and no client ends timed_out, consuming nothing: the request of a
// client that comes later is the next accept's.
TEST_F(Asio, AsyncAcceptWithADeadlineEndsTimedOutAndTheNextAcceptTakesTheLaterClient) {
  cm::Listener listener(test_addr(), 0);
  bool done = false;
  std::optional<cm::Connection> server, client;
  std::chrono::steady_clock::duration took{};
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    const cm::ConnectionOptions options{};
    const auto t0 = std::chrono::steady_clock::now();
    auto [ec, c] = co_await verbs::asio::async_accept(io.get_executor(), listener, options, 300ms,
                                                      asio::experimental::as_tuple(asio::use_awaitable));
    took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(ec, std::errc::timed_out) << ec.message();
    EXPECT_FALSE(c.has_value());
    const cm::ClientOptions client_options{.timeout = 10s};
    const std::string host = test_addr();
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      client = co_await verbs::asio::async_connect(io.get_executor(), host, listener.port(), client_options,
                                                   asio::use_awaitable);
    }, asio::detached);
    server = co_await verbs::asio::async_accept(io.get_executor(), listener, options, 10s, asio::use_awaitable);
    done = true;
  }, asio::detached);
  ASSERT_TRUE(run_until(io, [&] { return done && client.has_value(); }));
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 5s);
  EXPECT_TRUE(server->connected());
}

/// The verbs::Error (bad_argument) `f` threw, its message; empty when it threw none.
template <typename F>
std::optional<std::string> refusal(F&& f) {
  try {
    f();
  } catch (const verbs::Error& e) {
    EXPECT_EQ(e.code(), verbs::Errc::bad_argument) << e.what();
    return e.what();
  }
  return std::nullopt;
}

// The helpers watch one object's fd. An object on an EventChannel has none of its own (the
// channel's is every object's, readable for others' news too): they refuse it at once, saying
// why, where they used to busy-loop at 100% CPU on the shared fd.
TEST_F(Asio, TheHelpersRefuseAnObjectOnAnEventChannelSayingWhy) {
  cm::EventChannel channel;
  cm::Listener shared(test_addr(), 0, {.channel = channel.key(0)});
  const auto accept = refusal([&] {
    verbs::asio::async_accept(io.get_executor(), shared, {}, [](std::error_code, std::optional<cm::Connection>) {});
  });
  ASSERT_TRUE(accept) << "async_accept took a listener on an EventChannel";
  EXPECT_NE(accept->find("EventChannel"), std::string::npos) << *accept;

  cm::Listener own(test_addr(), 0);
  cm::ClientOptions options{.timeout = 10s};
  options.connection.channel = channel.key(0);
  const auto connect = refusal([&] {
    verbs::asio::async_connect(io.get_executor(), test_addr(), own.port(), options,
                               [](std::error_code, std::optional<cm::Connection>) {});
  });
  ASSERT_TRUE(connect) << "async_connect took a connection on an EventChannel";

  auto accepted = std::async(std::launch::async, [&] { return own.accept(10s); });
  cm::Connection conn = cm::connect(test_addr(), own.port(), options);
  cm::Connection peer = accepted.get();
  const auto waiter = refusal([&] { verbs::asio::ConnectionWaiter w(io.get_executor(), conn); });
  ASSERT_TRUE(waiter) << "ConnectionWaiter took a connection on an EventChannel";
}

}  // namespace
