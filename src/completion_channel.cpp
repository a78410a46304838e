#include "verbs/completion_channel.hpp"

#include <fcntl.h>
#include <poll.h>

#include <algorithm>

#include "channel_state.hpp"
#include "detail.hpp"

namespace verbs {

CompletionChannel::CompletionChannel(const Device& device, SourceLocation where) {
  ibv_context* ctx = device.native_handle();
  detail::require_not_empty(ctx != nullptr, "CompletionChannel: the Device", where);
  ibv_comp_channel* ch = detail::check_ptr(ibv_create_comp_channel(ctx), "ibv_create_comp_channel", where);
  // Non-blocking, so get_events() never sleeps inside ibv_get_cq_event.
  const int fl = ::fcntl(ch->fd, F_GETFL);
  if (fl < 0 || ::fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    const int err = errno;
    ibv_destroy_comp_channel(ch);
    detail::throw_errno(err, "fcntl(O_NONBLOCK) on the completion channel", where);
  }
  try {
    state_ = std::make_shared<detail::ChannelState>(ch, device.shared_handle());
  } catch (...) {
    ibv_destroy_comp_channel(ch);
    throw;
  }
}

int CompletionChannel::fd() const noexcept { return state_ ? state_->channel->fd : -1; }

ibv_comp_channel* CompletionChannel::native_handle() const noexcept { return state_ ? state_->channel : nullptr; }

std::uint64_t CompletionChannel::unacknowledged() const noexcept {
  if (!state_) return 0;
  const std::lock_guard lock(state_->mutex);
  return state_->total;
}

std::span<CqEvent> CompletionChannel::get_events(std::span<CqEvent> out, std::error_code& ec) noexcept {
  ec.clear();
  if (!state_) {
    ec = make_error_code(Errc::empty_object);
    return {};
  }
  std::size_t n = 0;
  while (n < out.size()) {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    if (ibv_get_cq_event(state_->channel, &cq, &ctx) != 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) ec.assign(errno, std::generic_category());
      break;
    }
    state_->count(cq, ack_batch);
    out[n++] = CqEvent{cq, ctx};
  }
  return out.first(n);
}

std::span<CqEvent> CompletionChannel::get_events(std::span<CqEvent> out) {
  std::error_code ec;
  auto got = get_events(out, ec);
  if (ec)
    detail::throw_error(ec, ec == Errc::empty_object ? "CompletionChannel::get_events: the channel is empty (moved from)"
                                                     : "ibv_get_cq_event",
                        SourceLocation::current());
  return got;
}

std::span<CqEvent> CompletionChannel::wait(std::span<CqEvent> out, std::chrono::milliseconds timeout,
                                           std::error_code& ec) noexcept {
  const auto deadline = detail::deadline_after(timeout);
  for (;;) {
    if (auto got = get_events(out, ec); !got.empty() || ec) return got;
    if (std::chrono::steady_clock::now() >= deadline) return {};
    pollfd p{state_->channel->fd, POLLIN, 0};
    if (::poll(&p, 1, std::max(1, detail::poll_ms_until(deadline))) < 0 && errno != EINTR) {
      ec.assign(errno, std::generic_category());
      return {};
    }
  }
}

std::span<CqEvent> CompletionChannel::wait(std::span<CqEvent> out, std::chrono::milliseconds timeout) {
  std::error_code ec;
  auto got = wait(out, timeout, ec);
  if (ec) detail::throw_error(ec, "CompletionChannel::wait", SourceLocation::current());
  return got;
}

}  // namespace verbs
