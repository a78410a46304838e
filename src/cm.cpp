#include "verbs/cm.hpp"

#include "cm_internal.hpp"
#include "cm_private_data.hpp"
#include "detail.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>

namespace verbs::cm {
// The helpers src/cm_datagram.cpp shares are declared in cm_internal.hpp.
namespace internal {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

[[noreturn]] void fail(int err, Phase phase, const std::string& text, SourceLocation where) {
  throw ConnectError(std::error_code(err, std::generic_category()), phase, text, where);
}

// now + timeout without overflow, and the milliseconds left for poll(2): the core's helpers.
using detail::deadline_after;

/// A timeout for librdmacm's int milliseconds: at least 1, at most 2^30 (12 days).
int clamp_ms(milliseconds timeout) { return static_cast<int>(std::clamp<std::int64_t>(timeout.count(), 1, 1 << 30)); }

int ms_until(Clock::time_point deadline) { return detail::poll_ms_until(deadline); }

/// A new non-blocking channel, the caller's to destroy.
rdma_event_channel* new_channel(Phase phase, SourceLocation where) {
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr) fail(errno, phase, "rdma_create_event_channel", where);
  const int fl = ::fcntl(ch->fd, F_GETFL);
  if (fl < 0 || ::fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    const int err = errno;
    rdma_destroy_event_channel(ch);
    fail(err, phase, "fcntl(O_NONBLOCK) on the rdma_cm channel", where);
  }
  return ch;
}

std::shared_ptr<rdma_event_channel> make_channel(Phase phase, SourceLocation where) {
  // Should the control block fail to allocate, the constructor calls the deleter.
  return {new_channel(phase, where), [](rdma_event_channel* c) { rdma_destroy_event_channel(c); }};
}

/// An id on `ch`; destroying it keeps the channel alive until then.
std::shared_ptr<rdma_cm_id> own_id(rdma_cm_id* id, std::shared_ptr<rdma_event_channel> ch) {
  return {id, [ch = std::move(ch)](rdma_cm_id* i) { rdma_destroy_id(i); }};
}

std::shared_ptr<rdma_cm_id> make_id(const std::shared_ptr<rdma_event_channel>& ch, Phase phase, SourceLocation where,
                                    rdma_port_space ps) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch.get(), &id, nullptr, ps) != 0) fail(errno, phase, "rdma_create_id", where);
  return own_id(id, ch);
}

sockaddr_storage to_sockaddr(std::string_view host, std::uint16_t port, Phase phase, SourceLocation where) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICSERV | (host.empty() ? AI_PASSIVE : 0);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string h(host);
  const std::string p = std::to_string(port);
  if (const int rc = ::getaddrinfo(h.empty() ? nullptr : h.c_str(), p.c_str(), &hints, &res); rc != 0)
    fail(rc == EAI_SYSTEM ? errno : EINVAL, phase, "cannot resolve '" + h + "': " + ::gai_strerror(rc), where);
  sockaddr_storage out{};
  std::memcpy(&out, res->ai_addr, std::min<std::size_t>(res->ai_addrlen, sizeof out));
  ::freeaddrinfo(res);
  return out;
}

std::string address_text(const sockaddr* sa) {
  if (sa == nullptr) return {};
  char text[INET6_ADDRSTRLEN] = {};
  std::uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);  // NOLINT
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    port = ntohs(in->sin_port);
    return std::string(text) + ":" + std::to_string(port);
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);  // NOLINT
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    port = ntohs(in6->sin6_port);
    return "[" + std::string(text) + "]:" + std::to_string(port);
  }
  return {};
}

/// A copy of `ev` (not acknowledged). Throws std::bad_alloc.
Event to_event(const rdma_cm_event* ev) {
  Event e{ev->event, ev->status, ev->id, {}};
  const bool datagram = ev->id != nullptr && ev->id->ps == RDMA_PS_UDP;
  // A SIDR reply that refuses (UNREACHABLE on a UD id) carries the refusing side's data.
  const bool carries_data = e.type == RDMA_CM_EVENT_CONNECT_REQUEST || e.type == RDMA_CM_EVENT_ESTABLISHED ||
                            e.type == RDMA_CM_EVENT_REJECTED || e.type == RDMA_CM_EVENT_CONNECT_RESPONSE ||
                            (datagram && e.type == RDMA_CM_EVENT_UNREACHABLE);
  if (carries_data && ev->param.conn.private_data != nullptr) {
    const auto* p = static_cast<const std::byte*>(ev->param.conn.private_data);
    e.private_data.assign(p, p + ev->param.conn.private_data_len);
  }
  if (e.type == RDMA_CM_EVENT_CONNECT_REQUEST && !datagram) {
    e.responder_resources = ev->param.conn.responder_resources;
    e.initiator_depth = ev->param.conn.initiator_depth;
  }
  const bool multicast = e.type == RDMA_CM_EVENT_MULTICAST_JOIN || e.type == RDMA_CM_EVENT_MULTICAST_ERROR;
  if (multicast) {
    // librdmacm puts the join's context where the private data would be.
    e.context = ev->param.ud.private_data;
  }
  if (datagram && (e.type == RDMA_CM_EVENT_ESTABLISHED || e.type == RDMA_CM_EVENT_MULTICAST_JOIN)) {
    e.ah_attr = ev->param.ud.ah_attr;
    e.ud_qp_num = ev->param.ud.qp_num;
    e.ud_qkey = ev->param.ud.qkey;
  }
  return e;
}

/// The next event on `ch`, acknowledged; empty when `deadline` passes first (ec clear) or on
/// failure (ec set).
std::optional<Event> next_event(rdma_event_channel* ch, Clock::time_point deadline, std::error_code& ec) {
  ec.clear();
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) == 0) {
      std::optional<Event> e;
      try {
        e.emplace(to_event(ev));
      } catch (...) {
        rdma_ack_cm_event(ev);
        throw;
      }
      rdma_ack_cm_event(ev);
      return e;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      ec.assign(errno, std::generic_category());
      return std::nullopt;
    }
    const int left = ms_until(deadline);
    if (left <= 0) return std::nullopt;
    pollfd p{ch->fd, POLLIN, 0};
    if (::poll(&p, 1, left) < 0 && errno != EINTR) {
      ec.assign(errno, std::generic_category());
      return std::nullopt;
    }
  }
}

[[noreturn]] void fail_no_answer(Phase phase, std::chrono::milliseconds budget, SourceLocation where) {
  fail(ETIMEDOUT, phase, "no answer within " + std::to_string(budget.count()) + " ms (is the peer reachable?)", where);
}

/// `e` when it is `wanted` (or `also`); any other event ends the phase with an error saying which.
Event check_event(Event e, rdma_cm_event_type wanted, Phase phase, SourceLocation where,
                  std::optional<rdma_cm_event_type> also) {
  if (e.type == wanted || (also && e.type == *also)) return e;
  const std::string what = std::string(rdma_event_str(e.type)) + " (status " + std::to_string(e.status) + ")";
  switch (e.type) {
    case RDMA_CM_EVENT_REJECTED:
      // The status is the IB CM reject reason (8: invalid service ID, nothing listens there).
      throw ConnectError(std::error_code(ECONNREFUSED, std::generic_category()), phase,
                         e.status == 8 ? "rejected: no listener on that port (" + what + ")"
                                        : "rejected by the peer (" + what +
                                              "; its private data, if any, is in ConnectError::private_data())",
                         e.status, e.private_data, where);
    case RDMA_CM_EVENT_UNREACHABLE: fail(EHOSTUNREACH, phase, "peer unreachable (" + what + ")", where);
    case RDMA_CM_EVENT_ADDR_ERROR:
      fail(e.status == -ENODEV ? ENODEV : (e.status < 0 ? -e.status : EHOSTUNREACH), phase,
           "address resolution failed (" + what + ")", where);
    case RDMA_CM_EVENT_ROUTE_ERROR:
      fail(e.status < 0 ? -e.status : ENETUNREACH, phase, "route resolution failed (" + what + ")", where);
    case RDMA_CM_EVENT_DEVICE_REMOVAL: fail(ENODEV, phase, "the RDMA device was removed (" + what + ")", where);
    default: fail(ECONNABORTED, phase, "unexpected " + what, where);
  }
}

/// Waits for `wanted` (or `also`, when given) on `ch`; any other event ends the phase with an
/// error saying which.
Event expect_event(rdma_event_channel* ch, rdma_cm_event_type wanted, Clock::time_point deadline, Phase phase,
                   std::chrono::milliseconds budget, SourceLocation where,
                   std::optional<rdma_cm_event_type> also) {
  std::error_code ec;
  std::optional<Event> e = next_event(ch, deadline, ec);
  if (ec) fail(ec.value(), phase, "rdma_get_cm_event", where);
  if (!e) fail_no_answer(phase, budget, where);
  return check_event(std::move(*e), wanted, phase, where, also);
}

/// Sleeps until `fd` is readable or `deadline` passes (poll(2); EINTR is a wakeup).
void wait_readable(int fd, Clock::time_point deadline, Phase phase, SourceLocation where) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, std::max(0, ms_until(deadline))) < 0 && errno != EINTR) fail(errno, phase, "poll", where);
}

/// Checks of the options that need no device, made before anything is sent or waited for.
void check_options(const ConnectionOptions& o, Phase phase, SourceLocation where) {
  const TransportOptions& t = o.transport;
  if (t.retry_count > 7 || t.rnr_retry_count > 7 || t.ack_timeout > 31 || t.min_rnr_timer > 31)
    fail(EINVAL, phase,
         "ConnectionOptions::transport: retry_count and rnr_retry_count are 0..7, ack_timeout and min_rnr_timer "
         "0..31; nothing was sent", where);
  constexpr AccessFlags remote = Access::remote_read | Access::remote_write | Access::remote_atomic;
  if (o.expose && (o.qp.access & remote).value() == 0)
    fail(EINVAL, phase,
         "ConnectionOptions::expose hands the peer a buffer, but the QP grants it no remote right "
         "(QpOptions::access is empty): set .qp.access to what the peer may do with it, e.g. Access::remote_read; "
         "nothing was sent", where);
}

std::vector<std::byte> frame(const ConnectionOptions& o, std::size_t limit, Phase phase, SourceLocation where) {
  const std::size_t extra = o.expose ? RemoteSlice::wire_size : 0;
  if (o.private_data.size() + extra > limit)
    fail(EMSGSIZE, phase,
         "private data of " + std::to_string(o.private_data.size()) + " bytes" +
             (extra != 0 ? " plus the 24-byte exposed slice" : "") + " exceeds the limit of " + std::to_string(limit) +
             " bytes; nothing was sent", where);
  if (detail::cm_private_data_ambiguous(o.expose, o.private_data))
    fail(EINVAL, phase,
         detail::decode_mtu_tag(o.private_data)
             ? "the private data begins with the path MTU tag verbs sends (\"VM\", 1, an MTU), which the peer would "
               "take for one: start the data differently; nothing was sent"
             : "the private data begins with the wire form of a RemoteSlice, which the peer would take for an exposed "
               "slice (ConnectionOptions::expose): use .expose for a slice, or start the data differently; nothing "
               "was sent",
         where);
  return detail::frame_cm_private_data(o.expose, o.private_data);
}

/// The private data of `o` with the path MTU tag `tag` in front (cm_private_data.hpp): this
/// side takes a smaller path MTU than the peer would use without it.
std::vector<std::byte> frame_with_mtu(const ConnectionOptions& o, std::size_t limit, Mtu tag, Mtu assumed, Phase phase,
                                      SourceLocation where) {
  const std::size_t n = o.private_data.size() + (o.expose ? RemoteSlice::wire_size : 0);
  if (n + detail::mtu_tag_size > limit)
    fail(EMSGSIZE, phase,
         "this side takes a path MTU of " + std::to_string(mtu_bytes(tag)) + " bytes, below the peer's " +
             std::to_string(mtu_bytes(assumed)) + " (a smaller MTU here, or TransportOptions::path_mtu), and needs " +
             std::to_string(detail::mtu_tag_size) + " bytes of the private data to tell it; " + std::to_string(n) +
             " of the " + std::to_string(limit) + " are taken (set the same MTU on both hosts, or send less)",
         where);
  return detail::frame_cm_private_data(o.expose, o.private_data, tag);
}

