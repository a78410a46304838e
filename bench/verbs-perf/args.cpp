// verbs-perf: the command line, the parameters' wire form, and the per-size plan.
#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "perf.hpp"

namespace perf {
namespace {

constexpr std::array<TestInfo, 7> kTests{{
    {Test::write_lat, "write_lat", Verb::write, false, "RDMA_Write Latency Test"},
    {Test::write_bw, "write_bw", Verb::write, true, "RDMA_Write BW Test"},
    {Test::read_lat, "read_lat", Verb::read, false, "RDMA_Read Latency Test"},
    {Test::read_bw, "read_bw", Verb::read, true, "RDMA_Read BW Test"},
    {Test::send_lat, "send_lat", Verb::send, false, "Send Latency Test"},
    {Test::send_bw, "send_bw", Verb::send, true, "Send BW Test"},
    {Test::atomic_lat, "atomic_lat", Verb::atomic, false, "Atomic FETCH_AND_ADD Latency Test"},
}};

constexpr std::uint64_t kMaxSize = std::uint64_t{1} << 23;   // -a goes up to 8 MiB, as perftest's
constexpr std::uint64_t kVerifyBudget = 32u << 20;            // per area and QP, with --verify
constexpr std::uint64_t kCycleBuffer = 4096;                  // perftest's cycle buffer: one page

void usage(FILE* f) {
  std::fprintf(f, R"(Usage: verbs-perf TEST [options]          server (waits for one client)
       verbs-perf TEST [options] HOST     client (connects to the server at HOST)

perftest's tests on the verbs library, measured as perftest measures them. TEST is one of
write_lat write_bw read_lat read_bw send_lat send_bw atomic_lat (perftest's ib_TEST). The
client's test parameters are sent to the server, which needs only TEST and its local options.

Test parameters (the client's count):
  -s, --size BYTES       message size (default 2, atomic 8, bandwidth tests 65536)
  -a, --all              all sizes from 2 B to 8 MiB
  -n, --iters N          iterations (default 1000; write_bw 5000)
  -D, --duration SECS    run for SECS seconds instead of -n iterations
  -q, --qp N             queue pairs (bandwidth tests; default 1)
  -t, --tx-depth N       send queue depth kept busy (default 128 for bandwidth, 1 for latency)
  -r, --rx-depth N       receives kept posted (send tests; default 512)
  -I, --inline-size N    send inline up to N bytes (default: write_lat 220, send_lat 236, else 0;
                         capped at what the QP accepts)
  -l, --post-list N      post N requests per ibv_post_send call (bandwidth tests)
  -Q, --cq-mod N         one signaled request every N (default 100; 1 above 8 KiB; the post
                         list with -l)
  -o, --outs N           outstanding reads/atomics (default: the device's maximum)
  -N, --no-peak          skip the peak bandwidth (automatic above 20000 iterations)
      --verify           check the data after each bandwidth run (and atomic_lat's counter);
                         the sender then writes a new pattern per message, which costs time
Local options:
  -d, --ib-dev NAME      RDMA device (default: the first)
  -i, --ib-port N        port (default 1)
  -x, --gid-index N      GID index (default: RoCE v2 with an IPv4-mapped address first)
  -p, --port N           TCP port of the exchange, or rdma_cm port with -R (default 18515)
  -R, --rdma-cm          connect with rdma_cm instead of the TCP exchange
  -e, --events           latency tests: sleep until a completion comes (each CQ with a
                         completion channel of its own, CompletionQueue::wait) instead of
                         busy-polling, as perftest's -e; each side chooses for itself.
                         write_lat still watches memory for the peer's message, as perftest's
      --wr-api           post through the extended QP API (verbs::SendBatch: ibv_wr_start,
                         ibv_wr_*, ibv_wr_complete), as perftest does by default on the
                         devices it knows; without it, ibv_post_send (verbs::QueuePair::post),
                         as perftest on the others (rxe) or with --use_old_post_send. Each
                         side chooses for itself
      --bind ADDR        -R: the local address (default: server, the first with an RDMA
                         device; client, the one routed to HOST)
      --json FILE        write the results as JSON (client)
      --timeout SECS     give up when the peer is silent this long (default 30)
  -h, --help             this help

Output: perftest's table, e.g. for latency
 #bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] t_stdev[usec] 99%% percentile[usec] 99.9%% percentile[usec]
and for bandwidth
 #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]
Exit status: 0 fine, 1 failure (including a --verify mismatch), 64 bad usage.
)");
}

std::uint64_t parse_number(std::string_view text, std::string_view opt) {
  std::uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  std::uint64_t unit = 1;
  if (ec == std::errc{} && p + 1 == end && (*p == 'K' || *p == 'k')) unit = 1024, ++p;
  if (ec == std::errc{} && p + 1 == end && (*p == 'M' || *p == 'm')) unit = 1024 * 1024, ++p;
  if (ec != std::errc{} || p != end || text.empty() || v > std::numeric_limits<std::uint64_t>::max() / unit)
    throw std::invalid_argument(std::string(opt) + ": '" + std::string(text) + "' is not a number");
  return v * unit;
}

template <typename T>
T number_in(std::string_view text, std::string_view opt, std::uint64_t lo, std::uint64_t hi) {
  const std::uint64_t v = parse_number(text, opt);
  if (v < lo || v > hi)
    throw std::invalid_argument(std::string(opt) + " must be between " + std::to_string(lo) + " and " +
                                std::to_string(hi));
  return static_cast<T>(v);
}

void put16(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint64_t get(const std::byte* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::to_integer<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

std::uint64_t seed_of(std::uint32_t q, std::uint64_t i) noexcept {
  std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + (std::uint64_t{q} << 48);
  return x ^ (x >> 29);
}

}  // namespace

const TestInfo& info(Test t) noexcept { return kTests[static_cast<std::size_t>(t)]; }

std::optional<Test> test_from_name(std::string_view name) noexcept {
  if (name.starts_with("ib_")) name.remove_prefix(3);
  for (const TestInfo& t : kTests)
    if (name == t.name) return t.test;
  return std::nullopt;
}

std::uint64_t Config::default_size() const noexcept {
  if (test == Test::atomic_lat) return 8;
  return info().bw ? 65536 : 2;
}
std::uint64_t Config::iterations() const noexcept {
  if (duration > 0) return 0;
  if (iters > 0) return iters;
  return test == Test::write_bw ? 5000 : 1000;
}
std::uint32_t Config::inline_default() const noexcept {
  // perftest's defaults for the devices it knows (DEF_INLINE_WRITE, DEF_INLINE_SEND_RC_UC).
  // It turns inline off altogether on devices it does not know (rxe among them); bench/compare
  // passes perftest's figure with -I so that both run alike.
  if (test == Test::write_lat) return 220;
  if (test == Test::send_lat) return 236;
  return 0;
}
std::vector<std::uint64_t> Config::sizes() const {
  if (!all_sizes) return {size != 0 ? size : default_size()};
  if (test == Test::atomic_lat) return {8};
  std::vector<std::uint64_t> v;
  for (std::uint64_t s = 2; s <= kMaxSize; s *= 2) v.push_back(s);
  return v;
}

Config parse_args(int argc, char** argv) {
  Config c;
  std::optional<Test> test;
  bool size_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      usage(stdout);
      std::exit(0);
    }
    if (arg.size() < 2 || arg[0] != '-') {
      if (!test) {
        test = test_from_name(arg);
        if (!test) throw std::invalid_argument("unknown test '" + std::string(arg) + "' (see --help)");
      } else if (c.host.empty()) {
        c.host = arg;
      } else {
        throw std::invalid_argument("more than one HOST given");
      }
      continue;
    }
    // Flags without a value.
    if (arg == "-a" || arg == "--all") { c.all_sizes = true; continue; }
    if (arg == "-R" || arg == "--rdma-cm") { c.rdma_cm = true; continue; }
    if (arg == "-e" || arg == "--events") { c.events = true; continue; }
    if (arg == "--wr-api") { c.wr_api = true; continue; }
    if (arg == "-N" || arg == "--no-peak") { c.no_peak = true; continue; }
    if (arg == "--verify") { c.verify = true; continue; }
    // -X VALUE, -XVALUE, --name VALUE, --name=VALUE
    std::string name(arg);
    std::string_view value;
    bool have_value = false;
    if (arg.starts_with("--")) {
      if (const auto eq = arg.find('='); eq != std::string_view::npos) {
        name = std::string(arg.substr(0, eq));
        value = arg.substr(eq + 1);
        have_value = true;
      }
    } else if (arg.size() > 2) {
      name = std::string(arg.substr(0, 2));
      value = arg.substr(2);
      have_value = true;
    }
    if (!have_value) {
      if (i + 1 >= argc) throw std::invalid_argument(name + " needs a value (see --help)");
      value = argv[++i];
    }
    const auto is = [&](const char* s, const char* l) { return name == s || name == l; };
    if (is("-s", "--size")) {
      c.size = number_in<std::uint64_t>(value, name, 1, std::numeric_limits<std::uint32_t>::max());
      size_given = true;
    } else if (is("-n", "--iters")) {
      c.iters = number_in<std::uint64_t>(value, name, 5, std::uint64_t{1} << 40);
    } else if (is("-D", "--duration")) {
      c.duration = number_in<std::uint32_t>(value, name, 1, 86400);
    } else if (is("-q", "--qp")) {
      c.qps = number_in<std::uint32_t>(value, name, 1, 1024);
    } else if (is("-t", "--tx-depth")) {
      c.tx_depth = number_in<std::uint32_t>(value, name, 1, 1u << 20);
    } else if (is("-r", "--rx-depth")) {
      c.rx_depth = number_in<std::uint32_t>(value, name, 1, 1u << 20);
    } else if (is("-I", "--inline-size")) {
      c.inline_size = number_in<std::uint32_t>(value, name, 0, 4096);
    } else if (is("-l", "--post-list")) {
      c.post_list = number_in<std::uint32_t>(value, name, 1, 4096);
    } else if (is("-Q", "--cq-mod")) {
      c.cq_mod = number_in<std::uint32_t>(value, name, 1, 1024);
    } else if (is("-o", "--outs")) {
      c.out_reads = number_in<std::uint32_t>(value, name, 1, 255);
    } else if (is("-d", "--ib-dev")) {
      c.device = value;
    } else if (is("-i", "--ib-port")) {
      c.ib_port = number_in<std::uint8_t>(value, name, 1, 255);
    } else if (is("-x", "--gid-index")) {
      c.gid_index = number_in<std::uint32_t>(value, name, 0, 65535);
    } else if (is("-p", "--port")) {
      c.port = number_in<std::uint16_t>(value, name, 1, 65535);
    } else if (name == "--bind") {
      c.bind = value;
    } else if (name == "--json") {
      c.json = value;
    } else if (name == "--timeout") {
      c.timeout = std::chrono::seconds(number_in<std::uint32_t>(value, name, 1, 86400));
    } else {
      throw std::invalid_argument("unknown option " + name + " (see --help)");
    }
  }
  if (!test) throw std::invalid_argument("no TEST given (see --help)");
  c.test = *test;
  if (size_given && c.all_sizes) throw std::invalid_argument("-s and -a: give one of them");
  if (c.server() && !c.json.empty()) throw std::invalid_argument("--json: the client reports, not the server");
  validate(c);
  return c;
}

void validate(const Config& c) {
  const TestInfo& t = c.info();
  const auto bad = [](const std::string& why) { throw std::invalid_argument(why); };
  if (c.test == Test::atomic_lat && c.size != 0 && c.size != 8) bad("atomic_lat: the size is 8 bytes");
  if (!t.bw && c.qps != 1) bad(std::string(t.name) + ": latency tests use one QP (-q 1)");
  if (!t.bw && c.post_list != 1) bad(std::string(t.name) + ": -l is for bandwidth tests");
  if (c.duration > 0 && c.all_sizes) bad("-D and -a: give one of them");
  if (c.duration > 0 && c.iters > 0) bad("-D and -n: give one of them");
  if (c.verify && !t.bw && c.test != Test::atomic_lat) bad("--verify: for the bandwidth tests and atomic_lat");
  if (c.events && t.bw) bad("-e: for the latency tests");
  if (c.tx_depth > 0 && c.post_list > c.tx_depth) bad("-l: the post list cannot be longer than the tx depth (-t)");
  for (const std::uint64_t size : c.sizes()) (void)plan_for(c, size);  // throws on a bad combination
}

std::vector<std::byte> encode_params(const Config& c) {
  std::vector<std::byte> w(kParamsWire);
  std::byte* p = w.data();
  p[0] = std::byte{'V'};
  p[1] = std::byte{'P'};
  p[2] = std::byte{1};  // version
  p[3] = static_cast<std::byte>(c.test);
  p[4] = static_cast<std::byte>((c.all_sizes ? 1 : 0) | (c.verify ? 2 : 0) | (c.no_peak ? 4 : 0));
  put16(p + 6, c.qps);
  put16(p + 8, c.post_list);
  put16(p + 10, c.cq_mod);
  put16(p + 12, c.inline_size == Config::kUnset ? 0xFFFF : c.inline_size);
  put16(p + 14, c.out_reads);
  put32(p + 16, static_cast<std::uint32_t>(c.size));
  put32(p + 20, c.tx_depth);
  put32(p + 24, c.rx_depth);
  put32(p + 28, c.duration);
  put64(p + 32, c.iters);
  return w;
}

void decode_params(std::span<const std::byte> wire, Config& c) {
  if (wire.size() < kParamsWire || wire[0] != std::byte{'V'} || wire[1] != std::byte{'P'})
    throw Failure("the peer is not verbs-perf (bad parameter block)");
  if (wire[2] != std::byte{1}) throw Failure("the peer runs another version of verbs-perf");
  const std::byte* p = wire.data();
  const auto test = static_cast<std::uint8_t>(p[3]);
  if (test >= kTests.size()) throw Failure("the peer asked for an unknown test");
  if (static_cast<Test>(test) != c.test)
    throw Failure(std::string("the client runs ") + info(static_cast<Test>(test)).name + ", this server " +
                  c.info().name);
  const auto flags = std::to_integer<unsigned>(p[4]);
  c.all_sizes = (flags & 1) != 0;
  c.verify = (flags & 2) != 0;
  c.no_peak = (flags & 4) != 0;
  c.qps = static_cast<std::uint32_t>(get(p + 6, 2));
  c.post_list = static_cast<std::uint32_t>(get(p + 8, 2));
  c.cq_mod = static_cast<std::uint32_t>(get(p + 10, 2));
  const auto inl = static_cast<std::uint32_t>(get(p + 12, 2));
  c.inline_size = inl == 0xFFFF ? Config::kUnset : inl;
  c.out_reads = static_cast<std::uint32_t>(get(p + 14, 2));
  c.size = get(p + 16, 4);
  c.tx_depth = static_cast<std::uint32_t>(get(p + 20, 4));
  c.rx_depth = static_cast<std::uint32_t>(get(p + 24, 4));
  c.duration = static_cast<std::uint32_t>(get(p + 28, 4));
  c.iters = get(p + 32, 8);
  try {
    validate(c);
  } catch (const std::invalid_argument& e) {
    throw Failure(std::string("the client's parameters are invalid: ") + e.what());
  }
}

std::string describe_params(const Config& c) {
  std::string s = std::string(c.info().name) + (c.all_sizes ? " -a" : " -s " + std::to_string(c.sizes()[0]));
  s += c.duration > 0 ? " -D " + std::to_string(c.duration) : " -n " + std::to_string(c.iterations());
  if (c.qps != 1) s += " -q " + std::to_string(c.qps);
  if (c.tx_depth) s += " -t " + std::to_string(c.tx_depth);
  if (c.rx_depth) s += " -r " + std::to_string(c.rx_depth);
  if (c.inline_size != Config::kUnset) s += " -I " + std::to_string(c.inline_size);
  if (c.post_list != 1) s += " -l " + std::to_string(c.post_list);
  if (c.cq_mod) s += " --cq-mod " + std::to_string(c.cq_mod);
  if (c.out_reads) s += " -o " + std::to_string(c.out_reads);
  if (c.verify) s += " --verify";
  if (c.no_peak) s += " -N";
  if (c.events) s += " -e";  // this side's own choice
  if (c.wr_api) s += " --wr-api";  // and this
  return s;
}

Plan plan_for(const Config& c, std::uint64_t size) {
  const TestInfo& t = c.info();
  const bool timed = c.duration > 0;
  const auto bad = [&](const std::string& why) {
    throw std::invalid_argument(why + " (size " + std::to_string(size) + ")");
  };
  Plan p;
  p.size = size;
  p.iters = c.iterations();
  p.post_list = c.post_list;
  std::uint32_t tx = c.tx_depth != 0 ? c.tx_depth : (t.bw ? 128 : 1);
  if (!timed) tx = static_cast<std::uint32_t>(std::min<std::uint64_t>(tx, p.iters));
  std::uint32_t rx = 1;
  if (t.verb == Verb::send) {
    rx = c.rx_depth != 0 ? c.rx_depth : 512;
    if (!timed) rx = static_cast<std::uint32_t>(std::min<std::uint64_t>(rx, p.iters));
  }
  // perftest: CQ moderation 100, off above 8 KiB unless asked (not with -a), never above the
  // tx depth; with a post list, the post list's length unless asked.
  const bool mod_given = c.cq_mod != 0;
  std::uint32_t mod = mod_given ? c.cq_mod : 100;
  if (size > 8192 && !c.all_sizes && !mod_given) mod = 1;
  mod = std::min(mod, tx);
  if (p.post_list > 1) {
    if (!timed && p.iters % p.post_list != 0) bad("-n must be a multiple of the post list (-l)");
    if (!mod_given) {
      mod = p.post_list;
    } else if (p.post_list % mod != 0) {
      bad("the post list (-l) must be a multiple of --cq-mod");
    }
  }
  p.stride = (std::max<std::uint64_t>(size, 8) + 63) / 64 * 64;
  p.slots = t.bw && size <= kCycleBuffer / 2 ? static_cast<std::uint32_t>(kCycleBuffer / p.stride) : 1;
  p.rx_slots = c.test == Test::send_bw ? p.slots : 1;
  if (c.verify && t.bw) {
    // A slot is written anew for every message, so none may be rewritten while its request is
    // outstanding: as many slots as the depth, within a memory budget that may cut the depth.
    const auto fit = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, kVerifyBudget / p.stride));
    p.slots = std::min(tx, fit);
    tx = p.slots;
    if (c.test == Test::send_bw) {
      p.rx_slots = std::min(rx, fit);
      rx = p.rx_slots;
    }
    mod = std::min(mod, tx);
  }
  if (p.post_list > tx) bad("the post list (-l) is longer than the tx depth");
  if (p.post_list > 1 && p.post_list % mod != 0) bad("the post list (-l) must be a multiple of the CQ moderation");
  p.tx_depth = tx;
  p.rx_depth = rx;
  p.cq_mod = std::max<std::uint32_t>(1, mod);
  p.inline_size = c.inline_size == Config::kUnset ? c.inline_default() : c.inline_size;
  if (t.verb == Verb::read || t.verb == Verb::atomic) p.inline_size = 0;
  return p;
}

std::uint64_t area_bytes(const Config& c) {
  std::uint64_t most = 64;
  for (const std::uint64_t size : c.sizes()) {
    const Plan p = plan_for(c, size);
    most = std::max(most, std::max(p.slots, p.rx_slots) * p.stride);
  }
  return (most + 4095) / 4096 * 4096;  // page-aligned areas, as perftest's buffers
}

void fill_pattern(std::span<std::byte> out, std::uint32_t q, std::uint64_t i) noexcept {
  const std::uint64_t seed = seed_of(q, i);
  std::size_t k = 0;
  for (; k + 8 <= out.size(); k += 8) {
    const std::uint64_t v = seed ^ (k * 0xD6E8FEB86659FD93ull);
    std::memcpy(out.data() + k, &v, 8);
  }
  const std::uint64_t v = seed ^ (k * 0xD6E8FEB86659FD93ull);
  std::memcpy(out.data() + k, &v, out.size() - k);
}

bool has_pattern(std::span<const std::byte> data, std::uint32_t q, std::uint64_t i) noexcept {
  const std::uint64_t seed = seed_of(q, i);
  std::size_t k = 0;
  for (; k + 8 <= data.size(); k += 8) {
    const std::uint64_t v = seed ^ (k * 0xD6E8FEB86659FD93ull);
    if (std::memcmp(data.data() + k, &v, 8) != 0) return false;
  }
  const std::uint64_t v = seed ^ (k * 0xD6E8FEB86659FD93ull);
  return std::memcmp(data.data() + k, &v, data.size() - k) == 0;
}

}  // namespace perf
