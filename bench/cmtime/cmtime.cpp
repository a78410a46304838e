// verbs-cmtime: the time to establish and tear down N rdma_cm connections with verbs::cm, step by
// step, printed the way rdma-core's cmtime prints its own, so that bench/compare can set the two
// side by side. Also what each connection costs in memory and file descriptors, and what is left
// after teardown.
//
//   verbs-cmtime -b ADDR [-p PORT] [-c N] [--own-channels]                 server: accepts N
//                                                          connections, waits for their
//                                                          disconnects, exits
//   verbs-cmtime -s ADDR [-p PORT] [-c N] [--sequential] [--own-channels]  client
//
// The client, by default, starts all N connects at once (cm::start_connect) and drives them from
// one epoll loop; --sequential connects them one after the other with cm::connect. Then it
// disconnects them all, then destroys them. Both sides share one PD and one CQ among the
// connections (ConnectionOptions::pd, send_cq, recv_cq), make QPs of one request each way, and
// put every connection on one rdma_cm event channel (cm::EventChannel), as cmtime does (the
// server's listener too: ListenOptions::channel); --own-channels gives each connection a channel
// of its own instead (the library's default).
//
// The client times a cold round, as cmtime does (the PD and CQ are made inside it, as cmtime's
// first "create qp" makes its own), then runs a second round for the memory and descriptors each
// connection holds and what teardown leaves (the first round made what is made once).
//
// Steps (per connection; cmtime's names where the step is the same):
//   resolve addr   start_connect to the route request (rdma_resolve_addr)
//   route+qp+req   to the connection request sent: the route, the QP made and taken to INIT, and
//                  rdma_connect (cmtime times "resolve route" and "create qp" apart; here one
//                  PendingConnect::step() does them)
//   connect        to established (the server's answer, RTR and RTS, rdma_establish)
//   disconnect     Connection::disconnect
//   destroy        the Connection released (its QP, cm id and event channel)
//   full connect   start_connect to established
// For each: "total ms" from the first connection's start of the step to the last one's end,
// "max ms" and "min us" of one connection, and "us / conn", their sum over N.
#include <malloc.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <exception>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <verbs/cm.hpp>
#include <verbs/verbs.hpp>

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Args {
  std::string server;  // -s: the client's server address
  std::string bind;    // -b: the server's address
  std::uint16_t port = 7471;
  int conns = 100;  // cmtime's default
  bool sequential = false;
  bool own_channels = false;  // --own-channels: no EventChannel
  std::chrono::seconds timeout{60};
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "verbs-cmtime: %s\n"
               "usage: verbs-cmtime -b ADDR [-p PORT] [-c N] [--own-channels] [--timeout S]  (server)\n"
               "       verbs-cmtime -s ADDR [-p PORT] [-c N] [--sequential] [--own-channels] [--timeout S]  (client)\n",
               why);
  std::exit(64);
}

// An epoll set whose events carry a key (an index) each.
class Epoll {
 public:
  Epoll() : fd_(::epoll_create1(EPOLL_CLOEXEC)) {
    if (fd_ < 0) throw std::runtime_error(std::string("epoll_create1: ") + std::strerror(errno));
  }
  ~Epoll() { ::close(fd_); }
  Epoll(const Epoll&) = delete;
  Epoll& operator=(const Epoll&) = delete;
  void add(int fd, std::size_t key) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = key;
    if (::epoll_ctl(fd_, EPOLL_CTL_ADD, fd, &e) != 0)
      throw std::runtime_error(std::string("epoll_ctl: ") + std::strerror(errno));
  }
  void remove(int fd) { ::epoll_ctl(fd_, EPOLL_CTL_DEL, fd, nullptr); }
  /// The keys of what is readable, after waiting up to `timeout` for one.
  std::vector<std::size_t> wait(std::chrono::milliseconds timeout) {
    std::array<epoll_event, 256> got{};
    const int n = ::epoll_wait(fd_, got.data(), static_cast<int>(got.size()), static_cast<int>(timeout.count()));
    std::vector<std::size_t> keys;
    for (int i = 0; i < n; ++i) keys.push_back(got[static_cast<std::size_t>(i)].data.u64);
    return keys;
  }

 private:
  int fd_;
};