/// The connection parameters of a connect, or (with the request) of an accept: the depths of
/// the options, capped by the device and, answering a request, by what the request offers
/// (rdma_accept(3)): never more reads in flight than the peer can take, nor more resources
/// than it will use. Without that, a peer whose device has a smaller max_qp_rd_atom fails RTR.
rdma_conn_param conn_param(const ConnectionOptions& o, const std::vector<std::byte>& data, const Device& dev,
                           const QueuePair& qp, const Event* request = nullptr) {
  rdma_conn_param p{};
  // The QP is not on the id (see Connection::Impl::build): the handshake names it.
  p.qp_num = qp.qp_num();
  p.srq = o.qp.srq != nullptr ? 1 : 0;
  p.private_data = data.empty() ? nullptr : data.data();
  p.private_data_len = static_cast<std::uint8_t>(data.size());
  const ibv_device_attr& a = dev.attributes().orig_attr;
  int responder = std::min<int>(o.transport.responder_resources.value_or(16), a.max_qp_rd_atom);
  int initiator = std::min<int>(o.transport.initiator_depth.value_or(16), a.max_qp_init_rd_atom);
  if (request != nullptr) {
    responder = std::min<int>(responder, request->responder_resources);
    initiator = std::min<int>(initiator, request->initiator_depth);
  }
  p.responder_resources = static_cast<std::uint8_t>(responder);
  p.initiator_depth = static_cast<std::uint8_t>(initiator);
  p.retry_count = o.transport.retry_count;
  p.rnr_retry_count = o.transport.rnr_retry_count;
  return p;
}

/// A Device over the context librdmacm opened for `id`; it keeps `id` (and so the context)
/// alive for as long as anything made from it lives.
Device device_of(const std::shared_ptr<rdma_cm_id>& id) {
  return Device::adopt(std::shared_ptr<ibv_context>(id->verbs, [id](ibv_context*) {}));
}

void set_bind_options(rdma_cm_id* id, bool reuse_address, std::optional<bool> ipv6_only, Phase phase,
                      SourceLocation where) {
  if (reuse_address) {
    int one = 1;
    if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one) != 0)
      fail(errno, phase, "rdma_set_option(REUSEADDR)", where);
  }
  if (ipv6_only) {
    int only = *ipv6_only ? 1 : 0;
    if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &only, sizeof only) != 0)
      fail(errno, phase, "rdma_set_option(AFONLY)", where);
  }
}

void make_pd_and_cqs(const Device& dev, const ProtectionDomain* pd, const CompletionQueue* send_cq,
                     const CompletionQueue* recv_cq, int cq_depth, std::string_view prefix, std::string_view owner,
                     std::string_view remedy, Phase phase, SourceLocation where,
                     std::optional<ProtectionDomain>& pd_out, std::optional<CompletionQueue>& send_out,
                     std::optional<CompletionQueue>& recv_out) {
  ibv_context* ctx = dev.native_handle();
  const auto named = [&](const char* field) { return std::string(prefix) + field; };
  if (pd != nullptr) {
    check_same_context(pd, ctx, named("pd"), owner, remedy, phase, where);
    pd_out.emplace(ProtectionDomain::adopt(pd->shared_handle(), where));
  } else {
    pd_out.emplace(dev, where);
  }
  const CqOptions cqo{.depth = cq_depth, .with_channel = true};
  if (send_cq != nullptr) check_same_context(send_cq, ctx, named("send_cq"), owner, remedy, phase, where);
  if (recv_cq != nullptr) check_same_context(recv_cq, ctx, named("recv_cq"), owner, remedy, phase, where);
  if (send_cq != nullptr)
    send_out.emplace(CompletionQueue::adopt(send_cq->shared_handle()));
  else
    send_out.emplace(dev, cqo, where);
  if (recv_cq != nullptr)
    recv_out.emplace(CompletionQueue::adopt(recv_cq->shared_handle()));
  else
    recv_out.emplace(dev, cqo, where);
}

/// Completions an exchange() polled that were not its own, kept for the CQ they came from. A CQ
/// may be shared by several connections (ConnectionOptions::send_cq, recv_cq), so what one
/// connection's exchange() polls may be another's: one store per ibv_cq, shared by every
/// Connection that uses the CQ (held_store()), and what it holds is returned by any of their
/// wait()s on that CQ, as though it were still in the CQ.
struct HeldCompletions {
  explicit HeldCompletions(std::shared_ptr<ibv_cq> q) noexcept : cq(std::move(q)) {}
  HeldCompletions(const HeldCompletions&) = delete;
  HeldCompletions& operator=(const HeldCompletions&) = delete;
  ~HeldCompletions();

  /// The CQ, kept: its address is the registry's key, and must not be reused while the store lives.
  const std::shared_ptr<ibv_cq> cq;
  /// What wait()'s fast path loads, once per poll: 0 when nothing is held and no exchange()
  /// runs on the CQ. Bit 0: `held` is not empty (written under `mutex`); above it, how many
  /// exchange()s run on the CQ (each adds `exchange_unit` while it runs).
  std::atomic<unsigned> state{0};
  static constexpr unsigned held_bit = 1, exchange_unit = 2;
  std::mutex mutex;
  /// For any connection's wait() or spin() on the CQ, in the order they were polled.
  std::deque<Completion> held;
  /// Requests of exchange() (wr_id exchange_wr_id) polled by anyone but the exchange() of their
  /// QP, while it runs: for that exchange() (by qp_num), never for wait().
  std::vector<Completion> reserved;
  /// The QPs whose exchange() runs on the CQ (one entry per exchange()). An exchange request of
  /// any other QP (a failed exchange()'s late one, a flushed one) is held for wait() instead: a
  /// reservation nobody takes would wait for a new QP given the same number.
  std::vector<std::uint32_t> exchanging_qps;
  [[nodiscard]] bool reserves(const Completion& wc) const noexcept {
    return wc.wr_id() == Connection::exchange_wr_id &&
           std::find(exchanging_qps.begin(), exchanging_qps.end(), wc.qp_num()) != exchanging_qps.end();
  }
  /// An eventfd of each connection on the CQ, written whenever something is kept: a thread asleep
  /// in wait() or exchange() on the CQ polls its connection's, and drains it before looking here.
  std::vector<int> wakers;

  /// Wakes every connection on the CQ. Under `mutex`, so that no fd is written once unregistered.
  void wake() noexcept {
    const std::uint64_t one = 1;
    for (const int fd : wakers) (void)!::write(fd, &one, sizeof one);
  }
  /// After `held` changed, under `mutex`.
  void update_held_bit() noexcept {
    if (held.empty())
      state.fetch_and(~held_bit, std::memory_order_release);
    else
      state.fetch_or(held_bit, std::memory_order_release);
  }
  [[nodiscard]] bool exchanging() const noexcept { return state.load(std::memory_order_acquire) >= exchange_unit; }

  /// wait()'s poll when `state` is not 0: what is held first; else the CQ (armed first when
  /// `arm`, as CompletionQueue::arm_and_poll), keeping from the caller, while an exchange() runs
  /// on the CQ, the requests of exchange() (wr_id exchange_wr_id): they are reserved for the
  /// exchange() of their QP, which is woken.
  std::span<Completion> poll(CompletionQueue& q, std::span<Completion> out, std::error_code& ec, bool arm) noexcept {
    const std::lock_guard lock(mutex);
    ec.clear();
    if (!held.empty()) {
      const std::size_t n = std::min(out.size(), held.size());
      std::copy_n(held.begin(), n, out.begin());
      held.erase(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(n));
      update_held_bit();
      return out.first(n);
    }
    if (state.load(std::memory_order_relaxed) < exchange_unit) return arm ? q.arm_and_poll(out, ec) : q.poll(out, ec);
    bool kept = false;
    std::size_t n = 0;
    for (bool first = true; n == 0; first = false) {
      const auto wcs = first && arm ? q.arm_and_poll(out, ec) : q.poll(out, ec);
      if (ec || wcs.empty()) break;
      for (const Completion& wc : wcs) {
        if (reserves(wc)) {
          try {
            reserved.push_back(wc);
            kept = true;
            continue;
          } catch (const std::bad_alloc&) {
            // Out of memory: the caller gets it, as before exchange() ran.
          }
        }
        out[n++] = wc;
      }
      if (wcs.size() < out.size()) break;
    }
    if (kept) wake();
    return out.first(n);
  }
};

/// The stores of the CQs that connections use, by ibv_cq (weak: a store lives as long as a
/// connection uses its CQ). Never destroyed: connections may outlive static destruction.
struct HeldRegistry {
  std::mutex mutex;
  std::unordered_map<const ibv_cq*, std::weak_ptr<HeldCompletions>> stores;
};

HeldRegistry& held_registry() {
  static auto* registry = new HeldRegistry;  // NOLINT(cppcoreguidelines-owning-memory): see above
  return *registry;
}

/// The store of `cq`, shared with every other connection on it.
std::shared_ptr<HeldCompletions> held_store(const std::shared_ptr<ibv_cq>& cq) {
  HeldRegistry& r = held_registry();
  const std::lock_guard lock(r.mutex);
  std::weak_ptr<HeldCompletions>& slot = r.stores[cq.get()];
  if (auto store = slot.lock()) return store;
  auto store = std::make_shared<HeldCompletions>(cq);
  slot = store;
  return store;
}

HeldCompletions::~HeldCompletions() {
  HeldRegistry& r = held_registry();
  const std::lock_guard lock(r.mutex);
  // Unless a connection made a new store for the CQ meanwhile (held_store() found this one expired).
  if (const auto it = r.stores.find(cq.get()); it != r.stores.end() && it->second.expired()) r.stores.erase(it);
}

/// A connection's link to the store of one of its CQs.
struct HeldLink {
  ibv_cq* cq = nullptr;  // the store's CQ: what wait() compares
  std::shared_ptr<HeldCompletions> store;
  /// Registered in the store: written when it keeps something, polled by this connection's
  /// waiters on this CQ. One per CQ, not per connection: a waiter on the other CQ would drain
  /// it and leave the waiter on this one asleep. Made by the first waiter that sleeps
  /// (Connection::Impl::wake_fd), so that a connection nobody waits on costs no descriptor;
  /// written and read under the store's mutex, and read without it only by the thread that made
  /// it or saw it made (wake_fd's return).
  int fd = -1;
};

/// An EventChannel's state: the channel, and who each event is for. Shared by the EventChannel
/// and every connection and listener on it (through their ids' deleters and their `shared`).
struct ChannelHub {
  /// Called under `mutex` with an event of the route's id (a connection request: of the
  /// listener's): must not block nor call into the hub. False: a connection request it could
  /// not keep (no memory), which the hub then rejects.
  using Deliver = bool (*)(void* self, Event&& e) noexcept;
  struct Route {
    void* self;
    Deliver deliver;
    std::uint64_t key;
    bool listed = false;  // its key is in `ready`
  };

