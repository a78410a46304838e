// CompletionQueue: ibv_create_cq(3), ibv_poll_cq(3), completion channels (ibv_req_notify_cq(3)).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <system_error>
#include <utility>

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include "verbs/device.hpp"
#include "verbs/error.hpp"

namespace verbs {

/// Mirrors enum ibv_wc_opcode.
enum class WcOpcode : int {
  send = IBV_WC_SEND,
  rdma_write = IBV_WC_RDMA_WRITE,
  rdma_read = IBV_WC_RDMA_READ,
  comp_swap = IBV_WC_COMP_SWAP,
  fetch_add = IBV_WC_FETCH_ADD,
  bind_mw = IBV_WC_BIND_MW,
  local_inv = IBV_WC_LOCAL_INV,
  atomic_write = IBV_WC_ATOMIC_WRITE,
  recv = IBV_WC_RECV,
  recv_rdma_with_imm = IBV_WC_RECV_RDMA_WITH_IMM,
};
/// The opcode's name, as its enumerator is spelled: "rdma_write", "recv_rdma_with_imm".
std::string_view to_string(WcOpcode op) noexcept;

/// One work completion. Layout-identical to ibv_wc, so polling writes straight into a span of
/// these. Only status, wr_id, vendor_err and qp_num are meaningful on a failed completion.
class Completion {
 public:
  /// A zeroed completion, to poll into.
  Completion() noexcept = default;
  /// A copy of a C work completion.
  explicit Completion(const ibv_wc& wc) noexcept : wc_(wc) {}

  /// The wr_id of the request this completes.
  [[nodiscard]] std::uint64_t wr_id() const noexcept { return wc_.wr_id; }
  /// Success or why the request failed.
  [[nodiscard]] WcStatus status() const noexcept { return static_cast<WcStatus>(wc_.status); }
  /// True on success.
  [[nodiscard]] bool ok() const noexcept { return wc_.status == IBV_WC_SUCCESS; }
  /// What completed (meaningful on success only).
  [[nodiscard]] WcOpcode opcode() const noexcept { return static_cast<WcOpcode>(wc_.opcode); }
  /// Bytes received (receives; on UD including the 40-byte GRH), or read/atomic result size.
  [[nodiscard]] std::uint32_t byte_len() const noexcept { return wc_.byte_len; }
  /// Immediate data in host byte order, if the completion carries any.
  [[nodiscard]] std::optional<std::uint32_t> imm_data() const noexcept {
    if ((wc_.wc_flags & IBV_WC_WITH_IMM) == 0) return std::nullopt;
    return ntohl(wc_.imm_data);
  }
  /// The local QP the request belonged to.
  [[nodiscard]] std::uint32_t qp_num() const noexcept { return wc_.qp_num; }
  /// The sender's QP number (UD receives).
  [[nodiscard]] std::uint32_t src_qp() const noexcept { return wc_.src_qp; }
  /// The provider's own error code, for a failed completion.
  [[nodiscard]] std::uint32_t vendor_err() const noexcept { return wc_.vendor_err; }
  /// IBV_WC_* flags (GRH, WITH_IMM, ...).
  [[nodiscard]] unsigned wc_flags() const noexcept { return wc_.wc_flags; }
  /// The rkey a SendWr::send_inv invalidated here, on its receive completion (the field the
  /// immediate shares). Read it when the protocol says the peer sends with invalidate: rxe 6.1
  /// sets IBV_WC_IP_CSUM_OK where IBV_WC_WITH_INV belongs, so the flag cannot tell.
  [[nodiscard]] std::uint32_t invalidated_rkey() const noexcept { return wc_.invalidated_rkey; }
  /// True when a UD receive starts with the 40-byte GRH.
  [[nodiscard]] bool has_grh() const noexcept { return (wc_.wc_flags & IBV_WC_GRH) != 0; }
  /// The completion's status as an error_code (category "ibv_wc_status"); empty on success.
  [[nodiscard]] std::error_code error_code() const noexcept {
    return ok() ? std::error_code{} : make_error_code(status());
  }
  /// Throws Error naming the status, wr_id, QP and vendor error if the completion failed.
  void throw_if_failed(SourceLocation where = SourceLocation::current()) const {
    if (!ok()) [[unlikely]] throw_failed(where);
  }
  /// The C work completion.
  [[nodiscard]] const ibv_wc& native() const noexcept { return wc_; }

