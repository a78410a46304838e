#include "verbs/error.hpp"

#include <cstdio>
#include <string>

#include "verbs/completion_queue.hpp"
#include "verbs/queue_pair.hpp"
#include "verbs/work_request.hpp"

namespace verbs {
namespace {

static_assert(max_wr_slices == 4, "Errc::too_many_slices's message names the limit");

class VerbsCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "verbs"; }
  std::string message(int v) const override {
    switch (static_cast<Errc>(v)) {
      case Errc::local_out_of_bounds: return "local slice outside its memory region";
      case Errc::remote_out_of_bounds: return "remote slice outside the remote region";
      case Errc::remote_too_small: return "data larger than the remote slice";
      case Errc::atomic_misaligned: return "atomic target not 8-byte aligned";
      case Errc::atomic_length: return "atomic target or result not 8 bytes long";
      case Errc::inline_too_large: return "inline data larger than the QP's max_inline_data";
      case Errc::too_many_sge: return "more scatter/gather entries than the queue was created with";
      case Errc::bad_qp_state:
        return "queue pair state does not allow this operation (sends need RTS: connect() an RC or UC QP, "
               "activate() a UD one; receives need INIT or later: to_init() to post them before connecting)";
      case Errc::wrong_qp_type: return "operation not supported on this queue pair type";
      case Errc::qp_has_srq: return "queue pair takes its receives from a shared receive queue";
      case Errc::length_overflow: return "length does not fit in a work request (at most 2^32 - 1)";
      case Errc::bad_encoding: return "malformed wire encoding";
      case Errc::no_device: return "no RDMA device";
      case Errc::timed_out: return "timed out";
      case Errc::bad_argument: return "invalid argument";
      case Errc::empty_object: return "the object is empty (it was moved from)";
      case Errc::inline_not_allowed: return "inline data is only for sends and RDMA writes (not reads or atomics)";
      case Errc::atomics_unsupported: return "the device does not support atomic operations (atomic_cap NONE)";
      case Errc::ud_message_too_large:
        return "UD message larger than the port's active MTU (it would be dropped silently; see Endpoint::mtu)";
      case Errc::ud_recv_too_small: return "UD receive smaller than the 40-byte GRH that precedes every message";
      case Errc::ud_needs_address: return "UD send without an address: use SendWr::send(...).to(ah, qpn, qkey)";
      case Errc::mw_bind_not_allowed:
        return "memory window bind or invalidate not allowed: the region needs Access::mw_bind (and local_write "
               "for a window with remote_write or remote_atomic), a window grants only remote_read, remote_write "
               "and remote_atomic, window, region and QP share one PD, and a type 2 window is bound only when "
               "free, to a range of at least one byte, and invalidated only when bound";
      case Errc::qp_not_extended:
        return "the queue pair was not made with QpOptions::extended (the extended API ibv_wr_*), or its send "
               "operations lack this one";
      case Errc::atomic_write_unsupported:
        return "the device does not report atomic write (IB_UVERBS_DEVICE_ATOMIC_WRITE), or the QP is not RC";
      case Errc::flush_unsupported:
        return built_with_flush
                   ? "the device does not report flush (IB_UVERBS_DEVICE_FLUSH_GLOBAL or _PERSISTENT), or the QP is not RC"
                   : "flush is not in this build: the rdma-core headers it was compiled against (older than 45) have "
                     "no ibv_wr_flush";
      case Errc::batch_closed: return "the SendBatch was completed: open another with QueuePair::batch()";
      case Errc::too_many_slices:
        return "a SendWr or RecvWr holds at most 4 slices (verbs::max_wr_slices); post more in one request with "
               "QueuePair::post_write/post_read/post_send/post_recv or SendBatch::write/read/send over a span, "
               "which read the caller's slices during the call";
    }
    return "unknown verbs error " + std::to_string(v);
  }
  std::error_condition default_error_condition(int v) const noexcept override {
    switch (static_cast<Errc>(v)) {
      case Errc::no_device: return std::errc::no_such_device;
      case Errc::timed_out: return std::errc::timed_out;
      case Errc::atomics_unsupported:
      case Errc::atomic_write_unsupported:
      case Errc::flush_unsupported:
      case Errc::qp_not_extended: return std::errc::operation_not_supported;
      case Errc::local_out_of_bounds:
      case Errc::remote_out_of_bounds:
      case Errc::remote_too_small:
      case Errc::length_overflow: return std::errc::result_out_of_range;
      default: return std::errc::invalid_argument;
    }
  }
};

class WcCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "ibv_wc_status"; }
  std::string message(int v) const override {
    return std::string(ibv_wc_status_str(static_cast<ibv_wc_status>(v))) + " (" + std::to_string(v) + ")";
  }
};

std::string where_text(const SourceLocation& w) {
  std::string file = w.file_name();
  if (const auto slash = file.find_last_of('/'); slash != std::string::npos) file.erase(0, slash + 1);
  return file + ":" + std::to_string(w.line()) + " in " + w.function_name();
}

}  // namespace

const std::error_category& verbs_category() noexcept {
  static const VerbsCategory c;
  return c;
}
const std::error_category& wc_category() noexcept {
  static const WcCategory c;
  return c;
}

Error::Error(std::error_code code, std::string_view context, SourceLocation where)
    : std::system_error(code, std::string(context) + " [at " + where_text(where) + "]"),
      context_(context),
      where_(where) {}

namespace detail {

void throw_error(std::error_code code, std::string_view context, SourceLocation where) {
  throw Error(code, context, where);
}

void throw_slice_error(Errc code, std::uint64_t offset, std::uint64_t len, std::uint64_t size,
                       SourceLocation where) {
  char text[160];
  std::snprintf(text, sizeof text, "slice [%llu, +%llu) of a region of %llu bytes", static_cast<unsigned long long>(offset),
                static_cast<unsigned long long>(len), static_cast<unsigned long long>(size));
  throw Error(code, text, where);
}

}  // namespace detail

void PostResult::throw_error(SourceLocation where) const {
  const std::string ctx = std::string(value_ > 0 ? "ibv_post" : "post") + " (work request " + std::to_string(index_) + " of the chain)";
  throw Error(error(), ctx, where);
}

void Completion::throw_failed(SourceLocation where) const {
  char text[200];
  // A failed completion's opcode is undefined, so it is not named.
  std::snprintf(text, sizeof text, "work completion wr_id=%llu qp_num=%u vendor_err=0x%x",
                static_cast<unsigned long long>(wc_.wr_id), wc_.qp_num, wc_.vendor_err);
  throw Error(error_code(), text, where);
}

std::string_view to_string(WcOpcode op) noexcept {
  switch (op) {
    case WcOpcode::send: return "send";
    case WcOpcode::rdma_write: return "rdma_write";
    case WcOpcode::rdma_read: return "rdma_read";
    case WcOpcode::comp_swap: return "comp_swap";
    case WcOpcode::fetch_add: return "fetch_add";
    case WcOpcode::bind_mw: return "bind_mw";
    case WcOpcode::local_inv: return "local_inv";
    case WcOpcode::flush: return "flush";
    case WcOpcode::atomic_write: return "atomic_write";
    case WcOpcode::recv: return "recv";
    case WcOpcode::recv_rdma_with_imm: return "recv_rdma_with_imm";
  }
  return "unknown";
}

}  // namespace verbs
