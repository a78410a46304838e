// verbs::cm without a device: what its types allow, and what a call that must not block does
// before it reaches rdma_cm.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <resolv.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <verbs/cm.hpp>
#include <verbs/cm_datagram.hpp>

namespace {

using namespace std::chrono_literals;

// The QP of a connection or a Datagram is theirs: posting on it, yes; moving it out (which left
// the connection's async-event route, and the Datagram's multicast detach, on a null QP), no.
TEST(CmAccessors, TheQpOfAConnectionOrADatagramCannotBeMovedOut) {
  using ConnQp = decltype(std::declval<verbs::cm::Connection&>().qp());
  using DatagramQp = decltype(std::declval<verbs::cm::Datagram&>().qp());
  EXPECT_FALSE((std::is_constructible_v<verbs::QueuePair, std::remove_reference_t<ConnQp>&&>));
  EXPECT_FALSE((std::is_constructible_v<verbs::QueuePair, std::remove_reference_t<DatagramQp>&&>));
  EXPECT_FALSE((std::is_assignable_v<ConnQp, verbs::QueuePair&&>));
  EXPECT_FALSE((std::is_assignable_v<DatagramQp, verbs::QueuePair&&>));
}

// Nor their CQs: polling and waiting on them, yes (const, as ibv_poll_cq is safe from several
// threads); moving them out of the connection or Datagram, or resizing them, no.
TEST(CmAccessors, TheCqsOfAConnectionOrADatagramCannotBeMovedOut) {
  using ConnCq = decltype(std::declval<verbs::cm::Connection&>().send_cq());
  using ConnRecvCq = decltype(std::declval<verbs::cm::Connection&>().recv_cq());
  using DatagramCq = decltype(std::declval<verbs::cm::Datagram&>().recv_cq());
  for (const bool movable : {std::is_constructible_v<verbs::CompletionQueue, std::remove_reference_t<ConnCq>&&>,
                             std::is_constructible_v<verbs::CompletionQueue, std::remove_reference_t<ConnRecvCq>&&>,
                             std::is_constructible_v<verbs::CompletionQueue, std::remove_reference_t<DatagramCq>&&>,
                             std::is_assignable_v<ConnCq, verbs::CompletionQueue&&>,
                             std::is_assignable_v<DatagramCq, verbs::CompletionQueue&&>})
    EXPECT_FALSE(movable);
  // What a waiter needs is there on the const reference.
  using Polled = decltype(std::declval<ConnCq>().poll(std::declval<std::span<verbs::Completion>>()));
  EXPECT_TRUE((std::is_same_v<Polled, std::span<verbs::Completion>>));
  EXPECT_TRUE((std::is_same_v<decltype(std::declval<ConnCq>().wait_one(1ms)), std::optional<verbs::Completion>>));
}

/// A UDP socket on the loopback that takes queries and never answers, made the resolver's only
/// name server (the resolver's legacy in-process state, _res), with one try of one second.
class SilentNameServer {
 public:
  SilentNameServer() {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||  // NOLINT
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)            // NOLINT
      return;
    if (res_init() != 0) return;
    _res.nscount = 1;
    _res.nsaddr_list[0] = a;
    _res.retrans = 1;
    _res.retry = 1;
    ready_ = true;
  }
  SilentNameServer(const SilentNameServer&) = delete;
  SilentNameServer& operator=(const SilentNameServer&) = delete;
  ~SilentNameServer() {
    if (fd_ >= 0) ::close(fd_);
    (void)res_init();  // the system's configuration again
  }
  [[nodiscard]] bool ready() const noexcept { return ready_; }

 private:
  int fd_ = -1;
  bool ready_ = false;
};

// start_connect() never blocks: a host name is not looked up inside it (a name server that
// never answers froze the caller's event loop for the resolver's whole timeout), it is refused
// at once, saying what to do. (The resolver's state is per thread: the calls run on this one.)
TEST(CmAddresses, AStartedConnectDoesNotWaitForANameServer) {
  SilentNameServer ns;
  ASSERT_TRUE(ns.ready());
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code code;
  std::string what = "nothing was thrown";
  try {
    (void)verbs::cm::start_connect("rdma-peer.invalid", 7471);
  } catch (const verbs::cm::ConnectError& e) {
    code = e.code();
    what = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms) << "start_connect waited for the name server: " << what;
  EXPECT_EQ(code, std::errc::invalid_argument) << what;
  EXPECT_NE(what.find("numeric"), std::string::npos) << what;
}

// The blocking connect() looks a name up (the system's resolver, within its own limits: here one
// try of one second), and a resolver that cannot answer yet says so (EAGAIN: try again), not
// EINVAL as for an address that does not parse.
TEST(CmAddresses, AConnectToANameWhoseServerIsSilentSaysTryAgain) {
  SilentNameServer ns;
  ASSERT_TRUE(ns.ready());
  std::error_code ec;
  EXPECT_FALSE(verbs::cm::connect("rdma-peer.invalid", 7471, {}, ec).has_value());
  EXPECT_EQ(ec, std::errc::resource_unavailable_try_again) << ec.message();
}

}  // namespace