 private:
  [[noreturn]] void throw_failed(SourceLocation where) const;
  ibv_wc wc_{};
};
static_assert(sizeof(Completion) == sizeof(ibv_wc) && std::is_standard_layout_v<Completion>);

namespace detail {
/// What a moved-from CompletionQueue points at: a CQ whose poll fails, so that polling needs no
/// null test and an empty queue still refuses with Errc::empty_object.
ibv_cq* empty_cq() noexcept;
}  // namespace detail

class CompletionChannel;

/// Options of a CompletionQueue.
struct CqOptions {
  int depth = 256;             ///< at least this many entries (devices round up)
  bool with_channel = false;   ///< a completion channel of its own, for wait() without busy polling and for fd()
  int comp_vector = 0;         ///< completion vector (interrupt) for the channel
  /// A channel shared with other CQs instead (of the same device; not with .with_channel: EINVAL).
  /// Read only at creation: the CQ shares the channel's ownership. Its events are read with
  /// CompletionChannel::get_events, not with this CQ's wait() or consume_events().
  CompletionChannel* channel = nullptr;
  /// cq_context: what CqEvent::context and AsyncEvent::context() give for this CQ.
  void* context = nullptr;
};

/// A completion queue. Move-only; kept alive by the queue pairs that use it.
class CompletionQueue {
 public:
  /// ibv_create_cq(3) (and ibv_create_comp_channel(3) when asked). Throws Error (EINVAL for a
  /// depth over max_cqe, ENOMEM).
  explicit CompletionQueue(const Device& device, CqOptions options = {}, SourceLocation where = SourceLocation::current());
  /// Wraps a CQ created elsewhere (e.g. by another library, or a test's fake provider). `cq`'s
  /// deleter destroys it and must keep alive whatever it uses (context, completion channel).
  /// Nothing is asked of the device. Throws Error(Errc::bad_argument) for a null `cq`.
  [[nodiscard]] static CompletionQueue adopt(std::shared_ptr<ibv_cq> cq);

  ///@{
  /// Move-only: the moved-from object is empty. Polling or waiting on it fails with
  /// Errc::empty_object; native_handle() is null.
  CompletionQueue(CompletionQueue&& o) noexcept : cq_(std::exchange(o.cq_, empty_handle_())) {}
  CompletionQueue& operator=(CompletionQueue&& o) noexcept {
    cq_ = std::exchange(o.cq_, empty_handle_());
    return *this;
  }
  ///@}
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;
  ~CompletionQueue() = default;
  /// Exchanges two CompletionQueues.
  void swap(CompletionQueue& o) noexcept { cq_.swap(o.cq_); }

  /// Polls up to out.size() completions; returns the filled front of `out`, empty when none is
  /// ready. Never allocates or blocks. On a device error (negative return) sets `ec`.
  std::span<Completion> poll(std::span<Completion> out, std::error_code& ec) noexcept {
    ec.clear();
    const int n = ibv_poll_cq(cq_.get(), static_cast<int>(out.size()), reinterpret_cast<ibv_wc*>(out.data()));  // NOLINT
    if (n < 0) [[unlikely]] {
      ec = poll_error_(n);
      return {};
    }
    return out.first(static_cast<std::size_t>(n));
  }
  /// As above; throws Error only when the device reports a failure of the CQ itself.
  std::span<Completion> poll(std::span<Completion> out) {
    const int n = ibv_poll_cq(cq_.get(), static_cast<int>(out.size()), reinterpret_cast<ibv_wc*>(out.data()));  // NOLINT
    if (n < 0) [[unlikely]] throw_poll_error_(n);
    return out.first(static_cast<std::size_t>(n));
  }
  /// One completion if one is ready.
  std::optional<Completion> poll_one() {
    Completion c;
    if (poll(std::span(&c, 1)).empty()) return std::nullopt;
    return c;
  }

  /// Waits up to `timeout` for at least one completion and returns what was polled; empty on
  /// timeout. With a channel of its own it sleeps on the channel's fd; without one it
  /// busy-polls. On a shared channel (CqOptions::channel): Errc::bad_argument.
  ///@{
  std::span<Completion> wait(std::span<Completion> out, std::chrono::milliseconds timeout, std::error_code& ec) noexcept;
  std::span<Completion> wait(std::span<Completion> out, std::chrono::milliseconds timeout);
  ///@}
  /// One completion, waiting up to `timeout`; empty on timeout.
  std::optional<Completion> wait_one(std::chrono::milliseconds timeout) {
    Completion c;
    if (wait(std::span(&c, 1), timeout).empty()) return std::nullopt;
    return c;
  }

