// kv_asio: a key-value table read with RDMA, server and clients in asio C++20 coroutines, each
// side on one thread (needs the standalone asio, libasio-dev; the verbs library does not).
//
//   server: kv_asio [-p PORT] [-a BIND_ADDR] [-e ENTRIES] [-c CLIENTS]
//   client: kv_asio [-p PORT] [-c CONNECTIONS] [-n READS] HOST
//
// The server registers a table of ENTRIES 64-byte values once, for remote read only, and
// exposes it in every connection's handshake; its CPU takes no part in the reads. It serves
// CLIENTS clients (0: until no client comes for -t seconds) and watches each one's end.
// The client opens CONNECTIONS connections from coroutines on one thread, and each RDMA-reads
// READS entries one at a time and checks them:
//   kv_asio: 8 connections read 800 entries (100 each), all as expected, in 41 ms
// Every wait has a deadline (-t, default 30 s): the accept, the connect, each read, the end.
#include <verbs/asio.hpp>
#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

#include "example_args.hpp"

namespace {

constexpr const char* kName = "kv_asio";
constexpr std::size_t kValue = 64;  // bytes per entry
using asio::experimental::as_tuple;

/// The value of key `k`, as the server stores it and the client expects it.
std::array<char, kValue> value_of(std::uint64_t k) {
  std::array<char, kValue> v{};
  std::snprintf(v.data(), v.size(), "value of key %llu", static_cast<unsigned long long>(k));
  return v;
}

/// One client's end: the server learns it from the connection's events, or drops the client
/// that is still there after `limit`.
asio::awaitable<void> watch(verbs::cm::Connection conn, std::chrono::seconds limit, std::uint64_t& live) {
  verbs::asio::ConnectionWaiter end(co_await asio::this_coro::executor, conn);
  const auto [ec] = co_await end.async_wait_closed(limit, as_tuple(asio::use_awaitable));
  std::printf("%s: %s %s\n", kName, conn.peer_address().c_str(),
              !ec ? "left" : ec == std::errc::timed_out ? "was still there at the limit: dropped" : ec.message().c_str());
  std::fflush(stdout);
  --live;
}

asio::awaitable<void> serve(const example::Args& args, std::uint64_t entries, std::uint64_t clients) {
  const auto ex = co_await asio::this_coro::executor;
  const std::string local = example::local_address(args);
  verbs::cm::Listener listener(local, args.port);
  // The table outlives every connection that exposes it: a client may read it until it leaves,
  // and a region deregistered earlier (say, one local to a coroutine that returned after the
  // accept) fails the client's next read with REM_ACCESS_ERR.
  const verbs::ProtectionDomain pd{listener.device()};
  auto table = verbs::MemoryRegion::allocate(pd, entries * kValue, verbs::Access::remote_read);
  for (std::uint64_t k = 0; k < entries; ++k) std::memcpy(table.data() + k * kValue, value_of(k).data(), kValue);
  example::print_listening(kName, local, listener.port());

  // Options as a named variable: g++ 12 destroys a temporary in a co_await expression wrongly.
  const verbs::cm::ConnectionOptions options{.qp = {.access = verbs::Access::remote_read}, .pd = &pd,
                                             .expose = table.remote()};
  std::uint64_t served = 0, live = 0, failed_in_a_row = 0;
  while (clients == 0 || served < clients) {
    auto [ec, conn] = co_await verbs::asio::async_accept(ex, listener, options, args.timeout, as_tuple(asio::use_awaitable));
    if (ec == std::errc::timed_out) {
      std::printf("%s: no client for %lld s\n", kName, static_cast<long long>(args.timeout.count()));
      break;
    }
    if (ec) {  // this request's failure; ten in a row is the listener's (its device gone, say)
      std::printf("%s: a request failed: %s\n", kName, ec.message().c_str());
      if (++failed_in_a_row == 10) throw std::system_error(ec, "ten requests in a row failed");
      continue;
    }
    failed_in_a_row = 0;
    ++served;
    ++live;
    asio::co_spawn(ex, watch(std::move(*conn), args.timeout, live), asio::detached);
  }
  // Until the last client has gone (each watch() ends by its deadline at the latest).
  asio::steady_timer tick(ex);
  while (live > 0) {
    tick.expires_after(std::chrono::milliseconds(10));
    co_await tick.async_wait(asio::use_awaitable);
  }
  std::printf("%s: served %llu clients\n", kName, static_cast<unsigned long long>(served));
  if (clients != 0 && served < clients) throw std::runtime_error("fewer clients came than -c asked for");
}

/// One connection: connect, read `reads` entries one at a time (each within the deadline) and
/// check each, then leave.
asio::awaitable<void> client(const example::Args& args, std::uint64_t id, std::uint64_t reads, std::uint64_t& read) {
  const auto ex = co_await asio::this_coro::executor;
  const verbs::cm::ClientOptions options{.timeout = args.timeout, .source_address = args.bind};
  std::optional<verbs::cm::Connection> conn =
      co_await verbs::asio::async_connect(ex, args.host, args.port, options, asio::use_awaitable);
  const verbs::RemoteSlice table = conn->remote();  // the server's table, from the handshake
  const std::uint64_t entries = table.length / kValue;
  auto buf = verbs::MemoryRegion::allocate(conn->pd(), kValue, verbs::Access::local_write);
  verbs::asio::CqWaiter done(ex, conn->send_cq());
  std::array<verbs::Completion, 1> wc;
  for (std::uint64_t i = 0; i < reads; ++i) {
    const std::uint64_t k = (id * 7919 + i * 104729) % entries;
    conn->qp().post_read(buf.slice(), table.slice(k * kValue, kValue), {.wr_id = k}).check();
    const auto [ec, n] = co_await done.async_wait(wc, args.timeout, as_tuple(asio::use_awaitable));
    if (ec) throw std::runtime_error("read of key " + std::to_string(k) + ": " + ec.message());
    wc[0].throw_if_failed();
    if (std::memcmp(buf.data(), value_of(k).data(), kValue) != 0)
      throw std::runtime_error("key " + std::to_string(k) + " read '" +
                               std::string(reinterpret_cast<const char*>(buf.data())) + "'");
    ++read;
  }
  conn->disconnect();
}

int run_clients(const example::Args& args, std::uint64_t connections, std::uint64_t reads) {
  asio::io_context io(1);
  std::uint64_t read = 0, finished = 0;
  std::string failure;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t id = 0; id < connections; ++id)
    asio::co_spawn(io, client(args, id, reads, read), [&](std::exception_ptr e) {
      ++finished;
      if (e && failure.empty()) try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          failure = x.what();
        }
    });
  io.run();  // returns when every coroutine has ended: each wait in them has a deadline
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  if (!failure.empty()) {
    std::fprintf(stderr, "%s: %s\n", kName, failure.c_str());
    return 1;
  }
  std::printf("%s: %llu connections read %llu entries (%llu each), all as expected, in %lld ms\n", kName,
              static_cast<unsigned long long>(finished), static_cast<unsigned long long>(read),
              static_cast<unsigned long long>(reads), static_cast<long long>(ms.count()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::uint64_t entries = 1024, clients = 0, reads = 100;
  const example::Args args = example::parse_args(
      argc, argv, kName, "A key-value table read with RDMA; server and clients in asio coroutines.",
      {{'e', "ENTRIES", "server: entries in the table", &entries, 1},
       {'c', "COUNT", "server: clients to serve (0: until none comes for -t s); client: connections (0: 8)", &clients},
       {'n', "READS", "client: entries each connection reads", &reads}});
  if (!args.server()) return run_clients(args, clients == 0 ? 8 : clients, reads);
  asio::io_context io(1);
  std::exception_ptr failed;
  asio::co_spawn(io, serve(args, entries, clients), [&](std::exception_ptr e) { failed = e; });
  io.run();
  if (failed) std::rethrow_exception(failed);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", kName, e.what());
  return 1;
}