  /// Takes `c`; throws ConnectError (epoll_create1, eventfd), destroying it.
  ChannelHub(rdma_event_channel* c, SourceLocation where) : ch(c) {
    notify_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event e{};
    e.events = EPOLLIN;
    if (notify_fd < 0 || epoll_fd < 0 || ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, ch->fd, &e) != 0 ||
        ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, notify_fd, &e) != 0) {
      const int err = errno;
      close_all();
      fail(err, Phase::connect, "EventChannel: epoll_create1 or eventfd", where);
    }
  }
  ChannelHub(const ChannelHub&) = delete;
  ChannelHub& operator=(const ChannelHub&) = delete;
  ~ChannelHub() { close_all(); }
  void close_all() noexcept {
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (notify_fd >= 0) ::close(notify_fd);
    rdma_destroy_event_channel(ch);
  }

  rdma_event_channel* const ch;
  // What EventChannel::fd() gives: an epoll set over the channel's fd and `notify_fd`, which is
  // readable while `ready` names something another thread listed. A thread that reads the
  // channel for its own wait (any connection's wait(), a blocking connect()) takes the channel's
  // readiness with the events; the keys it lists keep the event loop's fd readable until
  // dispatch() takes them. What dispatch() lists itself it returns in the same call.
  int notify_fd = -1;
  int epoll_fd = -1;
  std::mutex mutex;
  std::unordered_map<const rdma_cm_id*, Route> routes;
  std::vector<std::pair<const rdma_cm_id*, std::uint64_t>> ready;  // routes with news, in order
  std::vector<std::uint64_t> handed;                                // what dispatch() last returned

  /// Routes the events of `id`; throws std::bad_alloc. The id of a connection request taken
  /// from a listener on this channel has had a route since its request came (park()): what came
  /// for it meanwhile goes to `r` now, in order, as though `r` had been there all along.
  void add(const rdma_cm_id* id, Route r) {
    const std::lock_guard lock(mutex);
    Route& in = routes.insert_or_assign(id, r).first->second;
    if (const auto it = parked.find(id); it != parked.end()) {
      std::vector<Event> came = std::move(it->second);
      parked.erase(it);
      for (Event& e : came) (void)in.deliver(in.self, std::move(e));
      if (!came.empty()) list(id, in, false);
    }
  }
  /// Stops routing `id`'s events: once it returns, its route is not called any more, and the
  /// events it did not take are dropped (acknowledged, so that rdma_destroy_id(3) need not wait).
  void remove(const rdma_cm_id* id) noexcept {
    const std::lock_guard lock(mutex);
    remove_locked(id);
  }
  void remove_locked(const rdma_cm_id* id) noexcept {
    if (const auto it = routes.find(id); it != routes.end()) {
      if (it->second.listed) std::erase_if(ready, [&](const auto& r) { return r.first == id; });
      routes.erase(it);
    }
    parked.erase(id);
  }
  /// Reads every pending event and hands each to its id's route. Sets `ec` on failure.
  void pump(std::error_code& ec) noexcept {
    const std::lock_guard lock(mutex);
    pump_locked(ec, false);
  }
  /// pump(), then the keys of the routes with news since the last call.
  std::span<const std::uint64_t> dispatch(std::error_code& ec) noexcept {
    const std::lock_guard lock(mutex);
    // What this call lists it returns at once: `notify_fd` is written only for what another
    // thread's pump() lists (two syscalls per call saved, the common case of an event loop).
    pump_locked(ec, true);
    if (!ec) {
      handed.clear();
      try {
        handed.reserve(ready.size());
      } catch (const std::bad_alloc&) {
        ec = std::make_error_code(std::errc::not_enough_memory);
      }
    }
    if (ec) {  // what was listed stays for the next call: the fd must say so
      if (!ready.empty()) notify();
      return {};
    }
    if (notified) {  // `ready` is taken now; a later listing writes it again
      std::uint64_t n = 0;
      (void)!::read(notify_fd, &n, sizeof n);
      notified = false;
    }
    for (const auto& [id, key] : ready) {
      handed.push_back(key);
      if (const auto it = routes.find(id); it != routes.end()) it->second.listed = false;
    }
    ready.clear();
    return handed;
  }

  /// A connection request nobody keeps: the client hears at once.
  static void refuse(rdma_cm_id* id) noexcept {
    rdma_reject(id, nullptr, 0);
    rdma_destroy_id(id);
  }

 private:
  bool notified = false;  // `notify_fd` was written since dispatch() last read it (under `mutex`)
  // What came for the id of a connection request before an accept took it (a REJECTED, a
  // DEVICE_REMOVAL): its route until then is park().
  std::unordered_map<const rdma_cm_id*, std::vector<Event>> parked;

  static bool park(void* self, Event&& e) noexcept {
    auto& hub = *static_cast<ChannelHub*>(self);
    try {
      hub.parked[e.id].push_back(std::move(e));
    } catch (const std::bad_alloc&) {
      // Lost: the handshake of that request then ends at its deadline instead of at once.
    }
    return true;
  }
  void list(const rdma_cm_id* id, Route& r, bool for_dispatch) noexcept {
    if (r.listed) return;
    try {
      ready.emplace_back(id, r.key);
      r.listed = true;
      if (!for_dispatch) notify();
    } catch (const std::bad_alloc&) {
      // Not listed: dispatch() will not name it; its owner has the event all the same.
    }
  }
  void notify() noexcept {
    if (notified) return;
    const std::uint64_t one = 1;
    (void)!::write(notify_fd, &one, sizeof one);
    notified = true;
  }
  /// pump() under `mutex`; `for_dispatch`: the caller takes what is listed before unlocking.
  void pump_locked(std::error_code& ec, bool for_dispatch) noexcept {
    ec.clear();
    for (;;) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(ch, &ev) != 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) ec.assign(errno, std::generic_category());
        return;
      }
      // A connection request is the listener's; the id it brings is new (the caller's to
      // accept or reject and destroy).
      rdma_cm_id* request = ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? ev->id : nullptr;
      const rdma_cm_id* id = request != nullptr ? ev->listen_id : ev->id;
      std::optional<Event> e;
      try {
        e.emplace(to_event(ev));
      } catch (const std::bad_alloc&) {
        ec = std::make_error_code(std::errc::not_enough_memory);
      }
      rdma_ack_cm_event(ev);
      if (!e) {
        if (request != nullptr) refuse(request);
        return;
      }
      if (request != nullptr) {
        // Its events are kept from now on, until an accept routes them (add()) or refuses it.
        try {
          routes.insert_or_assign(request, Route{this, &ChannelHub::park, 0});
        } catch (const std::bad_alloc&) {
          refuse(request);
          continue;
        }
      }
      const auto it = routes.find(id);
      if (it == routes.end()) {  // its connection (or listener) is gone
        if (request != nullptr) {
          routes.erase(request);
          refuse(request);
        }
        continue;
      }
      Route& r = it->second;
      if (!r.deliver(r.self, std::move(*e))) {  // a listener that could not keep the request
        if (request != nullptr) {
          routes.erase(request);
          refuse(request);
        }
        continue;
      }
      // A request's parked events are nobody's news yet: add() lists its connection with them.
      if (r.deliver != &ChannelHub::park) list(id, r, for_dispatch);
    }
  }
};

struct ChannelAccess {
  static const std::shared_ptr<ChannelHub>& hub(const EventChannel& c) noexcept { return c.hub_; }
};

/// The channel of `hub` as the connection code uses a channel of its own: a shared_ptr that
/// keeps the hub (which owns it) alive.
std::shared_ptr<rdma_event_channel> channel_of(const std::shared_ptr<ChannelHub>& hub) noexcept {
  return {hub, hub->ch};
}

/// What an EventChannel's readers handed to one owner that reads it later (a handshake in
/// progress, a listener), under the hub's mutex. `fd` is made by an owner about to sleep
/// (sleep()), since another thread may read its event off the channel; keep() writes it.
struct HandedOver {
  std::vector<Event> events;  // an event or two at a time: no deque's first block
  bool lost = false;          // one could not be kept (no memory)
  int fd = -1;

  HandedOver() = default;
  HandedOver(const HandedOver&) = delete;
  HandedOver& operator=(const HandedOver&) = delete;
  ~HandedOver() {
    if (fd >= 0) ::close(fd);
  }

  /// Under the hub's mutex: keeps `e` (false, and `lost`, when it cannot) and wakes a sleeper
  /// either way.
  bool keep(Event&& e) noexcept {
    bool kept = true;
    try {
      events.push_back(std::move(e));
    } catch (const std::bad_alloc&) {
      lost = true;
      kept = false;
    }
    if (fd >= 0) {
      const std::uint64_t one = 1;
      (void)!::write(fd, &one, sizeof one);
    }
    return kept;
  }

  /// The next event without blocking: one kept already, else one this read of the channel
  /// hands over. Empty with `ec` clear when there is none; ENOMEM once one was lost.
  std::optional<Event> next(ChannelHub& hub, std::error_code& ec) {
    ec.clear();
    const auto take = [&]() -> std::optional<Event> {
      const std::lock_guard lock(hub.mutex);
      if (lost) ec = std::make_error_code(std::errc::not_enough_memory);
      if (lost || events.empty()) return std::nullopt;
      Event e = std::move(events.front());
      events.erase(events.begin());
      return e;
    };
    if (auto e = take(); e || ec) return e;  // handed over already (dispatch() read it)
    hub.pump(ec);
    if (ec) return std::nullopt;
    return take();
  }

  /// Sleeps until the channel is readable or something is kept, or `deadline`. `fd` is made
  /// before `events` is looked at, under the mutex keep() runs under: neither can be missed.
  void sleep(ChannelHub& hub, Clock::time_point deadline, Phase phase, SourceLocation where) {
    {
      const std::lock_guard lock(hub.mutex);
      if (fd < 0) {
        fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (fd < 0) fail(errno, phase, "eventfd", where);
      }
      if (!events.empty() || lost) return;
    }
    std::array<pollfd, 2> fds{{{hub.ch->fd, POLLIN, 0}, {fd, POLLIN, 0}}};
    if (::poll(fds.data(), fds.size(), std::max(1, ms_until(deadline))) < 0 && errno != EINTR)
      fail(errno, phase, "poll", where);
    std::uint64_t n = 0;
    (void)!::read(fd, &n, sizeof n);  // what it says is in `events`, which next() reads
  }
};

}  // namespace internal
using namespace internal;

std::string_view to_string(Phase p) noexcept {
  switch (p) {
    case Phase::resolve_address: return "address resolution";
    case Phase::resolve_route: return "route resolution";
    case Phase::connect: return "connect";
    case Phase::listen: return "listen";
    case Phase::accept: return "accept";
    case Phase::established: return "established connection";
  }
  return "unknown";
}

ConnectError::ConnectError(std::error_code code, Phase phase, std::string_view context, SourceLocation where)
    : Error(code, "rdma_cm " + std::string(to_string(phase)) + ": " + std::string(context), where), phase_(phase) {}

ConnectError::ConnectError(std::error_code code, Phase phase, std::string_view context, int status,
                           std::span<const std::byte> private_data, SourceLocation where)
    : ConnectError(code, phase, context, where) {
  status_ = status;
  if (!private_data.empty())
    private_data_ = std::make_shared<const std::vector<std::byte>>(private_data.begin(), private_data.end());
}

Reject::Reject(std::span<const std::byte> private_data, const std::string& why) : std::runtime_error(why) {
  if (private_data.size() > max_reject_private_data)
    throw std::length_error("cm::Reject: " + std::to_string(private_data.size()) + " bytes of private data exceed the " +
                            std::to_string(max_reject_private_data) + "-byte limit of a reject");
  data_ = std::make_shared<const std::vector<std::byte>>(private_data.begin(), private_data.end());
}

// ---------------------------------------------------------------------------------------------
struct Connection::Impl {
  // Its own channel, or an EventChannel's (then `shared` is that channel's hub, and `channel`
  // keeps the hub alive).
  std::shared_ptr<rdma_event_channel> channel;
  std::shared_ptr<ChannelHub> shared;
  std::shared_ptr<rdma_cm_id> id;
  std::optional<Device> device;
  /// Runs `call` (an rdma_cm command on the id); 0, or the errno it failed with. When the
  /// channel is shared, under the hub's mutex, which every reader holds while it reads: another
  /// thread may read the command's event meanwhile, and librdmacm writes into the id on both
  /// paths (rdma_resolve_addr copies the destination after its write(2), rdma_get_cm_event copies
  /// the resolved address in: ThreadSanitizer saw them race).
  template <typename Call>
  [[nodiscard]] int command(Call&& call) const {
    const auto lock = shared ? std::unique_lock<std::mutex>(shared->mutex) : std::unique_lock<std::mutex>();
    return std::forward<Call>(call)() == 0 ? 0 : errno;
  }
  // Its own, or sharing the ownership of the caller's (ConnectionOptions::pd, send_cq,
  // recv_cq): the caller's objects may be moved or destroyed while the connection lives.
  std::optional<ProtectionDomain> pd;
  std::optional<CompletionQueue> send_cq, recv_cq;
  std::optional<QueuePair> qp;
  std::vector<std::byte> peer_private;
  std::optional<RemoteSlice> peer_remote;
  AccessFlags access;
  // The stores of completions held for the receive and the send CQ (one store, and one link,
  // when they are the same CQ): shared with every connection on the CQ (HeldCompletions).
  HeldLink recv_held, send_held;
  std::uint32_t qp_num = 0;
  // Regions of failed exchange()s whose requests may still be posted: kept until the QP goes.
  std::vector<MemoryRegion> retired;
  // Set while connecting or accepting, before the Connection is handed out; read-only after.
  bool established = false;
  TransportOptions transport;
  std::uint8_t responder = 0, initiator = 0;  // read/atomic depths of the handshake
  // Path MTUs: the peer's tag (the most it takes, when below what it expects of us); after RTR,
  // the QP's, and the one the peer would use without a tag from us (see mtu_limit()).
  std::optional<Mtu> peer_mtu;
  ibv_mtu rtr_mtu = IBV_MTU_4096, peer_assumes = IBV_MTU_4096;
  // What the events have told, written by whichever thread reads them (wait() and
  // poll_events() may run in several threads at once, e.g. one per CQ): atomics.
  std::atomic<bool> disconnected{false};  // rdma_disconnect called (or being called)
  std::atomic<bool> peer_gone{false};
  std::atomic<bool> device_removed{false};   // DEVICE_REMOVAL: over, but not the peer's doing
  std::atomic<bool> address_changed{false};  // ADDR_CHANGE seen
  // Eventfds made readable (and left so) once the connection is over (over_fd), and once the
  // peer or the device ended it (gone_fd): every thread asleep in wait() polls over_fd, and in
  // wait_disconnected() gone_fd, so the thread that read the ending event (or disconnect()ed)
  // wakes the others (the cm channel is readable for one reader only, and a CQ with nothing
  // posted never wakes). wait_disconnected() after our own disconnect() waits for the peer's
  // answer: over_fd, readable already, would make it spin.
  // Made by the first thread that is about to sleep (wake_fd()), not with the connection: a
  // process with many connections driven from its own event loop holds one descriptor per
  // connection (the cm channel), not four. A waiter makes the fd before it reads the flags that
  // say the connection is over, and wake_all() reads the fd after they are set (both seq_cst):
  // either the waiter sees the connection over, or wake_all() sees the fd and writes it.
  std::atomic<int> over_fd{-1};
  std::atomic<int> gone_fd{-1};
  // The device context's async event reader (Device's), and what it told of this QP: the type of
  // the first QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR of the QP or DEVICE_FATAL (-1: none). Set by
  // whichever thread reads the event, this connection's waiter or not (on_async_event).
  std::shared_ptr<detail::AsyncHub> hub;
  bool routed = false;
  std::atomic<int> fatal_event{-1};
  // On an EventChannel (`shared`), under its mutex: while the handshake runs, the events its
  // readers hand over wait in `inbox` for step(); once established, deliver() notes them at
  // once (note()), as pump() does on a channel of its own.
  bool channel_routed = false;
  bool handshaking = true;
  HandedOver inbox;

