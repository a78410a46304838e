// verbs::rails on one host: a Target (on its own thread) and a Group whose rails all lead to it
// over the test address. What one host can show: striping over every QP with every byte checked,
// a rail taken out mid-transfer and back, every rail gone, the refusals. A wire that is cut is
// the two-host suite's (twohost.rails.*).
#include <poll.h>

#include <algorithm>
#include <cstring>

#include "rails_fixture.hpp"

namespace verbs::test {
namespace {

TEST_F(Rails, AStripedWriteAndReadOverTwoRailsOfFourQpsMoveEveryByte) {
  constexpr std::size_t size = 4 << 20;
  std::vector<std::byte> remote(size), local(size), back(size);
  fill_pattern(local, 7);
  ServedTarget target(remote);
  Group g = Group::connect(options_for(target.port(), 2, 4), 30s);
  EXPECT_EQ(g.live_rails(), 2u);
  EXPECT_EQ(g.device_count(), 1u);  // both rails on the one device: one PD, one registration
  EXPECT_EQ(g.remote_size(), size);
  const rails::Region src = g.register_memory(local);
  const rails::Region dst = g.register_memory(back);
  const auto w = finish(g, g.write(src, 0, 0, size));
  EXPECT_TRUE(w.ok()) << w.what;
  EXPECT_TRUE(same_bytes(remote, local));
  // Back, at an offset, a length that is no multiple of the chunk.
  const std::uint64_t off = 4096 + 3, len = size - 3 * 65536 - 5;
  const auto r = finish(g, g.read(dst, off, off, len));
  EXPECT_TRUE(r.ok()) << r.what;
  EXPECT_TRUE(same_bytes(std::span(back).subspan(off, len), std::span(local).subspan(off, len)));
  EXPECT_TRUE(all_bytes(std::span(back).first(off), std::byte{0}));
  EXPECT_TRUE(g.poll_rail_events().empty());
  // Both rails carried chunks: 64 of the write's and 61 of the read's 64 KiB chunks between them.
  const auto r0 = g.rail_counters(0), r1 = g.rail_counters(1);
  EXPECT_EQ(r0.chunks + r1.chunks, 64u + 61u);
  EXPECT_GE(r0.chunks, 20u);
  EXPECT_GE(r1.chunks, 20u);
  EXPECT_EQ(r0.chunks_failed + r1.chunks_failed, 0u);
}

TEST_F(Rails, ManyTransfersAtOnceEachEndOnceInPoll) {
  constexpr std::size_t size = 1 << 20, n = 16;
  std::vector<std::byte> remote(size), local(size);
  fill_pattern(local, 3);
  ServedTarget target(remote);
  Group g = Group::connect(options_for(target.port(), 2, 2), 30s);
  const rails::Region src = g.register_memory(local);
  std::vector<std::uint64_t> ids;
  for (std::size_t i = 0; i < n; ++i) ids.push_back(g.write(src, i * (size / n), i * (size / n), size / n));
  std::vector<rails::Completion> got;
  std::array<rails::Completion, 4> out;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (got.size() < n && std::chrono::steady_clock::now() < deadline)
    for (auto& c : g.poll(out)) got.push_back(std::move(c));
  ASSERT_EQ(got.size(), n);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(got[i].ok()) << got[i].what;
    EXPECT_NE(std::find(ids.begin(), ids.end(), got[i].id), ids.end());
  }
  EXPECT_TRUE(same_bytes(remote, local));
  EXPECT_THROW((void)g.wait(ids[0], 1ms), Error);  // taken already: not in progress
}

TEST_F(Rails, ARailTakenDownMidTransferEndsOnTheOtherAndComesBack) {
  constexpr std::size_t size = 8 << 20;
  std::vector<std::byte> remote(size), local(size);
  fill_pattern(local, 11);
  ServedTarget target(remote);
  Group g = Group::connect(options_for(target.port(), 2, 2), 30s);
  const rails::Region src = g.register_memory(local);
  const std::uint64_t id = g.write(src, 0, 0, size);
  g.take_down(1);
  EXPECT_EQ(g.rail_state(1), RailState::down);
  const auto c = finish(g, id);
  EXPECT_TRUE(c.ok()) << c.what;
  EXPECT_TRUE(same_bytes(remote, local));
  // 128 chunks done once each. (What rail 1 had posted has mostly completed by the time it is
  // taken down: rxe runs a loopback write inside the post call. Its flushed chunks going again
  // elsewhere is what twohost.rails.cut_one shows, and RailsSchedule on the host.)
  EXPECT_EQ(g.rail_counters(0).chunks + g.rail_counters(1).chunks, 128u);
  EXPECT_EQ(g.rail_counters(1).failures, 1u);
  std::vector<rails::RailEvent> events;
  const auto take_events = [&] {
    for (const auto& e : g.poll_rail_events()) events.push_back(e);
  };
  take_events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].rail, 1u);
  EXPECT_FALSE(events[0].up);
  EXPECT_EQ(events[0].error, std::errc::operation_canceled);
  EXPECT_NE(events[0].what.find("taken down by the caller"), std::string::npos) << events[0].what;
  // It comes back after reconnect_interval (maybe while the write above was finishing), and
  // carries chunks again.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (g.rail_state(1) != RailState::up && std::chrono::steady_clock::now() < deadline) {
    (void)g.wait(g.write(src, 0, 0, 4096), 1s);
    take_events();
  }
  EXPECT_EQ(g.rail_state(1), RailState::up);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].rail, 1u);
  EXPECT_TRUE(events[1].up);
  EXPECT_EQ(g.rail_counters(1).reconnects, 1u);
  const auto carried = g.rail_counters(1).chunks;
  EXPECT_EQ(g.live_rails(), 2u);
  std::memset(remote.data(), 0, size);
  const auto again = finish(g, g.write(src, 0, 0, size));
  EXPECT_TRUE(again.ok()) << again.what;
  EXPECT_TRUE(same_bytes(remote, local));
  EXPECT_GE(g.rail_counters(1).chunks - carried, 20u);  // back in the stripe
}

