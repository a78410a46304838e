// verbs-perf: perftest's latency and bandwidth tests, measured the way perftest measures them,
// on the verbs library's data path (QueuePair::post, CompletionQueue::poll).
//
// Shared declarations of the tool: the command line (Config), the per-size parameters (Plan),
// the connected resources (Session) with their control channel, and the results.
#pragma once

#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace perf {

/// The tests, named as perftest's programs without the ib_ prefix.
enum class Test : std::uint8_t { write_lat, write_bw, read_lat, read_bw, send_lat, send_bw, atomic_lat };
/// The operation a test measures.
enum class Verb : std::uint8_t { write, read, send, atomic };

struct TestInfo {
  Test test;
  const char* name;   ///< "write_lat"
  Verb verb;
  bool bw;            ///< a bandwidth test (else latency)
  const char* title;  ///< perftest's banner title, e.g. "RDMA_Write Latency Test"
};
const TestInfo& info(Test t) noexcept;
std::optional<Test> test_from_name(std::string_view name) noexcept;

/// A failure the tool reports and exits on (status 1); usage errors are std::invalid_argument
/// (status 64).
class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The command line. The client's test parameters travel to the server in the handshake
/// (encode_params), so the server needs only the test name and its local options.
struct Config {
  // ---- test parameters: the client's, sent to the server ----
  Test test = Test::write_lat;
  bool all_sizes = false;           ///< -a: 2 B .. 8 MiB
  bool verify = false;              ///< --verify
  bool no_peak = false;             ///< -N: no peak bandwidth
  std::uint64_t size = 0;           ///< -s (0: the test's default)
  std::uint64_t iters = 0;          ///< -n (0: the test's default)
  std::uint32_t duration = 0;       ///< -D seconds (0: run -n iterations)
  std::uint32_t qps = 1;            ///< -q
  std::uint32_t tx_depth = 0;       ///< -t (0: default)
  std::uint32_t rx_depth = 0;       ///< -r (0: default)
  std::uint32_t inline_size = kUnset;  ///< -I (kUnset: the test's default)
  std::uint32_t post_list = 1;      ///< -l
  std::uint32_t cq_mod = 0;         ///< --cq-mod / -Q (0: default)
  std::uint32_t out_reads = 0;      ///< -o (0: the device's maximum)

  // ---- local options ----
  std::string host;                       ///< the server's address; empty: this is the server
  std::string device;                     ///< -d
  std::optional<std::uint32_t> gid_index; ///< -x
  std::uint8_t ib_port = 1;               ///< -i
  std::uint16_t port = 18515;             ///< -p (perftest's default)
  bool rdma_cm = false;                   ///< -R
  bool events = false;                    ///< -e: sleep on the CQs' completion channels, not poll
  bool wr_api = false;                    ///< --wr-api: post through SendBatch (ibv_wr_*), not QueuePair::post
  std::string bind;                       ///< --bind: local address for rdma_cm
  std::string json;                       ///< --json FILE
  std::chrono::seconds timeout{30};       ///< --timeout: longest silence of the peer

  static constexpr std::uint32_t kUnset = 0xFFFFFFFF;
  [[nodiscard]] bool server() const noexcept { return host.empty(); }
  [[nodiscard]] const TestInfo& info() const noexcept { return perf::info(test); }
  // Defaults resolved as perftest resolves them.
  [[nodiscard]] std::uint64_t default_size() const noexcept;
  [[nodiscard]] std::uint64_t iterations() const noexcept;
  [[nodiscard]] std::uint32_t inline_default() const noexcept;
  [[nodiscard]] std::vector<std::uint64_t> sizes() const;
};

/// Parses the command line; throws std::invalid_argument on a usage error. Prints the help
/// and exits for -h.
Config parse_args(int argc, char** argv);
/// Checks the combination of test parameters (both sides run it on the client's parameters).
void validate(const Config& c);

