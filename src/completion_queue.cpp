#include "verbs/completion_queue.hpp"

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <string>

#include "channel_state.hpp"
#include "detail.hpp"
#include "verbs/completion_channel.hpp"

namespace verbs {
namespace detail {

// The deleter of a CQ made here: what the CQ keeps alive, and the acknowledgement of a shared
// channel's remaining events before ibv_destroy_cq (which waits for them).
struct CqDeleter {
  std::shared_ptr<ibv_comp_channel> own;   // a channel of its own (CqOptions::with_channel)
  std::shared_ptr<ChannelState> shared;    // a shared one (CqOptions::channel)
  std::shared_ptr<ibv_context> ctx;
  void operator()(ibv_cq* c) const noexcept {
    if (shared) shared->remove(c);
    ibv_destroy_cq(c);
  }
};

}  // namespace detail
namespace {

int empty_poll(ibv_cq*, int, ibv_wc*) { return -EBADF; }
int empty_notify(ibv_cq*, int) { return EBADF; }

struct EmptyCq {
  ibv_context ctx{};
  ibv_cq cq{};
  EmptyCq() noexcept {
    ctx.ops.poll_cq = &empty_poll;
    ctx.ops.req_notify_cq = &empty_notify;
    cq.context = &ctx;
  }
};

}  // namespace

ibv_cq* detail::empty_cq() noexcept {
  static EmptyCq empty;
  return &empty.cq;
}

std::error_code CompletionQueue::poll_error_(int rc) const noexcept {
  if (!*this) return make_error_code(Errc::empty_object);
  return {detail::rc_to_errno(rc), std::generic_category()};
}

void CompletionQueue::throw_poll_error_(int rc) const {
  const std::error_code ec = poll_error_(rc);
  detail::throw_error(ec, ec == Errc::empty_object ? "CompletionQueue::poll: the CompletionQueue is empty (moved from)"
                                                   : "ibv_poll_cq",
                      SourceLocation::current());
}

void CompletionQueue::check_not_empty_(const char* what, SourceLocation where) const {
  if (!*this)
    detail::throw_error(make_error_code(Errc::empty_object),
                        std::string("CompletionQueue::") + what + ": the CompletionQueue is empty (moved from)", where);
}

CompletionQueue::CompletionQueue(const Device& device, CqOptions options, SourceLocation where) {
  ibv_context* ctx = device.native_handle();
  detail::require_not_empty(ctx != nullptr, "CompletionQueue: the Device", where);
  std::shared_ptr<ibv_comp_channel> channel;
  std::shared_ptr<detail::ChannelState> shared;
  if (options.channel != nullptr) {
    if (options.with_channel)
      detail::throw_error(make_error_code(Errc::bad_argument),
                          "CompletionQueue: CqOptions::with_channel and CqOptions::channel both set (a channel of "
                          "its own, or a shared one)", where);
    shared = options.channel->shared_state();
    if (!shared)
      detail::throw_error(make_error_code(Errc::empty_object),
                          "CompletionQueue: CqOptions::channel is empty (moved from)", where);
    if (shared->channel->context != ctx)
      detail::throw_errno(EINVAL, "CompletionQueue: CqOptions::channel belongs to another device", where);
  }
  if (options.with_channel) {
    ibv_comp_channel* ch = detail::check_ptr(ibv_create_comp_channel(ctx), "ibv_create_comp_channel", where);
    // The channel holds the context itself: ibv_destroy_comp_channel locks the context's mutex,
    // so the context must outlive it whatever else is released first.
    channel.reset(ch, [ctx = device.shared_handle()](ibv_comp_channel* c) { ibv_destroy_comp_channel(c); });
    // Non-blocking, so consume_events() and wait() never sleep inside ibv_get_cq_event.
    const int fl = ::fcntl(ch->fd, F_GETFL);
    if (fl < 0 || ::fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0)
      detail::throw_errno(errno, "fcntl(O_NONBLOCK) on the completion channel", where);
  }
  ibv_comp_channel* ch = shared ? shared->channel : channel.get();
  ibv_cq* cq = nullptr;
  if (options.extended) {
    ibv_device_attr_ex dev{};
    detail::check_rc(ibv_query_device_ex(ctx, nullptr, &dev), "ibv_query_device_ex", where);
    const std::uint64_t want = options.fields.value();
    constexpr std::uint64_t stamps = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
    if ((want & stamps) != 0 && dev.completion_timestamp_mask == 0)
      detail::throw_errno(EOPNOTSUPP,
                          "CompletionQueue: CqOptions::fields asks for completion timestamps, which " + device.name() +
                              " does not have (ibv_device_attr_ex::completion_timestamp_mask is 0)",
                          where);
    ibv_cq_init_attr_ex attr{};
    attr.cqe = static_cast<std::uint32_t>(options.depth);
    attr.cq_context = options.context;
    attr.channel = ch;
    attr.comp_vector = static_cast<std::uint32_t>(options.comp_vector);
    attr.wc_flags = want;
    ibv_cq_ex* cqx = detail::check_ptr(ibv_create_cq_ex(ctx, &attr), "ibv_create_cq_ex", where);
    cq = ibv_cq_ex_to_cq(cqx);
    cqx_ = cqx;
    fields_ = want;
    legacy_poll_ = detail::is_rxe(dev);  // see start_poll()
  } else {
    cq = detail::check_ptr(ibv_create_cq(ctx, options.depth, options.context, ch, options.comp_vector), "ibv_create_cq",
                           where);
  }
  try {
    if (shared) shared->add(cq);
  } catch (...) {
    ibv_destroy_cq(cq);
    throw;
  }
  // Every owner holds what it needs itself (the channel its context), so the order in which
  // the members are destroyed does not matter. (Should the control block fail to allocate,
  // shared_ptr calls the deleter.)
  cq_ = std::shared_ptr<ibv_cq>(cq, detail::CqDeleter{std::move(channel), std::move(shared), device.shared_handle()});
}

void CompletionQueue::resize(int depth, SourceLocation where) {
  check_not_empty_("resize", where);
  detail::check_rc(ibv_resize_cq(cq_.get(), depth), "ibv_resize_cq(" + std::to_string(depth) + ")", where);
}

void CompletionQueue::moderate(std::uint16_t count, std::uint16_t period_us, SourceLocation where) {
  check_not_empty_("moderate", where);
  ibv_modify_cq_attr attr{};
  attr.attr_mask = IBV_CQ_ATTR_MODERATE;
  attr.moderate.cq_count = count;
  attr.moderate.cq_period = period_us;
  detail::check_rc(ibv_modify_cq(cq_.get(), &attr), "ibv_modify_cq(moderate)", where);
}

CompletionPoll::CompletionPoll(const CompletionQueue& cq) noexcept
    : cq_(cq.native_handle()), cqx_(cq.cqx_), fields_(cq.fields_), legacy_(cq.legacy_poll_) {
  current_.fields_ = fields_;
  if (cq_ == nullptr) {
    error_ = make_error_code(Errc::empty_object);
    return;
  }
  if (cqx_ == nullptr) {
    error_ = make_error_code(Errc::bad_argument);
    return;
  }
  if (legacy_) {
    next_();
    return;
  }
  ibv_poll_cq_attr attr{};
  const int rc = ibv_start_poll(cqx_, &attr);
  if (rc == ENOENT) return;  // nothing ready: no ibv_end_poll (ibv_create_cq_ex(3))
  if (rc != 0) {
    error_ = {detail::rc_to_errno(rc), std::generic_category()};
    return;
  }
  started_ = true;
  read_();
}

void CompletionPoll::read_() noexcept {
  ExCompletion& c = current_;
  const std::uint64_t f = fields_;
  c.wr_id_ = cqx_->wr_id;
  c.status_ = cqx_->status;
  c.opcode_ = ibv_wc_read_opcode(cqx_);
  c.vendor_err_ = ibv_wc_read_vendor_err(cqx_);
  c.wc_flags_ = ibv_wc_read_wc_flags(cqx_);
  if ((f & IBV_WC_EX_WITH_BYTE_LEN) != 0) c.byte_len_ = ibv_wc_read_byte_len(cqx_);
  if ((f & IBV_WC_EX_WITH_IMM) != 0) c.imm_ = ibv_wc_read_imm_data(cqx_);
  if ((f & IBV_WC_EX_WITH_QP_NUM) != 0) c.qp_num_ = ibv_wc_read_qp_num(cqx_);
  if ((f & IBV_WC_EX_WITH_SRC_QP) != 0) c.src_qp_ = ibv_wc_read_src_qp(cqx_);
  if ((f & IBV_WC_EX_WITH_SLID) != 0) c.slid_ = ibv_wc_read_slid(cqx_);
  if ((f & IBV_WC_EX_WITH_SL) != 0) c.sl_ = ibv_wc_read_sl(cqx_);
  if ((f & IBV_WC_EX_WITH_DLID_PATH_BITS) != 0) c.dlid_path_bits_ = ibv_wc_read_dlid_path_bits(cqx_);
  if ((f & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) != 0) c.ts_ = ibv_wc_read_completion_ts(cqx_);
  if ((f & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) != 0) c.wallclock_ = ibv_wc_read_completion_wallclock_ns(cqx_);
  has_ = true;
  ++count_;
}

void CompletionPoll::next_() noexcept {
  has_ = false;
  if (legacy_) {
    ibv_wc wc{};
    const int n = ibv_poll_cq(cq_, 1, &wc);
    if (n < 0) error_ = {detail::rc_to_errno(n), std::generic_category()};
    if (n <= 0) return;
    ExCompletion& c = current_;
    c.wr_id_ = wc.wr_id;
    c.status_ = wc.status;
    c.opcode_ = wc.opcode;
    c.vendor_err_ = wc.vendor_err;
    c.wc_flags_ = wc.wc_flags;
    c.byte_len_ = wc.byte_len;
    c.imm_ = wc.imm_data;  // the union's other member is invalidated_rkey
    c.qp_num_ = wc.qp_num;
    c.src_qp_ = wc.src_qp;
    c.slid_ = wc.slid;
    c.sl_ = wc.sl;
    c.dlid_path_bits_ = wc.dlid_path_bits;
    has_ = true;
    ++count_;
    return;
  }
  if (!started_) return;
  const int rc = ibv_next_poll(cqx_);
  if (rc == 0) {
    read_();
    return;
  }
  if (rc != ENOENT) error_ = {detail::rc_to_errno(rc), std::generic_category()};
  finish_();
}

void CompletionPoll::finish_() noexcept {
  has_ = false;
  if (started_) {
    started_ = false;
    ibv_end_poll(cqx_);
  }
}

bool CompletionQueue::shares_channel() const noexcept {
  const auto* d = std::get_deleter<detail::CqDeleter>(cq_);
  return d != nullptr && d->shared != nullptr;
}

CompletionQueue CompletionQueue::adopt(std::shared_ptr<ibv_cq> cq) {
  if (!cq)
    detail::throw_error(make_error_code(Errc::bad_argument), "CompletionQueue::adopt: no CQ",
                        SourceLocation::current());
  // Non-blocking, as a CQ made here is: consume_events() drains the channel until EAGAIN.
  if (cq->channel != nullptr) {
    const int fl = ::fcntl(cq->channel->fd, F_GETFL);
    if (fl < 0 || ((fl & O_NONBLOCK) == 0 && ::fcntl(cq->channel->fd, F_SETFL, fl | O_NONBLOCK) < 0))
      detail::throw_errno(errno, "CompletionQueue::adopt: fcntl(O_NONBLOCK) on the completion channel",
                          SourceLocation::current());
  }
  CompletionQueue q;
  q.cq_ = std::move(cq);
  return q;
}

CompletionQueue CompletionQueue::adopt(std::shared_ptr<ibv_cq> cq, ibv_cq_ex* ex, WcFields fields) {
  const SourceLocation where = SourceLocation::current();
  if (!cq || ex == nullptr || ibv_cq_ex_to_cq(ex) != cq.get())
    detail::throw_error(make_error_code(Errc::bad_argument),
                        "CompletionQueue::adopt: an extended CQ needs its ibv_cq and its ibv_cq_ex, the one of the other",
                        where);
  ibv_device_attr_ex dev{};
  detail::check_rc(ibv_query_device_ex(cq->context, nullptr, &dev), "ibv_query_device_ex", where);
  CompletionQueue q = adopt(std::move(cq));
  q.cqx_ = ex;
  q.fields_ = fields.value();
  q.legacy_poll_ = detail::is_rxe(dev);  // see start_poll()
  return q;
}

void CompletionQueue::req_notify(bool solicited_only) const {
  check_not_empty_("req_notify", SourceLocation::current());
  if (!has_channel())
    detail::throw_error(make_error_code(Errc::bad_argument),
                        "CompletionQueue::req_notify: the CQ has no completion channel (CqOptions::with_channel)",
                        SourceLocation::current());
  detail::check_rc(ibv_req_notify_cq(cq_.get(), solicited_only ? 1 : 0), "ibv_req_notify_cq");
}

std::span<Completion> CompletionQueue::arm_and_poll(std::span<Completion> out, std::error_code& ec,
                                                    bool solicited_only) const noexcept {
  ec.clear();
  if (!has_channel()) {
    ec = make_error_code(*this ? Errc::bad_argument : Errc::empty_object);
    return {};
  }
  if (const int rc = ibv_req_notify_cq(cq_.get(), solicited_only ? 1 : 0); rc != 0) {
    ec.assign(detail::rc_to_errno(rc), std::generic_category());
    return {};
  }
  // A completion that landed between the caller's last poll and the arming raised no event.
  return poll(out, ec);
}

std::span<Completion> CompletionQueue::arm_and_poll(std::span<Completion> out, bool solicited_only) const {
  check_not_empty_("arm_and_poll", SourceLocation::current());
  std::error_code ec;
  auto got = arm_and_poll(out, ec, solicited_only);
  if (ec == make_error_code(Errc::bad_argument))
    detail::throw_error(ec, "CompletionQueue::arm_and_poll: the CQ has no completion channel (CqOptions::with_channel)",
                        SourceLocation::current());
  if (ec) detail::throw_error(ec, "ibv_req_notify_cq", SourceLocation::current());
  return got;
}

int CompletionQueue::fd() const noexcept { return has_channel() ? cq_->channel->fd : -1; }

int CompletionQueue::consume_events(std::error_code& ec) const noexcept {
  ec.clear();
  if (!has_channel()) return 0;
  if (shares_channel()) {  // the events are the channel's, of every CQ on it
    ec = make_error_code(Errc::bad_argument);
    return 0;
  }
  int n = 0;
  for (;;) {
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    if (ibv_get_cq_event(cq_->channel, &ev_cq, &ev_ctx) != 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) ec.assign(errno, std::generic_category());
      break;
    }
    ibv_ack_cq_events(ev_cq, 1);
    ++n;
  }
  return n;
}

