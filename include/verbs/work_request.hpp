// Work requests: typed builders over ibv_send_wr / ibv_recv_wr, and the result of a post.
// Building never allocates or throws; a request that fails a check carries the reason and is
// rejected, with nothing posted, by the QueuePair or SharedReceiveQueue it is posted on.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <system_error>

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include "verbs/address_handle.hpp"
#include "verbs/error.hpp"
#include "verbs/memory_region.hpp"

namespace verbs {

/// Per-request flags. `signaled` asks for a completion (ignored when the QP signals all).
struct PostOptions {
  std::uint64_t wr_id = 0;   ///< returned in the completion
  bool signaled = true;      ///< ask for a completion
  /// Copy the payload into the WQE (IBV_SEND_INLINE; sends and writes only); lkey unused. The
  /// provider reads the slices' addresses as pointers: not for slices of a region registered at
  /// an IOVA (MemoryRegion's Iova constructor) or of a dma-buf, whose addresses are not this
  /// process's.
  bool inline_data = false;
  bool fence = false;        ///< wait for earlier reads and atomics (IBV_SEND_FENCE)
  bool solicited = false;    ///< wake a solicited-only waiter on the receiver (IBV_SEND_SOLICITED)
};

/// The outcome of a post. Failure says why (std::error_code: category "verbs" for a check the
/// library made, generic errno from ibv_post_send/ibv_post_recv), and at which request of a chain.
class [[nodiscard]] PostResult {
 public:
  /// Success.
  constexpr PostResult() noexcept = default;
  /// Request `index` failed the library's check `e`; nothing was posted (or, with
  /// `before_posted`, the requests before it: a SendBatch that a multi-SGE request split).
  static constexpr PostResult rejected(Errc e, std::uint32_t index, bool before_posted = false) noexcept {
    return PostResult(-(static_cast<int>(e) | (before_posted ? partial_ : 0)), index);
  }
  /// The device refused request `index` with errno `err`; the ones before it were posted.
  static constexpr PostResult device_error(int err, std::uint32_t index) noexcept { return PostResult(err, index); }

  /// True when everything was posted.
  [[nodiscard]] constexpr bool ok() const noexcept { return value_ == 0; }
  /// Same as ok().
  constexpr explicit operator bool() const noexcept { return ok(); }
  /// Why the post failed; empty on success.
  [[nodiscard]] std::error_code error() const noexcept {
    if (value_ == 0) return {};
    if (value_ < 0) return make_error_code(static_cast<Errc>(-value_ & (partial_ - 1)));
    return {value_, std::generic_category()};
  }
  /// Index in the chain of the request that failed. Requests before it were posted when the
  /// device refused it (ibv_post_send's bad_wr); none was posted when a check failed (except
  /// in a split SendBatch: posted()).
  [[nodiscard]] constexpr std::uint32_t failed_index() const noexcept { return index_; }
  /// How many requests of the chain went to the device: those before failed_index() when the
  /// device refused one; none when a check failed, except in a SendBatch that a multi-SGE
  /// request split, where the requests before the refused one were posted (SendBatch).
  [[nodiscard]] constexpr std::uint32_t posted() const noexcept {
    return value_ > 0 || (value_ < 0 && (-value_ & partial_) != 0) ? index_ : 0;
  }
  /// Throws Error if the post failed.
  void check(SourceLocation where = SourceLocation::current()) const {
    if (!ok()) [[unlikely]] throw_error(where);
  }

