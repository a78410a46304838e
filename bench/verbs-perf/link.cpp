// verbs-perf: connecting the two sides, as perftest does: a TCP exchange of each QP's Endpoint
// and the peer's region (RemoteSlice), or rdma_cm (-R) with the parameters in the connect
// request's private data and the regions swapped by Connection::exchange. Also the control
// channel used between runs.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "clock.hpp"
#include "handshake.hpp"
#include "perf.hpp"

namespace perf {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

/// A file descriptor that closes itself.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_ = -1;
};

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

void write_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw Failure("the peer closed the TCP connection (" + errno_text(errno) + ")");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

/// Reads exactly n bytes, waiting up to the deadline.
void read_all(int fd, void* data, std::size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int rc = ::poll(&pfd, 1, ms_left(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) throw Failure("poll: " + errno_text(errno));
    if (rc == 0) throw Failure("the peer did not answer in time");
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) throw Failure("the peer closed the connection");
    if (k < 0) throw Failure("recv: " + errno_text(errno));
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

/// Frames: a 4-byte little-endian length, then the bytes.
void send_frame(int fd, std::span<const std::byte> body) {
  std::vector<std::byte> f(4 + body.size());
  for (int i = 0; i < 4; ++i) f[static_cast<std::size_t>(i)] = static_cast<std::byte>(body.size() >> (8 * i));
  std::copy(body.begin(), body.end(), f.begin() + 4);
  write_all(fd, f.data(), f.size());
}

std::vector<std::byte> recv_frame(int fd, Clock::time_point deadline) {
  unsigned char len[4];
  read_all(fd, len, 4, deadline);
  const std::uint32_t n = frame_length(len);
  std::vector<std::byte> body(n);
  read_all(fd, body.data(), n, deadline);
  return body;
}

class TcpControl final : public Control {
 public:
  explicit TcpControl(Fd fd) : fd_(std::move(fd)) {}
  void send(std::string_view msg) override { send_frame(fd_.get(), std::as_bytes(std::span(msg))); }
  std::string receive(milliseconds timeout) override {
    const std::vector<std::byte> b = recv_frame(fd_.get(), Clock::now() + timeout);
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }
  std::optional<std::string> try_receive() override {
    pollfd pfd{fd_.get(), POLLIN, 0};
    if (::poll(&pfd, 1, 0) <= 0) return std::nullopt;
    return receive(std::chrono::seconds(10));  // the rest of a frame follows its first byte
  }
  void finish() override {}

 private:
  Fd fd_;
};

/// Control messages over rdma_cm, by RDMA writes into the peer's control area, which it polls.
/// Area layout (both sides alike): [0, 64) inbox: payload, its length at 48, sequence number at
/// 56 (written by a second write, which RC places after the payload); [64, 72) how many of our
/// messages the peer has taken (the peer writes it); [128, 256) staging for what we write. A
/// message is sent only once the previous one was taken, so none overwrites another. Used only
/// between runs (and by send_bw's receiver with -D), when no other request is outstanding.
class CmControl final : public Control {
 public:
  static constexpr std::size_t kPayload = 48;
  static constexpr std::uint64_t kWrId = 0xC0'17'20'1Full;

  explicit CmControl(Session& s) : s_(s) {}

  void send(std::string_view msg) override {
    if (msg.size() > kPayload) throw std::logic_error("control message too long");
    // The peer must have taken the previous message.
    const auto deadline = Clock::now() + s_.cfg.timeout;
    for (std::uint32_t spins = 0; word(kAcked) < sent_; ++spins) idle(spins, deadline);
    std::byte* out = area() + kStaging;
    std::memset(out, 0, 64);
    std::memcpy(out, msg.data(), msg.size());
    out[kPayload] = static_cast<std::byte>(msg.size());
    const std::uint64_t seq = ++sent_;
    std::memcpy(out + 56, &seq, 8);
    const verbs::RemoteSlice inbox = peer_area().slice(kInbox, 64);
    std::array<verbs::SendWr, 2> wrs{
        verbs::SendWr::write(local(kStaging, 56), inbox.slice(0, 56), {.wr_id = kWrId, .signaled = false}),
        verbs::SendWr::write(local(kStaging + 56, 8), inbox.slice(56, 8), {.wr_id = kWrId, .signaled = true}),
    };
    s_.qps[0]->post(wrs).check();
    await_completion(msg);
  }

  std::string receive(milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (std::uint32_t spins = 0;; ++spins) {
      if (auto m = try_receive()) return *m;
      idle(spins, deadline);
    }
  }

  void finish() override {
    // Our last message must be taken (and acknowledged into our region) before we go.
    const auto deadline = Clock::now() + s_.cfg.timeout;
    try {
      for (std::uint32_t spins = 0; word(kAcked) < sent_; ++spins) idle(spins, deadline);
    } catch (const Failure&) {
      // the peer is gone already: nothing left to wait for
    }
  }

  std::optional<std::string> try_receive() override {
    if (word(kInbox + 56) != received_ + 1) return std::nullopt;
    std::atomic_thread_fence(std::memory_order_acquire);
    const std::byte* in = area() + kInbox;
    const auto len = std::min<std::size_t>(std::to_integer<std::size_t>(in[kPayload]), kPayload);
    std::string m(reinterpret_cast<const char*>(in), len);
    // Tell the peer it may send the next one.
    const std::uint64_t taken = ++received_;
    std::memcpy(area() + kStaging + 64, &taken, 8);
    s_.qps[0]->post_write(local(kStaging + 64, 8), peer_area().slice(kAcked, 8), {.wr_id = kWrId}).check();
    await_completion("acknowledgement of " + m);
    return m;
  }

 private:
  static constexpr std::uint64_t kInbox = 0, kAcked = 64, kStaging = 128;

  std::byte* area() const { return s_.mr->data() + s_.control_offset(); }
  verbs::LocalSlice local(std::uint64_t at, std::uint64_t len) const { return s_.mr->slice(s_.control_offset() + at, len); }
  verbs::RemoteSlice peer_area() const {
    return s_.peer.slice(s_.peer.length - Session::kControlBytes, Session::kControlBytes);
  }
  std::uint64_t word(std::uint64_t at) const {
    return *reinterpret_cast<const volatile std::uint64_t*>(area() + at);  // NOLINT: the peer writes it
  }

  void await_completion(std::string_view what) {
    const auto deadline = Clock::now() + s_.cfg.timeout;
    verbs::Completion wc;
    for (;;) {
      if (!s_.send_cq->poll(std::span(&wc, 1)).empty()) {
        if (!wc.ok())
          throw Failure("control message '" + std::string(what) + "': " + wc.error_code().message() + " (wr_id " +
                        std::to_string(wc.wr_id()) + ")");
        if (wc.wr_id() == kWrId) return;
        continue;  // a late completion of the test itself
      }
      if (Clock::now() > deadline) throw Failure("control message not delivered in time");
    }
  }

  /// Between polls: spin a little, then sleep (the peer may be running a test on this CPU),
  /// and look at the connection now and then.
  void idle(std::uint32_t spins, Clock::time_point deadline) {
    if (spins < 1000) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (spins % 64 != 0) return;
    if (!s_.conns[0].poll_events()) throw Failure("the peer disconnected");
    if (Clock::now() > deadline) throw Failure("the peer did not answer in time");
  }

  Session& s_;
  std::uint64_t sent_ = 0, received_ = 0;
};

// ---- addresses ----

std::string numeric_host(const sockaddr* sa, socklen_t len) {
  char text[NI_MAXHOST] = {};
  ::getnameinfo(sa, len, text, sizeof text, nullptr, 0, NI_NUMERICHOST);
  return text;
}

/// The local address the kernel routes `host` from (a connected UDP socket sends nothing).
std::string routed_source(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), "18515", &hints, &res); rc != 0)
    throw Failure("cannot resolve " + host + ": " + ::gai_strerror(rc));
  Fd fd(::socket(res->ai_family, SOCK_DGRAM, 0));
  sockaddr_storage me{};
  socklen_t len = sizeof me;
  const bool ok = fd.get() >= 0 && ::connect(fd.get(), res->ai_addr, res->ai_addrlen) == 0 &&
                  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&me), &len) == 0;
  const int err = errno;
  ::freeaddrinfo(res);
  if (!ok) throw Failure("no route to " + host + ": " + errno_text(err));
  return numeric_host(reinterpret_cast<sockaddr*>(&me), len);
}

