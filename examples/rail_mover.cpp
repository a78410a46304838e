// rail_mover: a bulk mover over every rail, with failover (verbs::rails).
//
//   server: rail_mover [-p PORT] -a ADDR[,ADDR...] [-s SIZE]
//   client: rail_mover [-p PORT] [-a LOCAL[,LOCAL...]] [-s SIZE] [-n ROUNDS] [-c QPS] HOST[,HOST...]
//
// The server is a rails::Target: it listens on each of its addresses (one per NIC: one rail
// each), exposes a SIZE-byte buffer registered on every device, and serves until its client has
// come and gone. The client is a rails::Group with one rail per HOST (the server's address on
// that network; the local address is -a's at the same place, or the one the kernel routes to
// it) and QPS connections on each. Each round writes SIZE bytes of a new pattern striped over
// every rail, reads them back and compares; it prints the round's rate, each rail's share, and
// every rail event: a rail that went down and why, one that came back. Cut a rail's wire in the
// middle of a round, and the round ends on the others.
#include <verbs/rails.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "example_args.hpp"

namespace {

constexpr const char* kName = "rail_mover";
using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    const auto comma = s.find(',', at);
    out.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

void serve(const example::Args& args, std::size_t size) {
  if (args.bind.empty()) throw std::invalid_argument("the server needs -a ADDR[,ADDR...]: its address on each rail");
  std::vector<std::byte> buffer(size);
  verbs::rails::Target target({.addresses = split(args.bind), .port = args.port}, buffer,
                              verbs::Access::remote_write | verbs::Access::remote_read);
  example::print_listening(kName, split(args.bind).front(), target.port());
  // Until the client has come and every connection of it has gone (or nobody came in -t).
  const auto give_up = Clock::now() + args.timeout;
  std::size_t most = 0;
  while (most == 0 || target.connections() > 0) {
    if (most == 0 && Clock::now() > give_up) throw std::runtime_error("no client within -t");
    target.run_for(std::chrono::milliseconds(100));
    most = std::max(most, target.connections());
  }
  std::printf("%s: served %zu connections; the client went\n", kName, most);
}

void move(const example::Args& args, std::size_t size, std::uint64_t rounds, std::uint64_t qps) {
  verbs::rails::GroupOptions o;
  const std::vector<std::string> hosts = split(args.host);
  const std::vector<std::string> locals = args.bind.empty() ? std::vector<std::string>{} : split(args.bind);
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    example::Args one = args;
    one.host = hosts[i];
    one.bind = i < locals.size() ? locals[i] : std::string();
    o.rails.push_back({example::local_address(one), hosts[i]});
  }
  o.port = args.port;
  o.qps_per_rail = static_cast<int>(qps);
  // The emulated hosts of the tests stall for half a second now and then: 268 ms a try.
  o.transport.ack_timeout = 16;
  o.transport.retry_count = 5;
  verbs::rails::Group g = verbs::rails::Group::connect(o, args.timeout);
  std::printf("%s: %zu of %zu rails up, %llu QPs each; a silent rail is noticed within %lld ms\n", kName,
              g.live_rails(), g.rail_count(), static_cast<unsigned long long>(qps),
              static_cast<long long>(g.failure_bound().count()));
  std::vector<std::byte> data(size), back(size);
  const verbs::rails::Region src = g.register_memory(data);
  const verbs::rails::Region dst = g.register_memory(back);
  const auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(args.timeout * 4);
  const auto report_events = [&] {
    for (const auto& e : g.poll_rail_events()) {
      if (e.up) std::printf("%s: rail %zu (to %s) is back up\n", kName, e.rail, o.rails[e.rail].remote_address.c_str());
      else std::printf("%s: rail %zu (to %s) went down: %s\n", kName, e.rail, o.rails[e.rail].remote_address.c_str(), e.what.c_str());
    }
  };
  for (std::uint64_t r = 1; r <= rounds; ++r) {
    for (std::size_t i = 0; i < size; ++i) data[i] = static_cast<std::byte>((i * 31 + r * 7) >> 3);
    std::vector<std::uint64_t> before;
    for (std::size_t k = 0; k < g.rail_count(); ++k) before.push_back(g.rail_counters(k).chunks);
    const auto t0 = Clock::now();
    const auto w = g.wait(g.write(src, 0, 0, size), limit);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    report_events();
    if (!w) throw std::runtime_error("round " + std::to_string(r) + ": the write did not end in time");
    if (!w->ok()) throw std::runtime_error("round " + std::to_string(r) + ": " + w->what);
    std::memset(back.data(), 0, size);
    const auto rd = g.wait(g.read(dst, 0, 0, size), limit);
    report_events();
    if (!rd || !rd->ok()) throw std::runtime_error("round " + std::to_string(r) + ": the read back failed");
    if (std::memcmp(back.data(), data.data(), size) != 0)
      throw std::runtime_error("round " + std::to_string(r) + ": what was read back differs");
    std::string shares;
    for (std::size_t k = 0; k < g.rail_count(); ++k)
      shares += (k ? ", " : "") + std::to_string(g.rail_counters(k).chunks - before[k]);
    std::printf("%s: round %llu: %zu bytes in %.3f s (%.1f MB/s), chunks per rail %s, checked\n", kName,
                static_cast<unsigned long long>(r), size, secs, static_cast<double>(size) / secs / 1e6, shares.c_str());
  }
  std::printf("%s: %llu rounds of %zu bytes over %zu rails, every byte checked\n", kName,
              static_cast<unsigned long long>(rounds), size, g.rail_count());
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t size = 64 << 20, rounds = 10, qps = 4;
  try {
    const example::Args args = example::parse_args(
        argc, argv, kName, "A bulk mover over every rail (one NIC each), with failover: verbs::rails.",
        {{'s', "SIZE", "bytes moved each round (K, M)", &size, 4096},
         {'n', "ROUNDS", "rounds (client)", &rounds, 1},
         {'c', "QPS", "connections (QPs) on each rail (client)", &qps, 1}});
    if (args.server()) serve(args, size);
    else move(args, size, rounds, qps);
    return 0;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s: %s\n", kName, e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kName, e.what());
    return 1;
  }
}