TEST_F(Rails, WhenTheTargetGoesATransferFailsSayingEveryRailIsDown) {
  constexpr std::size_t size = 32 << 20;  // still in flight when the target goes
  std::vector<std::byte> remote(size), local(size);
  std::optional<ServedTarget> target(std::in_place, remote);
  Group g = Group::connect(options_for(target->port(), 2, 2), 30s);
  const rails::Region src = g.register_memory(local);
  const std::uint64_t id = g.write(src, 0, 0, size);
  g.progress();
  target.reset();  // its connections go: each QP's DISCONNECTED, or its next request's failure
  const auto t0 = std::chrono::steady_clock::now();
  const auto c = finish(g, id, g.failure_bound() * 2 + 20s);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.error, std::errc::network_down);
  EXPECT_NE(c.what.find("every rail is down"), std::string::npos) << c.what;
  EXPECT_LT(took, g.failure_bound() * 2 + 10s);
  EXPECT_EQ(g.live_rails(), 0u);
  // A transfer started now fails at once, the same way.
  const auto late = finish(g, g.write(src, 0, 0, 4096), 5s);
  EXPECT_EQ(late.error, std::errc::network_down);
}

TEST_F(Rails, AReadTheTargetDoesNotAllowIsRefusedBeforeAnythingIsPosted) {
  std::vector<std::byte> remote(1 << 20), local(1 << 20);
  fill_pattern(local, 5);
  ServedTarget target(remote, Access::remote_write);  // writes only: its handshake says so
  Group g = Group::connect(options_for(target.port(), 2, 1), 30s);
  const rails::Region buf = g.register_memory(local);
  const auto e = thrown_by<Error>([&] { (void)g.read(buf, 0, 0, 1 << 20); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::errc::permission_denied);
  EXPECT_NE(std::string(e->what()).find("lacks remote_read"), std::string::npos) << e->what();
  EXPECT_EQ(g.live_rails(), 2u);
  const auto w = finish(g, g.write(buf, 0, 0, 1 << 20));
  EXPECT_TRUE(w.ok()) << w.what;
  EXPECT_TRUE(same_bytes(remote, local));
}

TEST_F(Rails, ARefusedRequestFailsItsTransferWithItsStatusAndTheOthersGoOn) {
  // The refused read takes the rails its chunks met down (their QPs are in ERR): the write in
  // progress beside it waits for them to come back, and ends, instead of failing with ENETDOWN.
  constexpr std::size_t size = 8 << 20;
  std::vector<std::byte> remote(size), local(size), back(1 << 20);
  fill_pattern(local, 9);
  LyingTarget target(remote);
  Group g = Group::connect(options_for(target.port(), 2, 1), 30s);
  const rails::Region src = g.register_memory(local);
  const rails::Region dst = g.register_memory(back);
  // The read first: transfers go in order, so its chunks are the ones in flight on both rails.
  const std::uint64_t r = g.read(dst, 0, 0, 1 << 20);
  const std::uint64_t w = g.write(src, 0, 0, size);
  const auto rc = finish(g, r);
  EXPECT_FALSE(rc.ok());
  EXPECT_TRUE(rc.error == WcStatus::rem_access_err || rc.error == WcStatus::rem_inv_req_err) << rc.error << " " << rc.what;
  EXPECT_NE(rc.what.find("refused"), std::string::npos) << rc.what;
  const auto wc = finish(g, w);
  EXPECT_TRUE(wc.ok()) << wc.what;
  EXPECT_TRUE(same_bytes(remote, local));
}

TEST_F(Rails, WhatCannotBeDoneIsRefusedSayingWhy) {
  std::vector<std::byte> remote(1 << 20), local(1 << 20);
  ServedTarget target(remote);
  auto o = options_for(target.port(), 1, 1);
  o.max_transfers = 2;
  Group g = Group::connect(o, 30s);
  const rails::Region src = g.register_memory(local);
  EXPECT_EQ(thrown_by<Error>([&] { (void)g.write(src, 0, 1, 1 << 20); })->code(), Errc::remote_out_of_bounds);
  EXPECT_EQ(thrown_by<Error>([&] { (void)g.write(src, 1, 0, 1 << 20); })->code(), Errc::local_out_of_bounds);
  EXPECT_EQ(thrown_by<Error>([&] { (void)g.wait(12345, 1ms); })->code(), Errc::bad_argument);
  EXPECT_EQ(thrown_by<Error>([&] { g.take_down(1); })->code(), Errc::bad_argument);
  (void)g.write(src, 0, 0, 1 << 20);
  (void)g.write(src, 0, 0, 1 << 20);
  const auto full = thrown_by<Error>([&] { (void)g.write(src, 0, 0, 4096); });
  ASSERT_TRUE(full);
  EXPECT_EQ(full->code(), std::errc::resource_unavailable_try_again);
  EXPECT_NE(std::string(full->what()).find("max_transfers"), std::string::npos) << full->what();
  Group other = Group::connect(options_for(target.port(), 1, 1), 30s);
  EXPECT_EQ(thrown_by<Error>([&] { (void)other.write(src, 0, 0, 4096); })->code(), Errc::bad_argument);
  // Options out of range, each named.
  const auto refused = [&](auto change, const char* field) {
    auto bad = options_for(target.port(), 1, 1);
    change(bad);
    const auto e = thrown_by<Error>([&] { (void)Group::connect(bad, 5s); });
    ASSERT_TRUE(e) << field;
    EXPECT_EQ(e->code(), Errc::bad_argument) << field;
    EXPECT_NE(std::string(e->what()).find(field), std::string::npos) << e->what();
  };
  refused([](GroupOptions& b) { b.qps_per_rail = 0; }, "qps_per_rail");
  refused([](GroupOptions& b) { b.rails.clear(); }, "rails");
  refused([](GroupOptions& b) { b.chunk_size = 100; }, "chunk_size");
  refused([](GroupOptions& b) { b.port = 0; }, "port");
  refused([](GroupOptions& b) { b.transport.retry_count = 7; }, "retry_count 7");
}

TEST_F(Rails, AnEventLoopSleepingOnItsFdAloneSeesARailTakenDownComeBack) {
  // fd() covers reconnections: its timer is set when take_down() schedules one.
  std::vector<std::byte> remote(1 << 20);
  ServedTarget target(remote);
  Group g = Group::connect(options_for(target.port(), 2, 1), 30s);
  g.take_down(1);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (g.rail_state(1) != RailState::up && std::chrono::steady_clock::now() < deadline) {
    pollfd p{g.fd(), POLLIN, 0};
    (void)::poll(&p, 1, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now()).count()));
    g.progress();
  }
  EXPECT_EQ(g.rail_state(1), RailState::up);
}