/// The first local IPv4 address whose interface has an RDMA device.
std::string first_rdma_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw Failure("getifaddrs: " + errno_text(errno));
  std::string found;
  for (const ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    const std::string text = numeric_host(a->ifa_addr, sizeof(sockaddr_in));
    try {
      (void)verbs::cm::device_for(text);
      found = text;
    } catch (const verbs::Error&) {
      // no RDMA device behind this address
    }
  }
  ::freeifaddrs(list);
  if (found.empty()) throw Failure("no local IPv4 address has an RDMA device (give one with --bind)");
  return found;
}

Fd tcp_listen(std::uint16_t port) {
  // IPv6 socket that also takes IPv4 clients; IPv4 alone where IPv6 is off.
  for (const int family : {AF_INET6, AF_INET}) {
    Fd fd(::socket(family, SOCK_STREAM, 0));
    if (fd.get() < 0) continue;
    const int one = 1, zero = 0;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(port);
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(port);
      len = sizeof *a;
    }
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
      if (errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL) continue;
      throw Failure("cannot listen on TCP port " + std::to_string(port) + ": " + errno_text(errno));
    }
    if (::listen(fd.get(), 1) != 0) throw Failure("listen: " + errno_text(errno));
    return fd;
  }
  throw Failure("cannot create a TCP socket: " + errno_text(errno));
}

