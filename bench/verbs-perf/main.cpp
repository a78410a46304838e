// verbs-perf: perftest's tests on the verbs library (see --help, and perf.hpp and run.cpp).
//
//   server:  verbs-perf write_bw [-d DEV] [-x GID] [-p PORT] [-R]
//   client:  verbs-perf write_bw [-d DEV] [-x GID] [-p PORT] [-R] [test parameters] SERVER
//
// Per message size the two sides agree over the control channel (TCP, or RDMA writes with -R):
// the client prepares and says "go SIZE", the server prepares (zeroes buffers, posts receives)
// and says "ready", the client runs and says "count Q N" per QP and "done", and the server checks
// the data (--verify) and answers "ok" or "fail WHY".
#include <cstdio>
#include <cstdlib>
#include <string>

#include "clock.hpp"
#include "perf.hpp"

namespace {

using namespace perf;

constexpr auto kForever = std::chrono::hours(24 * 365);

std::string expect(Control& ctl, std::chrono::milliseconds timeout, std::string_view what) {
  std::string m = ctl.receive(timeout);
  if (!m.starts_with(what)) throw Failure("expected '" + std::string(what) + "' from the peer, got '" + m + "'");
  return m;
}

int client(const Config& cfg) {
  const std::unique_ptr<Session> session = open_session(cfg);
  Session& s = *session;
  print_banner(s);
  print_header(s.cfg);
  std::vector<RunOutcome> results;
  std::string failures;
  for (const std::uint64_t size : s.cfg.sizes()) {
    const Plan p = plan_for(s.cfg, size);
    prepare(s, p);
    s.control->send("go " + std::to_string(size));
    (void)expect(*s.control, s.cfg.timeout, "ready");
    RunOutcome r = run_client(s, p);
    for (std::uint32_t q = 0; q < r.per_qp.size(); ++q)
      s.control->send("count " + std::to_string(q) + " " + std::to_string(r.per_qp[q]));
    s.control->send("done");
    const std::string verdict = s.control->receive(kForever);  // the server may check a lot of data
    if (verdict.starts_with("fail") && r.verify_error.empty())
      r.verify_error = "server: " + (verdict.size() > 5 ? verdict.substr(5) : std::string("?"));
    else if (verdict != "ok" && !verdict.starts_with("fail"))
      throw Failure("expected the server's verdict, got '" + verdict + "'");
    print_row(s.cfg, r);
    if (!r.verify_error.empty()) failures += " size " + std::to_string(size) + ": " + r.verify_error + ";";
    results.push_back(std::move(r));
  }
  s.control->finish();
  print_footer();
  if (!s.cfg.json.empty()) write_json(s, results, s.cfg.json);
  if (s.cfg.verify) {
    if (!failures.empty()) {
      std::fprintf(stderr, "verbs-perf: --verify FAILED:%s\n", failures.c_str());
      return 1;
    }
    std::printf(" --verify: the data of every size checked out\n");
  }
  return 0;
}

int server(const Config& cfg) {
  const std::unique_ptr<Session> session = open_session(cfg);
  Session& s = *session;
  print_banner(s);
  std::printf(" Client's parameters: %s\n", describe_params(s.cfg).c_str());
  bool failed = false;
  for (const std::uint64_t size : s.cfg.sizes()) {
    const Plan p = plan_for(s.cfg, size);
    const std::string go = expect(*s.control, s.cfg.timeout, "go ");
    if (go != "go " + std::to_string(size)) throw Failure("out of step with the client: '" + go + "'");
    prepare(s, p);
    s.control->send("ready");
    ReceiveState st;
    st.told.assign(s.qps.size(), 0);
    if (s.cfg.test == Test::send_bw) {
      receive_bw(s, p, st);
    } else {
      run_server(s, p);
    }
    while (!st.done) take_message(s.control->receive(kForever), st);  // the client's run may be long
    std::string error = st.error;
    if (error.empty() && s.cfg.test == Test::send_bw && st.received != st.told)
      error = "received a different number of messages than the client sent";
    if (error.empty()) error = verify_server(s, p, st.told);
    if (!error.empty()) {
      failed = true;
      std::fprintf(stderr, "verbs-perf: --verify FAILED at size %llu: %s\n", static_cast<unsigned long long>(size),
                   error.c_str());
      s.control->send(("fail " + error).substr(0, 48));
    } else {
      s.control->send("ok");
    }
  }
  s.control->finish();
  print_footer();
  if (s.cfg.verify && !failed) std::printf(" --verify: the data of every size checked out\n");
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Ticks::start();
  Config cfg;
  try {
    cfg = parse_args(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "verbs-perf: %s\n", e.what());
    return 64;
  }
  try {
    return cfg.server() ? server(cfg) : client(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "verbs-perf: %s\n", e.what());
    return 1;
  }
}
