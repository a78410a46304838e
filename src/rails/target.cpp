// rails::Target: listeners on one EventChannel, the exposed buffer registered on each device,
// the handshakes and connections of every group (docs/design/rails.md, "target").
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <utility>

#include "../detail.hpp"
#include "verbs/rails.hpp"
#include "wire.hpp"

namespace verbs::rails {

namespace {
// EventChannel keys: a listener's is its index; handshakes and connections take theirs from here.
constexpr std::uint64_t first_connection_key = 1u << 16;
}  // namespace

struct Target::Impl {
  struct Dev {
    Device device;
    ProtectionDomain pd;
    CompletionQueue cq;  // every connection's on the device: nothing completes on a target's QPs
    MemoryRegion region;
  };
  struct Listening {
    cm::Listener listener;
    std::size_t dev;
  };
  struct Handshake {
    cm::PendingAccept pending;
    std::size_t dev;
    std::uint64_t key;
    std::optional<internal::Hello> hello;  // which group and slot, as its request said
  };
  struct Accepted {
    cm::Connection conn;
    std::uint64_t key;
    std::optional<internal::Hello> hello;
  };

  TargetOptions options;
  AccessFlags access;
  cm::EventChannel channel;
  std::vector<Dev> devs;
  std::vector<Listening> listeners;
  std::vector<Handshake> handshakes;
  std::vector<Accepted> accepted;
  std::uint64_t next_key = first_connection_key;
  std::array<std::byte, 4> rights_data{};     // what the handshake answers: the groups' rights
  std::optional<internal::Hello> last_hello;  // the request before_handshake saw last

  cm::ConnectionOptions connection_options(std::size_t dev, std::uint64_t key) {
    Dev& d = devs[dev];
    cm::ConnectionOptions o;
    o.qp.max_send_wr = 1;
    o.qp.max_recv_wr = 1;
    o.qp.access = access & (Access::remote_write | Access::remote_read | Access::remote_atomic);
    o.cq_depth = 1;
    o.pd = &d.pd;
    o.send_cq = &d.cq;
    o.recv_cq = &d.cq;
    o.expose = d.region.remote();
    o.channel = channel.key(key);
    o.private_data = rights_data;
    o.before_handshake = [this](const cm::Handshake& h) { last_hello = internal::decode_hello(h.peer_private_data); };
    return o;
  }

  void accept_waiting(std::size_t l, SourceLocation where) {
    // One pass over what waits, bounded: a request that fails is rejected and the next taken.
    for (int i = 0; i < options.backlog + 1; ++i) {
      const std::uint64_t key = next_key;
      try {
        last_hello.reset();
        std::optional<cm::PendingAccept> p = listeners[l].listener.start_accept(connection_options(listeners[l].dev, key), where);
        if (!p) return;
        ++next_key;
        handshakes.push_back({std::move(*p), listeners[l].dev, key, last_hello});
      } catch (const cm::ConnectError&) {
        // That client's handshake failed (it went away, or asked what cannot be given): dropped.
      }
    }
  }

