// rails::Target: listeners on one EventChannel, the exposed buffer registered on each device,
// the handshakes and connections of every group (docs/design/rails.md, "target").
#include <poll.h>

#include <algorithm>
#include <utility>

#include "../detail.hpp"
#include "verbs/rails.hpp"

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
  };
  struct Accepted {
    cm::Connection conn;
    std::uint64_t key;
  };

  TargetOptions options;
  AccessFlags access;
  cm::EventChannel channel;
  std::vector<Dev> devs;
  std::vector<Listening> listeners;
  std::vector<Handshake> handshakes;
  std::vector<Accepted> accepted;
  std::uint64_t next_key = first_connection_key;

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
    return o;
  }

  void accept_waiting(std::size_t l, SourceLocation where) {
    // One pass over what waits, bounded: a request that fails is rejected and the next taken.
    for (int i = 0; i < options.backlog + 1; ++i) {
      const std::uint64_t key = next_key;
      try {
        std::optional<cm::PendingAccept> p = listeners[l].listener.start_accept(connection_options(listeners[l].dev, key), where);
        if (!p) return;
        ++next_key;
        handshakes.push_back({std::move(*p), listeners[l].dev, key});
      } catch (const cm::ConnectError&) {
        // That client's handshake failed (it went away, or asked what cannot be given): dropped.
      }
    }
  }

  void step_handshakes() {
    for (std::size_t i = 0; i < handshakes.size();) {
      std::error_code ec;
      std::optional<cm::Connection> c = handshakes[i].pending.step(ec);
      if (c) accepted.push_back({std::move(*c), handshakes[i].key});
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

}  // namespace verbs::rails