  ~Impl() {
    // Out of the hubs first: their routes must not be called with this Impl half destroyed.
    if (channel_routed) shared->remove(id.get());
    if (routed) hub->remove_route(qp->native_handle());
    if (established && !disconnected) {
      to_error();
      rdma_disconnect(id.get());
    }
    // Out of the stores first: what this QP's destruction flushes is not reserved for it.
    unlink_held(recv_held);
    if (send_held.store != recv_held.store) unlink_held(send_held);
    qp.reset();  // before the CQs, PD and id it uses, and the regions of its requests
    if (const int fd = over_fd.load(); fd >= 0) ::close(fd);
    if (const int fd = gone_fd.load(); fd >= 0) ::close(fd);
  }

  /// The eventfd in `slot`, made now if no thread made it yet; -1 with errno set on failure.
  static int wake_fd(std::atomic<int>& slot) noexcept {
    if (const int fd = slot.load(); fd >= 0) return fd;
    const int made = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (made < 0) return -1;
    int none = -1;
    if (slot.compare_exchange_strong(none, made)) return made;
    ::close(made);  // another thread's came first
    return none;
  }

  /// The eventfd of `l` in its store, made and registered now if no waiter made it yet; -1 with
  /// errno set on failure. Registered before the waiter arms and polls the CQ: whatever is kept
  /// after that writes it, and what was kept before, the poll finds.
  static int wake_fd(HeldLink& l) noexcept {
    const std::lock_guard lock(l.store->mutex);
    if (l.fd >= 0) return l.fd;
    const int made = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (made < 0) return -1;
    try {
      l.store->wakers.push_back(made);
    } catch (const std::bad_alloc&) {
      ::close(made);
      errno = ENOMEM;
      return -1;
    }
    l.fd = made;
    return made;
  }

  /// Leaves the store: no more wakeups, and the exchange() completions reserved for this QP go
  /// (its number may be given to a new QP, whose exchange() would take them for its own).
  void unlink_held(HeldLink& l) noexcept {
    if (l.store) {
      const std::lock_guard lock(l.store->mutex);
      if (l.fd >= 0) std::erase(l.store->wakers, l.fd);
      if (qp_num != 0) std::erase_if(l.store->reserved, [&](const Completion& wc) { return wc.qp_num() == qp_num; });
    }
    if (l.fd >= 0) ::close(l.fd);
  }

  /// The link of `cq` for wait(): the receive CQ's, else the send CQ's. One pointer compare, on
  /// the data path; wait_cq() uses the store for the CQ the link names only.
  HeldLink& held_link(const CompletionQueue& cq) noexcept {
    return cq.shared_handle().get() == recv_held.cq ? recv_held : send_held;
  }

  /// Joins the store of `cq` (its eventfd comes with the first waiter: wake_fd()).
  void link_held(HeldLink& l, const CompletionQueue& cq) {
    l.cq = cq.shared_handle().get();
    l.store = held_store(cq.shared_handle());
  }

  /// Makes over_fd readable (and gone_fd once the peer or the device ended the connection),
  /// waking every thread that waits on this connection.
  void wake_all() noexcept {
    const std::uint64_t one = 1;
    if (const int fd = over_fd.load(); fd >= 0) (void)!::write(fd, &one, sizeof one);
    if (peer_gone || device_removed)
      if (const int fd = gone_fd.load(); fd >= 0) (void)!::write(fd, &one, sizeof one);
  }

  /// Empties an eventfd of a held link (it was readable), before the store is looked at again.
  static void drain(int fd) noexcept {
    std::uint64_t n = 0;
    (void)!::read(fd, &n, sizeof n);
  }

  /// Creates PD (unless shared), CQs (unless shared) and the QP on the id's device.
  void build(const ConnectionOptions& o, Phase phase, SourceLocation where) {
    ibv_context* ctx = id->verbs;
    if (ctx == nullptr) fail(ENODEV, phase, "no RDMA device for this address", where);
    device.emplace(device_of(id));
    const std::string owner = "the connection (" + device->name() + ")";
    constexpr std::string_view remedy = "make it from cm::device_for() or Listener::device()";
    make_pd_and_cqs(*device, o.pd, o.send_cq, o.recv_cq, o.cq_depth, "ConnectionOptions::", owner, remedy, phase,
                    where, pd, send_cq, recv_cq);
    link_held(recv_held, *recv_cq);
    if (send_cq->shared_handle() == recv_cq->shared_handle())
      send_held = recv_held;  // never used for its fd: held_link() and exchange() take recv_held's
    else
      link_held(send_held, *send_cq);
    if (o.qp.type != QpType::rc) fail(EINVAL, phase, "rdma_cm connections are RC (QpOptions::type)", where);
    if (o.qp.srq != nullptr) {
      check_same_context(o.qp.srq, ctx, "QpOptions::srq", owner, remedy, phase, where);
      if (o.qp.srq->native_handle()->pd != pd->native_handle())
        fail(EINVAL, phase,
             "QpOptions::srq is on another protection domain than the connection's (receives would fail at the "
             "first message): make the SRQ on the PD given as ConnectionOptions::pd", where);
    }

    QpOptions q = o.qp;
    q.port = id->port_num;
    // Created by the core, not rdma_create_qp(3): librdmacm then sees no QP on the id
    // (id->qp stays null) and never modifies it. Left to librdmacm, rdma_accept and the
    // client's CONNECT_RESPONSE handling re-apply its INIT attributes (remote read and write)
    // and send the reply or RTU before the caller could take them back: a peer writing at once
    // went through rights never granted. This side makes every transition itself (transition()).
    // With rdma_cm's source GID (librdmacm queried it with the address): QueuePair need not
    // look for one, and takes its index from the RTR's address vector.
    qp.emplace(detail::rdma_cm_queue_pair(*pd, *send_cq, *recv_cq, q, Gid::from_native(id->route.addr.addr.ibaddr.sgid),
                                          where));
    qp_num = qp->qp_num();
    // Async events of this QP (and DEVICE_FATAL) end the connection as a disconnect does.
    hub = detail::async_hub(device->shared_handle());
    hub->add_route(qp->native_handle(), qp_num, {&Impl::on_async_event, this});
    routed = true;
    access = o.qp.access;
    transport = o.transport;
    transition(IBV_QPS_INIT, phase, where);
  }

  /// Moves the QP to `state` with what rdma_cm knows of the connection (rdma_init_qp_attr(3):
  /// pkey and port, path, the peer's QP number, PSNs) and what is this side's to choose: the
  /// access rights of the options, its TransportOptions, and the read/atomic depths negotiated
  /// in the handshake (responder, initiator).
  void transition(ibv_qp_state state, Phase phase, SourceLocation where) {
    ibv_qp_attr a{};
    int mask = 0;
    a.qp_state = state;
    if (rdma_init_qp_attr(id.get(), &a, &mask) != 0)
      fail(errno, phase, std::string("rdma_init_qp_attr(") + std::string(to_string(static_cast<QpState>(state))) + ")",
           where);
    const TransportOptions& t = transport;
    switch (state) {
      case IBV_QPS_INIT:
        a.qp_access_flags = static_cast<unsigned>(access.value());
        mask |= IBV_QP_ACCESS_FLAGS;
        break;
      case IBV_QPS_RTR:
        // rdma_cm would leave min_rnr_timer at 0, which the specification makes 655 ms.
        a.min_rnr_timer = t.min_rnr_timer;
        a.max_dest_rd_atomic = (mask & IBV_QP_MAX_DEST_RD_ATOMIC) != 0 ? std::min(a.max_dest_rd_atomic, responder)
                                                                         : responder;
        mask |= IBV_QP_MIN_RNR_TIMER | IBV_QP_MAX_DEST_RD_ATOMIC;
        if ((mask & IBV_QP_PATH_MTU) != 0) {
          const ibv_mtu route = a.path_mtu;
          a.path_mtu = mtu_limit(route);
          if (peer_mtu) a.path_mtu = std::min(a.path_mtu, static_cast<ibv_mtu>(*peer_mtu));
          rtr_mtu = a.path_mtu;
          peer_assumes = peer_mtu ? std::min(route, static_cast<ibv_mtu>(*peer_mtu)) : route;
        }
        if (t.service_level) a.ah_attr.sl = *t.service_level;
        if (t.traffic_class) a.ah_attr.grh.traffic_class = *t.traffic_class;
        if (t.hop_limit) a.ah_attr.grh.hop_limit = *t.hop_limit;
        break;
      case IBV_QPS_RTS:
        a.timeout = t.ack_timeout;
        a.retry_cnt = t.retry_count;
        a.rnr_retry = t.rnr_retry_count;
        a.max_rd_atomic = (mask & IBV_QP_MAX_QP_RD_ATOMIC) != 0 ? std::min(a.max_rd_atomic, initiator) : initiator;
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
        break;
      default: break;
    }
    qp->modify(a, mask | IBV_QP_STATE, where);
  }

  /// The largest path MTU this side takes, given the route's: TransportOptions::path_mtu, or
  /// the smaller of the route's and this port's active MTU. The route's is the client's (rdma_cm
  /// puts the client's in the request, and the server takes it): a server whose netdev carries
  /// less would send packets it cannot transmit, and the client's would be refused by its
  /// responder (measured between a 9000-byte and a 1500-byte host: a 4 KiB read ended in
  /// RNR_RETRY_EXC after 3 s; once the server alone was capped, a 4 KiB write in REM_INV_REQ).
  /// So a side that takes less says so with a tag (cm_private_data.hpp), and the peer uses it.
  [[nodiscard]] ibv_mtu mtu_limit(ibv_mtu route) const noexcept {
    if (transport.path_mtu) return static_cast<ibv_mtu>(*transport.path_mtu);
    return std::min(route, static_cast<ibv_mtu>(qp->endpoint().mtu));
  }

  /// INIT -> RTR -> RTS, with the depths of the handshake (`p`, as this side sends or sent it).
  void to_rts(const rdma_conn_param& p, Phase phase, SourceLocation where) {
    responder = p.responder_resources;
    initiator = p.initiator_depth;
    transition(IBV_QPS_RTR, phase, where);
    transition(IBV_QPS_RTS, phase, where);
  }

  /// Moves the QP to ERR, flushing what is posted: librdmacm does so only for a QP it manages,
  /// and rxe leaves the QP in RTS otherwise, where a posted receive would wait forever. Not by
  /// a QueuePair transition, which another thread's posting forbids: posts allowed in RTS are
  /// allowed in ERR too (they flush), and qp().state() becomes ERR.
  void to_error() noexcept {
    if (qp) detail::flush_to_error(*qp);
  }

  /// The peer's private data: an exposed slice first (when it decodes as one), then the rest.
  void take_private_data(std::vector<std::byte> data) {
    detail::CmPeerPrivateData p = detail::parse_cm_private_data(std::move(data));
    peer_mtu = p.path_mtu;
    if (p.remote) peer_remote = p.remote;
    peer_private = std::move(p.rest);
  }

  /// Once this side is connected. On an EventChannel, events from now on are noted as they are
  /// handed over; those that came with the last handshake event (a DISCONNECTED right after
  /// ESTABLISHED) are noted now.
  void on_established() {
    established = true;
    if (!shared) return;
    std::vector<Event> left;
    {
      const std::lock_guard lock(shared->mutex);
      handshaking = false;
      left.swap(inbox.events);
    }
    for (const Event& e : left) note(e);
  }

  /// What an event of the established connection changes: a disconnect, a device removal.
  void note(const Event& e) noexcept {
    if (e.type == RDMA_CM_EVENT_DISCONNECTED) peer_gone = true;
    if (e.type == RDMA_CM_EVENT_DEVICE_REMOVAL) device_removed = true;
    if (e.type == RDMA_CM_EVENT_ADDR_CHANGE) address_changed = true;
    if (over()) wake_all();
  }

