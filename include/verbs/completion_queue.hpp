// CompletionQueue: ibv_create_cq(3), ibv_poll_cq(3), completion channels (ibv_req_notify_cq(3)).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <system_error>
#include <utility>

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include "verbs/device.hpp"
#include "verbs/error.hpp"
#include "verbs/flags.hpp"

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
  flush = 8,  ///< IBV_WC_FLUSH (rdma-core 45)
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
class CompletionQueue;

/// What an extended CQ's completions carry besides wr_id, status, opcode, vendor_err and
/// wc_flags: ibv_create_cq_ex(3)'s wc_flags (IBV_WC_EX_WITH_*). Ask only for what is read: a
/// provider may do work for each.
enum class WcField : std::uint64_t {
  byte_len = IBV_WC_EX_WITH_BYTE_LEN,              ///< bytes received or read
  imm = IBV_WC_EX_WITH_IMM,                        ///< immediate data, or the rkey a send_inv invalidated
  qp_num = IBV_WC_EX_WITH_QP_NUM,                  ///< the local QP
  src_qp = IBV_WC_EX_WITH_SRC_QP,                  ///< the sender's QP (UD)
  slid = IBV_WC_EX_WITH_SLID,                      ///< the sender's LID (InfiniBand)
  sl = IBV_WC_EX_WITH_SL,                          ///< the service level
  dlid_path_bits = IBV_WC_EX_WITH_DLID_PATH_BITS,  ///< the destination LID path bits
  /// The device's clock when the completion was made (only where ibv_device_attr_ex::
  /// completion_timestamp_mask is not 0; rxe: none).
  completion_timestamp = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
  /// The same in nanoseconds of wall-clock time (where the device has it).
  completion_timestamp_wallclock = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
};
template <>
/// Makes WcField a bitmask enum: Flags<WcField> (WcFields) and its operators.
struct FlagTraits<WcField> {
  static constexpr bool is_bitmask = true;  ///< WcField is a set of bits
  /// Every defined WcField bit: IBV_WC_STANDARD_FLAGS (bits 0-6), COMPLETION_TIMESTAMP (7) and
  /// its WALLCLOCK (11); a literal, since g++ warns at or-ing libibverbs' unnamed enums.
  static constexpr std::uint64_t all = 0x8ff;
};
/// A set of WcField.
using WcFields = Flags<WcField>;

/// One completion of an extended CQ, read by CompletionQueue::start_poll: the fields the CQ was
/// made with, copied out, so it stays valid after the pass moves on. A field the CQ was not
/// made with reads as empty.
class ExCompletion {
 public:
  /// The wr_id of the request this completes.
  [[nodiscard]] std::uint64_t wr_id() const noexcept { return wr_id_; }
  /// Success or why the request failed.
  [[nodiscard]] WcStatus status() const noexcept { return static_cast<WcStatus>(status_); }
  /// True on success.
  [[nodiscard]] bool ok() const noexcept { return status_ == IBV_WC_SUCCESS; }
  /// What completed (meaningful on success only).
  [[nodiscard]] WcOpcode opcode() const noexcept { return static_cast<WcOpcode>(opcode_); }
  /// The provider's own error code, for a failed completion.
  [[nodiscard]] std::uint32_t vendor_err() const noexcept { return vendor_err_; }
  /// IBV_WC_* flags (GRH, WITH_IMM, ...).
  [[nodiscard]] unsigned wc_flags() const noexcept { return wc_flags_; }
  /// The fields it carries (the CQ's CqOptions::fields).
  [[nodiscard]] WcFields fields() const noexcept { return WcFields(fields_); }
  /// Bytes received (on UD including the 40-byte GRH), or read/atomic result size.
  [[nodiscard]] std::optional<std::uint32_t> byte_len() const noexcept { return get_(WcField::byte_len, byte_len_); }
  /// Immediate data in host byte order, if the completion carries any.
  [[nodiscard]] std::optional<std::uint32_t> imm_data() const noexcept {
    if ((wc_flags_ & IBV_WC_WITH_IMM) == 0) return std::nullopt;
    return get_(WcField::imm, ntohl(imm_));
  }
  /// The rkey a SendWr::send_inv invalidated here (see Completion::invalidated_rkey()).
  [[nodiscard]] std::optional<std::uint32_t> invalidated_rkey() const noexcept { return get_(WcField::imm, imm_); }
  /// The local QP the request belonged to.
  [[nodiscard]] std::optional<std::uint32_t> qp_num() const noexcept { return get_(WcField::qp_num, qp_num_); }
  /// The sender's QP number (UD receives).
  [[nodiscard]] std::optional<std::uint32_t> src_qp() const noexcept { return get_(WcField::src_qp, src_qp_); }
  /// The sender's LID.
  [[nodiscard]] std::optional<std::uint32_t> slid() const noexcept { return get_(WcField::slid, slid_); }
  /// The service level.
  [[nodiscard]] std::optional<std::uint8_t> sl() const noexcept { return get_(WcField::sl, sl_); }
  /// The destination LID path bits.
  [[nodiscard]] std::optional<std::uint8_t> dlid_path_bits() const noexcept {
    return get_(WcField::dlid_path_bits, dlid_path_bits_);
  }
  /// The device's clock at the completion.
  [[nodiscard]] std::optional<std::uint64_t> completion_timestamp() const noexcept {
    return get_(WcField::completion_timestamp, ts_);
  }
  /// The completion's wall-clock time in nanoseconds.
  [[nodiscard]] std::optional<std::uint64_t> completion_timestamp_wallclock() const noexcept {
    return get_(WcField::completion_timestamp_wallclock, wallclock_);
  }
  /// The completion's status as an error_code (category "ibv_wc_status"); empty on success.
  [[nodiscard]] std::error_code error_code() const noexcept {
    return ok() ? std::error_code{} : make_error_code(status());
  }

