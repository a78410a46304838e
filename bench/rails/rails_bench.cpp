// verbs-rails-bench: what verbs::rails costs and gives, in figures (not asserted).
//
//   verbs-rails-bench serve ADDR... [--size BYTES] [--port PORT]
//       a Target on each ADDR exposing BYTES (default 64 MiB), served until killed
//   verbs-rails-bench stripe_one_rail --rail LOCAL:REMOTE --port PORT [options]
//       the striping layer on one rail and one QP against one plain QP at the same depth: the
//       same chunks written to the same Target, a cm::Connection of its own posting them with
//       the core's post_write and polling its CQ; alternated run by run (plain, rails, plain, ...)
//   verbs-rails-bench rails --rail L:R [--rail L:R ...] --port PORT [options]
//       1 rail against all of them (the first rail alone, then every rail), the same QPs per
//       rail, alternated
// Options: --pairs N (runs of each, default 7), --bytes BYTES per run (default 32 MiB), --chunk
// BYTES (default 256 KiB), --depth N (chunks in flight per QP, default 4), --qps N (per rail,
// default 1 for stripe_one_rail, 4 for rails). Prints each run's MB/s, the medians, and the
// median of the pairs' own ratios as the last line:
//   paired stripe_one_rail <rails over plain>      or      paired two_rails <all over one>
#include <verbs/rails.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string mode;
  std::vector<std::string> addresses;
  std::vector<verbs::rails::Rail> rails;
  std::uint16_t port = 0;
  std::size_t size = 64u << 20, bytes = 32u << 20;
  std::uint32_t chunk = 256 * 1024;
  int depth = 4, pairs = 7, qps = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "verbs-rails-bench: %s (see the comment at the top of bench/rails/rails_bench.cpp)\n", why.c_str());
  std::exit(64);
}

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) usage("no mode");
  a.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string s = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(s + " needs a value");
      return argv[++i];
    };
    if (s == "--rail") {
      const std::string r = value();
      const auto colon = r.find(':');
      if (colon == std::string::npos) usage("--rail wants LOCAL:REMOTE");
      a.rails.push_back({r.substr(0, colon), r.substr(colon + 1)});
    } else if (s == "--port") a.port = static_cast<std::uint16_t>(std::stoul(value()));
    else if (s == "--size") a.size = std::stoull(value());
    else if (s == "--bytes") a.bytes = std::stoull(value());
    else if (s == "--chunk") a.chunk = static_cast<std::uint32_t>(std::stoul(value()));
    else if (s == "--depth") a.depth = std::stoi(value());
    else if (s == "--pairs") a.pairs = std::stoi(value());
    else if (s == "--qps") a.qps = std::stoi(value());
    else if (a.mode == "serve" && s[0] != '-') a.addresses.push_back(s);
    else usage("unknown argument " + s);
  }
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

verbs::rails::GroupOptions group_options(const Args& a, std::vector<verbs::rails::Rail> rails, int qps) {
  verbs::rails::GroupOptions o;
  o.rails = std::move(rails);
  o.port = a.port;
  o.qps_per_rail = qps;
  o.chunk_size = a.chunk;
  o.max_in_flight = a.depth;
  o.transport.ack_timeout = 16;  // the emulated hosts stall: see tests/twohost/rails_peer.cpp
  o.transport.retry_count = 5;
  return o;
}

// One write of a.bytes through the group, in MB/s.
double group_run(verbs::rails::Group& g, const verbs::rails::Region& r, const Args& a) {
  const auto t0 = Clock::now();
  const auto c = g.wait(g.write(r, 0, 0, a.bytes), 300s);
  if (!c || !c->ok()) throw std::runtime_error("a rails write failed: " + (c ? c->what : std::string("timeout")));
  return static_cast<double>(a.bytes) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e6;
}

// The same chunks, through one plain QP at the same depth: post while room, poll, post again.
double plain_run(const verbs::cm::Connection& c, const verbs::MemoryRegion& mr, const Args& a) {
  const verbs::RemoteSlice remote = c.remote();
  const std::size_t chunks = (a.bytes + a.chunk - 1) / a.chunk;
  std::size_t posted = 0, done = 0;
  int in_flight = 0;
  std::vector<verbs::Completion> wcs(32);
  const auto t0 = Clock::now();
  while (done < chunks) {
    while (in_flight < a.depth && posted < chunks) {
      const std::uint64_t at = posted * a.chunk;
      const auto len = static_cast<std::uint32_t>(std::min<std::uint64_t>(a.chunk, a.bytes - at));
      const auto r = c.qp().post_write(mr.slice(at, len), remote.slice(at, len), {.wr_id = posted});
      if (!r) throw std::runtime_error("plain post failed: " + r.error().message());
      ++posted;
      ++in_flight;
    }
    for (const auto& wc : c.send_cq().poll(wcs)) {
      if (!wc.ok()) throw std::runtime_error("plain write failed: " + wc.error_code().message());
      ++done;
      --in_flight;
    }
    if (Clock::now() - t0 > 300s) throw std::runtime_error("plain run: over 300 s");
  }
  return static_cast<double>(a.bytes) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e6;
}

