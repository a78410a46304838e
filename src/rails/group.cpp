// rails::Group: rails x QPs to one Target, chunks striped over the live ones, failover and
// reconnection, all inside progress() (docs/design/rails.md, "group").
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <exception>
#include <new>
#include <random>
#include <utility>

#include "../detail.hpp"
#include "schedule.hpp"
#include "wire.hpp"
#include "verbs/rails.hpp"

namespace verbs::rails {

using internal::right_read;
using internal::right_write;
using std::chrono::milliseconds;
using clock = std::chrono::steady_clock;

// An fd closed with its owner. Not in the anonymous namespace: Group::Impl, which has external
// linkage, holds two (g++ warns of that where this file is compiled inside another, as in a
// unity build).
namespace internal {
class Fd {
 public:
  explicit Fd(int fd = -1) noexcept : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_;
};
}  // namespace internal
using internal::Fd;

namespace {

void check(bool ok, const char* what, SourceLocation where) {
  if (!ok) detail::throw_error(make_error_code(Errc::bad_argument), std::string("rails::Group: ") + what, where);
}

}  // namespace

struct Group::Impl {
  struct Dev {
    Device device;
    ProtectionDomain pd;
    CompletionQueue cq;  // every slot's on the device, send and receive (nothing is received)
    std::vector<std::size_t> slots;
    std::shared_ptr<detail::AsyncHub> hub;  // the context's async event reader
    bool armed = false;  // armed since its last event: a completion raises one
  };
  struct Slot {
    std::size_t rail = 0, dev = 0;
    std::optional<cm::PendingConnect> pending;
    std::optional<cm::Connection> conn;  // kept after a failure until what it had posted has flushed
    std::uint32_t qp_num = 0;
    RemoteSlice remote;
    std::uint32_t in_flight = 0;
  };
  struct RailRec {
    RailState state = RailState::connecting;
    bool was_down = false;         // an up event is due when it comes back
    clock::time_point retry_at = clock::time_point::max();
    milliseconds backoff{};
    std::error_code error;         // the last failure
    std::string why;
    bool request_fault = false;    // down because a request was refused, not because of its path
    RailCounters counters;
  };

  GroupOptions options;
  milliseconds bound{};
  cm::EventChannel channel;
  std::vector<Dev> devs;
  std::vector<RailRec> rails;
  std::vector<Slot> slots;             // rail-major: rail r's QP q is r * qps_per_rail + q
  std::vector<std::size_t> post_order;  // r0q0, r1q0, ..., r0q1, ...: every rail gets work
  internal::Schedule schedule;
  std::vector<std::pair<Completion, std::uint32_t>> finished;  // for poll() and wait(), with their table entries
  std::vector<std::shared_ptr<const Region::State>> regions_in_use;  // per table entry
  std::optional<std::uint8_t> target_rights;  // what the target said it allows (right_write, right_read)
  std::vector<RailEvent> events, events_out;
  std::vector<std::uint64_t> keys;     // the channel's news, copied (reading it again reuses its list)
  std::array<verbs::Completion, 32> wcs{};
  Fd epoll, timer;
  clock::time_point timer_at = clock::time_point::max();  // what the timer is set to
  std::uint64_t next_id = 1;
  std::optional<std::uint64_t> remote_size;
  std::minstd_rand jitter{std::random_device{}()};
  std::uint64_t group_id = (std::uint64_t{std::random_device{}()} << 32) | std::random_device{}();  // names this group to the target