template <typename T>
T number(std::string_view s, const char* what, T lo, T hi) {
  T v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi)
    usage((std::string(what) + ": not a number in range: " + std::string(s)).c_str());
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view o = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) usage((std::string(o) + " needs a value").c_str());
      return argv[++i];
    };
    if (o == "-s") a.server = value();
    else if (o == "-b") a.bind = value();
    else if (o == "-p") a.port = number<std::uint16_t>(value(), "-p", 1, 65535);
    else if (o == "-c") a.conns = number<int>(value(), "-c", 1, 65536);
    else if (o == "--sequential") a.sequential = true;
    else if (o == "--own-channels") a.own_channels = true;
    else if (o == "--timeout") a.timeout = std::chrono::seconds(number<int>(value(), "--timeout", 1, 86400));
    else usage(("unknown option " + std::string(o)).c_str());
  }
  if (a.server.empty() == a.bind.empty()) usage("give -s ADDR (client) or -b ADDR (server)");
  return a;
}

// What the process holds: resident memory, heap in use (malloc's: what a leak would keep; the
// resident size also keeps what malloc holds on to after a free) and open file descriptors.
struct Usage {
  long rss_kib = 0;
  long heap_kib = 0;
  int fds = 0;
};
Usage usage_now() {
  Usage u;
  u.heap_kib = static_cast<long>(::mallinfo2().uordblks / 1024);
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  u.rss_kib = resident * (::sysconf(_SC_PAGESIZE) / 1024);
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++u.fds;
    ::closedir(d);
    --u.fds;  // the directory's own
  }
  return u;
}

// The process's CPU time (user, system) so far, in ms: what a round costs beside its wall time.
std::pair<double, double> cpu_ms() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto ms = [](const timeval& t) { return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_usec) / 1e3; };
  return {ms(u.ru_utime), ms(u.ru_stime)};
}

// One step's figures over the connections, as cmtime prints them.
struct Step {
  const char* name;
  std::vector<Clock::time_point> start, end;
};
double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

void print_steps(const std::vector<Step>& steps, int n) {
  std::printf("step              total ms     max ms     min us  us / conn\n");
  for (const Step& s : steps) {
    if (s.start.empty()) continue;
    const auto first = *std::min_element(s.start.begin(), s.start.end());
    const auto last = *std::max_element(s.end.begin(), s.end.end());
    double sum = 0, max = 0, min = 1e300;
    for (std::size_t i = 0; i < s.start.size(); ++i) {
      const double d = us(s.end[i] - s.start[i]);
      sum += d;
      max = std::max(max, d);
      min = std::min(min, d);
    }
    std::printf("%-13s: %11.2f %10.2f %10.2f %10.2f\n", s.name, us(last - first) / 1000, max / 1000, min, sum / n);
  }
}

verbs::cm::ConnectionOptions shared_options(const verbs::ProtectionDomain& pd, verbs::CompletionQueue& cq) {
  // One request each way, as cmtime's QPs; everything shared.
  return {.qp = {.max_send_wr = 1, .max_recv_wr = 1}, .pd = &pd, .send_cq = &cq, .recv_cq = &cq};
}

void report_usage(const char* who, const Usage& before, const Usage& connected, const Usage& after, int n) {
  const auto per = [n](long a, long b) { return static_cast<double>(b - a) / n; };
  std::printf("%s: per connection %.1f KiB heap, %.1f KiB resident, %.2f fds; left after teardown %+ld KiB heap, "
              "%+d fds (resident %+ld KiB)\n",
              who, per(before.heap_kib, connected.heap_kib), per(before.rss_kib, connected.rss_kib),
              per(before.fds, connected.fds), after.heap_kib - before.heap_kib, after.fds - before.fds,
              after.rss_kib - before.rss_kib);
}