 private:
  static constexpr int partial_ = 1 << 16;  // with -Errc: the requests before index_ were posted
  constexpr PostResult(int value, std::uint32_t index) noexcept : value_(value), index_(index) {}
  [[noreturn]] void throw_error(SourceLocation where) const;
  int value_ = 0;  // 0 ok, > 0 errno, < 0 -Errc (| partial_)
  std::uint32_t index_ = 0;
};
static_assert(sizeof(PostResult) == 8);

class QueuePair;

/// The most slices a SendWr or RecvWr holds. A request is a value: its builders copy the slices
/// into it (as scatter/gather entries), so it may be kept, copied and moved, and posted after the
/// caller's array of slices is gone. A builder given more is refused (Errc::too_many_slices);
/// QueuePair's post_write, post_read, post_send and post_recv over a span, and SendBatch's
/// write, read and send over a span, take any number, as they read the slices during the call.
inline constexpr std::size_t max_wr_slices = 4;

/// One send-queue work request. It carries copies of its slices (at most max_wr_slices; more
/// are refused at build time, Errc::too_many_slices), so it may outlive the caller's array of
/// them. The memory the slices name must stay valid until the request's completion is polled.
class SendWr {
 public:
  ///@{
  /// RDMA write of `src` to the front of `dst` (which must be large enough).
  static SendWr write(LocalSlice src, RemoteSlice dst, const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_RDMA_WRITE, src, o);
    w.remote_(dst);
    return w;
  }
  static SendWr write(std::span<const LocalSlice> src, RemoteSlice dst, const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_RDMA_WRITE, src, o);
    w.remote_(dst);
    return w;
  }
  ///@}
  ///@{
  /// RDMA write with immediate (`imm` in host byte order). An empty span writes nothing and
  /// only delivers the immediate.
  static SendWr write_imm(LocalSlice src, RemoteSlice dst, std::uint32_t imm, const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_RDMA_WRITE_WITH_IMM, src, o);
    w.remote_(dst);
    w.wr_.imm_data = htonl(imm);
    return w;
  }
  static SendWr write_imm(std::span<const LocalSlice> src, RemoteSlice dst, std::uint32_t imm,
                          const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_RDMA_WRITE_WITH_IMM, src, o);
    w.remote_(dst);
    w.wr_.imm_data = htonl(imm);
    return w;
  }
  ///@}
  ///@{
  /// RDMA read of the front of `src` into `dst` (scattered across the slices). Inline data
  /// is refused (Errc::inline_not_allowed): a read carries no payload out.
  static SendWr read(LocalSlice dst, RemoteSlice src, const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_RDMA_READ, dst, o);
    w.remote_(src);
    w.no_inline_(o);
    return w;
  }
  static SendWr read(std::span<const LocalSlice> dst, RemoteSlice src, const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_RDMA_READ, dst, o);
    w.remote_(src);
    w.no_inline_(o);
    return w;
  }
  ///@}
  ///@{
  /// Send of `src` into the peer's next receive.
  static SendWr send(LocalSlice src, const PostOptions& o = {}) noexcept { return SendWr(IBV_WR_SEND, src, o); }
  static SendWr send(std::span<const LocalSlice> src, const PostOptions& o = {}) noexcept {
    return SendWr(IBV_WR_SEND, src, o);
  }
  ///@}
  ///@{
  /// Send with immediate (`imm` in host byte order).
  static SendWr send_imm(LocalSlice src, std::uint32_t imm, const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_SEND_WITH_IMM, src, o);
    w.wr_.imm_data = htonl(imm);
    return w;
  }
  static SendWr send_imm(std::span<const LocalSlice> src, std::uint32_t imm, const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_SEND_WITH_IMM, src, o);
    w.wr_.imm_data = htonl(imm);
    return w;
  }
  ///@}
  /// Atomic fetch-and-add on the 8-byte, 8-aligned `target`; the old value lands in `result`
  /// (8 bytes, in the target's byte order, i.e. host order between like hosts). Not inline
  /// (Errc::inline_not_allowed); refused on a device without atomics (Errc::atomics_unsupported).
  static SendWr fetch_add(LocalSlice result, RemoteSlice target, std::uint64_t add, const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_ATOMIC_FETCH_AND_ADD, result, o);
    w.atomic_(result, target, o);
    w.wr_.wr.atomic.compare_add = add;
    return w;
  }
  /// Atomic compare-and-swap: if *target == compare, *target = swap; the old value lands in
  /// result. Checked as fetch_add().
  static SendWr compare_swap(LocalSlice result, RemoteSlice target, std::uint64_t compare, std::uint64_t swap,
                             const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_ATOMIC_CMP_AND_SWP, result, o);
    w.atomic_(result, target, o);
    w.wr_.wr.atomic.compare_add = compare;
    w.wr_.wr.atomic.swap = swap;
    return w;
  }

  /// A send that also invalidates the peer's memory window `rkey` (RC; IBV_WR_SEND_WITH_INV):
  /// the peer's receive completion carries it (Completion::invalidated_rkey()).
  static SendWr send_inv(LocalSlice src, std::uint32_t rkey, const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_SEND_WITH_INV, src, o);
    w.wr_.invalidate_rkey = rkey;
    return w;
  }
  /// Invalidates this side's memory window `rkey` (IBV_WR_LOCAL_INV; RC): once it completes,
  /// the peer's requests with that rkey fail with REM_ACCESS_ERR. MemoryWindow::invalidate()
  /// posts it for a window.
  static SendWr local_inv(std::uint32_t rkey, const PostOptions& o = {}) noexcept {
    SendWr w(IBV_WR_LOCAL_INV, std::span<const LocalSlice>{}, o);
    w.wr_.invalidate_rkey = rkey;
    w.no_inline_(o);
    return w;
  }

  /// Addresses a send on a UD QP: the peer's address handle, QP number and Q_Key. The handle
  /// must outlive the request's completion.
  SendWr& to(const AddressHandle& ah, std::uint32_t remote_qpn, std::uint32_t remote_qkey) noexcept {
    wr_.wr.ud.ah = ah.native_handle();
    if (wr_.wr.ud.ah == nullptr) [[unlikely]] fail_(Errc::empty_object);  // a moved-from handle
    wr_.wr.ud.remote_qpn = remote_qpn;
    wr_.wr.ud.remote_qkey = remote_qkey;
    key_ |= ud_bit;
    return *this;
  }

  /// The check this request failed at build time, if any (Errc{} when none).
  [[nodiscard]] Errc error() const noexcept { return static_cast<Errc>(err_); }
  /// Bytes the request carries (sum of its slices).
  [[nodiscard]] std::uint64_t total_length() const noexcept { return total_; }
  /// The wr_id its completion will carry.
  [[nodiscard]] std::uint64_t wr_id() const noexcept { return wr_.wr_id; }
  /// The scatter/gather entries the request carries: copies of its slices, in order (none when
  /// it was given more than max_wr_slices: error()).
  [[nodiscard]] std::span<const ibv_sge> sges() const noexcept {
    const auto n = static_cast<std::size_t>(wr_.num_sge);
    return {sge_, n <= max_wr_slices ? n : 0};
  }
  /// The C work request. Its sg_list is set when posting (to the request's own copy of its
  /// entries, sges(), since the object may have moved): null before.
  [[nodiscard]] const ibv_send_wr& native() const noexcept { return wr_; }

 private:
  friend class QueuePair;
  friend class SendBatch;     // posts it through ibv_wr_*
  friend class MemoryWindow;  // builds IBV_WR_BIND_MW requests
  // key_ is the opcode, plus ud_bit when addressed for UD, plus one_sge_bit when the request
  // was built from one LocalSlice (its one SGE known when building). A QP allows a key
  // (QueuePair::allowed_) when its type and state take such a request and, for one_sge_bit, it
  // has at least one send SGE: posting tests one bit for all of that (QueuePair::passes_). A
  // request built from a span (0 to max_wr_slices SGEs, or a borrowing one of any number) has
  // no one_sge_bit, and its num_sge is compared with the QP's max_send_sge.
  static constexpr std::uint8_t ud_bit = 16;
  static constexpr std::uint8_t one_sge_bit = 32;

  // The builders' constructors: the request carries its SGEs (sge_; sg_list is pointed at them
  // when posting, since this object may move or be copied). Only the entries in use are
  // written: a single-SGE request costs what it did before it had room for more.
  SendWr(ibv_wr_opcode op, LocalSlice s, const PostOptions& o) noexcept : total_(s.length()) {
    sge_[0] = s.native();
    init_(op, o, nullptr, 1);
    key_ |= one_sge_bit;
  }
  SendWr(ibv_wr_opcode op, std::span<const LocalSlice> s, const PostOptions& o) noexcept {
    init_(op, o, nullptr, static_cast<int>(s.size()));  // over max_wr_slices: num_sge says how many
    if (s.size() > max_wr_slices) [[unlikely]] {
      fail_(Errc::too_many_slices);  // nothing copied: sges() is empty
    } else {
      for (std::size_t i = 0; i < s.size(); ++i) sge_[i] = s[i].native();
    }
    for (const LocalSlice& x : s) total_ += x.length();
  }

  // QueuePair's and SendBatch's span forms post the request within the call, so it points at
  // the caller's slices, of any number, instead of copying them (the borrowing builders below;
  // QueuePair::post_borrowing_, SendBatch::add_). Such a request never reaches the user.
  struct Borrow {};
  SendWr(Borrow, ibv_wr_opcode op, std::span<const LocalSlice> s, const PostOptions& o) noexcept {
    init_(op, o, const_cast<ibv_sge*>(reinterpret_cast<const ibv_sge*>(s.data())),  // NOLINT
          static_cast<int>(s.size()));
    for (const LocalSlice& x : s) total_ += x.length();
  }
  static SendWr borrowing_write_(std::span<const LocalSlice> src, RemoteSlice dst, const PostOptions& o) noexcept {
    SendWr w(Borrow{}, IBV_WR_RDMA_WRITE, src, o);
    w.remote_(dst);
    return w;
  }
  static SendWr borrowing_read_(std::span<const LocalSlice> dst, RemoteSlice src, const PostOptions& o) noexcept {
    SendWr w(Borrow{}, IBV_WR_RDMA_READ, dst, o);
    w.remote_(src);
    w.no_inline_(o);
    return w;
  }
  static SendWr borrowing_send_(std::span<const LocalSlice> src, const PostOptions& o) noexcept {
    return SendWr(Borrow{}, IBV_WR_SEND, src, o);
  }
  // Writes every byte of wr_: the head field by field, the rest (immediate, remote address,
  // UD address, XRC, memory-window and TSO fields, and their padding) zeroed, so that the
  // builders' stores overwrite it without zeroing the whole 128 bytes first.
  void init_(ibv_wr_opcode op, const PostOptions& o, ibv_sge* sg_list, int num_sge) noexcept {
    wr_.wr_id = o.wr_id;
    wr_.next = nullptr;
    wr_.sg_list = sg_list;
    wr_.num_sge = num_sge;
    wr_.opcode = op;
    wr_.send_flags = (o.signaled ? unsigned{IBV_SEND_SIGNALED} : 0u) | (o.inline_data ? unsigned{IBV_SEND_INLINE} : 0u) |
                     (o.fence ? unsigned{IBV_SEND_FENCE} : 0u) | (o.solicited ? unsigned{IBV_SEND_SOLICITED} : 0u);
    wr_.imm_data = 0;
    static_assert(offsetof(ibv_send_wr, wr) == offsetof(ibv_send_wr, send_flags) + 2 * sizeof(std::uint32_t),
                  "the head of ibv_send_wr has no padding");
    std::memset(&wr_.wr, 0, sizeof(ibv_send_wr) - offsetof(ibv_send_wr, wr));
    key_ = static_cast<std::uint16_t>(op);
  }
  // For the builders, which construct in place and return by name (NRVO): returning a chained
  // `SendWr(...).remote_()` would copy the 208-byte object.
  void remote_(const RemoteSlice& r) noexcept {
    wr_.wr.rdma.remote_addr = r.addr;
    wr_.wr.rdma.rkey = r.rkey;
    if (total_ > r.length) fail_(Errc::remote_too_small);
  }
  void atomic_(const LocalSlice& result, const RemoteSlice& target, const PostOptions& o) noexcept {
    wr_.wr.atomic.remote_addr = target.addr;
    wr_.wr.atomic.rkey = target.rkey;
    if (result.length() != 8 || target.length != 8) fail_(Errc::atomic_length);
    if (target.addr % 8 != 0) fail_(Errc::atomic_misaligned);
    no_inline_(o);
  }
  // Only sends and writes carry a payload out, so only they may be inline (ibv_post_send(3)).
  void no_inline_(const PostOptions& o) noexcept {
    if (o.inline_data) fail_(Errc::inline_not_allowed);
  }
  void fail_(Errc e) noexcept {
    if (err_ == 0) err_ = static_cast<std::uint16_t>(e);
  }

  ibv_send_wr wr_;                // written whole by init_
  ibv_sge sge_[max_wr_slices];    // the first num_sge written by the constructor, the rest never read
  std::uint64_t total_ = 0;
  std::uint16_t err_ = 0;         // an Errc; 16 bits, so that err_ and key_ are one 4-byte store
  std::uint16_t key_ = 0;         // what the QP must allow (above)
};