  Impl(const GroupOptions& o, milliseconds b)
      : options(o),
        bound(b),
        rails(o.rails.size()),
        slots(o.rails.size() * static_cast<std::size_t>(o.qps_per_rail)),
        schedule(static_cast<std::uint32_t>(o.max_transfers),
                 static_cast<std::uint32_t>(slots.size()) * static_cast<std::uint32_t>(o.max_in_flight), o.chunk_size) {
    for (std::size_t q = 0; q < static_cast<std::size_t>(o.qps_per_rail); ++q)
      for (std::size_t r = 0; r < rails.size(); ++r) post_order.push_back(r * static_cast<std::size_t>(o.qps_per_rail) + q);
    for (std::size_t i = 0; i < slots.size(); ++i) slots[i].rail = i / static_cast<std::size_t>(o.qps_per_rail);
    for (auto& r : rails) r.backoff = o.reconnect_interval;
    finished.reserve(static_cast<std::size_t>(o.max_transfers));
    regions_in_use.resize(static_cast<std::size_t>(o.max_transfers));
    keys.reserve(slots.size() + 8);
  }

  // The text of a failure, made by `make`; empty when it cannot be made (no memory left): what
  // the failure accounts for (a chunk, a transfer, a rail) must happen all the same.
  template <typename Make>
  static std::string say(Make&& make) noexcept {
    try {
      return make();
    } catch (const std::exception&) {
      return {};
    }
  }

  [[nodiscard]] std::string rail_name(std::size_t r) const {
    return "rail " + std::to_string(r) + " (" + options.rails[r].local_address + " -> " + options.rails[r].remote_address + ")";
  }
  [[nodiscard]] bool any_up() const noexcept {
    return std::any_of(rails.begin(), rails.end(), [](const RailRec& r) { return r.state == RailState::up; });
  }
  // No rail is up, and none is down only because a request of its was refused (that one comes
  // back at once: its path is fine).
  [[nodiscard]] bool every_rail_gone() const noexcept {
    return std::none_of(rails.begin(), rails.end(),
                        [](const RailRec& r) { return r.state == RailState::up || r.request_fault; });
  }

  // ---- connecting -----------------------------------------------------------------------------