/// The test parameters in a fixed 40-byte little-endian form (fits rdma_cm's private data).
inline constexpr std::size_t kParamsWire = 40;
std::vector<std::byte> encode_params(const Config& c);
/// Copies the parameters from `wire` into `c`, keeping c's local options. Throws Failure.
void decode_params(std::span<const std::byte> wire, Config& c);
/// One line describing the test parameters, for messages.
std::string describe_params(const Config& c);

/// The parameters of one message size, after perftest's adjustments (tx depth no more than
/// the iterations, CQ moderation off for messages over 8 KiB, ...). Both sides compute it
/// from the same Config.
struct Plan {
  std::uint64_t size = 0;
  std::uint64_t iters = 0;          ///< per QP (0 with -D)
  std::uint32_t tx_depth = 1;
  std::uint32_t rx_depth = 1;
  std::uint32_t cq_mod = 1;
  std::uint32_t post_list = 1;
  std::uint32_t inline_size = 0;    ///< inline when size <= this (before the QP's own limit)
  std::uint64_t stride = 64;        ///< distance between slots (size rounded up to 64)
  std::uint32_t slots = 1;          ///< slots the sender (or reader) cycles through, per QP
  std::uint32_t rx_slots = 1;       ///< receive slots (send tests), per QP
};
Plan plan_for(const Config& c, std::uint64_t size);
/// Bytes of each of the two per-QP areas (out and in) over all sizes of the run.
std::uint64_t area_bytes(const Config& c);

/// The pattern --verify writes: message `i` of QP `q` (slot-indexed data uses the slot as `i`).
void fill_pattern(std::span<std::byte> out, std::uint32_t q, std::uint64_t i) noexcept;
bool has_pattern(std::span<const std::byte> data, std::uint32_t q, std::uint64_t i) noexcept;

// ---- the link between the two sides ----

/// Small text messages between the two sides, outside the measured data path: over the TCP
/// socket of the exchange, or (with -R) by RDMA writes into the peer's control slot.
class Control {
 public:
  virtual ~Control() = default;
  virtual void send(std::string_view msg) = 0;
  /// Waits for the next message, up to `timeout`; throws Failure on timeout or a lost peer.
  virtual std::string receive(std::chrono::milliseconds timeout) = 0;
  /// The next message if one has arrived, without waiting.
  virtual std::optional<std::string> try_receive() = 0;
  /// Before leaving: waits until the peer has taken our last message.
  virtual void finish() = 0;
};

/// Everything one side of a test uses: device, PD, the CQs shared by all QPs, the QPs (owned
/// here, or by the rdma_cm connections), one memory region and the peer's region.
///
/// The region holds, per QP, an "out" area (what this side writes or sends from, or lets the
/// peer read) and an "in" area (what the peer writes into, or this side reads or receives
/// into), each area_bytes() long, then a 256-byte control area (-R). Both sides lay it out alike.
class Session {
 public:
  Session() = default;
  Session(const Session&) = delete;  // the control channel refers to it
  Session& operator=(const Session&) = delete;

  Config cfg;
  std::optional<verbs::Device> device;
  std::optional<verbs::ProtectionDomain> pd;
  std::optional<verbs::CompletionQueue> send_cq, recv_cq;
  std::vector<verbs::QueuePair> own_qps;
  std::vector<verbs::cm::Connection> conns;
  std::vector<const verbs::QueuePair*> qps;  // posted on: own_qps, or the connections'
  std::optional<verbs::MemoryRegion> mr;
  verbs::RemoteSlice peer{};   ///< the peer's whole region
  std::unique_ptr<Control> control;
  std::uint64_t area = 0;      ///< area_bytes(cfg)
  std::uint32_t inline_cap = 0;  ///< the smallest max_inline_data of our QPs

  static constexpr std::uint64_t kControlBytes = 256;

  [[nodiscard]] std::uint64_t out_offset(std::uint32_t q) const noexcept { return 2 * area * q; }
  [[nodiscard]] std::uint64_t in_offset(std::uint32_t q) const noexcept { return 2 * area * q + area; }
  [[nodiscard]] std::uint64_t control_offset() const noexcept { return 2 * area * qps.size(); }

