// What a CompletionChannel and the CQs on it share (not installed).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <infiniband/verbs.h>

namespace verbs::detail {

/// The channel, and for each CQ on it the events read and not yet acknowledged: a CQ's
/// ibv_destroy_cq waits until every event it raised is acknowledged, so its deleter
/// acknowledges the rest first (remove()), and destroying a CQ never blocks.
struct ChannelState {
  ChannelState(ibv_comp_channel* c, std::shared_ptr<ibv_context> context) noexcept
      : channel(c), ctx(std::move(context)) {}
  ChannelState(const ChannelState&) = delete;
  ChannelState& operator=(const ChannelState&) = delete;
  // ibv_destroy_comp_channel locks the context's mutex: the context outlives it (ctx).
  ~ChannelState() { ibv_destroy_comp_channel(channel); }

  ibv_comp_channel* const channel;
  const std::shared_ptr<ibv_context> ctx;
  mutable std::mutex mutex;
  std::unordered_map<ibv_cq*, unsigned> unacked;  // every CQ on the channel
  std::uint64_t total = 0;                       // the sum of `unacked`

  /// A CQ made on the channel. Throws std::bad_alloc.
  void add(ibv_cq* cq) {
    const std::lock_guard lock(mutex);
    unacked.emplace(cq, 0);
  }
  /// Before the CQ is destroyed: its remaining events acknowledged, and the CQ forgotten. An
  /// event read for it after this (get_events racing the destruction) is acknowledged at once.
  void remove(ibv_cq* cq) noexcept {
    unsigned n = 0;
    {
      const std::lock_guard lock(mutex);
      if (const auto it = unacked.find(cq); it != unacked.end()) {
        n = it->second;
        total -= n;
        unacked.erase(it);
      }
    }
    if (n != 0) ibv_ack_cq_events(cq, n);
  }
  /// An event read for `cq`: counted, and acknowledged when `batch` have gathered.
  void count(ibv_cq* cq, unsigned batch) noexcept {
    const std::lock_guard lock(mutex);
    const auto it = unacked.find(cq);
    if (it == unacked.end()) {  // being destroyed (remove() ran): its destruction waits for this
      ibv_ack_cq_events(cq, 1);
      return;
    }
    if (++it->second >= batch) {
      ibv_ack_cq_events(cq, it->second);
      total -= it->second - 1;
      it->second = 0;
    } else {
      ++total;
    }
  }
};

}  // namespace verbs::detail
