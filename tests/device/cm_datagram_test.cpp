// verbs::cm::Datagram on a real device: UD through rdma_cm (a SIDR request answered by a
// listening Datagram, then traffic both ways), multicast (join, send, receive, leave), the
// failures each names, the rdma_cm options set before binding, and the same without blocking
// (start_resolve, start_join) driven by poll(2) from one thread.
#include <poll.h>

#include <cstring>
#include <future>
#include <string>
#include <thread>

#include <verbs/cm.hpp>
#include <verbs/cm_datagram.hpp>

#include "cm_fixture.hpp"

namespace verbs::test {
namespace {

using cm::ConnectError;
using cm::Datagram;
using cm::Phase;

constexpr std::size_t kGrh = 40;

std::string text_of(std::span<const std::byte> b, std::size_t n) {
  return {reinterpret_cast<const char*>(b.data()), std::min(n, b.size())};  // NOLINT
}

/// The code of the ConnectError `f` threw; an empty code (and so a failed comparison, not a
/// crash) when it threw none.
template <typename F>
std::error_code code_of(F&& f) {
  const auto e = connect_error(std::forward<F>(f));
  return e ? e->code() : std::error_code{};
}

using CmDatagram = CmFixture;

TEST_F(CmDatagram, ResolveGetsTheListenersQpAndTrafficFlowsBothWays) {
  Datagram server(test_addr(), 0);
  server.listen();
  auto sbuf = MemoryRegion::allocate(server.pd(), 4096, Access::local_write);
  ASSERT_TRUE(posted(server.qp().post_recv(sbuf.slice(0, kGrh + 256), 1)));

  Datagram client(test_addr(), 0);
  auto cbuf = MemoryRegion::allocate(client.pd(), 4096, Access::local_write);
  ASSERT_TRUE(posted(client.qp().post_recv(cbuf.slice(0, kGrh + 256), 2)));

  const auto hi = bytes_of("hello, server");
  auto answered = std::async(std::launch::async, [&] { return server.accept(10s, bytes_of("welcome")); });
  cm::DatagramPeer peer = client.resolve(test_addr(), server.port(), {.private_data = hi});
  const cm::DatagramRequest req = answered.get();

  EXPECT_EQ(peer.qp_num, server.qp().qp_num());
  EXPECT_EQ(peer.qkey, cm::datagram_qkey);
  EXPECT_EQ(text_of(peer.private_data, 7), "welcome");
  EXPECT_EQ(text_of(req.private_data, hi.size()), "hello, server");
  // From the client's address, and the port of its request's own short-lived id.
  const std::string client_address = client.local_address();
  EXPECT_EQ(req.peer_address.substr(0, req.peer_address.rfind(':')), client_address.substr(0, client_address.rfind(':')));
  EXPECT_EQ(server.qp().query().qkey, cm::datagram_qkey);

  // Client to server, through what resolve() gave.
  const std::string msg = "a datagram through rdma_cm";
  std::memcpy(cbuf.data() + 1024, msg.data(), msg.size());
  ASSERT_TRUE(posted(client.qp().post(
      SendWr::send(cbuf.slice(1024, msg.size()), {.wr_id = 3, .signaled = true}).to(peer.ah, peer.qp_num, peer.qkey))));
  EXPECT_TRUE(completed(expect_completion(client.send_cq()), WcOpcode::send, 3));
  const Completion got = expect_completion(server.recv_cq());
  ASSERT_TRUE(completed(got, WcOpcode::recv, 1));
  EXPECT_EQ(got.byte_len(), kGrh + msg.size());
  EXPECT_EQ(got.src_qp(), client.qp().qp_num());
  EXPECT_EQ(text_of(sbuf.bytes().subspan(kGrh), msg.size()), msg);

  // And back, to the sender of that receive.
  const AddressHandle back = AddressHandle::reply_to(server.pd(), got, sbuf.data());
  const std::string answer = "and one back";
  std::memcpy(sbuf.data() + 2048, answer.data(), answer.size());
  ASSERT_TRUE(posted(server.qp().post(SendWr::send(sbuf.slice(2048, answer.size()), {.wr_id = 4, .signaled = true})
                                          .to(back, got.src_qp(), cm::datagram_qkey))));
  EXPECT_TRUE(completed(expect_completion(server.send_cq()), WcOpcode::send, 4));
  const Completion reply = expect_completion(client.recv_cq());
  ASSERT_TRUE(completed(reply, WcOpcode::recv, 2));
  EXPECT_EQ(reply.src_qp(), server.qp().qp_num());
  EXPECT_EQ(text_of(cbuf.bytes().subspan(kGrh), answer.size()), answer);
}

TEST_F(CmDatagram, OneListenerAnswersManyRequestersWithItsOneQp) {
  Datagram server(test_addr(), 0);
  server.listen();
  auto answering = std::async(std::launch::async, [&] {
    for (int k = 0; k < 3; ++k) (void)server.accept(10s);
  });
  std::vector<Datagram> clients;
  for (int k = 0; k < 3; ++k) {
    clients.emplace_back(test_addr(), 0);
    const cm::DatagramPeer p = clients.back().resolve(test_addr(), server.port());
    EXPECT_EQ(p.qp_num, server.qp().qp_num()) << "requester " << k;
  }
  answering.get();
}

TEST_F(CmDatagram, ResolveWithNoListenerIsRefusedNamingIt) {
  Datagram nobody(test_addr(), 0);  // bound, not listening
  Datagram client(test_addr(), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = connect_error([&] { (void)client.resolve(test_addr(), nobody.port(), {.timeout = 5s}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::errc::connection_refused) << e->what();
  EXPECT_EQ(e->phase(), Phase::connect);
  EXPECT_NE(std::string(e->what()).find("no listening Datagram"), std::string::npos) << e->what();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST_F(CmDatagram, ResolveToASilentAddressEndsAtItsDeadline) {
  Datagram client(test_addr(), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = connect_error(
      [&] { (void)client.resolve("192.0.2.77", 4791, {.timeout = 3s, .resolve_timeout = 1s}); });
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->code() == std::errc::timed_out || e->code() == std::errc::host_unreachable) << e->what();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s + 2s);
}

TEST_F(CmDatagram, BadOptionsAreRefusedBeforeAnythingIsMadeOrSent) {
  const auto rc = connect_error([&] { Datagram d(test_addr(), 0, {.qp = {.type = QpType::rc}}); });
  ASSERT_TRUE(rc);
  EXPECT_EQ(rc->code(), std::errc::invalid_argument);
  EXPECT_NE(std::string(rc->what()).find("UD"), std::string::npos) << rc->what();

  const auto wild = connect_error([&] { Datagram d("0.0.0.0", 0); });
  ASSERT_TRUE(wild);
  EXPECT_EQ(wild->code(), std::errc::invalid_argument) << wild->what();

  Datagram server(test_addr(), 0);
  server.listen();
  Datagram client(test_addr(), 0);
  const std::vector<std::byte> big(cm::max_resolve_private_data + 1, std::byte{1});
  const auto e = connect_error([&] { (void)client.resolve(test_addr(), server.port(), {.private_data = big}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::errc::message_size);
  EXPECT_FALSE(server.poll_accept()) << "a request was sent";

  const std::vector<std::byte> big_answer(cm::max_answer_private_data + 1, std::byte{1});
  EXPECT_EQ(code_of([&] { (void)server.accept(10ms, big_answer); }), std::errc::message_size);
  EXPECT_EQ(code_of([&] { (void)client.accept(10ms); }), std::errc::invalid_argument)
      << "accept() before listen()";
  EXPECT_EQ(code_of([&] { (void)server.accept(50ms); }), std::errc::timed_out);
}

TEST_F(CmDatagram, PrivateDataAtTheLimitsTravelsBothWays) {
  Datagram server(test_addr(), 0);
  server.listen();
  Datagram client(test_addr(), 0);
  std::vector<std::byte> ask(cm::max_resolve_private_data), answer(cm::max_answer_private_data);
  fill_pattern(ask, 5);
  fill_pattern(answer, 6);
  auto answered = std::async(std::launch::async, [&] { return server.accept(10s, answer); });
  const cm::DatagramPeer peer = client.resolve(test_addr(), server.port(), {.private_data = ask});
  const cm::DatagramRequest req = answered.get();
  ASSERT_GE(req.private_data.size(), ask.size());
  EXPECT_TRUE(same_bytes(std::span(req.private_data).first(ask.size()), ask));
  ASSERT_GE(peer.private_data.size(), answer.size());
  EXPECT_TRUE(same_bytes(std::span(peer.private_data).first(answer.size()), answer));
}

/// The group for a test: its own, so that tests never see each other's messages.
std::string group_for(int k) { return "239.1.2." + std::to_string(k); }

TEST_F(CmDatagram, MulticastReachesEveryMemberUntilItLeaves) {
  Datagram a(test_addr(), 0), b(test_addr(), 0), c(test_addr(), 0);
  const std::string g = group_for(1);
  const cm::DatagramPeer to_group = a.join(g);
  (void)b.join(g);
  (void)c.join(g);
  EXPECT_EQ(to_group.qp_num, cm::multicast_qp_num);
  EXPECT_EQ(to_group.qkey, cm::datagram_qkey);
  EXPECT_EQ(b.groups(), std::vector<std::string>{g});

  auto sbuf = MemoryRegion::allocate(a.pd(), 4096, Access::local_write);
  auto bbuf = MemoryRegion::allocate(b.pd(), 4096, Access::local_write);
  auto cbuf = MemoryRegion::allocate(c.pd(), 4096, Access::local_write);
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(posted(b.qp().post_recv(bbuf.slice(k * 1024, kGrh + 512), 10 + k)));
    ASSERT_TRUE(posted(c.qp().post_recv(cbuf.slice(k * 1024, kGrh + 512), 20 + k)));
  }
  const std::string msg = "to everyone in the group";
  std::memcpy(sbuf.data(), msg.data(), msg.size());
  ASSERT_TRUE(posted(a.qp().post(
      SendWr::send(sbuf.slice(0, msg.size()), {.wr_id = 1, .signaled = true}).to(to_group.ah, to_group.qp_num, to_group.qkey))));
  EXPECT_TRUE(completed(expect_completion(a.send_cq()), WcOpcode::send, 1));
  for (auto* d : {&b, &c}) {
    const Completion got = expect_completion(d->recv_cq());
    ASSERT_TRUE(got.ok()) << describe(got);
    EXPECT_EQ(got.byte_len(), kGrh + msg.size());
    EXPECT_EQ(got.src_qp(), a.qp().qp_num());
  }
  EXPECT_EQ(text_of(bbuf.bytes().subspan(kGrh), msg.size()), msg);
  EXPECT_EQ(text_of(cbuf.bytes().subspan(kGrh), msg.size()), msg);

  // c leaves: the next message reaches b only.
  c.leave(g);
  EXPECT_TRUE(c.groups().empty());
  ASSERT_TRUE(posted(a.qp().post(
      SendWr::send(sbuf.slice(0, msg.size()), {.wr_id = 2, .signaled = true}).to(to_group.ah, to_group.qp_num, to_group.qkey))));
  EXPECT_TRUE(completed(expect_completion(a.send_cq()), WcOpcode::send, 2));
  EXPECT_TRUE(completed(expect_completion(b.recv_cq()), WcOpcode::recv, 11));
  expect_no_completion(c.recv_cq(), 1s);
}

// rdma-core tests/test_rdmacm.py test_rdmacm_async_ex_multicast_traffic (rdma_join_multicast_ex
// with join flags): a send-only member reaches the full members, and is not attached, so what
// is sent to the group does not reach it.
TEST_F(CmDatagram, ASendOnlyMemberSendsToTheGroupAndReceivesNothingOfIt) {
  Datagram sender(test_addr(), 0), member(test_addr(), 0);
  const std::string g = group_for(41);
  const cm::DatagramPeer to_group = sender.join(g, cm::Membership::send_only);
  const cm::DatagramPeer member_to_group = member.join(g, cm::Membership::full);
  EXPECT_EQ(to_group.qp_num, cm::multicast_qp_num);
  EXPECT_EQ(sender.groups(), std::vector<std::string>{g});
  auto sbuf = MemoryRegion::allocate(sender.pd(), 4096, Access::local_write);
  auto mbuf = MemoryRegion::allocate(member.pd(), 4096, Access::local_write);
  ASSERT_TRUE(posted(sender.qp().post_recv(sbuf.slice(1024, kGrh + 512), 30)));
  ASSERT_TRUE(posted(member.qp().post_recv(mbuf.slice(0, kGrh + 512), 31)));
  const std::string msg = "from a send-only member";
  std::memcpy(sbuf.data(), msg.data(), msg.size());
  ASSERT_TRUE(posted(sender.qp().post(
      SendWr::send(sbuf.slice(0, msg.size()), {.wr_id = 1, .signaled = true}).to(to_group.ah, to_group.qp_num, to_group.qkey))));
  EXPECT_TRUE(completed(expect_completion(sender.send_cq()), WcOpcode::send, 1));
  const Completion got = expect_completion(member.recv_cq());
  ASSERT_TRUE(got.ok()) << describe(got);
  EXPECT_EQ(text_of(mbuf.bytes().subspan(kGrh), msg.size()), msg);
  // The full member's message to the group: not to the send-only one.
  std::memcpy(mbuf.data() + 2048, msg.data(), msg.size());
  ASSERT_TRUE(posted(member.qp().post(SendWr::send(mbuf.slice(2048, msg.size()), {.wr_id = 2, .signaled = true})
                                          .to(member_to_group.ah, member_to_group.qp_num, member_to_group.qkey))));
  EXPECT_TRUE(completed(expect_completion(member.send_cq()), WcOpcode::send, 2));
  expect_no_completion(sender.recv_cq(), 1s);
  sender.leave(g);  // nothing attached to detach
  EXPECT_TRUE(sender.groups().empty());
}

TEST_F(CmDatagram, JoinRefusesWhatIsNotAGroupOrJoinedTwice) {
  Datagram a(test_addr(), 0);
  const auto unicast = connect_error([&] { (void)a.join(test_addr()); });
  ASSERT_TRUE(unicast);
  EXPECT_EQ(unicast->code(), std::errc::invalid_argument);
  EXPECT_NE(std::string(unicast->what()).find("not a multicast address"), std::string::npos) << unicast->what();

  const std::string g = group_for(2);
  (void)a.join(g);
  EXPECT_EQ(code_of([&] { (void)a.join(g); }), std::errc::invalid_argument);
  EXPECT_EQ(code_of([&] { a.leave(group_for(3)); }), std::errc::invalid_argument);
  EXPECT_EQ(code_of([&] { a.listen(); }), std::errc::invalid_argument);
  a.leave(g);
  (void)a.join(g);  // and again, once left

  Datagram l(test_addr(), 0);
  l.listen();
  EXPECT_EQ(code_of([&] { (void)l.join(group_for(4)); }), std::errc::invalid_argument);
}

TEST_F(CmDatagram, WhatOutlivesAListeningDatagramKeepsNeitherItsPortNorItsListener) {
  std::optional<Datagram> server(std::in_place, test_addr(), 0);
  server->listen();
  const std::uint16_t port = server->port();
  // Made from the server, kept after it: it holds the PD, and so the device context.
  auto kept = MemoryRegion::allocate(server->pd(), 64, Access::local_write);
  server.reset();
  Datagram client(test_addr(), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = connect_error([&] { (void)client.resolve(test_addr(), port, {.timeout = 5s}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::errc::connection_refused) << e->what() << " (a listener nobody answers for?)";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  EXPECT_NO_THROW(Datagram again(test_addr(), port)) << "the port is still bound";
}

TEST_F(CmDatagram, ReuseAddressLetsTwoBindThePortOnlyWhenBothAsk) {
  Datagram first(test_addr(), 0);
  const auto busy = connect_error([&] { Datagram second(test_addr(), first.port()); });
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->code(), std::errc::address_in_use) << busy->what();

  Datagram shared(test_addr(), 0, {.reuse_address = true});
  EXPECT_NO_THROW(Datagram again(test_addr(), shared.port(), {.reuse_address = true}));
  const auto one_asked = connect_error([&] { Datagram again(test_addr(), shared.port()); });
  ASSERT_TRUE(one_asked) << "bound without asking to reuse";
  EXPECT_EQ(one_asked->code(), std::errc::address_in_use);
}

// --- Without blocking: PendingResolve and PendingJoin, driven from one thread by poll(2). ---

/// Milliseconds from now to `t` for poll(2): 0 once it has passed, at most 100.
int poll_ms(std::chrono::steady_clock::time_point t) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - std::chrono::steady_clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 100));
}

TEST_F(CmDatagram, OneThreadResolvesAndAnswersWithoutBlocking) {
  // One thread is both sides: with a blocking resolve() or accept() it would wait for itself.
  Datagram server(test_addr(), 0);
  server.listen();
  auto sbuf = MemoryRegion::allocate(server.pd(), 4096, Access::local_write);
  ASSERT_TRUE(posted(server.qp().post_recv(sbuf.slice(0, kGrh + 256), 1)));
  Datagram client(test_addr(), 0);
  StepClock clock;
  const auto hi = bytes_of("from an event loop");
  cm::PendingResolve pending = clock([&] { return client.start_resolve(test_addr(), server.port(), {.private_data = hi}); });
  EXPECT_EQ(pending.phase(), Phase::resolve_address);
  EXPECT_GE(pending.fd(), 0);
  EXPECT_NE(pending.fd(), client.fd()) << "a request has an event channel of its own";
  std::optional<cm::DatagramPeer> peer;
  std::optional<cm::DatagramRequest> request;
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while ((!peer || !request) && std::chrono::steady_clock::now() < give_up) {
    std::vector<pollfd> fds{{server.fd(), POLLIN, 0}};
    if (!peer) fds.push_back({pending.fd(), POLLIN, 0});
    ASSERT_GE(::poll(fds.data(), fds.size(), peer ? 100 : poll_ms(pending.deadline())), 0);
    if (!request) request = clock([&] { return server.poll_accept(bytes_of("hi")); });
    if (!peer) peer = clock([&] { return pending.step(); });
  }
  ASSERT_TRUE(request) << "the server saw no request";
  ASSERT_TRUE(peer) << "the client got no answer";
  EXPECT_LT(clock.longest, 1s) << "a call blocked for " << std::chrono::duration<double>(clock.longest).count() << " s";
  EXPECT_EQ(peer->qp_num, server.qp().qp_num());
  EXPECT_EQ(peer->qkey, cm::datagram_qkey);
  EXPECT_EQ(text_of(peer->private_data, 2), "hi");
  EXPECT_EQ(text_of(request->private_data, hi.size()), "from an event loop");
  // Over: the channel is gone, and another step says so.
  EXPECT_EQ(pending.fd(), -1);
  EXPECT_EQ(code_of([&] { (void)pending.step(); }), std::errc::not_connected);

  auto cbuf = MemoryRegion::allocate(client.pd(), 64, Access::local_write);
  std::memcpy(cbuf.data(), "ping", 4);
  ASSERT_TRUE(posted(client.qp().post(
      SendWr::send(cbuf.slice(0, 4), {.wr_id = 2, .signaled = true}).to(peer->ah, peer->qp_num, peer->qkey))));
  EXPECT_TRUE(completed(expect_completion(client.send_cq()), WcOpcode::send, 2));
  EXPECT_TRUE(completed(expect_completion(server.recv_cq()), WcOpcode::recv, 1));
  EXPECT_EQ(text_of(sbuf.bytes().subspan(kGrh), 4), "ping");
}

// A Datagram on an EventChannel (DatagramOptions::channel): no fd of its own; the channel's
// poll_events() names its key when a request waits, and poll_accept() answers it. A join on it
// completes through the same channel (its step() reads it).
TEST_F(CmDatagram, ADatagramOnAnEventChannelIsNamedByItsKeyAndAnswersAndJoinsThere) {
  cm::EventChannel channel;
  Datagram server(test_addr(), 0, {.channel = channel.key(42)});
  EXPECT_EQ(server.fd(), -1) << "an object on an EventChannel has no fd of its own";
  server.listen();
  Datagram client(test_addr(), 0);
  auto answered = std::async(std::launch::async, [&] {
    std::optional<cm::DatagramRequest> request;
    bool named = false;
    const auto give_up = std::chrono::steady_clock::now() + 20s;
    while (!request && std::chrono::steady_clock::now() < give_up) {
      pollfd p{channel.fd(), POLLIN, 0};
      if (::poll(&p, 1, 100) < 0) break;
      for (const std::uint64_t key : channel.poll_events()) named = named || key == 42;
      if (named) request = server.poll_accept(bytes_of("keyed"));
    }
    EXPECT_TRUE(named) << "poll_events() never named the Datagram's key";
    return request;
  });
  const cm::DatagramPeer peer = client.resolve(test_addr(), server.port(), {.timeout = 20s});
  const auto request = answered.get();
  ASSERT_TRUE(request) << "the Datagram on the EventChannel answered no request";
  EXPECT_EQ(peer.qp_num, server.qp().qp_num());
  EXPECT_EQ(text_of(peer.private_data, 5), "keyed");

  Datagram member(test_addr(), 0, {.channel = channel.key(43)});
  const std::string g = group_for(40);
  const cm::DatagramPeer to_group = member.join(g, 10s);
  EXPECT_EQ(to_group.qp_num, cm::multicast_qp_num);
  EXPECT_EQ(member.groups(), std::vector<std::string>{g});
  member.leave(g);
  EXPECT_TRUE(member.groups().empty());
  // A moved-from channel is refused, naming the option.
  cm::EventChannel moved = std::move(channel);
  const auto e = connect_error([&] { (void)Datagram(test_addr(), 0, {.channel = channel.key(1)}); });  // NOLINT(bugprone-use-after-move)
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::errc::invalid_argument);
  EXPECT_NE(std::string(e->what()).find("DatagramOptions::channel"), std::string::npos) << e->what();
}

TEST_F(CmDatagram, APendingResolveWithNoListenerFailsInItsStepAndStaysFailed) {
  Datagram nobody(test_addr(), 0);  // bound, not listening
  Datagram client(test_addr(), 0);
  cm::PendingResolve pending = client.start_resolve(test_addr(), nobody.port(), {.timeout = 5s});
  std::error_code ec;
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (!ec && std::chrono::steady_clock::now() < give_up) {
    pollfd f{pending.fd(), POLLIN, 0};
    (void)::poll(&f, 1, poll_ms(pending.deadline()));
    ASSERT_FALSE(pending.step(ec).has_value());
  }
  EXPECT_EQ(ec, std::errc::connection_refused) << ec.message();
  EXPECT_EQ(pending.phase(), Phase::connect);
  const auto again = connect_error([&] { (void)pending.step(); });
  ASSERT_TRUE(again);
  EXPECT_EQ(again->code(), std::errc::connection_refused);
  EXPECT_NE(std::string(again->what()).find("no listening Datagram"), std::string::npos) << again->what();
  EXPECT_EQ(pending.fd(), -1);
}

TEST_F(CmDatagram, APendingResolveToASilentAddressFailsAtItsPhasesDeadline) {
  Datagram client(test_addr(), 0);
  std::string silent = test_addr();
  silent = silent.substr(0, silent.rfind('.')) + ".77";
  const auto t0 = std::chrono::steady_clock::now();
  cm::PendingResolve pending = client.start_resolve(silent, 4791, {.timeout = 3s, .resolve_timeout = 1s});
  EXPECT_LE(pending.deadline(), t0 + 1500ms) << "the address resolution's deadline is its own limit";
  std::optional<ConnectError> e;
  StepClock clock;
  while (!e && std::chrono::steady_clock::now() < t0 + 10s) {
    pollfd f{pending.fd(), POLLIN, 0};
    (void)::poll(&f, 1, poll_ms(pending.deadline()));
    e = connect_error([&] { (void)clock([&] { return pending.step(); }); });
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(e) << "no failure within 10 s";
  EXPECT_TRUE(e->code() == std::errc::timed_out || e->code() == std::errc::host_unreachable) << e->what();
  EXPECT_EQ(e->phase(), Phase::resolve_address) << e->what();
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 5s);
  EXPECT_LT(clock.longest, 500ms);
}

TEST_F(CmDatagram, TwoJoinsInProgressOnOneDatagramEachGetTheirOwnGroup) {
  Datagram a(test_addr(), 0), b(test_addr(), 0);
  const std::string g1 = group_for(5), g2 = group_for(6), g3 = group_for(9);
  StepClock clock;
  std::optional<cm::PendingJoin> j1(clock([&] { return a.start_join(g1, 10s); }));
  std::optional<cm::PendingJoin> j2(clock([&] { return a.start_join(g2, 10s); }));
  EXPECT_EQ(j1->group(), g1);
  EXPECT_EQ(j1->fd(), a.fd());
  EXPECT_TRUE(a.groups().empty()) << "a group counts as joined once its step returned";
  EXPECT_EQ(code_of([&] { (void)a.start_join(g1); }), std::errc::invalid_argument) << "being joined already";
  EXPECT_EQ(code_of([&] { a.listen(); }), std::errc::invalid_argument) << "a joining Datagram cannot listen";
  // A third join, waited on, reads the channel through: rdma_cm confirms joins in the order
  // asked (one ordered work queue), so j1's and j2's confirmations come before its own, and it
  // must hand them over. Then the channel is empty, and j1 and j2 still complete at once.
  (void)a.join(g3, 10s);
  pollfd f{a.fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&f, 1, 200), 0) << "an event was left on the channel";
  const std::optional<cm::DatagramPeer> p1 = clock([&] { return j1->step(); });
  const std::optional<cm::DatagramPeer> p2 = clock([&] { return j2->step(); });
  ASSERT_TRUE(p1) << "j1's confirmation was not handed over";
  ASSERT_TRUE(p2) << "j2's confirmation was not handed over";
  EXPECT_LT(clock.longest, 1s);
  EXPECT_EQ(p1->qp_num, cm::multicast_qp_num);
  EXPECT_EQ((std::vector<std::string>{g3, g1, g2}), a.groups());
  EXPECT_EQ(code_of([&] { (void)j1->step(); }), std::errc::not_connected);
  j1.reset();  // a PendingJoin that is over leaves nothing behind: the group stays joined
  j2.reset();
  EXPECT_EQ(a.groups().size(), 3u);

  // a receives what is sent to either group.
  auto abuf = MemoryRegion::allocate(a.pd(), 4096, Access::local_write);
  auto bbuf = MemoryRegion::allocate(b.pd(), 64, Access::local_write);
  ASSERT_TRUE(posted(a.qp().post_recv(abuf.slice(0, kGrh + 64), 1)));
  ASSERT_TRUE(posted(a.qp().post_recv(abuf.slice(1024, kGrh + 64), 2)));
  const cm::DatagramPeer to1 = b.join(g1), to2 = b.join(g2);
  std::memcpy(bbuf.data(), "one", 4);
  std::memcpy(bbuf.data() + 8, "two", 4);
  ASSERT_TRUE(posted(b.qp().post(SendWr::send(bbuf.slice(0, 4), {.wr_id = 1}).to(to1.ah, to1.qp_num, to1.qkey))));
  ASSERT_TRUE(posted(b.qp().post(SendWr::send(bbuf.slice(8, 4), {.wr_id = 2}).to(to2.ah, to2.qp_num, to2.qkey))));
  EXPECT_TRUE(completed(expect_completion(a.recv_cq()), WcOpcode::recv, 1));
  EXPECT_TRUE(completed(expect_completion(a.recv_cq()), WcOpcode::recv, 2));
  EXPECT_EQ(text_of(abuf.bytes().subspan(kGrh), 3), "one");
  EXPECT_EQ(text_of(abuf.bytes().subspan(1024 + kGrh), 3), "two");
}

TEST_F(CmDatagram, AnAbandonedJoinIsLeftAndAJoinOutlivingItsDatagramFailsCanceled) {
  Datagram a(test_addr(), 0);
  const std::string g = group_for(7);
  {
    cm::PendingJoin abandoned = a.start_join(g, 10s);
  }
  // Only the bookkeeping can be seen here (rdma_cm shows no group membership): the group is
  // not counted, and it can be joined and left again on the same Datagram.
  EXPECT_TRUE(a.groups().empty());
  EXPECT_NO_THROW((void)a.join(g, 10s));
  EXPECT_NO_THROW(a.leave(g));
  EXPECT_NO_THROW(a.listen()) << "nothing is joined or being joined any more";

  std::optional<Datagram> c(std::in_place, test_addr(), 0);
  cm::PendingJoin orphan = c->start_join(group_for(8), 10s);
  Datagram moved = std::move(*c);  // moving the Datagram keeps the join in progress
  c.reset();
  EXPECT_EQ(orphan.fd(), moved.fd());
  { Datagram gone = std::move(moved); }
  EXPECT_EQ(orphan.fd(), -1);
  const auto e = connect_error([&] { (void)orphan.step(); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::errc::operation_canceled) << e->what();
}

}  // namespace
}  // namespace verbs::test