enum StepIndex : std::size_t { kResolveAddr, kRouteQpReq, kConnect, kDisconnect, kDestroy, kFull, kSteps };

std::vector<Step> new_steps(std::size_t n) {
  std::vector<Step> steps{{"resolve addr", {}, {}}, {"route+qp+req", {}, {}}, {"connect", {}, {}},
                          {"disconnect", {}, {}},   {"destroy", {}, {}},      {"full connect", {}, {}}};
  for (Step& s : steps) {
    s.start.resize(n);
    s.end.resize(n);
  }
  return steps;
}

// Establishes a.conns connections into `conns`, recording each one's steps.
void establish(const Args& a, const verbs::cm::ClientOptions& opts, Clock::time_point limit, std::vector<Step>& steps,
               std::vector<verbs::cm::Connection>& conns) {
  const auto n = static_cast<std::size_t>(a.conns);
  if (a.sequential) {
    for (std::size_t i = 0; i < n; ++i) {
      steps[kFull].start[i] = Clock::now();
      conns.push_back(verbs::cm::connect(a.server, a.port, opts));
      steps[kFull].end[i] = Clock::now();
    }
    return;
  }
  std::vector<std::optional<verbs::cm::PendingConnect>> pending(n);
  std::vector<std::optional<verbs::cm::Connection>> done(n);
  verbs::cm::ClientOptions each = opts;
  verbs::cm::EventChannel* channel = opts.connection.channel ? &opts.connection.channel->channel() : nullptr;
  for (std::size_t i = 0; i < n; ++i) {
    if (channel != nullptr) each.connection.channel = channel->key(i);
    steps[kResolveAddr].start[i] = steps[kFull].start[i] = Clock::now();
    pending[i].emplace(verbs::cm::start_connect(a.server, a.port, each));
  }
  // One epoll set: each wake touches only the connections that have news (poll() over every fd,
  // or a step() of each, would cost O(N) per event). On one EventChannel, its fd alone, and its
  // poll_events() names them.
  constexpr std::size_t kChannel = ~std::size_t{0};
  Epoll ep;
  if (channel != nullptr)
    ep.add(channel->fd(), kChannel);
  else
    for (std::size_t i = 0; i < n; ++i) ep.add(pending[i]->fd(), i);
  std::size_t left = n;
  auto next_deadline_check = Clock::now();
  std::vector<std::size_t> ready;
  while (left > 0) {
    const auto now = Clock::now();
    if (now > limit) throw std::runtime_error("connections not established within --timeout");
    ready = ep.wait(100ms);
    if (!ready.empty() && ready.front() == kChannel) {
      ready.clear();
      for (const std::uint64_t key : channel->poll_events()) ready.push_back(static_cast<std::size_t>(key));
    }
    if (now >= next_deadline_check) {  // a phase's own limit: step() it then, readable or not
      for (std::size_t i = 0; i < n; ++i)
        if (pending[i] && pending[i]->deadline() <= now) ready.push_back(i);
      next_deadline_check = now + 100ms;
    }
    for (const std::size_t i : ready) {
      if (!pending[i]) continue;
      std::optional<verbs::cm::Connection> c = pending[i]->step();
      const auto t = Clock::now();
      const verbs::cm::Phase p = pending[i]->phase();
      // A phase passed: its step ends, the next begins (one step() may pass several).
      const auto passed = [&](std::size_t step) {
        if (steps[step].end[i] != Clock::time_point{}) return;
        steps[step].end[i] = t;
        steps[step + 1].start[i] = t;
      };
      if (p != verbs::cm::Phase::resolve_address || c) passed(kResolveAddr);
      if (p == verbs::cm::Phase::connect || c) passed(kRouteQpReq);
      if (c) {
        steps[kConnect].end[i] = steps[kFull].end[i] = t;
        if (channel == nullptr) ep.remove(pending[i]->fd());
        done[i] = std::move(c);
        pending[i].reset();
        --left;
      }
    }
  }
  for (auto& c : done) conns.push_back(std::move(*c));
}

