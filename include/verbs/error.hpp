// Errors: verbs::Error, the "verbs" error category for checks made before a call reaches the
// device, and the "ibv_wc_status" category for failed work completions.
#pragma once

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include <infiniband/verbs.h>

namespace verbs {

/// Where a failing call was made: std::source_location's interface, built on the compiler
/// builtins so that it works with clang 14 and libstdc++ too (which lack std::source_location
/// together), and so the library's ABI does not depend on which of the two a user compiles with.
class SourceLocation {
 public:
  /// The location of the call (the default arguments are evaluated at the caller).
  static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                          const char* function = __builtin_FUNCTION(),
                                          std::uint_least32_t line = __builtin_LINE()) noexcept {
    SourceLocation l;
    l.file_ = file;
    l.function_ = function;
    l.line_ = line;
    return l;
  }
  /// Source file of the call.
  [[nodiscard]] constexpr const char* file_name() const noexcept { return file_; }
  /// Function that made the call.
  [[nodiscard]] constexpr const char* function_name() const noexcept { return function_; }
  /// Line of the call.
  [[nodiscard]] constexpr std::uint_least32_t line() const noexcept { return line_; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  std::uint_least32_t line_ = 0;
};

/// What the library itself rejects before anything reaches the device (category "verbs").
enum class Errc : int {
  local_out_of_bounds = 1,  ///< a local slice lies outside its memory region
  remote_out_of_bounds,     ///< a remote slice lies outside the region the peer exposed
  remote_too_small,         ///< the data does not fit into the remote slice
  atomic_misaligned,        ///< an atomic target address is not 8-byte aligned
  atomic_length,            ///< an atomic target or result slice is not 8 bytes long
  inline_too_large,         ///< inline data exceeds the QP's inline size
  too_many_sge,             ///< more scatter/gather entries than the QP or SRQ was created with
  bad_qp_state,             ///< the QP's state does not allow this post
  wrong_qp_type,            ///< the operation does not exist on this QP type
  qp_has_srq,               ///< receives go to the QP's shared receive queue, not the QP
  length_overflow,          ///< a length does not fit a work request (2^32 - 1 at most)
  bad_encoding,             ///< a wire encoding is malformed
  no_device,                ///< there is no RDMA device (or none by that name)
  timed_out,                ///< a wait ran out of time
  bad_argument,             ///< an option is out of range or inconsistent
  empty_object,             ///< the object is empty: it was moved from (or never made)
  inline_not_allowed,       ///< inline data on an operation that carries none (RDMA read, atomics)
  atomics_unsupported,      ///< the device does not do atomics (atomic_cap NONE)
  ud_message_too_large,     ///< a UD send larger than the port's MTU (the receiver would drop it silently)
  ud_recv_too_small,        ///< a UD receive without room for the 40-byte GRH before the payload
  ud_needs_address,         ///< a UD send without an address: SendWr::send(...).to(ah, qpn, qkey)
  mw_bind_not_allowed,      ///< a memory window bind or invalidate the rules refuse: see MemoryWindow::bind() and MemoryWindow::invalidate()
  qp_not_extended,          ///< a SendBatch on a QP made without QpOptions::extended, or an operation its send_ops lack
  atomic_write_unsupported, ///< an atomic write on a device that does not report it (IB_UVERBS_DEVICE_ATOMIC_WRITE)
  batch_closed,             ///< a request or complete() on a SendBatch already completed
  too_many_slices,          ///< a SendWr or RecvWr built from more than max_wr_slices slices (the span forms of QueuePair and SendBatch take more)
  flush_unsupported,        ///< a flush on a device that does not report it, a QP that is not RC, or a build without ibv_wr_flush (built_with_flush)
};

/// Mirrors enum ibv_wc_status; 0 is success.
enum class WcStatus : int {
  success = IBV_WC_SUCCESS,
  loc_len_err = IBV_WC_LOC_LEN_ERR,
  loc_qp_op_err = IBV_WC_LOC_QP_OP_ERR,
  loc_eec_op_err = IBV_WC_LOC_EEC_OP_ERR,
  loc_prot_err = IBV_WC_LOC_PROT_ERR,
  /// Flushed: the QP was in ERR when the request's turn came (an earlier request failed, or
  /// the QP was moved there). Not always after another failure: rxe from Linux 6.12 on completes
  /// a request whose own lkey is invalid with this status (the specification: loc_prot_err).
  wr_flush_err = IBV_WC_WR_FLUSH_ERR,
  mw_bind_err = IBV_WC_MW_BIND_ERR,
  bad_resp_err = IBV_WC_BAD_RESP_ERR,
  loc_access_err = IBV_WC_LOC_ACCESS_ERR,
  rem_inv_req_err = IBV_WC_REM_INV_REQ_ERR,
  rem_access_err = IBV_WC_REM_ACCESS_ERR,
  rem_op_err = IBV_WC_REM_OP_ERR,
  retry_exc_err = IBV_WC_RETRY_EXC_ERR,
  rnr_retry_exc_err = IBV_WC_RNR_RETRY_EXC_ERR,
  loc_rdd_viol_err = IBV_WC_LOC_RDD_VIOL_ERR,
  rem_inv_rd_req_err = IBV_WC_REM_INV_RD_REQ_ERR,
  rem_abort_err = IBV_WC_REM_ABORT_ERR,
  inv_eecn_err = IBV_WC_INV_EECN_ERR,
  inv_eec_state_err = IBV_WC_INV_EEC_STATE_ERR,
  fatal_err = IBV_WC_FATAL_ERR,
  resp_timeout_err = IBV_WC_RESP_TIMEOUT_ERR,
  general_err = IBV_WC_GENERAL_ERR,
  tm_err = IBV_WC_TM_ERR,
  tm_rndv_incomplete = IBV_WC_TM_RNDV_INCOMPLETE,
};

/// The category of Errc: checks the library makes itself (name "verbs").
const std::error_category& verbs_category() noexcept;
/// The category of WcStatus: failed work completions (name "ibv_wc_status").
const std::error_category& wc_category() noexcept;

///@{
/// Makes Errc and WcStatus values std::error_codes (found by argument-dependent lookup).
inline std::error_code make_error_code(Errc e) noexcept { return {static_cast<int>(e), verbs_category()}; }
inline std::error_code make_error_code(WcStatus s) noexcept { return {static_cast<int>(s), wc_category()}; }
///@}

/// The exception every throwing call of the library raises. what() names the failing verb or
/// check, the reason, and the source location of the call that failed.
class Error : public std::system_error {
 public:
  /// `context` names the failing verb or check; `where` is the call site.
  Error(std::error_code code, std::string_view context,
        SourceLocation where = SourceLocation::current());