/// One receive work request. Like SendWr, it carries copies of its slices (at most
/// max_wr_slices; more are refused, Errc::too_many_slices, when it is posted).
class RecvWr {
 public:
  /// A receive with no buffer and wr_id 0.
  RecvWr() noexcept = default;
  /// Receives into one slice.
  explicit RecvWr(LocalSlice dst, std::uint64_t wr_id = 0) noexcept : total_(dst.length()) {
    wr_.wr_id = wr_id;
    wr_.num_sge = 1;
    sge_[0] = dst.native();
  }
  /// Scatters into several slices, at most max_wr_slices of them (more: error(), and the post
  /// refuses it); an empty span receives no payload (enough for a write with immediate, whose
  /// data lands by RDMA).
  explicit RecvWr(std::span<const LocalSlice> dst, std::uint64_t wr_id = 0) noexcept {
    wr_.wr_id = wr_id;
    wr_.num_sge = static_cast<int>(dst.size());  // over max_wr_slices: what error() and the post see
    if (dst.size() <= max_wr_slices) [[likely]]
      for (std::size_t i = 0; i < dst.size(); ++i) sge_[i] = dst[i].native();
    for (const LocalSlice& x : dst) total_ += x.length();
  }
  /// The check this request failed at build time, if any (Errc{} when none):
  /// Errc::too_many_slices when it was given more than max_wr_slices.
  [[nodiscard]] Errc error() const noexcept {
    return static_cast<std::size_t>(wr_.num_sge) > max_wr_slices ? Errc::too_many_slices : Errc{};
  }
  /// The wr_id its completion will carry.
  [[nodiscard]] std::uint64_t wr_id() const noexcept { return wr_.wr_id; }
  /// Bytes the receive has room for (sum of its slices).
  [[nodiscard]] std::uint64_t total_length() const noexcept { return total_; }
  /// The scatter/gather entries the request carries: copies of its slices, in order (none when
  /// it was given more than max_wr_slices: error()).
  [[nodiscard]] std::span<const ibv_sge> sges() const noexcept {
    const auto n = static_cast<std::size_t>(wr_.num_sge);
    return {sge_, n <= max_wr_slices ? n : 0};
  }
  /// The C work request. Its sg_list is set when posting (to the request's own copy of its
  /// entries, sges(), since the object may have moved): null before.
  [[nodiscard]] const ibv_recv_wr& native() const noexcept { return wr_; }