// Disconnects every connection, then destroys them, recording both steps.
void tear_down(std::vector<Step>& steps, std::vector<verbs::cm::Connection>& conns) {
  const std::size_t n = conns.size();
  for (std::size_t i = 0; i < n; ++i) {
    steps[kDisconnect].start[i] = Clock::now();
    conns[i].disconnect();
    steps[kDisconnect].end[i] = Clock::now();
  }
  for (std::size_t i = 0; i < n; ++i) {
    steps[kDestroy].start[i] = Clock::now();
    { verbs::cm::Connection gone(std::move(conns[i])); }
    steps[kDestroy].end[i] = Clock::now();
  }
  conns.clear();
}

int client(const Args& a) {
  const auto limit = Clock::now() + a.timeout;
  const auto n = static_cast<std::size_t>(a.conns);
  const verbs::Device dev = verbs::cm::device_to(a.server);
  // cmtime resolves the server's address with rdma_getaddrinfo(3) before its clock starts, which
  // also makes librdmacm look for ibacm (a file and a socket) once per process; so does this.
  rdma_addrinfo hints{};
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* info = nullptr;
  if (::rdma_getaddrinfo(a.server.c_str(), std::to_string(a.port).c_str(), &hints, &info) == 0) ::rdma_freeaddrinfo(info);
  std::vector<Step> steps = new_steps(n);
  std::vector<verbs::cm::Connection> conns;
  conns.reserve(n);
  std::optional<verbs::cm::EventChannel> channel;  // made before the clock starts, as cmtime's
  if (!a.own_channels) channel.emplace();
  // Timed as cmtime times its own: from a cold start (its first "create qp" makes its PD and CQ).
  const auto cpu0 = cpu_ms();
  const auto t0 = Clock::now();
  const verbs::ProtectionDomain pd(dev);
  verbs::CompletionQueue cq(dev, {.depth = 2 * a.conns + 16});
  verbs::cm::ClientOptions opts{.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(a.timeout),
                                .connection = shared_options(pd, cq)};
  if (channel) opts.connection.channel = channel->key(0);
  establish(a, opts, limit, steps, conns);
  const auto t1 = Clock::now();
  const auto cpu1 = cpu_ms();
  tear_down(steps, conns);
  if (a.sequential) steps.erase(steps.begin(), steps.begin() + kDisconnect);  // one call: no steps apart
  std::printf("verbs-cmtime: %d connections to %s port %u, %s, %s\n", a.conns, a.server.c_str(), a.port,
              a.sequential ? "one after the other (cm::connect)" : "all at once (cm::start_connect, one epoll loop)",
              a.own_channels ? "each on an event channel of its own" : "all on one cm::EventChannel");
  print_steps(steps, a.conns);
  std::printf("connections/s  %.1f   (%d in %.2f ms, the PD and CQ made first included)\n",
              a.conns / (us(t1 - t0) / 1e6), a.conns, us(t1 - t0) / 1000);
  std::printf("client: cpu in the timed round %.1f ms user, %.1f ms system\n", cpu1.first - cpu0.first,
              cpu1.second - cpu0.second);
  // Again, for what each connection costs: what the first round made once (librdmacm's and the
  // provider's state, this tool's records) is not counted, nor taken for a leak.
  std::vector<Step> again = new_steps(n);
  const Usage before = usage_now();
  establish(a, opts, limit, again, conns);
  const Usage connected = usage_now();
  tear_down(again, conns);
  const Usage after = usage_now();
  report_usage("client", before, connected, after, a.conns);
  return 0;
}