  void watch(int fd, SourceLocation where) {
    if (fd < 0) return;
    epoll_event e{};
    e.events = EPOLLIN;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &e) != 0 && errno != EEXIST) detail::throw_errno(errno, "epoll_ctl", where);
  }

  void start_rail(std::size_t r, SourceLocation where) {
    RailRec& rail = rails[r];
    rail.state = RailState::connecting;
    rail.retry_at = clock::time_point::max();
    const std::size_t qps = static_cast<std::size_t>(options.qps_per_rail);
    for (std::size_t i = r * qps; i < (r + 1) * qps; ++i) {
      Slot& s = slots[i];
      Dev& d = devs[s.dev];
      try {
        cm::ClientOptions co;
        co.timeout = options.connect_timeout;
        co.resolve_timeout = std::min(options.connect_timeout, milliseconds(2000));
        co.source_address = options.rails[r].local_address;
        co.connection.qp.max_send_wr = static_cast<std::uint32_t>(options.max_in_flight);
        co.connection.qp.max_recv_wr = 1;
        co.connection.transport = options.transport;
        co.connection.pd = &d.pd;
        co.connection.send_cq = &d.cq;
        co.connection.recv_cq = &d.cq;
        co.connection.channel = channel.key(i);
        const auto hello = internal::encode({group_id, static_cast<std::uint16_t>(i)});
        co.connection.private_data = hello;
        s.pending = cm::start_connect(options.rails[r].remote_address, options.port, co, where);
      } catch (const cm::ConnectError& e) {
        rail_failed(r, e.code(), say([&] { return std::string(e.what()); }));
        return;
      } catch (const std::bad_alloc&) {  // its QPs connect again after the backoff, as after a failure
        rail_failed(r, std::make_error_code(std::errc::not_enough_memory), say([] { return std::string("out of memory"); }));
        return;
      }
    }
  }

  void on_connected(std::size_t i, cm::Connection c) {
    Slot& s = slots[i];
    s.pending.reset();
    const auto& remote = c.peer_remote();
    if (!remote) {
      s.conn = std::move(c);
      rail_failed(s.rail, std::make_error_code(std::errc::protocol_error),
                  say([&] { return "the target exposed no buffer on " + rail_name(s.rail); }));
      return;
    }
    if (remote_size && *remote_size != remote->length) {
      s.conn = std::move(c);
      rail_failed(s.rail, std::make_error_code(std::errc::protocol_error), say([&] {
                    return "the target exposed " + std::to_string(remote->length) + " bytes on " + rail_name(s.rail) +
                           ", " + std::to_string(*remote_size) + " on the others";
                  }));
      return;
    }
    remote_size = remote->length;
    s.remote = *remote;
    if (const auto rights = internal::decode_rights(c.peer_private_data())) target_rights = *rights;
    s.qp_num = c.qp().qp_num();
    s.conn = std::move(c);
    // The rail carries chunks once every QP of it is connected.
    RailRec& rail = rails[s.rail];
    const std::size_t qps = static_cast<std::size_t>(options.qps_per_rail);
    for (std::size_t j = s.rail * qps; j < (s.rail + 1) * qps; ++j)
      if (!slots[j].conn || slots[j].pending) return;
    rail.state = RailState::up;
    rail.request_fault = false;
    rail.backoff = options.reconnect_interval;
    if (rail.was_down) {
      ++rail.counters.reconnects;
      try {
        events.push_back({s.rail, true, {}, {}});
      } catch (const std::bad_alloc&) {  // lost: the rail's state and counters still say it
      }
    }
    rail.was_down = false;
  }

  // ---- failing --------------------------------------------------------------------------------

  // Takes rail `r` out: its QPs to ERR (what they had posted flushes back to the retry ring),
  // a reconnection after the backoff; every transfer fails when no rail is left. What it
  // allocates (its event, the text of every rail gone, its copies) is left out when memory is
  // short: the state changes all the same.
  void rail_failed(std::size_t r, std::error_code ec, std::string why, bool request_fault = false) noexcept {
    RailRec& rail = rails[r];
    if (rail.state == RailState::down) return;
    rail.request_fault = request_fault;
    const bool was_up = rail.state == RailState::up;
    rail.state = RailState::down;
    rail.error = ec;
    if (was_up) ++rail.counters.failures;
    if (was_up || !rail.was_down) {
      try {
        events.push_back({r, false, ec, why});
      } catch (const std::bad_alloc&) {
      }
    }
    rail.why = std::move(why);
    rail.was_down = true;
    const std::size_t qps = static_cast<std::size_t>(options.qps_per_rail);
    for (std::size_t i = r * qps; i < (r + 1) * qps; ++i) {
      Slot& s = slots[i];
      s.pending.reset();
      if (s.conn) {
        try {
          s.conn->disconnect();
        } catch (const std::exception&) {  // ConnectError, or no memory to make one
          // Its QP could not be told: it is destroyed below once nothing is in flight.
        }
        if (s.in_flight == 0) s.conn.reset();
      }
    }
    const auto spread = rail.backoff.count() / 4;
    const auto extra = spread > 0 ? std::uniform_int_distribution<milliseconds::rep>(0, spread)(jitter) : 0;
    rail.retry_at = clock::now() + rail.backoff + milliseconds(extra);
    rail.backoff = std::min(rail.backoff * 2, options.reconnect_max);
    if (every_rail_gone())
      schedule.fail_all(std::make_error_code(std::errc::network_down), say([&] { return every_rail_down(); }));
  }

  [[nodiscard]] std::string every_rail_down() const {
    std::string s = "every rail is down:";
    for (std::size_t r = 0; r < rails.size(); ++r) {
      s += (r == 0 ? " " : "; ") + rail_name(r) + ": ";
      s += rails[r].why.empty() ? std::string("connecting") : rails[r].why;
    }
    return s;
  }

  // ---- the data path ----------------------------------------------------------------------------

  void post_all() {
    const std::uint32_t room = static_cast<std::uint32_t>(options.max_in_flight);
    bool posted = true;
    while (posted && schedule.has_work()) {
      posted = false;
      for (const std::size_t i : post_order) {
        Slot& s = slots[i];
        if (rails[s.rail].state != RailState::up || s.in_flight >= room) continue;
        const std::optional<internal::ChunkPost> c = schedule.next();
        if (!c) return;
        post(s, *c);
        posted = true;
      }
    }
  }

  void post(Slot& s, const internal::ChunkPost& c) noexcept {
    const MemoryRegion& mr = static_cast<const Region::State*>(c.local)->regions[s.dev];
    const LocalSlice local(reinterpret_cast<std::uint64_t>(mr.data()) + c.local_offset, c.length, mr.lkey());  // NOLINT
    const RemoteSlice remote{s.remote.addr + c.remote_offset, c.length, s.remote.rkey};
    const PostOptions po{.wr_id = c.wr_id};
    const PostResult res = c.op == internal::Op::write ? s.conn->qp().post_write(local, remote, po)
                                                     : s.conn->qp().post_read(local, remote, po);
    if (res) {
      ++s.in_flight;
      return;
    }
    schedule.completed(c.wr_id, false);
    ++rails[s.rail].counters.chunks_failed;
    rail_failed(s.rail, res.error(),
                say([&] { return "posting a chunk on " + rail_name(s.rail) + " failed: " + res.error().message(); }));
  }

  Slot* slot_of(Dev& d, std::uint32_t qp_num) noexcept {
    for (const std::size_t i : d.slots)
      if (slots[i].conn && slots[i].qp_num == qp_num) return &slots[i];
    return nullptr;
  }

  // Polls every CQ until empty; handles each completion. A CQ is armed once after its event was
  // consumed (not on every call: arming is a system call on some providers), and polled again
  // after arming, so that a completion that came in between is not left for an event that will
  // not come.
  void poll_cqs(bool events_ready, SourceLocation where) {
    for (Dev& d : devs) {
      std::error_code ec;
      if (events_ready && d.cq.consume_events(ec) > 0) d.armed = false;
      for (;;) {
        std::span<verbs::Completion> got = d.cq.poll(wcs, ec);
        if (!ec && got.empty() && !d.armed) {
          got = d.cq.arm_and_poll(wcs, ec);
          d.armed = !ec;
        }
        if (ec) detail::throw_error(ec, "rails::Group: polling the CQ of " + d.device.name(), where);
        if (got.empty()) break;
        for (const verbs::Completion& wc : got) on_completion(d, wc);
      }
    }
  }

  // A failed completion is a path's failure (the chunk goes again elsewhere), unless its status
  // says the request itself was wrong: the target refused it (its access, a bad address) or this
  // side's memory did. Repeated elsewhere it would fail the same way: its transfer fails at once
  // with that status. Either way the rail's QP is in ERR, so the rail goes down and comes back.
  static bool request_error(WcStatus st) noexcept {
    switch (st) {
      case WcStatus::loc_len_err:
      case WcStatus::loc_prot_err:
      case WcStatus::loc_access_err:
      case WcStatus::mw_bind_err:
      case WcStatus::rem_inv_req_err:
      case WcStatus::rem_access_err:
      case WcStatus::rem_inv_rd_req_err:
        return true;
      default:
        return false;
    }
  }

  // Allocates nothing but the texts of a failure (say()): a completion is never half handled.
  void on_completion(Dev& d, const verbs::Completion& wc) noexcept {
    Slot* s = slot_of(d, wc.qp_num());
    if (s == nullptr) return;  // cannot happen: a QP is destroyed only once nothing is in flight
    --s->in_flight;
    if (!wc.ok() && request_error(wc.status()))
      schedule.fail(static_cast<std::uint32_t>(wc.wr_id() >> internal::Schedule::chunk_bits), wc.error_code(), say([&] {
                      return "a chunk was refused on " + rail_name(s->rail) + ": " + wc.error_code().message() +
                             " (the request itself: the target's access or address, or this side's memory)";
                    }));
    schedule.completed(wc.wr_id(), wc.ok());
    ++(wc.ok() ? rails[s->rail].counters.chunks : rails[s->rail].counters.chunks_failed);
    if (!wc.ok() && rails[s->rail].state != RailState::down)
      rail_failed(s->rail, wc.error_code(),
                  say([&] { return "a chunk failed on " + rail_name(s->rail) + ": " + wc.error_code().message(); }),
                  request_error(wc.status()));
    if (s->in_flight == 0 && rails[s->rail].state == RailState::down) s->conn.reset();
  }

  // ---- progress ---------------------------------------------------------------------------------

  void step_slot(std::size_t i, SourceLocation where) {
    Slot& s = slots[i];
    if (s.pending) {
      std::error_code ec;
      std::optional<cm::Connection> c = s.pending->step(ec);
      if (c) on_connected(i, std::move(*c));
      else if (ec)
        rail_failed(s.rail, ec, say([&] { return "connecting " + rail_name(s.rail) + " failed: " + ec.message(); }));
      return;
    }
    if (!s.conn || rails[s.rail].state == RailState::down) return;
    bool live = false;
    std::error_code ec = std::make_error_code(std::errc::connection_reset);
    std::string why;
    try {
      live = s.conn->poll_events(where);
    } catch (const cm::ConnectError& e) {
      why = say([&] { return std::string(e.what()); });
    } catch (const std::bad_alloc&) {  // what the events said is not known: the rail connects again
      ec = std::make_error_code(std::errc::not_enough_memory);
      why = say([] { return std::string("out of memory"); });
    }
    if (live) return;
    if (why.empty())
      why = say([&] {
        return "the connection of " + rail_name(s.rail) + " ended (the target disconnected, or a fatal event)";
      });
    rail_failed(s.rail, ec, std::move(why));
  }

  void progress(SourceLocation where) {
    // What is not the data path runs only when the epoll set says its fd is readable, or a
    // deadline passed: a progress() that finds nothing costs one epoll_wait and the CQs' polls.
    std::array<epoll_event, 8> ready{};
    const int n = ::epoll_wait(epoll.get(), ready.data(), static_cast<int>(ready.size()), 0);
    const auto now = clock::now();
    if (n > 0 || now >= next_deadline()) {
      std::uint64_t expirations = 0;
      (void)::read(timer.get(), &expirations, sizeof expirations);  // non-blocking: only clears it
      const std::span<const std::uint64_t> news = channel.poll_events(where);
      keys.assign(news.begin(), news.end());
      for (const std::uint64_t k : keys)
        if (k < slots.size() && !slots[k].pending) step_slot(static_cast<std::size_t>(k), where);
      for (std::size_t i = 0; i < slots.size(); ++i)  // handshakes: their limits pass without an event
        if (slots[i].pending) step_slot(i, where);
      watch_async_events(where);
    }
    poll_cqs(n > 0, where);
    const std::size_t qps = static_cast<std::size_t>(options.qps_per_rail);
    for (std::size_t r = 0; r < rails.size(); ++r) {
      if (rails[r].state != RailState::down || rails[r].retry_at > now) continue;
      bool drained = true;
      for (std::size_t i = r * qps; i < (r + 1) * qps; ++i) drained = drained && !slots[i].conn;
      if (drained) start_rail(r, where);
    }
    post_all();
    collect_finished();
    arm_timer();
  }

  void collect_finished() {
    while (std::optional<internal::Finished> f = schedule.take_finished())
      finished.push_back({Completion{f->id, f->error, std::move(f->why)}, f->entry});
  }

  // Hands out finished[i]: its table entry and its region's registrations are released.
  Completion hand_out(std::size_t i) {
    Completion c = std::move(finished[i].first);
    schedule.release(finished[i].second);
    regions_in_use[finished[i].second].reset();
    finished.erase(finished.begin() + static_cast<std::ptrdiff_t>(i));
    return c;
  }

  // A device whose async fd is readable: the context's reader takes its events (routing each to
  // its connection and keeping it for Device::poll_async_events: none is taken from the user),
  // which empties the fd; then the connections look at what they were told (a fatal QP or
  // device event ends one).
  void watch_async_events(SourceLocation where) {
    for (Dev& d : devs) {
      pollfd p{d.hub->native_fd(), POLLIN, 0};
      if (p.fd < 0 || ::poll(&p, 1, 0) <= 0) continue;
      std::error_code ec;
      d.hub->pump(ec);
      if (ec) detail::throw_error(ec, "rails::Group: reading the async events of " + d.device.name(), where);
      for (const std::size_t i : d.slots)
        if (slots[i].conn && !slots[i].pending) step_slot(i, where);
    }
  }

  [[nodiscard]] clock::time_point next_deadline() const noexcept {
    auto d = clock::time_point::max();
    for (const auto& r : rails)
      if (r.state == RailState::down) d = std::min(d, r.retry_at);
    for (const auto& s : slots)
      if (s.pending) d = std::min(d, s.pending->deadline());
    return d;
  }

  void arm_timer() noexcept {
    const auto d = next_deadline();
    if (d == timer_at) return;  // a system call saved on every progress() that changed nothing
    timer_at = d;
    itimerspec t{};
    if (d != clock::time_point::max()) {
      const auto left = std::max(std::chrono::nanoseconds(1), std::chrono::nanoseconds(d - clock::now()));
      t.it_value.tv_sec = static_cast<time_t>(left.count() / 1000000000);
      t.it_value.tv_nsec = static_cast<long>(left.count() % 1000000000);
    }
    (void)::timerfd_settime(timer.get(), 0, &t, nullptr);
  }

  std::optional<Completion> take(std::uint64_t id) {
    for (std::size_t i = 0; i < finished.size(); ++i)
      if (finished[i].first.id == id) return hand_out(i);
    return std::nullopt;
  }

  std::uint64_t start(internal::Op op, const Region& local, std::uint64_t local_offset, std::uint64_t remote_offset,
                      std::uint64_t length, SourceLocation where) {
    check(local.state_ != nullptr && local.state_->owner == this, "the Region was registered by another Group (or moved from)", where);
    const std::size_t lsize = local.state_->bytes.size();
    if (local_offset > lsize || length > lsize - local_offset)
      detail::throw_slice_error(Errc::local_out_of_bounds, local_offset, length, lsize, where);
    if (target_rights) {
      const bool allowed = op == internal::Op::write ? (*target_rights & right_write) != 0 : (*target_rights & right_read) != 0;
      if (!allowed)
        detail::throw_error(std::make_error_code(std::errc::permission_denied),
                            std::string("rails::Group: the target does not allow ") +
                                (op == internal::Op::write ? "writes (its access lacks remote_write)" : "reads (its access lacks remote_read)"),
                            where);
    }
    const std::uint64_t rsize = remote_size.value_or(0);
    if (remote_offset > rsize || length > rsize - remote_offset)
      detail::throw_slice_error(Errc::remote_out_of_bounds, remote_offset, length, rsize, where);
    const std::uint64_t id = next_id;
    const std::optional<std::uint32_t> t = schedule.start(id, op, local.state_.get(), local_offset, remote_offset, length);
    if (!t)
      detail::throw_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                          "rails::Group: " + std::to_string(options.max_transfers) +
                              " transfers in progress (max_transfers): take completions with poll() or wait() first",
                          where);
    ++next_id;
    regions_in_use[*t] = local.state_;  // the registrations outlive the Region object if need be
    if (every_rail_gone())
      schedule.fail(*t, std::make_error_code(std::errc::network_down), say([&] { return every_rail_down(); }));
    post_all();
    collect_finished();
    arm_timer();
    return id;
  }
};