void report(const char* name, const char* a_name, const std::vector<double>& a, const char* b_name,
            const std::vector<double>& b) {
  std::vector<double> ratios;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) ratios.push_back(b[i] / a[i]);
  std::printf("%-10s median %8.2f MB/s over %zu runs\n", a_name, median(a), a.size());
  std::printf("%-10s median %8.2f MB/s over %zu runs\n", b_name, median(b), b.size());
  std::printf("ratio %s %.3f\n", name, median(b) / median(a));
  std::printf("paired %s %.3f\n", name, median(ratios));
}

int serve(const Args& a) {
  if (a.addresses.empty()) usage("serve: no address");
  std::vector<std::byte> buffer(a.size);
  verbs::rails::Target t({.addresses = a.addresses, .port = a.port}, buffer, verbs::Access::remote_write);
  std::printf("serving %u\n", t.port());
  std::fflush(stdout);
  for (;;) t.run_for(1s);
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  if (a.mode == "serve") return serve(a);
  if (a.rails.empty() || a.port == 0) usage("--rail and --port are needed");
  std::vector<std::byte> data(a.bytes, std::byte{0x5a});
  std::vector<double> first, second;
  if (a.mode == "stripe_one_rail") {
    const int qps = a.qps > 0 ? a.qps : 1;
    auto g = verbs::rails::Group::connect(group_options(a, {a.rails.front()}, qps), 60s);
    const verbs::rails::Region region = g.register_memory(data);
    verbs::cm::ClientOptions co;
    co.source_address = a.rails.front().local_address;
    co.connection.qp.max_send_wr = static_cast<std::uint32_t>(a.depth);
    co.connection.transport = group_options(a, {}, 1).transport;
    auto plain = verbs::cm::connect(a.rails.front().remote_address, a.port, co);
    const verbs::MemoryRegion mr(plain.pd(), data, verbs::Access::local_write);
    std::printf("stripe_one_rail: %zu bytes a run in %u-byte chunks, %d in flight, %d QP(s) for rails\n", a.bytes,
                a.chunk, a.depth, qps);
    (void)plain_run(plain, mr, a);  // warm both up once, unmeasured
    (void)group_run(g, region, a);
    for (int i = 0; i < a.pairs; ++i) {
      first.push_back(plain_run(plain, mr, a));
      second.push_back(group_run(g, region, a));
      std::printf("pair %d: plain %.2f MB/s, rails %.2f MB/s\n", i + 1, first.back(), second.back());
      std::fflush(stdout);
    }
    report("stripe_one_rail", "plain QP", first, "rails", second);
  } else if (a.mode == "rails") {
    if (a.rails.size() < 2) usage("rails: give two --rail or more");
    const int qps = a.qps > 0 ? a.qps : 4;
    auto one = verbs::rails::Group::connect(group_options(a, {a.rails.front()}, qps), 60s);
    auto all = verbs::rails::Group::connect(group_options(a, a.rails, qps), 60s);
    const verbs::rails::Region r1 = one.register_memory(data), rall = all.register_memory(data);
    std::printf("rails: %zu bytes a run, 1 rail against %zu, %d QPs each\n", a.bytes, a.rails.size(), qps);
    (void)group_run(one, r1, a);
    (void)group_run(all, rall, a);
    for (int i = 0; i < a.pairs; ++i) {
      first.push_back(group_run(one, r1, a));
      second.push_back(group_run(all, rall, a));
      std::printf("pair %d: 1 rail %.2f MB/s, %zu rails %.2f MB/s\n", i + 1, first.back(), a.rails.size(), second.back());
      std::fflush(stdout);
    }
    report("two_rails", "1 rail", first, "all rails", second);
  } else {
    usage("no mode " + a.mode);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "verbs-rails-bench: %s\n", e.what());
  return 1;
}
