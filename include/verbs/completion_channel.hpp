// CompletionChannel: one completion channel (ibv_create_comp_channel(3)) shared by many CQs, so
// that one fd in an event loop serves every CQ on it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <system_error>
#include <utility>

#include <infiniband/verbs.h>

#include "verbs/completion_queue.hpp"
#include "verbs/device.hpp"
#include "verbs/error.hpp"

namespace verbs {

/// Which CQ a channel event is for (ibv_get_cq_event(3)). Already accounted for: the channel
/// acknowledges events itself, in batches, and before a CQ is destroyed (so destroying it never
/// blocks). `cq` is for comparison only: the CQ may have been destroyed since.
struct CqEvent {
  ibv_cq* cq = nullptr;     ///< the CQ that fired
  void* context = nullptr;  ///< its CqOptions::context (cq_context)
  /// True when the event is for `q`.
  [[nodiscard]] bool is(const CompletionQueue& q) const noexcept { return q.native_handle() == cq && cq != nullptr; }
};

namespace detail {
struct ChannelState;
}

/// A completion channel for many CQs of one device: each CQ made with CqOptions::channel
/// reports to it, and reading it says which CQ fired. Its fd is non-blocking, for poll(2),
/// epoll(7) or an asio descriptor. Move-only; every CQ on it keeps it alive, so it may be
/// destroyed before them. Safe to read from one thread at a time (the CQs on it may be polled
/// and armed from any).
///
/// The loop, for each CQ the channel names (arming it once before the first wait):
///   fd() readable -> get_events() -> for each event: CompletionQueue::drain_and_arm() on its CQ.
/// drain_and_arm polls until empty, arms, and polls once more, so a completion that lands
/// between the last poll and the arming is never left waiting for an event that will not come.
class CompletionChannel {
 public:
  /// ibv_create_comp_channel(3), made non-blocking. Throws Error (EMFILE with no descriptor
  /// left, ENOMEM).
  explicit CompletionChannel(const Device& device, SourceLocation where = SourceLocation::current());
  ///@{
  /// Move-only: the moved-from channel is empty (fd() -1, get_events() fails with
  /// Errc::empty_object, and a CQ cannot be made on it).
  CompletionChannel(CompletionChannel&&) noexcept = default;
  CompletionChannel& operator=(CompletionChannel&&) noexcept = default;
  ///@}
  CompletionChannel(const CompletionChannel&) = delete;
  CompletionChannel& operator=(const CompletionChannel&) = delete;
  ~CompletionChannel() = default;
  /// Exchanges two channels.
  void swap(CompletionChannel& o) noexcept { state_.swap(o.state_); }

  /// The fd (non-blocking): readable when an armed CQ on the channel has a completion.
  [[nodiscard]] int fd() const noexcept;
  ///@{
  /// Reads the pending events without blocking, up to out.size(); returns the filled front of
  /// `out`, empty when none is pending. A CQ armed once raises one event however many
  /// completions then arrive; it must be armed again (drain_and_arm) for the next.
  std::span<CqEvent> get_events(std::span<CqEvent> out, std::error_code& ec) noexcept;
  std::span<CqEvent> get_events(std::span<CqEvent> out);
  ///@}
  ///@{
  /// Waits up to `timeout` for the fd to become readable, then get_events(); empty on timeout.
  std::span<CqEvent> wait(std::span<CqEvent> out, std::chrono::milliseconds timeout, std::error_code& ec) noexcept;
  std::span<CqEvent> wait(std::span<CqEvent> out, std::chrono::milliseconds timeout);
  ///@}
  /// Events read and not yet acknowledged to libibverbs (acknowledged in batches of
  /// ack_batch per CQ, and all of a CQ's before it is destroyed).
  [[nodiscard]] std::uint64_t unacknowledged() const noexcept;
  /// How many events of one CQ are acknowledged at once (ibv_ack_cq_events(3) takes a lock).
  static constexpr unsigned ack_batch = 256;

  /// False for a moved-from channel.
  [[nodiscard]] explicit operator bool() const noexcept { return state_ != nullptr; }
  /// The C handle; null for a moved-from channel.
  [[nodiscard]] ibv_comp_channel* native_handle() const noexcept;
  /// Shared ownership of the channel's state, for the CQs made on it.
  [[nodiscard]] const std::shared_ptr<detail::ChannelState>& shared_state() const noexcept { return state_; }

 private:
  std::shared_ptr<detail::ChannelState> state_;
};

/// Exchanges two CompletionChannels.
inline void swap(CompletionChannel& a, CompletionChannel& b) noexcept { a.swap(b); }

}  // namespace verbs