 private:
  friend class CompletionPoll;
  template <typename T>
  [[nodiscard]] std::optional<T> get_(WcField f, T v) const noexcept {
    if ((fields_ & static_cast<std::uint64_t>(f)) == 0) return std::nullopt;
    return v;
  }
  std::uint64_t wr_id_ = 0, fields_ = 0, ts_ = 0, wallclock_ = 0;
  int status_ = 0, opcode_ = 0;
  std::uint32_t vendor_err_ = 0, byte_len_ = 0, imm_ = 0, qp_num_ = 0, src_qp_ = 0, slid_ = 0;
  unsigned wc_flags_ = 0;
  std::uint8_t sl_ = 0, dlid_path_bits_ = 0;
};

/// One pass over the completions ready on an extended CQ (ibv_start_poll(3), ibv_next_poll,
/// ibv_end_poll), from CompletionQueue::start_poll():
///
///     for (const verbs::ExCompletion& c : cq.start_poll()) handle(c);
///
/// Each step reads the next completion, and its fields, out of the CQ; the pass ends (and the
/// provider's lock is released, ibv_end_poll) when none is left or the pass is destroyed.
/// Never allocates or throws; a device error ends the pass and error() says which. Neither
/// copied nor moved: keep it in the scope that iterates it. Not for two threads at once.
/// During a pass the provider may hold the CQ's lock (mlx5 does): touch the CQ no other way
/// from that thread (poll, wait, drain_and_arm, resize, another start_poll) until the pass
/// ends, or it deadlocks; other threads' polls wait.
class CompletionPoll {
 public:
  CompletionPoll(const CompletionPoll&) = delete;
  CompletionPoll& operator=(const CompletionPoll&) = delete;
  ~CompletionPoll() { finish_(); }

  /// The pass as an input range of ExCompletion.
  class iterator {
   public:
    using value_type = ExCompletion;         ///< what it reads
    using difference_type = std::ptrdiff_t;  ///< as input iterators have
    /// The current completion (a copy the pass keeps; copy it to keep it past the next step).
    const ExCompletion& operator*() const noexcept { return p_->current_; }
    /// Its members.
    const ExCompletion* operator->() const noexcept { return &p_->current_; }
    ///@{
    /// The next completion (ibv_next_poll), or the end of the pass.
    iterator& operator++() noexcept {
      p_->next_();
      return *this;
    }
    void operator++(int) noexcept { p_->next_(); }
    ///@}
    /// True at the end of the pass.
    friend bool operator==(const iterator& i, std::default_sentinel_t) noexcept { return i.at_end_(); }