int server(const Args& a) {
  const auto limit = Clock::now() + a.timeout;
  // The listener on the EventChannel too (key 0), as cmtime's server reads one channel: the
  // requests' ids are there already (no rdma_migrate_id), and one fd tells of everything.
  std::optional<verbs::cm::EventChannel> channel;
  if (!a.own_channels) channel.emplace();
  verbs::cm::Listener listener(a.bind, a.port,
                               {.backlog = std::max(64, a.conns), .channel = channel ? std::optional(channel->key(0)) : std::nullopt});
  const verbs::Device dev = listener.device();
  const verbs::ProtectionDomain pd(dev);
  verbs::CompletionQueue cq(dev, {.depth = 2 * a.conns + 16});
  auto opts = shared_options(pd, cq);
  std::printf("verbs-cmtime: listening on %s port %u for %d connections, twice, %s\n", a.bind.c_str(), a.port,
              a.conns, a.own_channels ? "each on an event channel of its own" : "all on one cm::EventChannel");
  std::fflush(stdout);
  // Pending handshakes by a key of their own (`channel.key(k)`); one epoll set for them and the
  // listener (key 0), or the EventChannel's fd alone.
  std::vector<std::optional<verbs::cm::PendingAccept>> pending(1);
  std::vector<verbs::cm::Connection> conns;
  conns.reserve(static_cast<std::size_t>(a.conns));
  constexpr std::size_t kChannel = ~std::size_t{0};
  Epoll ep;
  if (channel)
    ep.add(channel->fd(), kChannel);
  else
    ep.add(listener.fd(), 0);
  // The client's two rounds: the timed one, then the one whose memory and descriptors count.
  const auto round = [&] {
    auto next_deadline_check = Clock::now();
    while (static_cast<int>(conns.size()) < a.conns) {
      const auto now = Clock::now();
      if (now > limit) throw std::runtime_error("connections not accepted within --timeout");
      std::vector<std::size_t> ready = ep.wait(100ms);
      if (channel && std::find(ready.begin(), ready.end(), kChannel) != ready.end()) {
        std::erase(ready, kChannel);
        for (const std::uint64_t key : channel->poll_events()) ready.push_back(static_cast<std::size_t>(key));
      }
      if (now >= next_deadline_check) {
        for (std::size_t k = 1; k < pending.size(); ++k)
          if (pending[k] && pending[k]->deadline() <= now) ready.push_back(k);
        next_deadline_check = now + 100ms;
      }
      for (const std::size_t k : ready) {
        if (k == 0) {
          for (;;) {
            if (channel) opts.channel = channel->key(pending.size());
            auto p = listener.start_accept(opts);
            if (!p) break;
            if (!channel) ep.add(p->fd(), pending.size());
            pending.emplace_back(std::move(*p));
          }
        } else if (k < pending.size() && pending[k]) {
          if (auto c = pending[k]->step()) {
            if (!channel) ep.remove(pending[k]->fd());
            conns.push_back(std::move(*c));
            pending[k].reset();
          }
        }
      }
    }
    pending.resize(1);
  };
  const auto disconnected = [&] {
    for (verbs::cm::Connection& c : conns)
      c.wait_disconnected(std::max(std::chrono::duration_cast<std::chrono::milliseconds>(limit - Clock::now()), 1ms));
    conns.clear();
  };
  const auto cpu0 = cpu_ms();
  const auto t0 = Clock::now();
  round();
  const auto t1 = Clock::now();
  const auto cpu1 = cpu_ms();
  disconnected();
  // From listening (before the client starts) to the last accept: its wall time is no figure.
  std::printf("server: cpu in the timed round %.1f ms user, %.1f ms system (%.1f ms from listening)\n",
              cpu1.first - cpu0.first, cpu1.second - cpu0.second, us(t1 - t0) / 1000);
  const Usage before = usage_now();
  round();
  const Usage connected = usage_now();
  disconnected();
  const Usage after = usage_now();
  report_usage("server", before, connected, after, a.conns);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  // With --own-channels each connection holds a descriptor (its rdma_cm event channel), and a
  // thread that sleeps on it two more; the usual soft limit of 1024 ends a process near 1000
  // connections. Raise it as far as allowed.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  return a.bind.empty() ? client(a) : server(a);
} catch (const std::exception& e) {
  std::fprintf(stderr, "verbs-cmtime: %s\n", e.what());
  return 1;
}