  /// Reads pending events without blocking, and notes a disconnect (or device removal). On an
  /// EventChannel: hands every connection its events (this one's are noted by deliver()).
  void pump(std::error_code& ec) noexcept {
    ec.clear();
    if (shared) {
      shared->pump(ec);
      return;
    }
    for (;;) {
      std::optional<Event> e;
      try {
        e = next_event(channel.get(), Clock::time_point{}, ec);
      } catch (const std::bad_alloc&) {
        ec = std::make_error_code(std::errc::not_enough_memory);
      }
      if (!e) return;
      note(*e);
    }
  }

  /// The route of this connection's id on an EventChannel (ChannelHub::Deliver).
  static bool deliver(void* self, Event&& e) noexcept {
    auto& c = *static_cast<Impl*>(self);
    if (!c.handshaking) {
      c.note(e);
      return true;
    }
    (void)c.inbox.keep(std::move(e));  // one it cannot keep fails the handshake (next())
    return true;
  }

  /// The fd an event loop watches: the channel's, or the EventChannel's (EventChannel::fd()).
  [[nodiscard]] int user_fd() const noexcept { return shared ? shared->epoll_fd : channel->fd; }

  /// Sleeps until the handshake may have news, or `deadline`: for connect() and accept(), which
  /// step() when it returns. On an EventChannel, another thread may have taken the handshake's
  /// event off the channel and kept it in `inbox` (HandedOver::sleep).
  void wait_handshake(Clock::time_point deadline, Phase phase, SourceLocation where) {
    if (shared)
      inbox.sleep(*shared, deadline, phase, where);
    else
      wait_readable(channel->fd, deadline, phase, where);
  }

  /// Joins the routes of `shared` (the id is made or migrated there by the caller).
  void join(std::uint64_t key) {
    shared->add(id.get(), {this, &Impl::deliver, key});
    channel_routed = true;
  }

  /// The handshake's next event, without blocking: from its own channel, or what an
  /// EventChannel's readers handed over. Empty with `ec` clear when there is none yet.
  std::optional<Event> next(std::error_code& ec) {
    return shared ? inbox.next(*shared, ec) : next_event(channel.get(), Clock::time_point{}, ec);
  }

  /// The async event reader's route (detail::AsyncRoute), under its lock: an event of this QP,
  /// or DEVICE_FATAL. The ones that put the QP (or the device) in error end the connection.
  static void on_async_event(void* self, const AsyncEvent& e) noexcept {
    auto& c = *static_cast<Impl*>(self);
    const bool ends = e.type == IBV_EVENT_QP_FATAL || e.type == IBV_EVENT_QP_REQ_ERR ||
                      e.type == IBV_EVENT_QP_ACCESS_ERR || e.type == IBV_EVENT_DEVICE_FATAL;
    if (!ends) return;
    int none = -1;
    (void)c.fatal_event.compare_exchange_strong(none, static_cast<int>(e.type));
    c.wake_all();
  }

  /// Reads the device context's pending async events (routing them, this connection's and
  /// others', and keeping them for Device::poll_async_events) without blocking.
  void pump_async(std::error_code& ec) noexcept { hub->pump(ec); }

  /// A fatal async event of the QP or the device ended the connection.
  [[nodiscard]] bool failed() const noexcept { return fatal_event.load() >= 0; }

  /// The errno a wait() fails with once the connection is over.
  [[nodiscard]] int over_errno() const noexcept {
    if (const int t = fatal_event.load(); t >= 0) return t == IBV_EVENT_DEVICE_FATAL ? ENODEV : EIO;
    return peer_gone ? ECONNRESET : device_removed ? ENODEV : ENOTCONN;
  }

  /// What ended the connection, in words.
  [[nodiscard]] std::string over_text() const {
    if (const int t = fatal_event.load(); t >= 0) {
      AsyncEvent e;
      e.type = static_cast<ibv_event_type>(t);
      return std::string(t == IBV_EVENT_DEVICE_FATAL ? "the RDMA device" : "the connection's QP") +
             " got the async event " + std::string(e.type_name()) + " (" + std::string(e.name()) + ")";
    }
    return peer_gone        ? "the peer disconnected"
           : device_removed ? "the RDMA device was removed (DEVICE_REMOVAL)"
                            : "the connection was closed on this side";
  }

  /// The connection is over: the peer left, the device went, a fatal async event came, or
  /// this side disconnected.
  [[nodiscard]] bool over() const noexcept { return peer_gone || device_removed || disconnected || failed(); }

  /// After the peer left (or the device went): disconnect our side too, which moves the QP to
  /// ERR and flushes what is still posted (rxe leaves the QP in RTS otherwise, and a receive
  /// would wait forever).
  void settle() noexcept {
    if ((peer_gone || device_removed || failed()) && !disconnected.exchange(true)) {
      to_error();  // once, whichever thread gets here first
      rdma_disconnect(id.get());
      wake_all();
    }
  }
};