Group Group::connect(const GroupOptions& o, milliseconds timeout, SourceLocation where) {
  check(!o.rails.empty() && o.rails.size() <= 16, "GroupOptions::rails: want 1 to 16 rails", where);
  check(o.qps_per_rail >= 1 && o.qps_per_rail <= 64, "GroupOptions::qps_per_rail: want 1 to 64", where);
  check(o.chunk_size >= 4096 && o.chunk_size <= (1u << 30), "GroupOptions::chunk_size: want 4 KiB to 1 GiB", where);
  check(o.max_in_flight >= 1 && o.max_in_flight <= 1024, "GroupOptions::max_in_flight: want 1 to 1024", where);
  check(o.max_transfers >= 1 && o.max_transfers <= 65535, "GroupOptions::max_transfers: want 1 to 65535", where);
  check(o.port != 0, "GroupOptions::port: the Target's port is needed (Target::port())", where);
  check(o.reconnect_interval > milliseconds::zero() && o.reconnect_max >= o.reconnect_interval,
        "GroupOptions: want 0 < reconnect_interval <= reconnect_max", where);
  const FailureBound b = verbs::failure_bound(o.transport, where);
  check(b.transport.has_value(),
        "GroupOptions::transport: a rail that stops answering would never be noticed (retry_count 7 retries for ever "
        "on rxe, ack_timeout 0 never times out)",
        where);
  auto impl = std::make_unique<Impl>(o, *b.transport);
  Impl& g = *impl;
  g.epoll = Fd(::epoll_create1(EPOLL_CLOEXEC));
  g.timer = Fd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (g.epoll.get() < 0 || g.timer.get() < 0) detail::throw_errno(errno, "rails::Group: epoll_create1/timerfd_create", where);
  // One PD and CQ per local device, shared by every QP on it.
  std::vector<std::size_t> rail_dev(o.rails.size());
  std::vector<Device> found;
  for (std::size_t r = 0; r < o.rails.size(); ++r) {
    Device d = cm::device_for(o.rails[r].local_address, where);
    std::size_t i = 0;
    while (i < found.size() && found[i].native_handle() != d.native_handle()) ++i;
    if (i == found.size()) found.push_back(std::move(d));
    rail_dev[r] = i;
  }
  for (std::size_t i = 0; i < found.size(); ++i) {
    const auto per_device = static_cast<int>(std::count(rail_dev.begin(), rail_dev.end(), i));
    const int depth = per_device * o.qps_per_rail * (o.max_in_flight + 1) + 16;
    ProtectionDomain pd(found[i], where);
    CompletionQueue cq(found[i], {.depth = depth, .with_channel = true}, where);
    auto hub = detail::async_hub(found[i].shared_handle());
    g.devs.push_back({std::move(found[i]), std::move(pd), std::move(cq), {}, std::move(hub)});
  }
  for (std::size_t i = 0; i < g.slots.size(); ++i) {
    g.slots[i].dev = rail_dev[g.slots[i].rail];
    g.devs[g.slots[i].dev].slots.push_back(i);
  }
  g.watch(g.channel.fd(), where);
  g.watch(g.timer.get(), where);
  for (Impl::Dev& d : g.devs) {
    d.cq.req_notify();
    d.armed = true;
    g.watch(d.cq.fd(), where);
    g.watch(d.hub->native_fd(), where);  // a fatal QP or device event ends a connection
  }
  for (std::size_t r = 0; r < o.rails.size(); ++r) g.start_rail(r, where);
  Group group(std::move(impl));
  const auto deadline = detail::deadline_after(timeout);
  for (;;) {
    group.progress(where);
    const bool all = std::all_of(g.rails.begin(), g.rails.end(), [](const auto& r) { return r.state == RailState::up; });
    if (all || clock::now() >= deadline) break;
    pollfd p{g.epoll.get(), POLLIN, 0};
    (void)::poll(&p, 1, detail::poll_ms_until(std::min(deadline, g.next_deadline())));
  }
  if (!g.any_up()) {
    std::error_code first;
    for (const auto& r : g.rails)
      if (!first && r.error) first = r.error;
    throw cm::ConnectError(first ? first : std::make_error_code(std::errc::timed_out), cm::Phase::connect,
                           "rails::Group: no rail connected within the timeout; " + g.every_rail_down(), where);
  }
  return group;
}