int CompletionQueue::consume_events() const {
  std::error_code ec;
  const int n = consume_events(ec);
  if (ec == make_error_code(Errc::bad_argument))
    detail::throw_error(ec, "CompletionQueue::consume_events: the CQ's channel is shared (CqOptions::channel): read "
                            "its events with CompletionChannel::get_events", SourceLocation::current());
  if (ec) detail::throw_error(ec, "ibv_get_cq_event", SourceLocation::current());
  return n;
}

std::span<Completion> CompletionQueue::wait(std::span<Completion> out, std::chrono::milliseconds timeout,
                                            std::error_code& ec) const noexcept {
  using clock = std::chrono::steady_clock;
  const auto deadline = detail::deadline_after(timeout);
  ec.clear();
  if (shares_channel()) {  // sleeping here would take the other CQs' events
    ec = make_error_code(Errc::bad_argument);
    return {};
  }
  for (;;) {
    if (auto got = poll(out, ec); !got.empty() || ec) return got;
    const auto now = clock::now();
    if (now >= deadline) return {};
    if (!has_channel()) continue;  // busy-poll until the deadline
    if (auto got = arm_and_poll(out, ec); !got.empty() || ec) return got;
    pollfd p{cq_->channel->fd, POLLIN, 0};
    const int n = ::poll(&p, 1, std::max(1, detail::poll_ms_until(deadline)));
    if (n < 0 && errno != EINTR) {
      ec.assign(errno, std::generic_category());
      return {};
    }
    if (n > 0 && (consume_events(ec), ec)) return {};
  }
}

std::span<Completion> CompletionQueue::wait(std::span<Completion> out, std::chrono::milliseconds timeout) const {
  std::error_code ec;
  auto got = wait(out, timeout, ec);
  if (ec == make_error_code(Errc::bad_argument) && shares_channel())
    detail::throw_error(ec, "CompletionQueue::wait: the CQ's channel is shared (CqOptions::channel): wait on the "
                            "CompletionChannel (or poll this CQ)", SourceLocation::current());
  if (ec) detail::throw_error(ec, "CompletionQueue::wait", SourceLocation::current());
  return got;
}

}  // namespace verbs