Connection::Connection(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Connection::Connection(Connection&&) noexcept = default;
Connection& Connection::operator=(Connection&&) noexcept = default;
Connection::~Connection() = default;

Device& Connection::device() noexcept { return *impl_->device; }
const ProtectionDomain& Connection::pd() const noexcept { return *impl_->pd; }
CompletionQueue& Connection::send_cq() noexcept { return *impl_->send_cq; }
CompletionQueue& Connection::recv_cq() noexcept { return *impl_->recv_cq; }
QueuePair& Connection::qp() noexcept { return *impl_->qp; }
std::span<const std::byte> Connection::peer_private_data() const noexcept { return impl_->peer_private; }
const std::optional<RemoteSlice>& Connection::peer_remote() const noexcept { return impl_->peer_remote; }
RemoteSlice Connection::remote(SourceLocation where) const {
  if (!impl_->peer_remote) fail(EPROTO, Phase::established, "the peer exposed no buffer (ConnectionOptions::expose)", where);
  return *impl_->peer_remote;
}
RemoteSlice Connection::exchange(const RemoteSlice& mine, milliseconds timeout, SourceLocation where) {
  constexpr std::size_t n = RemoteSlice::wire_size;
  Impl& c = *impl_;
  const auto deadline = deadline_after(timeout);
  auto mr = MemoryRegion::allocate(pd(), 2 * n, Access::local_write, where);
  const RemoteSlice::Wire w = mine.encode();
  std::memcpy(mr.data(), w.data(), n);
  // Room in `retired` now: Retire's destructor runs while an exception unwinds, where a
  // push_back that threw bad_alloc would terminate.
  c.retired.reserve(c.retired.size() + 1);
  // While it runs, a wait() on its CQs through another connection keeps this exchange()'s
  // requests for it (HeldCompletions::poll). Counted before anything is posted.
  struct Running {
    HeldCompletions* recv;
    HeldCompletions* send;  // null when it is the same CQ
    std::uint32_t qpn;
    Running(HeldCompletions* r, HeldCompletions* s, std::uint32_t q) : recv(r), send(s == r ? nullptr : s), qpn(q) {
      enter(*recv);
      if (send != nullptr) {
        try {
          enter(*send);
        } catch (...) {
          leave(*recv);
          throw;
        }
      }
    }
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;
    ~Running() {
      leave(*recv);
      if (send != nullptr) leave(*send);
    }
    void enter(HeldCompletions& h) const {
      const std::lock_guard lock(h.mutex);
      h.exchanging_qps.push_back(qpn);
      h.state.fetch_add(HeldCompletions::exchange_unit);
    }
    void leave(HeldCompletions& h) const noexcept {
      const std::lock_guard lock(h.mutex);
      if (const auto it = std::find(h.exchanging_qps.begin(), h.exchanging_qps.end(), qpn); it != h.exchanging_qps.end())
        h.exchanging_qps.erase(it);
      h.state.fetch_sub(HeldCompletions::exchange_unit);
    }
  };
  const Running running(c.recv_held.store.get(), c.send_held.store.get(), c.qp_num);
  qp().post_recv(mr.slice(n, n), exchange_wr_id).check(where);
  // Until both requests have completed, the region must stay registered, whatever is thrown.
  struct Retire {
    Impl& c;
    MemoryRegion& mr;
    const bool& done;
    ~Retire() {
      if (!done) c.retired.push_back(std::move(mr));  // cannot throw: the capacity is there
    }
  };
  bool done = false;
  const Retire retire{c, mr, done};
  qp().post_send(mr.slice(0, n), {.wr_id = exchange_wr_id}).check(where);

  const std::uint32_t qpn = c.qp_num;
  CompletionQueue& rcq = *c.recv_cq;
  CompletionQueue& scq = *c.send_cq;
  const bool one_cq = c.send_held.store == c.recv_held.store;
  bool received = false, sent = false;
  int completed = 0;                      // of this QP's exchange requests, failed ones included
  std::optional<Completion> flushed;      // the first of them that was flushed
  std::optional<std::uint64_t> taken;     // a receive of the caller's that took the peer's message
  const auto takes_message = [&](const Completion& wc) {
    return wc.qp_num() == qpn && wc.ok() && wc.opcode() == WcOpcode::recv;
  };
  std::array<Completion, 16> got;
  std::vector<Completion> ours;
  ours.reserve(4);
  // What the other connections' exchange()s reserved for this QP, then what is in the CQ (all
  // of it, `arm`ing it first when asked): this QP's exchange requests go to `ours`, another's to
  // its reservation, the rest is held for wait(), waking the connections on the CQ. The CQ is
  // polled under the store's lock, so that what exchange()s hold keeps the CQ's order. Returns
  // how many completions it found.
  const auto collect = [&](CompletionQueue& cq, HeldCompletions& store, bool arm) -> std::size_t {
    std::size_t found = 0;
    std::error_code ec;
    {
      const std::lock_guard lock(store.mutex);
      for (auto it = store.reserved.begin(); it != store.reserved.end();) {
        if (it->qp_num() == qpn) {
          ours.push_back(*it);
          it = store.reserved.erase(it);
          ++found;
        } else {
          ++it;
        }
      }
      if (!taken)
        if (const auto it = std::find_if(store.held.begin(), store.held.end(), takes_message); it != store.held.end())
          taken = it->wr_id();
      bool kept = false;
      for (bool first = true;; first = false) {
        const auto wcs = first && arm ? cq.arm_and_poll(got, ec) : cq.poll(got, ec);
        if (ec) break;
        found += wcs.size();
        for (const Completion& wc : wcs) {
          if (wc.wr_id() == exchange_wr_id && wc.qp_num() == qpn) {
            ours.push_back(wc);
            continue;
          }
          kept = true;
          if (store.reserves(wc)) {
            store.reserved.push_back(wc);
          } else {
            store.held.push_back(wc);
            if (!taken && takes_message(wc)) taken = wc.wr_id();
          }
        }
        if (wcs.size() < got.size()) break;
      }
      if (kept) {
        store.update_held_bit();
        store.wake();
      }
    }
    if (ec) fail(ec.value(), Phase::established, "exchange: polling the CQ", where);
    return found;
  };
  const auto collect_all = [&](bool arm) {
    std::size_t found = collect(rcq, *c.recv_held.store, arm);
    if (!one_cq) found += collect(scq, *c.send_held.store, arm);
    return found;
  };
  // A failure other than a flush is the cause and is thrown at once. A flushed request (the QP
  // went to ERR) waits for the other one, whose failure may say why (e.g. the send's RNR retries
  // ran out because the peer never posted its receive): the flush is thrown only without one.
  const auto settle_ours = [&] {
    for (const Completion& wc : ours) {
      ++completed;
      if (wc.ok())
        (wc.opcode() == WcOpcode::recv ? received : sent) = true;
      else if (wc.status() != WcStatus::wr_flush_err)
        wc.throw_if_failed(where);  // the opcode of a failed completion is undefined
      else if (!flushed)
        flushed = wc;
    }
    ours.clear();
  };
  const auto timed_out = [&] {
    if (flushed) flushed->throw_if_failed(where);
    fail(ETIMEDOUT, Phase::established,
         "exchange: the peer did not answer within " + std::to_string(timeout.count()) + " ms", where);
  };
  // A CQ's event is for whoever sleeps on the CQ: another connection's exchange() asleep on a
  // shared CQ may have armed it for a completion of its own, which raises no event now that this
  // one is consumed (and this thread may leave before it comes). Wake every connection on the
  // CQ, so that they poll and arm it again.
  const auto consume = [&](CompletionQueue& cq, HeldCompletions& store) {
    std::error_code ec;
    const int events = cq.consume_events(ec);
    if (ec) fail(ec.value(), Phase::established, "exchange: ibv_get_cq_event", where);
    if (events > 0) {
      const std::lock_guard lock(store.mutex);
      store.wake();
    }
  };
  // Both CQs at once (they may be one): either request may fail first.
  // A CQ on a shared channel (CqOptions::channel) is busy-polled: its events are the channel's.
  const bool busy = !rcq.has_channel() || !scq.has_channel() || rcq.shares_channel() || scq.shares_channel();
  // What a sleeping exchange() polls besides the CQs and the cm channel, made before the loop
  // looks at over() or arms a CQ (Impl::over_fd, HeldLink::fd).
  int over_fd = -1, recv_held_fd = -1, send_held_fd = -1;
  if (!busy) {
    over_fd = Impl::wake_fd(c.over_fd);
    if (over_fd >= 0) recv_held_fd = Impl::wake_fd(c.recv_held);
    if (recv_held_fd >= 0 && !one_cq) send_held_fd = Impl::wake_fd(c.send_held);
    if (over_fd < 0 || recv_held_fd < 0 || (!one_cq && send_held_fd < 0))
      fail(errno, Phase::established, "exchange: eventfd", where);
  }
  unsigned spins = 0;
  for (bool first = true;; first = false) {
    const std::size_t found = collect_all(false);
    settle_ours();
    if (received && sent) break;
    if (flushed && completed >= 2) flushed->throw_if_failed(where);
    if (taken && !received)
      fail(EPROTO, Phase::established,
           "exchange: the peer's message went into a receive posted before exchange() (wr_id " +
               std::to_string(*taken) +
               "; its completion is kept for wait()): call exchange() before posting receives (not in "
               "before_handshake), or hand the buffer over with ConnectionOptions::expose", where);
    if (found != 0) {  // poll again before sleeping, unless time is up
      if (Clock::now() >= deadline) timed_out();
      continue;
    }
    if (busy && !first && (++spins & 1023u) != 0) {
      if (Clock::now() >= deadline) timed_out();
      continue;
    }
    std::error_code ec;
    if (c.pump(ec), ec) fail(ec.value(), Phase::established, "exchange: rdma_get_cm_event", where);
    if (busy && (c.pump_async(ec), ec)) fail(ec.value(), Phase::established, "exchange: ibv_get_async_event", where);
    if (c.over()) {
      // As wait(): what is in the CQs comes first (the loop takes it), then the error.
      if (collect_all(false) != 0) continue;
      c.settle();
      fail(c.over_errno(), Phase::established, "exchange: " + c.over_text(), where);
    }
    if (Clock::now() >= deadline) timed_out();
    if (busy) continue;
    if (collect_all(true) != 0) continue;
    // Asleep until a CQ has an event, the cm channel one, the connection is over, or another
    // connection's exchange() keeps something for one of the CQs.
    std::array<pollfd, 7> fds{};
    nfds_t k = 0;
    fds[k++] = {rcq.fd(), POLLIN, 0};
    if (!one_cq) fds[k++] = {scq.fd(), POLLIN, 0};
    const nfds_t held_at = k;
    fds[k++] = {recv_held_fd, POLLIN, 0};
    if (!one_cq) fds[k++] = {send_held_fd, POLLIN, 0};
    fds[k++] = {c.channel->fd, POLLIN, 0};
    fds[k++] = {over_fd, POLLIN, 0};
    const nfds_t async_at = k;
    fds[k++] = {c.hub->native_fd(), POLLIN, 0};
    if (::poll(fds.data(), k, std::max(1, ms_until(deadline))) < 0 && errno != EINTR)
      fail(errno, Phase::established, "exchange: poll", where);
    if (fds[async_at].revents != 0) {
      if (c.pump_async(ec), ec) fail(ec.value(), Phase::established, "exchange: ibv_get_async_event", where);
    }
    for (nfds_t i = held_at; i < held_at + (one_cq ? 1 : 2); ++i)
      if (fds[i].revents != 0) Impl::drain(fds[i].fd);
    if (fds[0].revents != 0) consume(rcq, *c.recv_held.store);
    if (!one_cq && fds[1].revents != 0) consume(scq, *c.send_held.store);
  }
  done = true;
  return RemoteSlice::decode(mr.bytes().subspan(n, n), where);
}

std::string Connection::peer_address() const { return address_text(rdma_get_peer_addr(impl_->id.get())); }
std::string Connection::local_address() const { return address_text(rdma_get_local_addr(impl_->id.get())); }
bool Connection::connected() const noexcept {
  return impl_->established && !impl_->over();
}
bool Connection::address_changed() const noexcept { return impl_->address_changed; }
int Connection::fd() const noexcept { return impl_->user_fd(); }
rdma_cm_id* Connection::native_handle() const noexcept { return impl_->id.get(); }

bool Connection::poll_events(SourceLocation where) {
  std::error_code ec;
  impl_->pump(ec);
  if (ec) fail(ec.value(), Phase::established, "rdma_get_cm_event", where);
  impl_->pump_async(ec);
  if (ec) fail(ec.value(), Phase::established, "ibv_get_async_event", where);
  impl_->settle();
  return !impl_->peer_gone && !impl_->device_removed && !impl_->failed();
}

bool Connection::wait_disconnected(milliseconds timeout, std::error_code& ec) noexcept {
  Impl& c = *impl_;
  const auto deadline = deadline_after(timeout);
  // Made before the flags are read (Impl::gone_fd).
  const int gone_fd = Impl::wake_fd(c.gone_fd);
  if (gone_fd < 0) {
    ec.assign(errno, std::generic_category());
    return false;
  }
  for (;;) {
    if (c.pump(ec), ec) return false;
    if (c.peer_gone || c.device_removed) {
      c.settle();
      return true;
    }
    const int left = ms_until(deadline);
    if (left <= 0) return false;
    pollfd fds[2] = {{c.channel->fd, POLLIN, 0}, {gone_fd, POLLIN, 0}};
    if (::poll(fds, 2, left) < 0 && errno != EINTR) {
      ec.assign(errno, std::generic_category());
      return false;
    }
  }
}

bool Connection::wait_disconnected(milliseconds timeout, SourceLocation where) {
  std::error_code ec;
  const bool over = wait_disconnected(timeout, ec);
  if (ec) fail(ec.value(), Phase::established, "waiting for the disconnect: rdma_get_cm_event", where);
  return over;
}

void Connection::disconnect(SourceLocation where) {
  if (!impl_->established || impl_->disconnected.exchange(true)) return;
  impl_->wake_all();  // threads in wait() now fail with ENOTCONN
  impl_->to_error();
  if (rdma_disconnect(impl_->id.get()) != 0) fail(errno, Phase::established, "rdma_disconnect", where);
}

std::span<Completion> Connection::wait(CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                       std::error_code& ec) noexcept {
  return wait_cq(cq, out, timeout, ec);
}

std::span<Completion> Connection::spin(CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                       std::error_code& ec) noexcept {
  return wait_cq(cq, out, timeout, ec, true);
}

std::span<Completion> Connection::wait_cq(CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                          std::error_code& ec, bool busy) noexcept {
  Impl& c = *impl_;
  ec.clear();
  // Polls `cq` (arming it first when `arm`). The fast path, nothing held and no exchange()
  // running on the CQ: one pointer compare here and one load per poll. Otherwise through the
  // store: what an exchange() held for the CQ first, as though still in it, and the requests of
  // a running exchange() kept for it.
  HeldLink& held = c.held_link(cq);
  const auto poll = [&](bool arm) -> std::span<Completion> {
    if (held.store->state.load(std::memory_order_acquire) != 0 && cq.shared_handle().get() == held.cq) [[unlikely]]
      return held.store->poll(cq, out, ec, arm);
    return arm ? cq.arm_and_poll(out, ec) : cq.poll(out, ec);
  };
  const auto deadline = deadline_after(timeout);
  // Completions in the CQ always come first. When the connection is over, the CQ is polled
  // once more (a completion can land between a poll and the event that ends the connection:
  // the peer saw our ACK, then left); only then does our side disconnect, flushing what is
  // still posted, and the wait fails.
  const auto closed = [&]() { return c.over(); };
  const auto finish = [&]() -> std::span<Completion> {
    if (auto got = poll(false); !got.empty() || ec) return got;
    c.settle();
    ec.assign(c.over_errno(), std::generic_category());
    return {};
  };
  unsigned spins = 0;  // per call: a count shared by threads would be a race on the data path
  // A CQ on a shared channel (CqOptions::channel) is busy-polled: its events are the channel's.
  const bool spinning = busy || !cq.has_channel() || cq.shares_channel();
  // held_fd: an exchange() kept something for this CQ (it polled the CQ, and may have taken the
  // completion that would have raised the event), or took the CQ's event (see below).
  const bool of_connection = cq.shared_handle().get() == held.cq;
  int over_fd = -1, held_fd = -1;  // poll(2) skips -1
  for (bool first = true;; first = false) {
    if (auto got = poll(false); !got.empty() || ec) return got;
    if (spinning) {
      // Busy polling: look at the cm channel now and then (a system call each time; not on every
      // empty poll, which would cost a busy-polling ping-pong a system call per round trip).
      if ((++spins & 1023u) == 0 || (first && closed())) {
        if (c.pump(ec), ec) return {};
        if (c.pump_async(ec), ec) return {};
        if (closed()) return finish();
      }
      if (Clock::now() >= deadline) return {};
      continue;
    }
    if (over_fd < 0) {
      // About to sleep for the first time: the wake fds, before over() is read and the CQ armed.
      over_fd = Impl::wake_fd(c.over_fd);
      if (over_fd >= 0 && of_connection) held_fd = Impl::wake_fd(held);
      if (over_fd < 0 || (of_connection && held_fd < 0)) {
        ec.assign(errno, std::generic_category());
        return {};
      }
    }
    if (c.pump(ec), ec) return {};
    if (closed()) return finish();
    if (Clock::now() >= deadline) return {};
    if (auto got = poll(true); !got.empty() || ec) return got;
    // The device's async fd: an event of this QP (or DEVICE_FATAL) ends the connection; any
    // other is kept for Device::poll_async_events by the reader (detail::AsyncHub).
    pollfd fds[5] = {{cq.fd(), POLLIN, 0}, {c.channel->fd, POLLIN, 0}, {over_fd, POLLIN, 0}, {held_fd, POLLIN, 0},
                     {c.hub->native_fd(), POLLIN, 0}};
    if (::poll(fds, 5, std::max(1, ms_until(deadline))) < 0 && errno != EINTR) {
      ec.assign(errno, std::generic_category());
      return {};
    }
    if (fds[4].revents != 0) {
      if (c.pump_async(ec), ec) return {};
    }
    if (fds[3].revents != 0) Impl::drain(held_fd);  // before the store is looked at again
    if (fds[0].revents != 0) {
      const int events = cq.consume_events(ec);
      if (ec) return {};
      // An exchange() asleep on this CQ may have armed it for its own completion, which raises
      // no event now that this one is taken: wake it to arm the CQ again.
      if (events > 0 && of_connection && held.store->exchanging()) {
        const std::lock_guard lock(held.store->mutex);
        held.store->wake();
      }
    }
    // A readable cm channel is read at the top of the loop, after the CQ.
  }
}

std::span<Completion> Connection::wait(CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                       SourceLocation where) {
  return wait_or_throw(cq, out, timeout, false, where);
}

std::span<Completion> Connection::spin(CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                       SourceLocation where) {
  return wait_or_throw(cq, out, timeout, true, where);
}

std::span<Completion> Connection::wait_or_throw(CompletionQueue& cq, std::span<Completion> out, milliseconds timeout,
                                                bool busy, SourceLocation where) {
  std::error_code ec;
  auto got = busy ? spin(cq, out, timeout, ec) : wait(cq, out, timeout, ec);
  if (ec) {
    const bool ended = impl_->over() && ec.value() == impl_->over_errno();
    fail(ec.value(), Phase::established, ended ? impl_->over_text() : "waiting for completions", where);
  }
  return got;
}

// ---------------------------------------------------------------------------------------------

// A connect, as a state machine driven by the events of its channel: one step per event, and
// never a wait (connect() waits between steps; an event loop calls step() itself).
struct PendingConnect::Impl {
  std::unique_ptr<Connection::Impl> c;
  ClientOptions o;                   // the caller's, with private_data pointing at `user_data`
  std::vector<std::byte> user_data;  // a copy of the caller's private data
  std::vector<std::byte> data;       // framed (expose, then user_data)
  std::vector<std::byte> tagged;     // framed with a path MTU tag, when one is needed
  rdma_conn_param param{};
  std::string target;
  Phase phase = Phase::resolve_address;
  Clock::time_point deadline, step_deadline;
  int resolve_ms = 0;
  SourceLocation where;
  std::exception_ptr failed;

  [[nodiscard]] Clock::time_point resolve_deadline() const { return std::min(deadline, deadline_after(o.resolve_timeout)); }

  void start(std::string_view host, std::uint16_t port) {
    deadline = deadline_after(o.timeout);
    data = frame(o.connection, max_connect_private_data, Phase::connect, where);
    check_options(o.connection, Phase::connect, where);
    c = std::make_unique<Connection::Impl>();
    if (o.connection.channel != nullptr) {
      c->shared = ChannelAccess::hub(*o.connection.channel);
      if (!c->shared) fail(EINVAL, Phase::resolve_address, "ConnectionOptions::channel is empty (moved from)", where);
      c->channel = channel_of(c->shared);
    } else {
      c->channel = make_channel(Phase::resolve_address, where);
    }
    c->id = make_id(c->channel, Phase::resolve_address, where);
    if (c->shared) c->join(o.connection.channel_key);
    o.connection.channel = nullptr;  // read here only: the caller's may go
    sockaddr_storage dst = to_sockaddr(host, port, Phase::resolve_address, where);
    sockaddr_storage src{};
    if (!o.source_address.empty()) src = to_sockaddr(o.source_address, 0, Phase::resolve_address, where);
    target = std::string(host) + ":" + std::to_string(port);
    resolve_ms = std::max(1, std::min(ms_until(deadline), clamp_ms(o.resolve_timeout)));
    step_deadline = resolve_deadline();
    if (const int err = c->command([&] {
          return rdma_resolve_addr(c->id.get(), o.source_address.empty() ? nullptr : reinterpret_cast<sockaddr*>(&src),  // NOLINT
                                   reinterpret_cast<sockaddr*>(&dst), resolve_ms);                                       // NOLINT
        })) {
      fail(err, Phase::resolve_address,
           target + (err == ENODEV ? ": no RDMA device can reach this address" : ": rdma_resolve_addr failed"), where);
    }
  }

  /// What the phase's limit is, for the "no answer" error.
  [[nodiscard]] milliseconds budget() const { return phase == Phase::connect ? o.timeout : o.resolve_timeout; }

  [[noreturn]] void timed_out() {
    if (phase == Phase::resolve_address) {
      try {
        fail_no_answer(phase, budget(), where);
      } catch (const ConnectError& e) {
        fail(e.code().value(), phase, target + ": " + e.context().substr(e.context().find(": ") + 2), where);
      }
    }
    fail_no_answer(phase, budget(), where);
  }

  /// One event of the phase in progress; the Connection once established.
  std::optional<Connection> on_event(Event e) {
    switch (phase) {
      case Phase::resolve_address: {
        try {
          (void)check_event(std::move(e), RDMA_CM_EVENT_ADDR_RESOLVED, Phase::resolve_address, where);
        } catch (const ConnectError& x) {
          fail(x.code().value(), Phase::resolve_address, target + ": " + x.context().substr(x.context().find(": ") + 2),
               where);
        }
        if (const auto tc = o.connection.transport.traffic_class) {
          std::uint8_t tos = *tc;
          if (rdma_set_option(c->id.get(), RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos) != 0)
            fail(errno, Phase::resolve_route, target + ": rdma_set_option(TOS)", where);
        }
        if (const int err = c->command([&] { return rdma_resolve_route(c->id.get(), resolve_ms); }))
          fail(err, Phase::resolve_route, target + ": rdma_resolve_route", where);
        phase = Phase::resolve_route;
        step_deadline = resolve_deadline();
        return std::nullopt;
      }
      case Phase::resolve_route: {
        (void)check_event(std::move(e), RDMA_CM_EVENT_ROUTE_RESOLVED, Phase::resolve_route, where);
        c->build(o.connection, Phase::connect, where);
        if (o.connection.before_handshake)
          o.connection.before_handshake({.qp = *c->qp, .pd = *c->pd, .peer_private_data = {}});
        // The request carries the route's MTU, this side's active one; taking less, say so.
        if (c->id->route.num_paths > 0 && c->id->route.path_rec != nullptr) {
          const auto route = static_cast<ibv_mtu>(c->id->route.path_rec[0].mtu);
          if (const ibv_mtu mine = c->mtu_limit(route); mine < route)
            tagged = frame_with_mtu(o.connection, max_connect_private_data, static_cast<Mtu>(mine),
                                    static_cast<Mtu>(route), Phase::connect, where);
        }
        param = conn_param(o.connection, tagged.empty() ? data : tagged, *c->device, *c->qp);
        phase = Phase::connect;
        step_deadline = deadline;
        if (const int err = c->command([&] { return rdma_connect(c->id.get(), &param); }))
          fail(err, Phase::connect, target + ": rdma_connect", where);
        return std::nullopt;
      }
      default: {
        // With no QP on the id, librdmacm hands the reply over as it is: the QP reaches RTS with
        // this side's attributes only, and then rdma_establish(3) sends the RTU.
        Event r = check_event(std::move(e), RDMA_CM_EVENT_CONNECT_RESPONSE, Phase::connect, where);
        c->take_private_data(std::move(r.private_data));  // before RTR: it may carry the server's MTU
        c->to_rts(param, Phase::connect, where);
        if (rdma_establish(c->id.get()) != 0) fail(errno, Phase::connect, target + ": rdma_establish", where);
        c->on_established();
        return Connection(std::move(c));
      }
    }
  }

  std::optional<Connection> step() {
    if (failed) std::rethrow_exception(failed);
    if (!c) fail(ENOTCONN, phase, "PendingConnect::step: the connect is over (its Connection was returned)", where);
    try {
      for (;;) {
        std::error_code ec;
        std::optional<Event> e = c->next(ec);  // never waits
        if (ec) fail(ec.value(), phase, "rdma_get_cm_event", where);
        if (!e) {
          if (Clock::now() >= step_deadline) timed_out();
          return std::nullopt;
        }
        if (auto done = on_event(std::move(*e))) return done;
      }
    } catch (...) {
      failed = std::current_exception();
      c.reset();
      throw;
    }
  }
};

EventChannel::EventChannel(SourceLocation where) {
  rdma_event_channel* ch = new_channel(Phase::connect, where);
  std::unique_ptr<ChannelHub> hub;
  try {
    hub = std::make_unique<ChannelHub>(ch, where);  // on failure it destroyed the channel
  } catch (const std::bad_alloc&) {
    rdma_destroy_event_channel(ch);
    throw;
  }
  hub_ = std::move(hub);
}
EventChannel::EventChannel(EventChannel&&) noexcept = default;
EventChannel& EventChannel::operator=(EventChannel&&) noexcept = default;
EventChannel::~EventChannel() = default;
int EventChannel::fd() const noexcept { return hub_ ? hub_->epoll_fd : -1; }
rdma_event_channel* EventChannel::native_handle() const noexcept { return hub_ ? hub_->ch : nullptr; }

std::span<const std::uint64_t> EventChannel::dispatch(std::error_code& ec) noexcept {
  if (!hub_) {
    ec = make_error_code(Errc::empty_object);
    return {};
  }
  return hub_->dispatch(ec);
}

std::span<const std::uint64_t> EventChannel::dispatch(SourceLocation where) {
  if (!hub_)
    detail::throw_error(make_error_code(Errc::empty_object), "EventChannel::dispatch: the EventChannel is empty (moved from)",
                        where);
  std::error_code ec;
  const auto keys = hub_->dispatch(ec);
  if (ec) fail(ec.value(), Phase::established, "EventChannel::dispatch: rdma_get_cm_event", where);
  return keys;
}

PendingConnect::PendingConnect(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
PendingConnect::PendingConnect(PendingConnect&&) noexcept = default;
PendingConnect& PendingConnect::operator=(PendingConnect&&) noexcept = default;
PendingConnect::~PendingConnect() = default;

std::optional<Connection> PendingConnect::step() {
  if (!impl_)
    detail::throw_error(make_error_code(Errc::empty_object), "PendingConnect::step: the PendingConnect is empty (moved from)",
                        SourceLocation::current());
  return impl_->step();
}

std::optional<Connection> PendingConnect::step(std::error_code& ec) noexcept { return step_or_code([this] { return step(); }, ec); }

int PendingConnect::fd() const noexcept { return impl_ && impl_->c ? impl_->c->user_fd() : -1; }
std::chrono::steady_clock::time_point PendingConnect::deadline() const noexcept { return !impl_ ? Clock::time_point{} : impl_->step_deadline; }
Phase PendingConnect::phase() const noexcept { return impl_ ? impl_->phase : Phase::connect; }

PendingConnect start_connect(std::string_view host, std::uint16_t port, const ClientOptions& o, SourceLocation where) {
  auto p = std::make_unique<PendingConnect::Impl>();
  p->o = o;
  p->user_data.assign(o.connection.private_data.begin(), o.connection.private_data.end());
  p->o.connection.private_data = p->user_data;
  p->where = where;
  p->start(host, port);
  return PendingConnect(std::move(p));
}

Connection connect(std::string_view host, std::uint16_t port, const ClientOptions& o, SourceLocation where) {
  PendingConnect pending = start_connect(host, port, o, where);
  for (;;) {
    if (auto c = pending.step()) return std::move(*c);
    pending.impl_->c->wait_handshake(pending.deadline(), pending.phase(), where);
  }
}

std::optional<Connection> connect(std::string_view host, std::uint16_t port, const ClientOptions& options,
                                  std::error_code& ec) {
  try {
    ec.clear();
    return connect(host, port, options);
  } catch (const Error& e) {
    ec = e.code();
    return std::nullopt;
  }
}

Device device_for(std::string_view local_address, SourceLocation where) {
  auto ch = make_channel(Phase::listen, where);
  auto id = make_id(ch, Phase::listen, where);
  sockaddr_storage a = to_sockaddr(local_address, 0, Phase::listen, where);
  if (rdma_bind_addr(id.get(), reinterpret_cast<sockaddr*>(&a)) != 0)  // NOLINT
    fail(errno, Phase::listen, "rdma_bind_addr(" + std::string(local_address) + ")", where);
  if (id->verbs == nullptr) fail(ENODEV, Phase::listen, "no RDMA device has the address " + std::string(local_address), where);
  return device_of(id);
}

Device device_to(std::string_view host, milliseconds timeout, SourceLocation where) {
  auto ch = make_channel(Phase::resolve_address, where);
  auto id = make_id(ch, Phase::resolve_address, where);
  sockaddr_storage dst = to_sockaddr(host, 0, Phase::resolve_address, where);
  const int ms = clamp_ms(timeout);
  if (rdma_resolve_addr(id.get(), nullptr, reinterpret_cast<sockaddr*>(&dst), ms) != 0)  // NOLINT
    fail(errno, Phase::resolve_address, std::string(host) + ": rdma_resolve_addr", where);
  (void)expect_event(ch.get(), RDMA_CM_EVENT_ADDR_RESOLVED, deadline_after(timeout), Phase::resolve_address, timeout, where);
  if (id->verbs == nullptr) fail(ENODEV, Phase::resolve_address, "no RDMA device reaches " + std::string(host), where);
  return device_of(id);
}

// ---------------------------------------------------------------------------------------------
struct Listener::Impl {
  // Its own channel, or an EventChannel's (then `shared` is that channel's hub, and `channel`
  // keeps the hub alive).
  std::shared_ptr<rdma_event_channel> channel;
  std::shared_ptr<ChannelHub> shared;
  std::shared_ptr<rdma_cm_id> id;
  std::string address;
  std::uint16_t port = 0;
  milliseconds handshake_timeout{};
  // On an EventChannel, under its mutex: the events its readers handed over (connection
  // requests, a DEVICE_REMOVAL) wait here for start_accept().
  bool channel_routed = false;
  HandedOver inbox;
  std::size_t backlog = 0;  // ListenOptions::backlog: the requests `inbox` keeps at most

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (channel_routed) {
      // Requests handed over and not taken: refused, so that their clients hear at once (the
      // kernel does the same with those still in the channel when the id goes).
      std::vector<Event> left;
      {
        const std::lock_guard lock(shared->mutex);
        shared->remove_locked(id.get());
        left.swap(inbox.events);
        for (const Event& e : left)
          if (e.type == RDMA_CM_EVENT_CONNECT_REQUEST) shared->remove_locked(e.id);
      }
      for (const Event& e : left)
        if (e.type == RDMA_CM_EVENT_CONNECT_REQUEST) ChannelHub::refuse(e.id);
    }
  }

  /// The listener's route on an EventChannel (ChannelHub::Deliver).
  static bool deliver(void* self, Event&& e) noexcept {
    auto& l = *static_cast<Impl*>(self);
    // The kernel's backlog ends where the channel is read: this one holds what it would have.
    const auto is_request = [](const Event& x) { return x.type == RDMA_CM_EVENT_CONNECT_REQUEST; };
    if (is_request(e) &&
        static_cast<std::size_t>(std::count_if(l.inbox.events.begin(), l.inbox.events.end(), is_request)) >= l.backlog)
      return false;  // refused by the hub, as a full backlog would
    if (l.inbox.keep(std::move(e))) return true;
    l.inbox.lost = false;  // a request is refused by the hub; anything else concerns no listener
    return false;
  }

  /// The next event for the listener, without blocking: from its own channel, or what the
  /// EventChannel's readers handed over. Empty with `ec` clear when there is none.
  std::optional<Event> next(std::error_code& ec) {
    return shared ? inbox.next(*shared, ec) : next_event(channel.get(), Clock::time_point{}, ec);
  }

  /// Sleeps until a request may have come, or `deadline`.
  void wait(Clock::time_point deadline, SourceLocation where) {
    if (shared)
      inbox.sleep(*shared, deadline, Phase::accept, where);
    else
      wait_readable(channel->fd, deadline, Phase::accept, where);
  }
};

Listener::Listener(std::string_view address, std::uint16_t port, const ListenOptions& options, SourceLocation where)
    : impl_(std::make_unique<Impl>()) {
  if (options.channel != nullptr) {
    impl_->shared = ChannelAccess::hub(*options.channel);
    if (!impl_->shared) fail(EINVAL, Phase::listen, "ListenOptions::channel is empty (moved from)", where);
    impl_->channel = channel_of(impl_->shared);
  } else {
    impl_->channel = make_channel(Phase::listen, where);
  }
  impl_->id = make_id(impl_->channel, Phase::listen, where);
  impl_->backlog = static_cast<std::size_t>(std::max(1, options.backlog));
  if (impl_->shared) {
    // Routed before it listens: no request can come unrouted.
    impl_->shared->add(impl_->id.get(), {impl_.get(), &Impl::deliver, options.channel_key});
    impl_->channel_routed = true;
  }
  impl_->address = address;
  impl_->handshake_timeout = options.handshake_timeout;
  sockaddr_storage a = to_sockaddr(address, port, Phase::listen, where);
  const std::string bound = std::string(address) + ":" + std::to_string(port);
  set_bind_options(impl_->id.get(), false, options.ipv6_only, Phase::listen, where);
  if (rdma_bind_addr(impl_->id.get(), reinterpret_cast<sockaddr*>(&a)) != 0)  // NOLINT
    fail(errno, Phase::listen, "rdma_bind_addr(" + bound + ")", where);
  const bool wildcard = address.empty() || address == "0.0.0.0" || address == "::";
  if (!wildcard && impl_->id->verbs == nullptr)
    fail(ENODEV, Phase::listen, "no RDMA device has the address " + std::string(address), where);
  if (rdma_listen(impl_->id.get(), options.backlog) != 0) fail(errno, Phase::listen, "rdma_listen(" + bound + ")", where);
  impl_->port = ntohs(rdma_get_src_port(impl_->id.get()));
}

Listener::Listener(Listener&&) noexcept = default;
Listener& Listener::operator=(Listener&&) noexcept = default;
Listener::~Listener() = default;

std::uint16_t Listener::port() const noexcept { return impl_->port; }
int Listener::fd() const noexcept { return impl_->shared ? impl_->shared->epoll_fd : impl_->channel->fd; }
rdma_cm_id* Listener::native_handle() const noexcept { return impl_->id.get(); }

Device Listener::device(SourceLocation where) const {
  if (impl_->id->verbs == nullptr)
    fail(ENODEV, Phase::listen, "a listener on a wildcard address has no single device: use cm::device_for(address)", where);
  return device_for(impl_->address, where);
}

// The handshake of an accepted request, from the answer (rdma_accept) to ESTABLISHED.
struct PendingAccept::Impl {
  std::unique_ptr<Connection::Impl> c;
  Clock::time_point deadline;
  milliseconds budget{};
  SourceLocation where;
  std::exception_ptr failed;

  std::optional<Connection> step() {
    if (failed) std::rethrow_exception(failed);
    if (!c) fail(ENOTCONN, Phase::accept, "PendingAccept::step: the accept is over (its Connection was returned)", where);
    try {
      std::error_code ec;
      std::optional<Event> e = c->next(ec);  // never waits
      if (ec) fail(ec.value(), Phase::accept, "rdma_get_cm_event", where);
      if (!e) {
        if (Clock::now() >= deadline) fail_no_answer(Phase::accept, budget, where);
        return std::nullopt;
      }
      // DISCONNECTED instead of ESTABLISHED: the client connected and already left, and its RTU
      // was lost (connection management messages are datagrams; a busy rxe drops some), so its
      // DREQ came first. It was connected (only a connected side sends a DREQ): hand out the
      // connection, closed by the peer, as when the DREQ comes after ESTABLISHED.
      const Event got = check_event(std::move(*e), RDMA_CM_EVENT_ESTABLISHED, Phase::accept, where,
                                    RDMA_CM_EVENT_DISCONNECTED);
      c->on_established();
      if (got.type == RDMA_CM_EVENT_DISCONNECTED) c->peer_gone = true;
      return Connection(std::move(c));
    } catch (...) {
      failed = std::current_exception();
      c.reset();
      throw;
    }
  }
};

PendingAccept::PendingAccept(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
PendingAccept::PendingAccept(PendingAccept&&) noexcept = default;
PendingAccept& PendingAccept::operator=(PendingAccept&&) noexcept = default;
PendingAccept::~PendingAccept() = default;

std::optional<Connection> PendingAccept::step() {
  if (!impl_)
    detail::throw_error(make_error_code(Errc::empty_object), "PendingAccept::step: the PendingAccept is empty (moved from)",
                        SourceLocation::current());
  return impl_->step();
}

std::optional<Connection> PendingAccept::step(std::error_code& ec) noexcept { return step_or_code([this] { return step(); }, ec); }

int PendingAccept::fd() const noexcept { return impl_ && impl_->c ? impl_->c->user_fd() : -1; }
std::chrono::steady_clock::time_point PendingAccept::deadline() const noexcept { return !impl_ ? Clock::time_point{} : impl_->deadline; }

/// A listener on an EventChannel accepts onto that channel only (its requests' ids are on it).
void check_channel(const ConnectionOptions& o, const std::shared_ptr<ChannelHub>& listener, SourceLocation where) {
  if (listener && o.channel != nullptr && ChannelAccess::hub(*o.channel) != listener)
    fail(EINVAL, Phase::accept,
         "ConnectionOptions::channel names another EventChannel than the listener's (ListenOptions::channel): a "
         "listener on an EventChannel accepts onto it; leave it empty or name the same one; nothing was taken",
         where);
}

std::optional<PendingAccept> Listener::start_accept(const ConnectionOptions& o, SourceLocation where) {
  const std::vector<std::byte> data = frame(o, max_accept_private_data, Phase::accept, where);
  check_options(o, Phase::accept, where);
  check_channel(o, impl_->shared, where);
  for (;;) {
    std::error_code ec;
    std::optional<Event> req = impl_->next(ec);  // never waits
    if (ec) fail(ec.value(), Phase::accept, "rdma_get_cm_event", where);
    if (!req) return std::nullopt;
    if (req->type == RDMA_CM_EVENT_DEVICE_REMOVAL)
      fail(ENODEV, Phase::accept, "the listener's RDMA device was removed (DEVICE_REMOVAL): listen again", where);
    if (req->type != RDMA_CM_EVENT_CONNECT_REQUEST) continue;  // nothing else concerns a listener

    // A request is taken: from here the client is answered, and waiting for it to confirm gets
    // its own budget. Ending on accept()'s deadline would destroy a connection the client
    // already has (accept(0ms) from an event loop would always do so).
    std::unique_ptr<PendingAccept::Impl> pending;
    std::unique_ptr<Connection::Impl> c;
    // Its own channel makes the connection independent of the listener and of the others. Until
    // the request's id is the connection's, a failure (no descriptor left for the channel, say,
    // or no memory) rejects the request, so that the client hears at once, and destroys its id.
    try {
      pending = std::make_unique<PendingAccept::Impl>();
      pending->budget = impl_->handshake_timeout;
      pending->deadline = deadline_after(pending->budget);
      pending->where = where;
      c = std::make_unique<Connection::Impl>();
      if (impl_->shared) {
        c->shared = impl_->shared;  // the request's id is on the listener's EventChannel already
        c->channel = channel_of(c->shared);
      } else if (o.channel != nullptr) {
        c->shared = ChannelAccess::hub(*o.channel);
        if (!c->shared) fail(EINVAL, Phase::accept, "ConnectionOptions::channel is empty (moved from)", where);
        c->channel = channel_of(c->shared);
      } else {
        c->channel = make_channel(Phase::accept, where);
      }
    } catch (...) {
      if (impl_->shared) impl_->shared->remove(req->id);  // its events were kept for an accept
      rdma_reject(req->id, nullptr, 0);
      rdma_destroy_id(req->id);
      throw;
    }
    // (Should the shared_ptr's control block fail to allocate, its deleter destroys the id.)
    if (impl_->shared) {
      // Out of the hub before it goes (its park route until join(), then the connection's): no
      // route may outlive its id, whose address a new one could take.
      c->id = std::shared_ptr<rdma_cm_id>(req->id, [hub = impl_->shared](rdma_cm_id* i) {
        hub->remove(i);
        rdma_destroy_id(i);
      });
    } else {
      c->id = own_id(req->id, c->channel);
    }
    if (c->shared) {
      try {
        // Before the id moves there: its events are routed. On the listener's channel, what
        // came for the id since its request is handed over now.
        c->join(o.channel_key);
      } catch (...) {
        rdma_reject(req->id, nullptr, 0);  // (its id leaves the hub as it goes)
        throw;
      }
    }
    // On the listener's EventChannel the id is where it belongs already.
    if (!impl_->shared && rdma_migrate_id(req->id, c->channel.get()) != 0) {
      const int err = errno;
      rdma_reject(req->id, nullptr, 0);
      fail(err, Phase::accept, "rdma_migrate_id", where);
    }
    try {
      c->build(o, Phase::accept, where);
      c->take_private_data(std::move(req->private_data));
      if (o.before_handshake) o.before_handshake({.qp = *c->qp, .pd = *c->pd, .peer_private_data = c->peer_private});
    } catch (const Reject& r) {
      const auto d = r.private_data();
      rdma_reject(c->id.get(), d.empty() ? nullptr : d.data(), static_cast<std::uint8_t>(d.size()));
      throw;
    } catch (...) {
      rdma_reject(c->id.get(), nullptr, 0);
      throw;
    }
    rdma_conn_param p = conn_param(o, data, *c->device, *c->qp, &*req);
    // In RTS before the reply goes: the client may send (or write) as soon as it has it, before
    // ESTABLISHED reaches us.
    std::vector<std::byte> tagged;
    try {
      c->to_rts(p, Phase::accept, where);
      // The client uses the request's MTU (its own) unless told: taking less, say so.
      if (c->rtr_mtu < c->peer_assumes) {
        tagged = frame_with_mtu(o, max_accept_private_data, static_cast<Mtu>(c->rtr_mtu),
                                static_cast<Mtu>(c->peer_assumes), Phase::accept, where);
        p.private_data = tagged.data();
        p.private_data_len = static_cast<std::uint8_t>(tagged.size());
      }
    } catch (...) {
      rdma_reject(c->id.get(), nullptr, 0);
      throw;
    }
    if (const int err = c->command([&] { return rdma_accept(c->id.get(), &p); })) {
      rdma_reject(c->id.get(), nullptr, 0);
      fail(err, Phase::accept, "rdma_accept", where);
    }
    pending->c = std::move(c);
    return PendingAccept(std::move(pending));
  }
}

Connection Listener::accept(milliseconds timeout, const ConnectionOptions& o, SourceLocation where) {
  const auto deadline = deadline_after(timeout);
  // Checked before waiting: nothing is sent for options that cannot be.
  (void)frame(o, max_accept_private_data, Phase::accept, where);
  check_options(o, Phase::accept, where);
  check_channel(o, impl_->shared, where);
  for (;;) {
    if (std::optional<PendingAccept> pending = start_accept(o, where)) {
      for (;;) {
        if (auto c = pending->step()) return std::move(*c);
        pending->impl_->c->wait_handshake(pending->deadline(), Phase::accept, where);
      }
    }
    if (Clock::now() >= deadline)
      fail(ETIMEDOUT, Phase::accept, "no connection request within " + std::to_string(timeout.count()) + " ms", where);
    impl_->wait(deadline, where);
  }
}

std::optional<Connection> Listener::accept(milliseconds timeout, const ConnectionOptions& options,
                                           std::error_code& ec) {
  try {
    ec.clear();
    return accept(timeout, options);
  } catch (const Error& e) {
    ec = e.code();
    return std::nullopt;
  }
}

}  // namespace verbs::cm