Group::Group(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Group::Group(Group&&) noexcept = default;
Group& Group::operator=(Group&&) noexcept = default;
Group::~Group() = default;

Region Group::register_memory(std::span<std::byte> buffer, AccessFlags access, SourceLocation where) {
  auto state = std::make_shared<Region::State>();
  state->bytes = buffer;
  state->owner = impl_.get();
  for (const Impl::Dev& d : impl_->devs) state->regions.emplace_back(d.pd, buffer, access | Access::local_write, where);
  Region r;
  r.state_ = std::move(state);
  return r;
}

std::uint64_t Group::write(const Region& local, std::uint64_t local_offset, std::uint64_t remote_offset,
                           std::uint64_t length, SourceLocation where) {
  return impl_->start(internal::Op::write, local, local_offset, remote_offset, length, where);
}

std::uint64_t Group::read(const Region& local, std::uint64_t local_offset, std::uint64_t remote_offset,
                          std::uint64_t length, SourceLocation where) {
  return impl_->start(internal::Op::read, local, local_offset, remote_offset, length, where);
}

void Group::progress(SourceLocation where) { impl_->progress(where); }

std::span<Completion> Group::poll(std::span<Completion> out, SourceLocation where) {
  impl_->progress(where);
  std::size_t n = 0;
  while (n < out.size() && !impl_->finished.empty()) out[n++] = impl_->hand_out(0);
  return out.first(n);
}

std::optional<Completion> Group::wait(std::uint64_t id, milliseconds timeout, SourceLocation where) {
  Impl& g = *impl_;
  if (!g.schedule.in_progress(id))
    detail::throw_error(make_error_code(Errc::bad_argument),
                        "rails::Group::wait: transfer " + std::to_string(id) + " is not in progress (its Completion was taken, or it never was)",
                        where);
  const auto deadline = detail::deadline_after(timeout);
  for (;;) {
    g.progress(where);
    if (std::optional<Completion> c = g.take(id)) return c;
    if (clock::now() >= deadline) return std::nullopt;
    pollfd p{g.epoll.get(), POLLIN, 0};
    (void)::poll(&p, 1, detail::poll_ms_until(std::min(deadline, g.next_deadline())));
  }
}

void Group::take_down(std::size_t i, SourceLocation where) {
  check(i < impl_->rails.size(), "take_down: no such rail", where);
  impl_->rail_failed(i, std::make_error_code(std::errc::operation_canceled), impl_->rail_name(i) + " taken down by the caller");
  impl_->arm_timer();
}

std::span<const RailEvent> Group::poll_rail_events() noexcept {
  impl_->events_out.swap(impl_->events);
  impl_->events.clear();
  return impl_->events_out;
}

int Group::fd() const noexcept { return impl_->epoll.get(); }
clock::time_point Group::next_deadline() const noexcept { return impl_->next_deadline(); }
std::size_t Group::rail_count() const noexcept { return impl_->rails.size(); }
RailState Group::rail_state(std::size_t i) const { return impl_->rails.at(i).state; }
RailCounters Group::rail_counters(std::size_t i) const { return impl_->rails.at(i).counters; }
std::size_t Group::live_rails() const noexcept {
  return static_cast<std::size_t>(std::count_if(impl_->rails.begin(), impl_->rails.end(),
                                                [](const auto& r) { return r.state == RailState::up; }));
}
std::size_t Group::device_count() const noexcept { return impl_->devs.size(); }
std::uint64_t Group::remote_size() const noexcept { return impl_->remote_size.value_or(0); }
milliseconds Group::failure_bound() const noexcept { return impl_->bound; }

}  // namespace verbs::rails