TEST_F(Rails, ARegionMayMoveWhileItsTransferRuns) {
  // The transfer holds the registrations, not the Region object: moving it (a vector that grows)
  // or destroying it meanwhile is fine; the memory stays the caller's to keep.
  constexpr std::size_t size = 4 << 20;
  std::vector<std::byte> remote(size), local(size);
  fill_pattern(local, 13);
  ServedTarget target(remote);
  Group g = Group::connect(options_for(target.port(), 2, 2), 30s);
  std::vector<rails::Region> regions;
  regions.push_back(g.register_memory(local));
  const std::uint64_t id = g.write(regions[0], 0, 0, size);
  for (int i = 0; i < 8; ++i) regions.push_back(g.register_memory(std::span(local).first(4096)));  // reallocates
  regions.erase(regions.begin());
  const auto c = finish(g, id);
  EXPECT_TRUE(c.ok()) << c.what;
  EXPECT_TRUE(same_bytes(remote, local));
}

TEST_F(Rails, TheTestDevicesAddressComesFromItsTopology) {
  // A rail's local address from the ranking: the device's netdevs' IPv4 addresses.
  const auto topo = device->topology();
  const auto addrs = rails::addresses_of(topo);
  EXPECT_NE(std::find(addrs.begin(), addrs.end(), test_addr()), addrs.end())
      << device->name() << "'s netdevs have no " << test_addr();
}

TEST_F(Rails, ConnectingToNoTargetFailsNamingEveryRail) {
  std::uint16_t port = 0;
  {
    std::vector<std::byte> remote(4096);
    Target t(rails::TargetOptions{.addresses = {test_addr()}}, remote, Access::remote_write);
    port = t.port();
  }
  const auto e = connect_error([&] { (void)Group::connect(options_for(port, 2, 1), 5s); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::errc::connection_refused);
  EXPECT_NE(std::string(e->what()).find("rail 0 ("), std::string::npos) << e->what();
  EXPECT_NE(std::string(e->what()).find("rail 1 ("), std::string::npos) << e->what();
}

}  // namespace
}  // namespace verbs::test
