// verbs-perf: the measured loops. Each follows perftest's (perftest_resources.c, run_iter_*):
//
//   write_lat  ping-pong of RDMA writes; each side busy-polls the last byte of its buffer for the
//              peer's next message, posts its own (signaled) and busy-polls its completion. The
//              server sends first. A sample is the time between two of the client's posts, one
//              round trip; latency is half of it.
//   send_lat   the same with sends into receives kept posted, busy-polling the receive CQ; the
//              client sends first.
//   read_lat,  one request at a time, busy-polling its completion; a sample is one round trip
//   atomic_lat (not halved). The server does nothing.
//   *_bw       the client keeps tx-depth requests outstanding per QP, posts them in chains of
//              the post list (one ibv_post_send each), signals one in cq-mod, polls up to 16
//              completions at a time, and stamps each post and each completion. Bandwidth is
//              size x messages over first post to last completion; the peak is the best
//              per-message time over any stretch from a post to a later completion.
//
// Everything on the data path goes through the library: QueuePair::post (one request or a
// span chain), or with --wr-api a SendBatch per post, QueuePair::post_recv, CompletionQueue::poll.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "clock.hpp"
#include "perf.hpp"

namespace perf {
namespace {

constexpr std::byte kStop{0xFF};  // write_lat with -D: the client's last message says "stop"
constexpr std::uint32_t kStopImm = 0x5704;  // send_lat with -D: a send with immediate says "stop"
constexpr std::uint64_t kQpShift = 40;      // wr_id: QP index above, message number below

/// The value of message i's last byte in write_lat: 1..254, never 0 (the zeroed buffer) nor kStop.
constexpr std::byte seq(std::uint64_t i) noexcept { return static_cast<std::byte>(1 + i % 254); }

[[noreturn]] void post_failed(const verbs::PostResult& r, const char* what) {
  throw Failure(std::string(what) + ": " + r.error().message());
}
/// --wr-api: the requests posted in one SendBatch (ibv_wr_start, one ibv_wr_* each,
/// ibv_wr_complete), as perftest posts a list by default.
verbs::PostResult batch_post(const verbs::QueuePair& qp, std::span<const verbs::SendWr> wrs) {
  verbs::SendBatch b = qp.batch();
  for (const verbs::SendWr& w : wrs) b.add(w);
  return b.complete();
}
[[noreturn]] void completion_failed(const verbs::Completion& wc) {
  throw Failure("work completion failed: " + wc.error_code().message() + " (wr_id " + std::to_string(wc.wr_id()) +
                ", vendor error " + std::to_string(wc.vendor_err()) + ")");
}
[[noreturn]] void starved(const Session& s) {
  throw Failure("the peer went quiet for " + std::to_string(s.cfg.timeout.count()) + " s (--timeout)");
}

/// Busy-polls one completion, as perftest's `do ne = ibv_poll_cq(cq, 1, &wc); while (ne == 0)`;
/// with -e, sleeps until it comes (CompletionQueue::wait: poll, arm, poll again, then sleep on
/// the channel's fd), where perftest sleeps in ibv_get_cq_event and arms after.
verbs::Completion spin(const Session& s, const verbs::CompletionQueue& cq, Watchdog& wd) {
  verbs::Completion wc;
  if (s.cfg.events) {
    if (cq.wait(std::span(&wc, 1), s.cfg.timeout).empty()) starved(s);
  } else {
    while (cq.poll(std::span(&wc, 1)).empty())
      if (wd.starved()) starved(s);
  }
  wd.progress();
  if (!wc.ok()) completion_failed(wc);
  return wc;
}

/// Busy-polls a byte the peer writes until it is `want` (or kStop).
std::byte spin_byte(const Session& s, const volatile std::byte* p, std::byte want, Watchdog& wd) {
  for (;;) {
    const std::byte v = *p;
    if (v == want || v == kStop) {
      wd.progress();
      return v;
    }
    if (wd.starved()) starved(s);
  }
}

/// For the tests of --verify itself: VERBS_PERF_CORRUPT set spoils one message (the client's
/// last, or the first slot a read_bw server offers).
bool corrupting() { return std::getenv("VERBS_PERF_CORRUPT") != nullptr; }

bool use_inline(const Session& s, const Plan& p) {
  const Verb v = s.cfg.info().verb;
  return (v == Verb::write || v == Verb::send) && p.size <= p.inline_size && p.size <= s.inline_cap;
}

std::uint64_t ticks_for(std::chrono::seconds d, double per_us) {
  return static_cast<std::uint64_t>(static_cast<double>(d.count()) * 1e6 * per_us);
}

/// What a latency loop records on the client: a stamp before each post (iterations), or the
/// first and last stamps and the count (-D).
struct Stamps {
  std::vector<std::uint64_t> t;
  std::uint64_t first = 0, last = 0, count = 0;
};

LatResult lat_stats(const Stamps& st, std::uint64_t bytes, double per_us, int rtt, bool timed) {
  LatResult r;
  r.bytes = bytes;
  r.iters = st.count;
  const double unit = per_us * rtt;  // ticks per reported microsecond
  if (timed) {
    r.timed = true;
    const auto span = static_cast<double>(st.last - st.first);
    const double n = static_cast<double>(std::max<std::uint64_t>(1, st.count));
    r.t_avg = span / unit / n;
    r.tps = span > 0 ? n / (span / (per_us * 1e6)) : 0;
    return r;
  }
  // perftest: deltas between consecutive posts, sorted, the two largest left out; the median of
  // the rest is t_typical, and t_max is the first one left out.
  std::vector<std::uint64_t> d;
  d.reserve(st.t.size());
  for (std::size_t i = 0; i + 1 < st.t.size(); ++i) d.push_back(st.t[i + 1] - st.t[i]);
  std::sort(d.begin(), d.end());
  const std::size_t m = d.size() > 3 ? d.size() - 2 : d.size();
  if (m == 0) return r;
  const double median = (m - 1) % 2 != 0 ? (static_cast<double>(d[m / 2]) + static_cast<double>(d[m / 2 - 1])) / 2
                                         : static_cast<double>(d[m / 2]);
  double sum = 0;
  for (std::size_t i = 0; i < m; ++i) sum += static_cast<double>(d[i]) / unit;
  const double avg = sum / static_cast<double>(m);
  double var = 0;
  for (std::size_t i = 0; i < m; ++i) var += std::pow(static_cast<double>(d[i]) / unit - avg, 2);
  const auto at = [&](double q) {
    const auto k = static_cast<std::size_t>(std::ceil(static_cast<double>(m) * q));
    return static_cast<double>(d[std::min(k, d.size() - 1)]) / unit;
  };
  r.t_min = static_cast<double>(d[0]) / unit;
  r.t_max = static_cast<double>(d[std::min(m, d.size() - 1)]) / unit;
  r.t_typical = median / unit;
  r.t_avg = avg;
  r.t_stdev = std::sqrt(var / static_cast<double>(m));
  r.p99 = at(0.99);
  r.p999 = at(0.999);
  return r;
}

// ---- latency ----

/// write_lat, both sides. Returns the messages this side sent.
std::uint64_t write_lat(Session& s, const Plan& p, Stamps* st, double per_us) {
  const bool wr_api = s.cfg.wr_api;
  const bool client = !s.cfg.server();
  const bool timed = s.cfg.duration > 0;
  const std::uint64_t n = p.iters;
  const verbs::QueuePair& qp = *s.qps[0];
  const verbs::CompletionQueue& cq = *s.send_cq;
  const volatile std::byte* in = s.in_ptr(0, p.size - 1);
  std::byte* out = s.out_ptr(0, p.size - 1);
  const verbs::LocalSlice src = s.out_slice(0, 0, p.size);
  const verbs::RemoteSlice dst = s.peer_in(0, 0, p.size);
  const verbs::PostOptions opt{.signaled = true, .inline_data = use_inline(s, p)};
  Watchdog wd(s.cfg.timeout, per_us);
  const auto send = [&](std::byte b) {
    *out = b;
    const verbs::PostResult r = wr_api ? qp.batch().write(src, dst, opt).complete() : qp.post_write(src, dst, opt);
    if (!r) post_failed(r, "post_write");
    (void)spin(s, cq, wd);
  };
  if (client) {
    const std::uint64_t deadline = timed ? Ticks::now() + ticks_for(std::chrono::seconds(s.cfg.duration), per_us) : 0;
    for (std::uint64_t i = 0; timed || i < n; ++i) {
      if (spin_byte(s, in, seq(i), wd) == kStop) throw Failure("the server stopped the test");
      const std::uint64_t now = Ticks::now();
      if (timed) {
        if (i == 0) st->first = now;
        if (now >= deadline) {
          send(kStop);
          st->last = now;
          st->count = i;
          return i + 1;
        }
      } else {
        st->t[i] = now;
      }
      send(seq(i));
    }
    st->count = n;
    return n;
  }
  for (std::uint64_t i = 0;; ++i) {
    if (i > 0 && spin_byte(s, in, seq(i - 1), wd) == kStop) return i;
    if (!timed && i == n) return n;
    send(seq(i));
  }
}

/// send_lat, both sides.
std::uint64_t send_lat(Session& s, const Plan& p, Stamps* st, double per_us) {
  const bool wr_api = s.cfg.wr_api;
  const bool client = !s.cfg.server();
  const bool timed = s.cfg.duration > 0;
  const std::uint64_t n = p.iters;
  const verbs::QueuePair& qp = *s.qps[0];
  const verbs::LocalSlice src = s.out_slice(0, 0, p.size);
  const verbs::LocalSlice dst = s.in_slice(0, 0, p.size);
  const bool inl = use_inline(s, p);
  Watchdog wd(s.cfg.timeout, per_us);
  std::uint64_t posted = timed ? p.rx_depth : std::min<std::uint64_t>(p.rx_depth, n);  // by prepare()
  const auto receive = [&]() -> bool {  // false: the peer said stop
    const verbs::Completion wc = spin(s, *s.recv_cq, wd);
    if (wc.imm_data()) return false;
    if (timed || posted < n) {
      if (const verbs::PostResult r = qp.post_recv(dst); !r) post_failed(r, "post_recv");
      ++posted;
    }
    return true;
  };
  const auto send = [&](std::uint64_t i) {
    const bool sig = (i + 1) % p.cq_mod == 0 || (!timed && i + 1 == n);
    const verbs::PostOptions o{.signaled = sig, .inline_data = inl};
    if (const verbs::PostResult r = wr_api ? qp.batch().send(src, o).complete() : qp.post_send(src, o); !r)
      post_failed(r, "post_send");
    if (sig) (void)spin(s, *s.send_cq, wd);
  };
  if (client) {
    const std::uint64_t deadline = timed ? Ticks::now() + ticks_for(std::chrono::seconds(s.cfg.duration), per_us) : 0;
    for (std::uint64_t i = 0; timed || i < n; ++i) {
      if (i > 0 && !receive()) throw Failure("the server stopped the test");
      const std::uint64_t now = Ticks::now();
      if (timed) {
        if (i == 0) st->first = now;
        if (now >= deadline) {
          const verbs::PostResult r = qp.post_send_imm(src, kStopImm, {.signaled = true});
          if (!r) post_failed(r, "post_send_imm");
          (void)spin(s, *s.send_cq, wd);
          st->last = now;
          st->count = i;
          return i + 1;
        }
      } else {
        st->t[i] = now;
      }
      send(i);
    }
    (void)receive();  // the answer to the last one
    st->count = n;
    return n;
  }
  for (std::uint64_t i = 0; timed || i < n; ++i) {
    if (!receive()) return i;
    send(i);
  }
  return n;
}

/// read_lat and atomic_lat, the client.
std::uint64_t one_at_a_time(Session& s, const Plan& p, Stamps* st, double per_us) {
  const bool wr_api = s.cfg.wr_api;
  const bool timed = s.cfg.duration > 0;
  const std::uint64_t n = p.iters;
  const verbs::QueuePair& qp = *s.qps[0];
  const bool atomic = s.cfg.test == Test::atomic_lat;
  const verbs::SendWr wr = atomic ? verbs::SendWr::fetch_add(s.in_slice(0, 0, 8), s.peer_in(0, 0, 8), 1)
                                  : verbs::SendWr::read(s.in_slice(0, 0, p.size), s.peer_out(0, 0, p.size));
  Watchdog wd(s.cfg.timeout, per_us);
  const std::uint64_t deadline = timed ? Ticks::now() + ticks_for(std::chrono::seconds(s.cfg.duration), per_us) : 0;
  std::uint64_t i = 0;
  for (; timed || i < n; ++i) {
    const std::uint64_t now = Ticks::now();
    if (timed) {
      if (i == 0) st->first = now;
      if (now >= deadline) {
        st->last = now;
        break;
      }
    } else {
      st->t[i] = now;
    }
    if (const verbs::PostResult r = wr_api ? qp.batch().add(wr).complete() : qp.post(wr); !r)
      post_failed(r, atomic ? "post_fetch_add" : "post_read");
    (void)spin(s, *s.send_cq, wd);
  }
  st->count = i;
  return i;
}

// ---- bandwidth ----

struct Point {
  std::uint64_t index, ticks;
};

/// The client's bandwidth loop (perftest's run_iter_bw).
RunOutcome bw_client(Session& s, const Plan& p, double per_us) {
  const bool wr_api = s.cfg.wr_api;
  const Config& c = s.cfg;
  const Verb verb = c.info().verb;
  const auto nq = static_cast<std::uint32_t>(s.qps.size());
  const bool timed = c.duration > 0;
  const std::uint64_t n = p.iters;
  const std::uint64_t total = n * nq;
  const std::uint32_t pl = p.post_list, mod = p.cq_mod, tx = p.tx_depth, slots = p.slots;
  const bool inl = use_inline(s, p);
  const bool fill = c.verify && verb != Verb::read;
  const bool corrupt = fill && !timed && corrupting();
  const bool peak = !timed && !c.no_peak && n <= 20000;  // perftest turns the peak off above 20000

  // Every slot's local and remote address, computed once.
  std::vector<verbs::LocalSlice> local(std::size_t{nq} * slots);
  std::vector<verbs::RemoteSlice> remote(std::size_t{nq} * slots);
  for (std::uint32_t q = 0; q < nq; ++q)
    for (std::uint32_t k = 0; k < slots; ++k) {
      const std::uint64_t at = k * p.stride;
      local[q * slots + k] = verb == Verb::read ? s.in_slice(q, at, p.size) : s.out_slice(q, at, p.size);
      if (verb != Verb::send) remote[q * slots + k] = verb == Verb::read ? s.peer_out(q, at, p.size) : s.peer_in(q, at, p.size);
    }

  std::vector<std::uint64_t> scnt(nq), ccnt(nq), covered(nq);  // covered: posted up to a signaled one
  std::vector<bool> finished(nq, false);
  std::vector<verbs::SendWr> chain;
  chain.reserve(pl);
  // A post list is built once per QP and posted again and again, as perftest does (its list's
  // addresses stay put; only a single request walks the cycle buffer). The list ends with a
  // signaled request (the post list is a multiple of the CQ moderation), so each completion
  // stands for cq-mod requests. --verify writes a new message every time, so it builds each list.
  const bool fixed = pl > 1 && !c.verify;
  std::vector<std::vector<verbs::SendWr>> lists(fixed ? nq : 0);
  for (std::uint32_t q = 0; q < lists.size(); ++q)
    for (std::uint32_t j = 0; j < pl; ++j) {
      const std::uint32_t k = j % slots;
      const verbs::PostOptions o{.wr_id = std::uint64_t{q} << kQpShift, .signaled = (j + 1) % mod == 0, .inline_data = inl};
      const verbs::LocalSlice& l = local[q * slots + k];
      switch (verb) {
        case Verb::write: lists[q].push_back(verbs::SendWr::write(l, remote[q * slots + k], o)); break;
        case Verb::read: lists[q].push_back(verbs::SendWr::read(l, remote[q * slots + k], o)); break;
        default: lists[q].push_back(verbs::SendWr::send(l, o)); break;
      }
    }
  std::vector<Point> posts, completions;
  if (peak) {
    posts.reserve(total / pl + 1);
    completions.reserve(total + 1);
  }
  std::array<verbs::Completion, 16> wcs;  // perftest's CTX_POLL_BATCH
  std::uint64_t totscnt = 0, totccnt = 0, first_post = 0, last_completion = 0;
  Watchdog wd(c.timeout, per_us);
  const std::uint64_t deadline = timed ? Ticks::now() + ticks_for(std::chrono::seconds(c.duration), per_us) : 0;
  bool stopping = false;
  std::uint32_t unfinished = nq;

  const auto finish = [&](std::uint32_t q) {
    finished[q] = true;
    --unfinished;
  };
  while (unfinished > 0 || totccnt < totscnt) {
    if (timed && !stopping && Ticks::now() >= deadline) stopping = true;
    for (std::uint32_t q = 0; q < nq; ++q) {
      while (!finished[q]) {
        if (stopping && covered[q] == scnt[q]) {  // -D: stop where a signaled request ends the stream
          finish(q);
          break;
        }
        if (scnt[q] - ccnt[q] + pl > tx) break;  // tx-depth requests outstanding
        if (fixed) {
          const std::uint64_t now = Ticks::now();
          if (totscnt == 0) first_post = now;
          if (peak) posts.push_back({totscnt, now});
          if (const verbs::PostResult r = wr_api ? batch_post(*s.qps[q], lists[q]) : s.qps[q]->post(std::span(lists[q])); !r)
            post_failed(r, "post");
          scnt[q] += pl;
          totscnt += pl;
          covered[q] = scnt[q];
          if (!timed && scnt[q] == n) {
            finish(q);
            break;
          }
          continue;
        }
        for (std::uint32_t j = 0; j < pl; ++j) {
          const std::uint64_t w = scnt[q] + j;
          const auto k = static_cast<std::uint32_t>(w % slots);
          const bool sig = (w + 1) % mod == 0 || (!timed && w + 1 == n) || (stopping && j + 1 == pl);
          const verbs::LocalSlice& l = local[q * slots + k];
          if (fill) fill_pattern(l.bytes(), q, w);
          if (corrupt && w + 1 == n) l.data()[0] ^= std::byte{1};
          const verbs::PostOptions o{.wr_id = (std::uint64_t{q} << kQpShift) | w, .signaled = sig, .inline_data = inl};
          switch (verb) {
            case Verb::write: chain.push_back(verbs::SendWr::write(l, remote[q * slots + k], o)); break;
            case Verb::read: chain.push_back(verbs::SendWr::read(l, remote[q * slots + k], o)); break;
            default: chain.push_back(verbs::SendWr::send(l, o)); break;
          }
          if (sig) covered[q] = w + 1;
        }
        const std::uint64_t now = Ticks::now();
        if (totscnt == 0) first_post = now;
        if (peak) posts.push_back({totscnt, now});
        const verbs::PostResult r = wr_api ? batch_post(*s.qps[q], chain)
                                    : pl == 1 ? s.qps[q]->post(chain[0])
                                              : s.qps[q]->post(std::span(chain));
        if (!r) post_failed(r, "post");
        chain.clear();
        scnt[q] += pl;
        totscnt += pl;
        if (!timed && scnt[q] == n) {
          finish(q);
          break;
        }
      }
    }
    if (totccnt < totscnt) {
      const std::span<verbs::Completion> got = s.send_cq->poll(wcs);
      if (got.empty()) {
        if (wd.starved()) starved(s);
        continue;
      }
      wd.progress();
      for (const verbs::Completion& wc : got) {
        if (!wc.ok()) completion_failed(wc);
        const auto q = static_cast<std::uint32_t>(wc.wr_id() >> kQpShift);
        const std::uint64_t w = fixed ? ccnt[q] + mod - 1 : wc.wr_id() & ((std::uint64_t{1} << kQpShift) - 1);
        totccnt += w + 1 - ccnt[q];
        ccnt[q] = w + 1;
        const std::uint64_t now = Ticks::now();
        last_completion = now;
        if (peak) completions.push_back({totccnt - 1, now});
      }
    }
  }

  RunOutcome out;
  out.count = timed ? 0 : n;
  out.per_qp = scnt;
  BwResult r;
  r.bytes = p.size;
  r.iters = totscnt;
  const double us = static_cast<double>(last_completion - first_post) / per_us;
  constexpr double kMB = 1024.0 * 1024.0;  // perftest's MB/sec are MiB/s
  if (us > 0) {
    r.bw_avg = static_cast<double>(p.size) * static_cast<double>(totscnt) / us * 1e6 / kMB;
    r.msg_rate = static_cast<double>(totscnt) / us;
  }
  if (peak) {
    // The best time per message over any stretch from a post to a later completion.
    double best = 0;
    std::size_t from = 0;
    for (const Point& a : posts) {
      while (from < completions.size() && completions[from].index < a.index) ++from;
      for (std::size_t k = from; k < completions.size(); ++k) {
        const Point& b = completions[k];
        const double t = static_cast<double>(b.ticks - a.ticks) / static_cast<double>(b.index - a.index + 1);
        if (best == 0 || t < best) best = t;
      }
    }
    if (best > 0) r.bw_peak = static_cast<double>(p.size) / (best / per_us) * 1e6 / kMB;
  }
  out.bw = r;
  // read_bw --verify: each slot holds what the server put there.
  if (c.verify && verb == Verb::read) {
    for (std::uint32_t q = 0; q < nq && out.verify_error.empty(); ++q)
      for (std::uint64_t k = 0; k < std::min<std::uint64_t>(scnt[q], slots); ++k)
        if (!has_pattern(local[q * slots + k].bytes(), q, k)) {
          out.verify_error = "QP " + std::to_string(q) + " slot " + std::to_string(k) + ": wrong data read";
          break;
        }
  }
  return out;
}

/// send_bw's server: keeps receives posted and takes the messages in (perftest's
/// run_iter_bw_server). With --verify, checks each message as it arrives. With -D it also
/// watches the control channel for the client's counts.
void bw_receiver(Session& s, const Plan& p, ReceiveState& st, double per_us) {
  const Config& c = s.cfg;
  const auto nq = static_cast<std::uint32_t>(s.qps.size());
  const bool timed = c.duration > 0;
  const std::uint64_t n = p.iters;
  std::vector<std::uint64_t> posted(nq, timed ? p.rx_depth : std::min<std::uint64_t>(p.rx_depth, n));
  std::array<verbs::Completion, 16> wcs;
  Watchdog wd(c.timeout, per_us);
  std::vector<std::uint64_t>& received = st.received;
  received.assign(nq, 0);
  st.told.assign(nq, 0);
  std::uint64_t got_total = 0, told_total = 0;
  const std::uint64_t want_total = timed ? 0 : n * nq;
  std::uint32_t idle = 0;
  for (;;) {
    if (timed ? st.done && got_total == told_total : got_total == want_total) return;
    const std::span<verbs::Completion> got = s.recv_cq->poll(wcs);
    if (got.empty()) {
      if (timed && (++idle & 4095u) == 0) {
        while (auto m = s.control->try_receive()) {
          take_message(*m, st);
          told_total = 0;
          for (const std::uint64_t k : st.told) told_total += k;
        }
        wd.progress();  // the client is alive as long as it has not said "done"
      }
      if (wd.starved()) starved(s);
      continue;
    }
    wd.progress();
    for (const verbs::Completion& wc : got) {
      if (!wc.ok()) completion_failed(wc);
      const std::uint32_t q = nq == 1 ? 0 : s.qp_index(wc.qp_num());
      const std::uint64_t r = received[q]++;
      ++got_total;
      const std::uint64_t at = (r % p.rx_slots) * p.stride;
      if (c.verify && st.error.empty()) {
        if (wc.byte_len() != p.size)
          st.error = "QP " + std::to_string(q) + " message " + std::to_string(r) + ": " + std::to_string(wc.byte_len()) +
                  " bytes";
        else if (!has_pattern(std::span<const std::byte>(s.in_ptr(q, at), p.size), q, r))
          st.error = "QP " + std::to_string(q) + " message " + std::to_string(r) + ": wrong data";
      }
      if (timed || posted[q] < n) {
        const std::uint64_t next = (posted[q] % p.rx_slots) * p.stride;
        if (const verbs::PostResult pr = s.qps[q]->post_recv(s.in_slice(q, next, p.size), posted[q]); !pr)
          post_failed(pr, "post_recv");
        ++posted[q];
      }
    }
  }
}

double calibrated() {
  static const double v = Ticks::per_us();  // a first estimate, for deadlines and watchdogs
  return v;
}

std::string zeros_or(std::span<const std::byte> b) {
  for (const std::byte x : b)
    if (x != std::byte{0}) return "bytes written outside the messages";
  return {};
}

}  // namespace

void prepare(Session& s, const Plan& p) {
  const Config& c = s.cfg;
  const bool server = c.server();
  const auto nq = static_cast<std::uint32_t>(s.qps.size());
  const std::uint64_t used = std::max(p.slots, p.rx_slots) * p.stride;
  for (std::uint32_t q = 0; q < nq; ++q) {
    // What the peer writes into, or this side reads or receives into, starts zeroed.
    std::memset(s.in_ptr(q, 0), 0, used);
    if (server && (c.test == Test::read_bw || c.test == Test::read_lat)) {
      for (std::uint32_t k = 0; k < p.slots; ++k)
        fill_pattern(std::span(s.out_ptr(q, k * p.stride), p.size), q, k);
      if (c.verify && q == 0 && corrupting()) s.out_ptr(0, 0)[0] ^= std::byte{1};
    }
    const bool receives = c.info().verb == Verb::send && (server || c.test == Test::send_lat);
    if (receives) {
      const std::uint64_t count = c.duration > 0 ? p.rx_depth : std::min<std::uint64_t>(p.rx_depth, p.iters);
      for (std::uint64_t r = 0; r < count; ++r) {
        const std::uint64_t at = (r % p.rx_slots) * p.stride;
        if (const verbs::PostResult pr = s.qps[q]->post_recv(s.in_slice(q, at, p.size), r); !pr)
          post_failed(pr, "post_recv");
      }
    }
  }
}

RunOutcome run_client(Session& s, const Plan& p) {
  const double per_us = calibrated();
  const Config& c = s.cfg;
  if (c.info().bw) {
    RunOutcome out = bw_client(s, p, per_us);
    // The report uses the calibration as it stands after the run (a longer baseline).
    const double better = Ticks::per_us();
    out.bw->bw_avg *= better / per_us;
    out.bw->bw_peak *= better / per_us;
    out.bw->msg_rate *= better / per_us;
    return out;
  }
  const bool timed = c.duration > 0;
  Stamps st;
  if (!timed) st.t.resize(p.iters);
  switch (c.test) {
    case Test::write_lat: (void)write_lat(s, p, &st, per_us); break;
    case Test::send_lat: (void)send_lat(s, p, &st, per_us); break;
    default: (void)one_at_a_time(s, p, &st, per_us); break;
  }
  const int rtt = c.info().verb == Verb::read || c.info().verb == Verb::atomic ? 1 : 2;
  RunOutcome out;
  out.count = st.count;
  out.per_qp = {st.count};
  out.lat = lat_stats(st, p.size, Ticks::per_us(), rtt, timed);
  return out;
}

void run_server(Session& s, const Plan& p) {
  const double per_us = calibrated();
  switch (s.cfg.test) {
    case Test::write_lat: (void)write_lat(s, p, nullptr, per_us); break;
    case Test::send_lat: (void)send_lat(s, p, nullptr, per_us); break;
    default: break;
  }
}

std::string verify_server(Session& s, const Plan& p, const std::vector<std::uint64_t>& per_qp) {
  const Config& c = s.cfg;
  if (!c.verify) return {};
  const auto nq = static_cast<std::uint32_t>(s.qps.size());
  if (c.test == Test::atomic_lat) {
    std::uint64_t v = 0;
    std::memcpy(&v, s.in_ptr(0, 0), 8);
    if (v != per_qp[0])
      return "the counter is " + std::to_string(v) + " after " + std::to_string(per_qp[0]) + " fetch-adds of 1";
    return {};
  }
  if (c.test != Test::write_bw) return {};
  for (std::uint32_t q = 0; q < nq; ++q) {
    const std::uint64_t count = per_qp[q];
    for (std::uint64_t k = 0; k < p.slots; ++k) {
      const std::span<const std::byte> slot(s.in_ptr(q, k * p.stride), p.stride);
      const std::span<const std::byte> msg = slot.first(p.size);
      if (k < count) {
        const std::uint64_t last = k + p.slots * ((count - 1 - k) / p.slots);  // the last message into slot k
        if (!has_pattern(msg, q, last))
          return "QP " + std::to_string(q) + " slot " + std::to_string(k) + ": not message " + std::to_string(last);
      } else if (const std::string e = zeros_or(msg); !e.empty()) {
        return "QP " + std::to_string(q) + " slot " + std::to_string(k) + ": written, but no message went there";
      }
      if (const std::string e = zeros_or(slot.subspan(p.size)); !e.empty())
        return "QP " + std::to_string(q) + " slot " + std::to_string(k) + ": " + e;
    }
  }
  return {};
}

void receive_bw(Session& s, const Plan& p, ReceiveState& st) { bw_receiver(s, p, st, calibrated()); }

void take_message(const std::string& m, ReceiveState& st) {
  if (m.starts_with("count ")) {
    unsigned q = 0;
    unsigned long long k = 0;
    if (std::sscanf(m.c_str(), "count %u %llu", &q, &k) != 2 || q >= st.told.size())
      throw Failure("bad message from the client: " + m);
    st.told[q] = k;
  } else if (m == "done") {
    st.done = true;
  } else {
    throw Failure("unexpected message from the client: " + m);
  }
}

}  // namespace perf