  void step_handshakes() {
    for (std::size_t i = 0; i < handshakes.size();) {
      std::error_code ec;
      std::optional<cm::Connection> c = handshakes[i].pending.step(ec);
      if (c) {
        // The same slot of the same group again: its older connection is dead (a client that
        // reconnects has given it up; one whose wire was cut never said so). Dropped, so that
        // a flapping link does not pile up QPs here.
        const auto& hello = handshakes[i].hello;
        if (hello)
          std::erase_if(accepted, [&](const Accepted& a) { return a.hello == hello; });
        accepted.push_back({std::move(*c), handshakes[i].key, hello});
      }
      if (c || ec) {
        handshakes.erase(handshakes.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      ++i;
    }
  }

  void drop_ended(std::span<const std::uint64_t> keys, SourceLocation where) {
    for (const std::uint64_t key : keys) {
      const auto it = std::find_if(accepted.begin(), accepted.end(), [key](const Accepted& a) { return a.key == key; });
      if (it == accepted.end()) continue;
      bool live = false;
      try {
        live = it->conn.poll_events(where);
      } catch (const cm::ConnectError&) {
      }
      if (!live) accepted.erase(it);
    }
  }
};

Target::Target(const TargetOptions& options, std::span<std::byte> buffer, AccessFlags access, SourceLocation where)
    : impl_(std::make_unique<Impl>()) {
  Impl& t = *impl_;
  if (options.addresses.empty())
    detail::throw_error(make_error_code(Errc::bad_argument), "rails::Target: no address to listen on", where);
  if (buffer.empty())
    detail::throw_error(make_error_code(Errc::bad_argument), "rails::Target: the buffer to expose is empty", where);
  if (!(access & (Access::remote_write | Access::remote_read)))
    detail::throw_error(make_error_code(Errc::bad_argument),
                        "rails::Target: the access grants the groups neither remote_write nor remote_read", where);
  t.options = options;
  t.access = access;
  if (access & Access::remote_write) t.access |= Access::local_write;
  t.rights_data = internal::encode_rights(static_cast<std::uint8_t>(((access & Access::remote_write) ? internal::right_write : 0) |
                                                                   ((access & Access::remote_read) ? internal::right_read : 0)));
  std::uint16_t port = options.port;
  for (std::size_t i = 0; i < options.addresses.size(); ++i) {
    cm::ListenOptions lo;
    lo.backlog = options.backlog;
    lo.handshake_timeout = options.handshake_timeout;
    lo.channel = t.channel.key(i);
    cm::Listener listener(options.addresses[i], port, lo, where);
    port = listener.port();
    Device device = listener.device(where);
    std::size_t dev = 0;
    while (dev < t.devs.size() && t.devs[dev].device.native_handle() != device.native_handle()) ++dev;
    if (dev == t.devs.size()) {
      ProtectionDomain pd(device, where);
      CompletionQueue cq(device, {.depth = 1}, where);
      MemoryRegion region(pd, buffer, t.access, where);
      t.devs.push_back({std::move(device), std::move(pd), std::move(cq), std::move(region)});
    }
    t.listeners.push_back({std::move(listener), dev});
  }
}

Target::Target(Target&&) noexcept = default;
Target& Target::operator=(Target&&) noexcept = default;
// Connections first (they hold PD, CQ and region), then listeners, then the devices' objects:
// the members' reverse order does that.
Target::~Target() = default;

void Target::progress(SourceLocation where) {
  Impl& t = *impl_;
  const std::span<const std::uint64_t> keys = t.channel.poll_events(where);
  // Copied: accepting and stepping read the channel again, which reuses its list.
  std::vector<std::uint64_t> news(keys.begin(), keys.end());
  for (const std::uint64_t key : news)
    if (key < t.listeners.size()) t.accept_waiting(static_cast<std::size_t>(key), where);
  t.step_handshakes();  // every one: their limits pass without an event
  t.drop_ended(news, where);
}

void Target::run_for(std::chrono::milliseconds duration, SourceLocation where) {
  const auto end = detail::deadline_after(duration);
  for (;;) {
    progress(where);
    const auto now = std::chrono::steady_clock::now();
    if (now >= end) return;
    pollfd p{fd(), POLLIN, 0};
    (void)::poll(&p, 1, detail::poll_ms_until(std::min(end, next_deadline())));
  }
}

int Target::fd() const noexcept { return impl_->channel.fd(); }

std::chrono::steady_clock::time_point Target::next_deadline() const noexcept {
  auto d = std::chrono::steady_clock::time_point::max();
  for (const auto& h : impl_->handshakes) d = std::min(d, h.pending.deadline());
  return d;
}

std::uint16_t Target::port() const noexcept { return impl_->listeners.front().listener.port(); }

std::size_t Target::connections() const noexcept { return impl_->accepted.size(); }

std::vector<std::string> addresses_of(const DeviceTopology& device) {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (const std::string& netdev : device.netdevs)
    for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || netdev != a->ifa_name) continue;
      char text[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);  // NOLINT
      out.emplace_back(text);
    }
  ::freeifaddrs(list);
  return out;
}

}  // namespace verbs::rails