  /// Arms the channel for the next completion (ibv_req_notify_cq(3)). Requires a channel.
  /// Arming only reports completions that arrive after it: one that landed between the last
  /// empty poll and the arming raises no event. Prefer arm_and_poll(), which polls again.
  void req_notify(bool solicited_only = false);
  ///@{
  /// The one safe way to go to sleep on fd(): arms the CQ (ibv_req_notify_cq(3)), then polls
  /// once more, so a completion that landed between the caller's last empty poll and the arming
  /// is returned instead of being waited for. Empty: the CQ is armed and fd() becomes readable
  /// at the next completion. CompletionQueue::wait and cm::Connection::wait use it. Requires a
  /// channel (else `ec` is Errc::bad_argument). The event loop is:
  ///   fd() readable -> consume_events() -> poll() until empty -> arm_and_poll() until empty -> sleep.
  std::span<Completion> arm_and_poll(std::span<Completion> out, std::error_code& ec, bool solicited_only = false) noexcept;
  std::span<Completion> arm_and_poll(std::span<Completion> out, bool solicited_only = false);
  ///@}
  /// The end of handling an event, the arm-then-poll-again rule in one call: polls until the CQ
  /// is empty, arms it and polls once more, handing each non-empty batch (a front of `buf`) to
  /// `on_batch`, until an arming finds nothing; then the CQ is armed and the next completion
  /// raises an event. Returns how many completions were handed over; on a device error sets
  /// `ec` and stops. Requires a channel (own or shared).
  template <typename F>
  std::size_t drain_and_arm(std::span<Completion> buf, F&& on_batch, std::error_code& ec,
                            bool solicited_only = false) noexcept(noexcept(on_batch(buf))) {
    std::size_t n = 0;
    for (;;) {
      std::span<Completion> got = poll(buf, ec);
      if (ec) return n;
      if (got.empty()) {
        got = arm_and_poll(buf, ec, solicited_only);
        if (ec || got.empty()) return n;
      }
      n += got.size();
      on_batch(got);
    }
  }
  /// Consumes and acknowledges pending channel events without blocking; returns how many. Call
  /// when fd() is readable, then poll until empty, then arm_and_poll() (see there). Only for a
  /// channel of its own (CqOptions::with_channel): on a shared one (CqOptions::channel) it
  /// fails with Errc::bad_argument, as would wait() (it would take the other CQs' events).
  ///@{
  int consume_events();
  int consume_events(std::error_code& ec) noexcept;
  ///@}
  /// The completion channel's fd (non-blocking), for an event loop; -1 without a channel.
  [[nodiscard]] int fd() const noexcept;
  /// True when made with a completion channel, its own or a shared one.
  [[nodiscard]] bool has_channel() const noexcept { return cq_->channel != nullptr; }
  /// True when on a CompletionChannel shared with other CQs (CqOptions::channel).
  [[nodiscard]] bool shares_channel() const noexcept;
  /// False for a moved-from (empty) CompletionQueue.
  [[nodiscard]] explicit operator bool() const noexcept { return cq_.get() != detail::empty_cq(); }
  /// Entries the device actually gave the CQ (at least the depth asked for).
  [[nodiscard]] int capacity() const noexcept { return cq_->cqe; }

  /// The C handle; null for a moved-from CompletionQueue.
  [[nodiscard]] ibv_cq* native_handle() const noexcept { return *this ? cq_.get() : nullptr; }
  /// Shared ownership of the CQ, for the QPs that use it.
  [[nodiscard]] const std::shared_ptr<ibv_cq>& shared_handle() const noexcept { return cq_; }

 private:
  CompletionQueue() noexcept : cq_(empty_handle_()) {}
  // Owns nothing: aliases the static empty CQ without a control block.
  static std::shared_ptr<ibv_cq> empty_handle_() noexcept { return {std::shared_ptr<void>(), detail::empty_cq()}; }
  [[nodiscard, gnu::cold, gnu::noinline]] std::error_code poll_error_(int rc) const noexcept;
  [[noreturn, gnu::cold, gnu::noinline]] void throw_poll_error_(int rc) const;
  void check_not_empty_(const char* what, SourceLocation where) const;
  std::shared_ptr<ibv_cq> cq_;  // deleter (CqDeleter for a CQ made here) holds the channel and the device context
};

/// Exchanges two CompletionQueues.
inline void swap(CompletionQueue& a, CompletionQueue& b) noexcept { a.swap(b); }

}  // namespace verbs