 private:
  friend class QueuePair;
  friend class SharedReceiveQueue;

  // QueuePair::post_recv over a span of slices posts within the call: the receive points at
  // the caller's slices, of any number (posted with post_chain<false>). Never reaches the user.
  static RecvWr borrowing_(std::span<const LocalSlice> dst, std::uint64_t wr_id) noexcept {
    RecvWr w;
    w.wr_.wr_id = wr_id;
    w.wr_.sg_list = const_cast<ibv_sge*>(reinterpret_cast<const ibv_sge*>(dst.data()));  // NOLINT
    w.wr_.num_sge = static_cast<int>(dst.size());
    for (const LocalSlice& x : dst) w.total_ += x.length();
    return w;
  }

  /// Checks and links a chain, then hands it to `post` (ibv_post_recv or ibv_post_srq_recv).
  /// `min_bytes`: the room each receive needs (40 for the GRH on UD; 0 otherwise). `owned`:
  /// the receives carry their SGEs (every RecvWr a user built), and sg_list is pointed at them;
  /// false for a borrowing_() one, whose sg_list is the caller's.
  template <bool owned = true, typename PostFn>
  static PostResult post_chain(std::span<RecvWr> wrs, std::uint32_t max_sge, std::uint32_t min_bytes,
                               PostFn&& post) noexcept {
    if (wrs.empty()) return {};
    // A receive given more than max_wr_slices keeps their number in num_sge (error()), so one
    // compare with this bound refuses it along with those over the queue's max_sge.
    const std::uint32_t most = owned ? std::min(max_sge, std::uint32_t{max_wr_slices}) : max_sge;
    for (std::size_t i = 0; i < wrs.size(); ++i) {
      RecvWr& w = wrs[i];
      if (static_cast<std::uint32_t>(w.wr_.num_sge) > most) [[unlikely]]
        return PostResult::rejected(owned && w.error() != Errc{} ? w.error() : Errc::too_many_sge,
                                    static_cast<std::uint32_t>(i));
      if constexpr (owned) w.wr_.sg_list = w.sge_;
      if (min_bytes != 0 && w.total_ < min_bytes) [[unlikely]]
        return PostResult::rejected(Errc::ud_recv_too_small, static_cast<std::uint32_t>(i));
      w.wr_.next = i + 1 < wrs.size() ? &wrs[i + 1].wr_ : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    const int rc = post(&wrs[0].wr_, &bad);
    if (rc != 0) [[unlikely]] {
      std::uint32_t at = 0;
      while (at < wrs.size() && &wrs[at].wr_ != bad) ++at;
      return PostResult::device_error(detail::rc_to_errno(rc), at);
    }
    return {};
  }

  ibv_recv_wr wr_{};
  ibv_sge sge_[max_wr_slices];  // the first num_sge written by the constructor, the rest never read
  std::uint64_t total_ = 0;     // bytes of the slices: the UD check of room for the GRH reads it
};

}  // namespace verbs