Fd tcp_accept(const Fd& listener) {
  for (;;) {
    const int fd = ::accept(listener.get(), nullptr, nullptr);
    if (fd >= 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return Fd(fd);
    }
    if (errno != EINTR) throw Failure("accept: " + errno_text(errno));
  }
}

/// Connects to host:port; a refused connection is retried for a few seconds, so a client
/// started together with its server finds it.
Fd tcp_connect(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    throw Failure("cannot resolve " + host + ": " + ::gai_strerror(rc));
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  int err = 0;
  for (;;) {
    for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
      Fd fd(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (fd.get() < 0) continue;
      if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        const int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
      }
      err = errno;
    }
    if (err != ECONNREFUSED || Clock::now() > give_up) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  ::freeaddrinfo(res);
  throw Failure("cannot connect to " + host + ":" + std::to_string(port) + ": " + errno_text(err));
}

// ---- resources ----

/// The remote rights this side grants: what the peer does to our region in this test, plus
/// remote write for the control slot with rdma_cm.
verbs::AccessFlags rights(const Config& c) {
  verbs::AccessFlags a{};
  const bool server = c.server();
  switch (c.test) {
    case Test::write_lat: a = verbs::Access::remote_write; break;
    case Test::write_bw: if (server) a = verbs::Access::remote_write; break;
    case Test::read_lat:
    case Test::read_bw: if (server) a = verbs::Access::remote_read; break;
    case Test::atomic_lat: if (server) a = verbs::Access::remote_atomic; break;
    case Test::send_lat:
    case Test::send_bw: break;
  }
  if (c.rdma_cm) a |= verbs::Access::remote_write;
  return a;
}

struct Depths {
  std::uint32_t tx = 1, rx = 1;
};
Depths depths(const Config& c) {
  Depths d;
  for (const std::uint64_t size : c.sizes()) {
    const Plan p = plan_for(c, size);
    d.tx = std::max(d.tx, p.tx_depth);
    d.rx = std::max(d.rx, p.rx_depth);
  }
  return d;
}

std::uint32_t inline_wanted(const Config& c) {
  return plan_for(c, c.sizes()[0]).inline_size;  // the same for every size
}

/// Receiver-not-ready retries: 7, "forever", as perftest. A sender may run ahead of the
/// receives (send_bw's receiver reposts as it goes; rdma_cm's exchange posts its receive only
/// when each side gets to it). A peer that stops for good is caught by the --timeout watchdog;
/// transport retries stay at 6, so a dead peer is not waited for forever.
constexpr std::uint8_t kRnrRetry = 7;

std::uint8_t cap8(std::uint32_t v) { return static_cast<std::uint8_t>(std::min<std::uint32_t>(v, 255)); }

/// Outstanding reads/atomics: ours as initiator (-o, else the device's maximum, as perftest),
/// and as responder the device's maximum.
std::pair<std::uint8_t, std::uint8_t> read_depths(const Config& c, const verbs::Device& d) {
  const auto& a = d.attributes().orig_attr;
  const auto init = static_cast<std::uint32_t>(std::max(1, a.max_qp_init_rd_atom));
  const auto resp = static_cast<std::uint32_t>(std::max(1, a.max_qp_rd_atom));
  return {cap8(c.out_reads != 0 ? std::min(c.out_reads, init) : init), cap8(resp)};
}