  [[nodiscard]] std::byte* out_ptr(std::uint32_t q, std::uint64_t at) const noexcept {
    return mr->data() + out_offset(q) + at;
  }
  [[nodiscard]] std::byte* in_ptr(std::uint32_t q, std::uint64_t at) const noexcept {
    return mr->data() + in_offset(q) + at;
  }
  [[nodiscard]] verbs::LocalSlice out_slice(std::uint32_t q, std::uint64_t at, std::uint64_t len) const {
    return mr->slice(out_offset(q) + at, len);
  }
  [[nodiscard]] verbs::LocalSlice in_slice(std::uint32_t q, std::uint64_t at, std::uint64_t len) const {
    return mr->slice(in_offset(q) + at, len);
  }
  /// The peer's areas, addressed the same way.
  [[nodiscard]] verbs::RemoteSlice peer_out(std::uint32_t q, std::uint64_t at, std::uint64_t len) const {
    return peer.slice(out_offset(q) + at, len);
  }
  [[nodiscard]] verbs::RemoteSlice peer_in(std::uint32_t q, std::uint64_t at, std::uint64_t len) const {
    return peer.slice(in_offset(q) + at, len);
  }
  /// The QP index of a completion's qp_num.
  [[nodiscard]] std::uint32_t qp_index(std::uint32_t qp_num) const;
};

/// Sets up a session: as the server (waits for the client, takes its parameters) or as the
/// client, over a TCP exchange of Endpoints and RemoteSlices or (cfg.rdma_cm) over rdma_cm.
std::unique_ptr<Session> open_session(const Config& cfg);

// ---- measuring ----

/// Latency results, in microseconds (perftest's t_min .. 99.9% percentile).
struct LatResult {
  std::uint64_t bytes = 0, iters = 0;
  double t_min = 0, t_max = 0, t_typical = 0, t_avg = 0, t_stdev = 0, p99 = 0, p999 = 0;
  double tps = 0;        ///< with -D: transactions per second
  bool timed = false;    ///< -D: only iters, t_avg and tps
};
/// Bandwidth results: MB/s as perftest counts them (2^20 bytes), million messages per second.
struct BwResult {
  std::uint64_t bytes = 0, iters = 0;
  double bw_peak = 0, bw_avg = 0, msg_rate = 0;
};

/// What a run leaves for the server to check and the client to report.
struct RunOutcome {
  std::uint64_t count = 0;                  ///< messages per QP (all QPs alike)
  std::vector<std::uint64_t> per_qp;        ///< messages each QP sent (bw with -D)
  std::optional<LatResult> lat;
  std::optional<BwResult> bw;
  std::string verify_error;                 ///< the client's own check (read_bw), empty if fine
};

/// Before a size: zero what the peer writes into, fill what it reads, post receives.
void prepare(Session& s, const Plan& p);
/// The client's measured run.
RunOutcome run_client(Session& s, const Plan& p);
/// The server's part in a latency ping-pong (write_lat, send_lat); nothing for the others.
void run_server(Session& s, const Plan& p);

/// The server's side of a run after it: the client's per-QP counts ("count Q N" messages, then
/// "done"), and for send_bw what arrived and the first --verify mismatch.
struct ReceiveState {
  std::vector<std::uint64_t> received, told;
  bool done = false;
  std::string error;
};
/// send_bw's receiver: takes the client's messages in (and, with -D, its counts).
void receive_bw(Session& s, const Plan& p, ReceiveState& st);
/// Records one control message of the client in `st` (throws Failure on anything else).
void take_message(const std::string& m, ReceiveState& st);
/// The server's check of the final buffer contents after a run of `count` messages per QP
/// (per_qp: each QP's count). Empty when fine.
std::string verify_server(Session& s, const Plan& p, const std::vector<std::uint64_t>& per_qp);

// ---- reporting ----
void print_banner(const Session& s);
void print_header(const Config& c);
void print_row(const Config& c, const RunOutcome& r);
void print_footer();
void write_json(const Session& s, const std::vector<RunOutcome>& results, const std::string& path);

}  // namespace perf
