// verbs-perf: the banner, perftest's result table, and the JSON file.
#include <cinttypes>
#include <cstdio>

#include "clock.hpp"
#include "perf.hpp"

namespace perf {
namespace {

constexpr const char* kLine = "---------------------------------------------------------------------------------------\n";

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      out += ' ';
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

}  // namespace

void print_banner(const Session& s) {
  const Config& c = s.cfg;
  const Plan p = plan_for(c, c.sizes()[0]);
  const verbs::QueuePair& qp = *s.qps[0];
  const verbs::PortInfo port = s.device->port(c.ib_port);
  std::printf("%s", kLine);
  std::printf("                    %s (verbs-perf)\n", c.info().title);
  std::printf(" Device          : %s\n", s.device->name().c_str());
  std::printf(" Number of qps   : %u\t\tTransport type : IB\n", c.qps);
  std::printf(" Connection type : RC\t\tUsing SRQ      : OFF\n");
  std::printf(" Post API        : %s\n", c.wr_api ? "ibv_wr_* (verbs::SendBatch)" : "ibv_post_send (verbs::QueuePair::post)");
  std::printf(" TX depth        : %u\n", p.tx_depth);
  if (c.info().verb == Verb::send) std::printf(" RX depth        : %u\n", p.rx_depth);
  if (c.info().bw) std::printf(" CQ Moderation   : %u\n", p.cq_mod);
  if (p.post_list > 1) std::printf(" Post List       : %u\n", p.post_list);
  std::printf(" Mtu             : %u[B]\n", verbs::mtu_bytes(port.active_mtu));
  std::printf(" Link type       : %s\n", port.is_ethernet() ? "Ethernet" : "IB");
  std::printf(" GID index       : %u\n", qp.gid_index());
  std::printf(" Max inline data : %u[B]\n", std::min(p.inline_size, s.inline_cap));
  std::printf(" rdma_cm QPs     : %s\n", c.rdma_cm ? "ON" : "OFF");
  std::printf(" Data ex. method : %s\n", c.rdma_cm ? "rdma_cm" : "Ethernet");
  std::printf(" Timer           : %s, %.1f per usec\n", Ticks::name(), Ticks::per_us());
  if (c.verify) std::printf(" Verify          : ON (the sender writes a new pattern per message)\n");
  std::printf("%s", kLine);
  for (std::uint32_t q = 0; q < s.qps.size(); ++q) {
    const verbs::Endpoint e = s.qps[q]->endpoint();
    std::printf(" local address: LID %#06x QPN %#06x PSN %#08x\n", e.lid, e.qp_num, e.psn);
    std::printf(" GID: %s\n", e.gid.to_string().c_str());
  }
}

void print_header(const Config& c) {
  std::printf("%s", kLine);
  if (c.info().bw)
    std::printf(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n");
  else if (c.duration > 0)
    std::printf(" #bytes        #iterations       t_avg[usec]    tps average\n");
  else
    std::printf(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]"
                "   99%% percentile[usec]   99.9%% percentile[usec] \n");
}

void print_row(const Config& c, const RunOutcome& r) {
  (void)c;
  if (r.bw) {
    const BwResult& b = *r.bw;
    std::printf(" %-7" PRIu64 "    %-10" PRIu64 "       %-7.2f            %-7.2f\t\t   %-7.6f\n", b.bytes, b.iters,
                b.bw_peak, b.bw_avg, b.msg_rate);
  } else if (r.lat && r.lat->timed) {
    const LatResult& l = *r.lat;
    std::printf(" %-7" PRIu64 "       %-10" PRIu64 "        %-7.2f        %-7.2f\n", l.bytes, l.iters, l.t_avg, l.tps);
  } else if (r.lat) {
    const LatResult& l = *r.lat;
    std::printf(" %-7" PRIu64 " %-10" PRIu64 "    %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f"
                " \t\t%-7.2f\n",
                l.bytes, l.iters, l.t_min, l.t_max, l.t_typical, l.t_avg, l.t_stdev, l.p99, l.p999);
  }
}

void print_footer() {
  std::printf("%s", kLine);
}

void write_json(const Session& s, const std::vector<RunOutcome>& results, const std::string& path) {
  const Config& c = s.cfg;
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw Failure("--json: cannot write " + path);
  const Plan p = plan_for(c, c.sizes()[0]);
  std::fprintf(f, "{\n  \"tool\": \"verbs-perf\",\n  \"test\": %s,\n  \"device\": %s,\n", json_string(c.info().name).c_str(),
               json_string(s.device->name()).c_str());
  std::fprintf(f,
               "  \"params\": {\"qps\": %u, \"tx_depth\": %u, \"rx_depth\": %u, \"cq_mod\": %u, \"post_list\": %u, "
               "\"inline_size\": %u, \"duration\": %u, \"rdma_cm\": %s, \"verify\": %s, \"events\": %s, \"wr_api\": %s, \"command\": %s},\n",
               c.qps, p.tx_depth, p.rx_depth, p.cq_mod, p.post_list, std::min(p.inline_size, s.inline_cap), c.duration,
               c.rdma_cm ? "true" : "false", c.verify ? "true" : "false", c.events ? "true" : "false",
               c.wr_api ? "true" : "false", json_string(describe_params(c)).c_str());
  std::fprintf(f, "  \"timer\": {\"source\": %s, \"ticks_per_usec\": %.3f},\n", json_string(Ticks::name()).c_str(),
               Ticks::per_us());
  std::fprintf(f, "  \"results\": [");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const RunOutcome& r = results[i];
    std::fprintf(f, "%s\n    {", i == 0 ? "" : ",");
    if (r.bw) {
      const BwResult& b = *r.bw;
      std::fprintf(f,
                   "\"bytes\": %" PRIu64 ", \"iterations\": %" PRIu64 ", \"bw_peak_mb_s\": %.4f, "
                   "\"bw_avg_mb_s\": %.4f, \"msg_rate_mpps\": %.6f",
                   b.bytes, b.iters, b.bw_peak, b.bw_avg, b.msg_rate);
    } else if (r.lat) {
      const LatResult& l = *r.lat;
      std::fprintf(f, "\"bytes\": %" PRIu64 ", \"iterations\": %" PRIu64 ", ", l.bytes, l.iters);
      if (l.timed)
        std::fprintf(f, "\"t_avg_us\": %.4f, \"tps\": %.2f", l.t_avg, l.tps);
      else
        std::fprintf(f,
                     "\"t_min_us\": %.4f, \"t_max_us\": %.4f, \"t_typical_us\": %.4f, \"t_avg_us\": %.4f, "
                     "\"t_stdev_us\": %.4f, \"p99_us\": %.4f, \"p99_9_us\": %.4f",
                     l.t_min, l.t_max, l.t_typical, l.t_avg, l.t_stdev, l.p99, l.p999);
    }
    if (c.verify) std::fprintf(f, ", \"verified\": %s", r.verify_error.empty() ? "true" : "false");
    std::fprintf(f, "}");
  }
  std::fprintf(f, "\n  ]\n}\n");
  if (std::fclose(f) != 0) throw Failure("--json: cannot write " + path);
}

}  // namespace perf
