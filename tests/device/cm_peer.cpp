// A peer for the cm tests, run as a separate process.
//   verbs_cm_peer ADDR PORT          connects to ADDR PORT and then idles until killed (or 60 s pass)
//   verbs_cm_peer --removal ADDR     for cm_device_removal.sh: connects to itself on ADDR, prints
//                                    "connected", then waits (20 s at most) on a listener, on the
//                                    server's receive CQ and on the client's, and on a Datagram's
//                                    fd (a group joined), and prints what each wait ended with
//                                    ("accept: ENODEV ..."), while the script removes the RDMA
//                                    device. Exit status 0 when the listener, the Datagram and at
//                                    least one end said ENODEV, and the other end ENODEV or
//                                    ECONNRESET (see removal()). The device stays open until the process exits
//                                    (librdmacm keeps its context), so the removal completes then.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <array>
#include <future>
#include <string>
#include <thread>

#include <poll.h>

#include <verbs/cm.hpp>
#include <verbs/cm_datagram.hpp>

namespace {

using namespace std::chrono_literals;

std::string describe(const std::error_code& ec, const std::string& text) {
  return std::string(ec.value() == ENODEV ? "ENODEV" : ec ? "error" : "no error") + " (" + text + ")";
}

int removal(const char* addr) {
  verbs::cm::Listener listener(addr, 0);
  verbs::cm::Listener idle(addr, 0);
  auto server = std::async(std::launch::async, [&] { return listener.accept(10s); });
  verbs::cm::Connection client = verbs::cm::connect(addr, listener.port());
  verbs::cm::Connection conn = server.get();
  auto accepting = std::async(std::launch::async, [&] {
    try {
      (void)idle.accept(20s);
      return std::string("accepted a connection");
    } catch (const verbs::Error& e) {
      return describe(e.code(), e.what());
    }
  });
  const auto waiting = [](verbs::cm::Connection& c) {
    return std::async(std::launch::async, [&c] {
      std::error_code ec;
      std::array<verbs::Completion, 1> wc;
      const auto got = c.wait(c.recv_cq(), wc, 20s, ec);
      return got.empty() ? describe(ec, ec ? ec.message() : "timed out") : std::string("a completion");
    });
  };
  // A Datagram that joined a group hears of the removal on its fd, and poll_events() reads it:
  // false, and the fd no longer readable (an event loop that watches it must not spin).
  verbs::cm::Datagram dgram(addr, 0);
  (void)dgram.join("239.1.2.3", 5s);
  auto datagram = std::async(std::launch::async, [&] {
    pollfd p{dgram.fd(), POLLIN, 0};
    if (::poll(&p, 1, 20000) != 1) return std::string("no event within 20 s");
    try {
      if (dgram.poll_events()) return std::string("poll_events() says it goes on");
    } catch (const verbs::Error& e) {
      return describe(e.code(), e.what());
    }
    return ::poll(&p, 1, 0) == 0 ? std::string("ENODEV (poll_events() false, the fd drained)")
                                 : std::string("the fd is still readable after poll_events()");
  });
  auto server_wait = waiting(conn);
  auto client_wait = waiting(client);
  std::printf("connected\n");
  std::fflush(stdout);
  const std::string results[] = {"accept: " + accepting.get(), "server wait: " + server_wait.get(),
                                 "client wait: " + client_wait.get()};
  const std::string heard = "datagram: " + datagram.get();
  std::printf("%s\n", heard.c_str());
  // The listener must say ENODEV. Both ends of the connection are on the removed device: the
  // end whose DEVICE_REMOVAL comes first has its id destroyed by the kernel, which sends the
  // other end a disconnect that may arrive before that end's own DEVICE_REMOVAL. So each wait
  // ends with ENODEV or ECONNRESET (never a timeout), and at least one with ENODEV.
  int status = results[0].find(": ENODEV") == std::string::npos || heard.find(": ENODEV") == std::string::npos ? 1 : 0;
  int enodev = 0;
  for (const std::string& r : results) {
    std::printf("%s\n", r.c_str());
    if (r.find(": ENODEV") != std::string::npos) ++enodev;
    else if (r.find("Connection reset by peer") == std::string::npos) status = 1;
  }
  if (enodev < 2) status = 1;  // the listener and at least one end
  // Which async events the removal raised (docs/async-events.md: rxe raises no DEVICE_FATAL).
  std::array<verbs::AsyncEvent, 16> events{};
  std::string seen;
  std::error_code ec;
  for (const verbs::AsyncEvent& e : client.device().poll_async_events(events, ec))
    seen += std::string(seen.empty() ? "" : ", ") + std::string(e.type_name());
  std::printf("async events: %s%s\n", seen.empty() ? "none" : seen.c_str(), ec ? (" (" + ec.message() + ")").c_str() : "");
  return status;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc == 3 && std::strcmp(argv[1], "--removal") == 0) return removal(argv[2]);
  if (argc != 3) {
    std::fprintf(stderr, "usage: verbs_cm_peer ADDR PORT | verbs_cm_peer --removal ADDR\n");
    return 2;
  }
  verbs::cm::Connection c =
      verbs::cm::connect(argv[1], static_cast<std::uint16_t>(std::atoi(argv[2])), {.timeout = std::chrono::seconds(20)});
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "verbs_cm_peer: %s\n", e.what());
  return 1;
}