void make_cqs(Session& s, int send_depth, int recv_depth) {
  const int max_cqe = s.device->attributes().orig_attr.max_cqe;
  s.send_cq.emplace(*s.device, verbs::CqOptions{.depth = std::min(send_depth, max_cqe), .with_channel = s.cfg.events});
  s.recv_cq.emplace(*s.device, verbs::CqOptions{.depth = std::min(recv_depth, max_cqe), .with_channel = s.cfg.events});
}

void make_region(Session& s) {
  s.area = area_bytes(s.cfg);
  const std::uint64_t bytes = 2 * s.area * s.cfg.qps + Session::kControlBytes;
  s.mr.emplace(verbs::MemoryRegion::allocate(*s.pd, bytes, verbs::Access::local_write | rights(s.cfg)));
}

verbs::QpOptions qp_options(const Config& c, std::uint32_t send_wr, std::uint32_t recv_wr, std::uint32_t inl) {
  return {.type = verbs::QpType::rc,
          .max_send_wr = send_wr,
          .max_recv_wr = recv_wr,
          .max_inline_data = inl,
          .access = rights(c),
          .port = c.ib_port,
          .gid_index = c.gid_index,
          .extended = c.wr_api};
}

/// Creates the QPs of the TCP exchange. An inline size the device refuses is turned off, with
/// a note (perftest lowers it to what the QP reports).
void make_qps(Session& s) {
  const Depths d = depths(s.cfg);
  std::uint32_t inl = inline_wanted(s.cfg);
  for (std::uint32_t q = 0; q < s.cfg.qps; ++q) {
    const auto opts = [&] { return qp_options(s.cfg, d.tx + 2, d.rx + 2, inl); };
    try {
      s.own_qps.emplace_back(*s.pd, *s.send_cq, *s.recv_cq, opts());
    } catch (const verbs::Error& e) {
      if (inl == 0 || e.code() != std::errc::invalid_argument) throw;
      std::fprintf(stderr, " Note: the device refused inline data of %u bytes; inline is off\n", inl);
      inl = 0;
      s.own_qps.emplace_back(*s.pd, *s.send_cq, *s.recv_cq, opts());
    }
  }
  for (verbs::QueuePair& qp : s.own_qps) s.qps.push_back(&qp);
}

void set_inline_cap(Session& s) {
  s.inline_cap = UINT32_MAX;
  for (const verbs::QueuePair* qp : s.qps) s.inline_cap = std::min(s.inline_cap, qp->max_inline_data());
}

std::vector<std::byte> encode_side(const Session& s) {
  std::vector<verbs::Endpoint> eps;
  for (const verbs::QueuePair* qp : s.qps) eps.push_back(qp->endpoint());
  return perf::encode_side(eps, s.mr->remote());
}

std::vector<verbs::Endpoint> decode_side(std::span<const std::byte> in, Session& s) {
  Side side = perf::decode_side(in, s.qps.size());
  s.peer = side.region;
  if (s.peer.length != 2 * s.area * s.cfg.qps + Session::kControlBytes)
    throw Failure("the peer's region does not have the expected size");
  return std::move(side.endpoints);
}

void connect_qps(Session& s, const std::vector<verbs::Endpoint>& eps) {
  const auto [init, resp] = read_depths(s.cfg, *s.device);
  // perftest's RNR timer (12, 0.64 ms), not the library's patient default: with an RNR retry
  // count of 7 the budget does not matter, only how soon a send that met RNR is retried.
  const verbs::TransportOptions o{.initiator_depth = init,
                                  .responder_resources = resp,
                                  .min_rnr_timer = 12,
                                  .rnr_retry_count = kRnrRetry};
  for (std::size_t q = 0; q < s.own_qps.size(); ++q) s.own_qps[q].connect(eps[q], o);
}