   private:
    friend class CompletionPoll;
    explicit iterator(CompletionPoll* p) noexcept : p_(p) {}
    [[nodiscard]] bool at_end_() const noexcept { return !p_->has_; }
    CompletionPoll* p_;
  };
  /// The first completion (where the pass is: call once).
  [[nodiscard]] iterator begin() noexcept { return iterator(this); }
  /// The end of the pass.
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }
  /// Completions read so far.
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  /// The error that ended the pass (ibv_start_poll or ibv_next_poll's errno, Errc::empty_object
  /// for a moved-from CQ, Errc::bad_argument for one made without CqOptions::extended); empty
  /// when it ended because none was left.
  [[nodiscard]] std::error_code error() const noexcept { return error_; }

 private:
  friend class CompletionQueue;
  explicit CompletionPoll(const CompletionQueue& cq) noexcept;
  void read_() noexcept;
  void next_() noexcept;
  void finish_() noexcept;

  ibv_cq* cq_ = nullptr;
  ibv_cq_ex* cqx_ = nullptr;
  std::uint64_t fields_ = 0;
  ExCompletion current_;
  std::size_t count_ = 0;
  std::error_code error_;
  bool has_ = false;      // current_ holds a completion
  bool started_ = false;  // between ibv_start_poll's success and ibv_end_poll
  bool legacy_ = false;   // read through ibv_poll_cq (rxe: CompletionQueue::start_poll)
};

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
  /// Create with ibv_create_cq_ex(3), carrying `fields`, for start_poll(); poll() works too.
  bool extended = false;
  /// The fields an extended CQ's completions carry (WcField). Timestamps are refused before
  /// creation where the device has none (completion_timestamp_mask 0).
  WcFields fields = WcField::byte_len | WcField::imm | WcField::qp_num;
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
  /// Wraps an extended CQ created elsewhere with ibv_create_cq_ex(3), for start_poll(): `fields`
  /// must be among the wc_flags it was created with (a pass reads each, through the provider's
  /// functions for them, which exist only for those), and `cq` is ibv_cq_ex_to_cq(ex), with its
  /// deleter as above. Asks the device's attributes (ibv_query_device_ex), to read rxe's CQs
  /// through ibv_poll_cq as start_poll() does for a CQ made here. Throws Error(Errc::bad_argument) for a null `cq` or
  /// `ex`, or an `ex` that is not `cq`'s, and Error when the device cannot be queried.
  [[nodiscard]] static CompletionQueue adopt(std::shared_ptr<ibv_cq> cq, ibv_cq_ex* ex, WcFields fields);

  ///@{
  /// Move-only: the moved-from object is empty. Polling or waiting on it fails with
  /// Errc::empty_object; native_handle() is null.
  CompletionQueue(CompletionQueue&& o) noexcept
      : cq_(std::exchange(o.cq_, empty_handle_())),
        cqx_(std::exchange(o.cqx_, nullptr)),
        fields_(std::exchange(o.fields_, 0)),
        legacy_poll_(std::exchange(o.legacy_poll_, false)) {}
  CompletionQueue& operator=(CompletionQueue&& o) noexcept {
    CompletionQueue(std::move(o)).swap(*this);
    return *this;
  }
  ///@}
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;
  ~CompletionQueue() = default;
  /// Exchanges two CompletionQueues.
  void swap(CompletionQueue& o) noexcept {
    cq_.swap(o.cq_);
    std::swap(cqx_, o.cqx_);
    std::swap(fields_, o.fields_);
    std::swap(legacy_poll_, o.legacy_poll_);
  }

  /// Polls up to out.size() completions; returns the filled front of `out`, empty when none is
  /// ready. Never allocates or blocks. On a device error (negative return) sets `ec`.
  std::span<Completion> poll(std::span<Completion> out, std::error_code& ec) const noexcept {
    ec.clear();
    const int n = ibv_poll_cq(cq_.get(), static_cast<int>(out.size()), reinterpret_cast<ibv_wc*>(out.data()));  // NOLINT
    if (n < 0) [[unlikely]] {
      ec = poll_error_(n);
      return {};
    }
    return out.first(static_cast<std::size_t>(n));
  }
  /// As above; throws Error only when the device reports a failure of the CQ itself.
  std::span<Completion> poll(std::span<Completion> out) const {
    const int n = ibv_poll_cq(cq_.get(), static_cast<int>(out.size()), reinterpret_cast<ibv_wc*>(out.data()));  // NOLINT
    if (n < 0) [[unlikely]] throw_poll_error_(n);
    return out.first(static_cast<std::size_t>(n));
  }
  /// One completion if one is ready.
  std::optional<Completion> poll_one() const {
    Completion c;
    if (poll(std::span(&c, 1)).empty()) return std::nullopt;
    return c;
  }

  /// Waits up to `timeout` for at least one completion and returns what was polled; empty on
  /// timeout. With a channel of its own it sleeps on the channel's fd; without one it
  /// busy-polls. On a shared channel (CqOptions::channel): Errc::bad_argument.
  ///@{
  std::span<Completion> wait(std::span<Completion> out, std::chrono::milliseconds timeout, std::error_code& ec) const noexcept;
  std::span<Completion> wait(std::span<Completion> out, std::chrono::milliseconds timeout) const;
  ///@}
  /// One completion, waiting up to `timeout`; empty on timeout.
  std::optional<Completion> wait_one(std::chrono::milliseconds timeout) const {
    Completion c;
    if (wait(std::span(&c, 1), timeout).empty()) return std::nullopt;
    return c;
  }

  /// Arms the channel for the next completion (ibv_req_notify_cq(3)). Requires a channel.
  /// Arming only reports completions that arrive after it: one that landed between the last
  /// empty poll and the arming raises no event. Prefer arm_and_poll(), which polls again.
  void req_notify(bool solicited_only = false) const;
  ///@{
  /// The one safe way to go to sleep on fd(): arms the CQ (ibv_req_notify_cq(3)), then polls
  /// once more, so a completion that landed between the caller's last empty poll and the arming
  /// is returned instead of being waited for. Empty: the CQ is armed and fd() becomes readable
  /// at the next completion. CompletionQueue::wait and cm::Connection::wait use it. Requires a
  /// channel (else `ec` is Errc::bad_argument). The event loop is:
  ///   fd() readable -> consume_events() -> poll() until empty -> arm_and_poll() until empty -> sleep.
  std::span<Completion> arm_and_poll(std::span<Completion> out, std::error_code& ec, bool solicited_only = false) const noexcept;
  std::span<Completion> arm_and_poll(std::span<Completion> out, bool solicited_only = false) const;
  ///@}
  /// The end of handling an event, the arm-then-poll-again rule in one call: polls until the CQ
  /// is empty, arms it and polls once more, handing each non-empty batch (a front of `buf`) to
  /// `on_batch`, until an arming finds nothing; then the CQ is armed and the next completion
  /// raises an event. Returns how many completions were handed over; on a device error sets
  /// `ec` and stops. Requires a channel (own or shared).
  template <typename F>
  std::size_t drain_and_arm(std::span<Completion> buf, F&& on_batch, std::error_code& ec,
                            bool solicited_only = false) const noexcept(noexcept(on_batch(buf))) {
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
  int consume_events() const;
  int consume_events(std::error_code& ec) const noexcept;
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

  /// An extended CQ (CqOptions::extended): start_poll() reads it.
  [[nodiscard]] bool extended() const noexcept { return cqx_ != nullptr; }
  /// The fields its completions carry (empty when not extended).
  [[nodiscard]] WcFields fields() const noexcept { return WcFields(fields_); }
  /// One pass over the ready completions of an extended CQ (CompletionPoll). On rxe the pass
  /// reads through ibv_poll_cq: rxe's ibv_next_poll before rdma-core 55 moves the consumer
  /// index past the last completion when it finds no next, and ibv_end_poll then moves it
  /// again, so the next pass reads entries the device never wrote.
  [[nodiscard]] CompletionPoll start_poll() const noexcept;
  /// ibv_resize_cq(3): room for at least `depth` entries; completions waiting are kept.
  /// Throws Error with the errno (EINVAL below the completions waiting or over max_cqe).
  void resize(int depth, SourceLocation where = SourceLocation::current());
  /// ibv_modify_cq(3) moderation: an event (completion channel) once `count` completions
  /// have arrived or `period_us` microseconds have passed since the first. Throws Error with the
  /// errno; EOPNOTSUPP where the device does not moderate (rxe).
  void moderate(std::uint16_t count, std::uint16_t period_us, SourceLocation where = SourceLocation::current());

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
  friend class CompletionPoll;
  ibv_cq_ex* cqx_ = nullptr;    // the extended CQ (CqOptions::extended)
  std::uint64_t fields_ = 0;    // its wc_flags
  bool legacy_poll_ = false;    // rxe: start_poll() reads through ibv_poll_cq
};

inline CompletionPoll CompletionQueue::start_poll() const noexcept { return CompletionPoll(*this); }

/// Exchanges two CompletionQueues.
inline void swap(CompletionQueue& a, CompletionQueue& b) noexcept { a.swap(b); }

}  // namespace verbs