  /// The verb or check that failed, e.g. "ibv_reg_mr".
  [[nodiscard]] const std::string& context() const noexcept { return context_; }
  /// The call site of the failing call.
  [[nodiscard]] const SourceLocation& where() const noexcept { return where_; }

 private:
  std::string context_;
  SourceLocation where_;
};

namespace detail {

[[noreturn]] void throw_error(std::error_code code, std::string_view context, SourceLocation where);
/// Throws Error(Errc::empty_object) saying that `what` (e.g. "QueuePair: the ProtectionDomain")
/// is empty, unless `present`.
inline void require_not_empty(bool present, std::string_view what, SourceLocation where) {
  if (!present) [[unlikely]]
    throw_error(make_error_code(Errc::empty_object), std::string(what) + " is empty (moved from)", where);
}
[[noreturn]] inline void throw_errno(int err, std::string_view verb, SourceLocation where) {
  throw_error(std::error_code(err, std::generic_category()), verb, where);
}

/// Throws Error(code) for a slice [offset, offset + len) that does not fit in `size` bytes.
[[noreturn]] void throw_slice_error(Errc code, std::uint64_t offset, std::uint64_t len, std::uint64_t size,
                                    SourceLocation where);

/// Verbs report failure three ways: NULL plus errno, a returned errno, or -1 plus errno.
/// These two helpers cover all three.
template <typename T>
T* check_ptr(T* p, std::string_view verb, SourceLocation where = SourceLocation::current()) {
  if (p == nullptr) [[unlikely]] throw_errno(errno != 0 ? errno : EIO, verb, where);
  return p;
}

/// rc 0: success; rc > 0: the errno itself; rc == -1: errno (EIO if unset); rc < -1: -rc
/// (a negated errno, as some providers' poll_cq return, whatever errno still holds).
inline int rc_to_errno(int rc) noexcept {
  if (rc == 0) return 0;
  if (rc > 0) return rc;
  if (rc == -1) return errno != 0 ? errno : EIO;
  return -rc;
}

inline void check_rc(int rc, std::string_view verb, SourceLocation where = SourceLocation::current()) {
  if (rc != 0) [[unlikely]] throw_errno(rc_to_errno(rc), verb, where);
}

}  // namespace detail
}  // namespace verbs

/// @cond
template <>
struct std::is_error_code_enum<verbs::Errc> : std::true_type {};
template <>
struct std::is_error_code_enum<verbs::WcStatus> : std::true_type {};
/// @endcond