std::unique_ptr<Session> open_tcp(const Config& local) {
  auto owned = std::make_unique<Session>();
  Session& s = *owned;
  s.cfg = local;
  Fd sock;
  if (local.server()) {
    Fd listener = tcp_listen(local.port);
    std::printf("\n************************************\n* Waiting for client to connect... *\n"
                "************************************\n");
    std::fflush(stdout);
    sock = tcp_accept(listener);
    decode_params(recv_frame(sock.get(), Clock::now() + local.timeout), s.cfg);
  } else {
    sock = tcp_connect(local.host, local.port);
    send_frame(sock.get(), encode_params(local));
  }
  s.device.emplace(local.device.empty() ? verbs::Device::open_first() : verbs::Device::open(local.device));
  s.pd.emplace(*s.device);
  const Depths d = depths(s.cfg);
  make_cqs(s, static_cast<int>(s.cfg.qps * (d.tx + 2)), static_cast<int>(s.cfg.qps * (d.rx + 2)));
  make_qps(s);
  set_inline_cap(s);
  make_region(s);
  const auto deadline = Clock::now() + local.timeout;
  std::vector<verbs::Endpoint> eps;
  if (local.server()) {
    eps = decode_side(recv_frame(sock.get(), deadline), s);
    send_frame(sock.get(), encode_side(s));
  } else {
    send_frame(sock.get(), encode_side(s));
    eps = decode_side(recv_frame(sock.get(), deadline), s);
  }
  connect_qps(s, eps);
  s.control = std::make_unique<TcpControl>(std::move(sock));
  return owned;
}

