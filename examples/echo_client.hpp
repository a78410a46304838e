// The client of the echo examples (echo_epoll, echo_asio): CONNECTIONS connections, one thread
// each, that wait QUIET seconds without sending, then send COUNT messages of SIZE bytes one at a
// time and check every echo. Prints one line when all were checked; returns the exit status.
#pragma once

#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "example_args.hpp"

namespace example {

inline void run_echo_client(const Args& args, std::uint64_t count, std::size_t size, std::chrono::seconds quiet) {
  verbs::cm::Connection conn =
      verbs::cm::connect(args.host, args.port, {.timeout = args.timeout, .source_address = args.bind});
  auto buf = verbs::MemoryRegion::allocate(conn.pd(), 2 * size, verbs::Access::local_write);
  const std::span<std::byte> out = buf.bytes().first(size), in = buf.bytes().subspan(size, size);
  std::this_thread::sleep_for(quiet);
  const auto wait = [&](verbs::CompletionQueue& cq) {
    const std::optional<verbs::Completion> wc = conn.wait_one(cq, args.timeout);
    if (!wc) throw std::runtime_error("no answer within " + std::to_string(args.timeout.count()) + " s");
    wc->throw_if_failed();
    return *wc;
  };
  for (std::uint64_t i = 0; i < count; ++i) {
    for (std::size_t k = 0; k < size; ++k) out[k] = static_cast<std::byte>(i * 131 + k * 7 + size);
    std::memset(in.data(), 0, size);
    conn.qp().post_recv(buf.slice(size, size), i).check();  // before the send: the echo may be quick
    conn.qp().post_send(buf.slice(0, size), {.wr_id = i}).check();
    (void)wait(conn.send_cq());
    const verbs::Completion echo = wait(conn.recv_cq());
    if (echo.byte_len() != size || std::memcmp(in.data(), out.data(), size) != 0)
      throw std::runtime_error("message " + std::to_string(i) + " came back changed");
  }
}

inline int run_echo_clients(const char* name, const Args& args, std::uint64_t connections, std::uint64_t count,
                            std::size_t size, std::chrono::seconds quiet) {
  std::atomic<std::uint64_t> failed{0};
  std::vector<std::thread> threads;
  for (std::uint64_t c = 0; c < connections; ++c)
    threads.emplace_back([&] {
      try {
        run_echo_client(args, count, size, quiet);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", name, e.what());
        ++failed;
      }
    });
  for (std::thread& t : threads) t.join();
  if (failed != 0) {
    std::fprintf(stderr, "%s: %llu of %llu connections failed\n", name, static_cast<unsigned long long>(failed.load()),
                 static_cast<unsigned long long>(connections));
    return 1;
  }
  std::printf("%s: %llu connections, %llu messages of %zu bytes each, echoed and checked\n", name,
              static_cast<unsigned long long>(connections), static_cast<unsigned long long>(count), size);
  return 0;
}

}  // namespace example