std::unique_ptr<Session> open_cm(const Config& local) {
  auto owned = std::make_unique<Session>();
  Session& s = *owned;
  s.cfg = local;
  const std::vector<std::byte> params = encode_params(local);
  std::optional<verbs::cm::Listener> listener;
  std::string address;
  if (local.server()) {
    address = local.bind.empty() ? first_rdma_address() : local.bind;
    listener.emplace(address, local.port);
    s.device.emplace(listener->device());
  } else {
    address = local.bind.empty() ? routed_source(local.host) : local.bind;
    s.device.emplace(verbs::cm::device_for(address));
  }
  if (!local.device.empty() && local.device != s.device->name())
    throw Failure("-d " + local.device + ": rdma_cm reaches " + s.device->name() + " from " + address);
  s.pd.emplace(*s.device);
  // The server learns the parameters only with the first request, after its QPs' capacities
  // are fixed: it makes them large enough for the defaults and checks the client's against them.
  const Depths d = local.server() ? Depths{16, 4096} : depths(local);
  if (local.server()) {
    make_cqs(s, 16384, 16384);
  } else {
    make_cqs(s, static_cast<int>(local.qps * (d.tx + 2)), static_cast<int>(local.qps * (d.rx + 2)));
  }
  const auto [init, resp] = read_depths(local, *s.device);
  verbs::cm::ConnectionOptions co{
      .qp = qp_options(local, d.tx + 2, d.rx + 2, inline_wanted(local)),
      .transport = {.initiator_depth = init, .responder_resources = resp, .rnr_retry_count = kRnrRetry},
      .pd = &*s.pd,
      .send_cq = &*s.send_cq,
      .recv_cq = &*s.recv_cq,
      .private_data = params};
  // The regions: the server exposes its own in the handshake (the accept's private data has
  // room), once the first request has said what the test needs. The client's request is full
  // with the 40-byte parameters: it sends its region in a first message (verbs-perf's own
  // protocol), into a receive the server posts before it answers, so it never meets RNR.
  constexpr std::uint64_t kHello = 0x68656c6c6f;  // "hello"
  constexpr std::uint32_t kSlice = verbs::RemoteSlice::wire_size;
  std::optional<verbs::MemoryRegion> hellos;  // one slot per connection
  hellos.emplace(verbs::MemoryRegion::allocate(*s.pd, kSlice * std::max<std::uint32_t>(local.qps, 64),
                                               verbs::Access::local_write));
  std::uint32_t answered = 0;
  if (!local.server()) {
    make_region(s);
  } else {
    co.before_handshake = [&](const verbs::cm::Handshake& h) {
      if (!s.mr) {
        decode_cm_params(h.peer_private_data, s.cfg);
        make_region(s);
      }
      h.expose = s.mr->remote();
      if (answered >= hellos->size() / kSlice) throw verbs::cm::Reject({}, "more connections than -q allows");
      h.qp.post_recv(hellos->slice(kSlice * answered, kSlice), kHello + answered).check();
      ++answered;
    };
  }
  if (local.server()) {
    std::printf("\n************************************\n* Waiting for client to connect... *\n"
                "************************************\n");
    std::fflush(stdout);
    co.private_data = {};
    // rdma_cm's accept has a deadline; a server waits for its client as long as it takes.
    for (;;) {
      std::error_code ec;
      auto c = listener->accept(std::chrono::hours(1), co, ec);
      if (c) {
        s.conns.push_back(std::move(*c));
        break;
      }
      if (ec != std::errc::timed_out) throw verbs::cm::ConnectError(ec, verbs::cm::Phase::accept, "accept");
    }
    decode_cm_params(s.conns[0].peer_private_data(), s.cfg);
    for (std::uint32_t q = 1; q < s.cfg.qps; ++q) {
      s.conns.push_back(listener->accept(local.timeout, co));
      Config again = local;
      decode_cm_params(s.conns.back().peer_private_data(), again);
    }
  } else {
    // As with TCP, a server that is not listening yet is given a few seconds.
    const auto give_up = Clock::now() + std::chrono::seconds(5);
    for (std::uint32_t q = 0; q < local.qps; ++q) {
      const verbs::cm::ClientOptions o{.timeout = local.timeout, .source_address = address, .connection = co};
      for (;;) {
        std::error_code ec;
        if (auto c = verbs::cm::connect(local.host, local.port, o, ec)) {
          s.conns.push_back(std::move(*c));
          break;
        }
        if (ec != std::errc::connection_refused || Clock::now() > give_up) (void)verbs::cm::connect(local.host, local.port, o);
        std::this_thread::sleep_for(milliseconds(100));
      }
    }
  }
  for (verbs::cm::Connection& c : s.conns) s.qps.push_back(&c.qp());  // posted on only
  set_inline_cap(s);
  // What this side posts: the client the test's requests, the server only latency replies;
  // receives on the side that receives sends.
  const Depths need = depths(s.cfg);
  const bool bw = s.cfg.info().bw;
  const std::uint32_t sends = s.cfg.server() ? (bw ? 2 : 3) : need.tx + 2;
  const bool receives = s.cfg.info().verb == Verb::send && (s.cfg.server() || !bw);
  const std::uint32_t recvs = receives ? need.rx : 0;
  for (const verbs::QueuePair* qp : s.qps)
    if (qp->max_send_wr() < sends || qp->max_recv_wr() < recvs)
      throw Failure("-R: the QPs hold " + std::to_string(qp->max_send_wr()) + " sends and " +
                    std::to_string(qp->max_recv_wr()) + " receives; this test needs " + std::to_string(sends) +
                    " and " + std::to_string(recvs) + " (lower -t or -r)");
  if (std::uint64_t{s.cfg.qps} * recvs > static_cast<std::uint64_t>(s.recv_cq->capacity()) ||
      std::uint64_t{s.cfg.qps} * sends > static_cast<std::uint64_t>(s.send_cq->capacity()))
    throw Failure("-R: the CQs are too small for this -q with this -t or -r");
  for (std::uint32_t i = 0; i < s.conns.size(); ++i) {
    verbs::cm::Connection& c = s.conns[i];
    if (local.server()) {  // the client's hello
      const auto wc = c.wait_one(c.recv_cq(), local.timeout);
      if (!wc) throw Failure("-R: the client's region did not come");
      wc->throw_if_failed();
      s.peer = verbs::RemoteSlice::decode(hellos->bytes().subspan(kSlice * (wc->wr_id() - kHello), kSlice));
    } else {
      s.peer = c.remote();
      std::memcpy(hellos->data() + kSlice * i, s.mr->remote().encode().data(), kSlice);
      c.qp().post_send(hellos->slice(kSlice * i, kSlice), {.wr_id = kHello + i}).check();
      const auto wc = c.wait_one(c.send_cq(), local.timeout);
      if (!wc) throw Failure("-R: the hello was not sent");
      wc->throw_if_failed();
    }
    if (s.peer.length != 2 * s.area * s.cfg.qps + Session::kControlBytes)
      throw Failure("the peer's region does not have the expected size");
  }
  s.control = std::make_unique<CmControl>(s);
  return owned;
}

}  // namespace

std::uint32_t Session::qp_index(std::uint32_t qp_num) const {
  for (std::uint32_t q = 0; q < qps.size(); ++q)
    if (qps[q]->qp_num() == qp_num) return q;
  throw Failure("a completion of an unknown QP " + std::to_string(qp_num));
}

std::unique_ptr<Session> open_session(const Config& cfg) { return cfg.rdma_cm ? open_cm(cfg) : open_tcp(cfg); }

}  // namespace perf
