// The rails' transfers and chunks (docs/design/rails.md, "scheduler"): a fixed table of
// transfers, the ring of chunks to post again, and the accounting of completions. No verbs
// calls, no allocation after construction (a failed transfer's text aside): the Group posts what
// next() gives and reports each completion; host tests drive it with fake ones.
#pragma once

#include <cstdint>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace verbs::rails::internal {

enum class Op : std::uint8_t { write, read };

/// One chunk to post: where in the local region and in the peer's buffer, and how much.
struct ChunkPost {
  std::uint64_t wr_id = 0;          // table index << 48 | chunk index
  Op op = Op::write;
  const void* local = nullptr;      // the transfer's local region (the Group's Region)
  std::uint64_t local_offset = 0;
  std::uint64_t remote_offset = 0;
  std::uint32_t length = 0;
};

/// A transfer that is over: every chunk completed once, or it failed and nothing of it is in flight.
struct Finished {
  std::uint64_t id = 0;
  std::error_code error;  // empty: every byte arrived
  std::string why;
  std::uint32_t entry = 0;  // its table entry, for release()
};

class Schedule {
 public:
  static constexpr int chunk_bits = 48;

  /// `capacity`: chunks that may be in flight at once over every slot (slots x max_in_flight);
  /// the retry ring never holds more (a new chunk is posted only while the ring is empty).
  Schedule(std::uint32_t max_transfers, std::uint32_t capacity, std::uint32_t chunk_size)
      : table_(max_transfers), free_(max_transfers), unposted_(max_transfers), finished_(max_transfers),
        retry_(capacity), chunk_size_(chunk_size) {
    for (std::uint32_t i = 0; i < max_transfers; ++i) free_.push(max_transfers - 1 - i);
  }

  /// Starts a transfer; empty when every entry of the table is taken. A transfer of 0 bytes is
  /// finished at once.
  std::optional<std::uint32_t> start(std::uint64_t id, Op op, const void* local, std::uint64_t local_offset,
                                     std::uint64_t remote_offset, std::uint64_t length) {
    if (free_.empty()) return std::nullopt;
    const std::uint32_t t = free_.pop();
    Transfer& x = table_[t];
    x = Transfer{};
    x.busy = true;
    x.id = id;
    x.op = op;
    x.local = local;
    x.local_offset = local_offset;
    x.remote_offset = remote_offset;
    x.length = length;
    x.chunks = (length + chunk_size_ - 1) / chunk_size_;
    if (x.chunks == 0) finish(t);
    else unposted_.push(t);
    return t;
  }

  /// The next chunk to post, counted in flight: one to post again first, else the oldest
  /// transfer's next. Empty when there is none.
  std::optional<ChunkPost> next() {
    if (!retry_.empty()) {  // never a failed transfer's: dequeue_failed() takes those out
      const std::uint64_t wr = retry_.pop();
      ++table_[wr >> chunk_bits].in_flight;
      return post_of(wr);
    }
    while (!unposted_.empty()) {
      const std::uint32_t t = unposted_.front();
      Transfer& x = table_[t];
      if (x.next == x.chunks) {
        unposted_.pop();
        continue;
      }
      const std::uint64_t wr = (std::uint64_t{t} << chunk_bits) | x.next++;
      ++x.in_flight;
      if (x.next == x.chunks) unposted_.pop();
      return post_of(wr);
    }
    return std::nullopt;
  }

  /// True when next() would give a chunk (without taking it).
  [[nodiscard]] bool has_work() const noexcept { return !retry_.empty() || !unposted_.empty(); }

  /// A chunk's completion: `ok` counts it done, otherwise it goes back to be posted again
  /// (unless its transfer failed meanwhile). A chunk the post itself refused counts as not ok.
  void completed(std::uint64_t wr_id, bool ok) noexcept {
    const std::uint32_t t = static_cast<std::uint32_t>(wr_id >> chunk_bits);
    Transfer& x = table_[t];
    --x.in_flight;
    if (ok) ++x.done;
    else if (!x.failed) retry_.push(wr_id);
    if (x.done == x.chunks || x.failed) maybe_finish(t);
  }

  /// Every transfer not finished fails with `error` and `why` (every rail is gone): nothing more
  /// of it is posted, and it is finished once nothing of it is in flight. A `why` that cannot be
  /// copied (no memory left) is left out; the failure is not.
  void fail_all(std::error_code error, const std::string& why) noexcept {
    for (std::uint32_t t = 0; t < table_.size(); ++t) mark_failed(t, error, why);
    dequeue_failed();
  }
  /// Transfer `t` (what start() returned) fails the same way.
  void fail(std::uint32_t t, std::error_code error, const std::string& why) noexcept {
    mark_failed(t, error, why);
    dequeue_failed();
  }

  /// The oldest finished transfer; its entry stays taken until release().
  std::optional<Finished> take_finished() {
    if (finished_.empty()) return std::nullopt;
    const std::uint32_t t = finished_.pop();
    Transfer& x = table_[t];
    return Finished{x.id, x.error, std::move(x.why), t};
  }

  /// Frees the table entry of a transfer take_finished() gave, once its Completion is handed out:
  /// the table bounds the transfers started and not yet handed out, finished ones included.
  void release(std::uint32_t entry) noexcept {
    table_[entry].busy = false;
    free_.push(entry);
  }
  /// True while transfer `id` is started and not yet released.
  [[nodiscard]] bool in_progress(std::uint64_t id) const noexcept {
    for (const Transfer& x : table_)
      if (x.busy && x.id == id) return true;
    return false;
  }
  /// Transfers started and not yet released.
  [[nodiscard]] std::uint32_t active() const noexcept {
    return static_cast<std::uint32_t>(table_.size()) - free_.size();
  }
  /// Chunks waiting to be posted again.
  [[nodiscard]] std::uint32_t retrying() const noexcept { return retry_.size(); }

 private:
  struct Transfer {
    bool busy = false, failed = false, finished = false;
    Op op = Op::write;
    std::uint64_t id = 0;
    const void* local = nullptr;
    std::uint64_t local_offset = 0, remote_offset = 0, length = 0;
    std::uint64_t chunks = 0, next = 0, done = 0;
    std::uint32_t in_flight = 0;
    std::error_code error;
    std::string why;
  };
  // A ring of fixed capacity.
  template <typename T>
  class Ring {
   public:
    explicit Ring(std::uint32_t capacity) : items_(capacity == 0 ? 1 : capacity) {}
    [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
    [[nodiscard]] std::uint32_t size() const noexcept { return count_; }
    void push(T v) noexcept {
      items_[(head_ + count_) % items_.size()] = v;
      ++count_;
    }
    T pop() noexcept {
      T v = items_[head_];
      head_ = static_cast<std::uint32_t>((head_ + 1) % items_.size());
      --count_;
      return v;
    }
    [[nodiscard]] const T& front() const noexcept { return items_[head_]; }
    template <typename Pred>
    void remove_if(Pred drop) noexcept {
      const std::uint32_t n = count_;
      count_ = 0;
      for (std::uint32_t i = 0; i < n; ++i) {
        const T v = pop_at(i);
        if (!drop(v)) items_[(head_ + count_++) % items_.size()] = v;
      }
    }

   private:
    T pop_at(std::uint32_t i) const noexcept { return items_[(head_ + i) % items_.size()]; }
    std::vector<T> items_;
    std::uint32_t head_ = 0, count_ = 0;
  };

  ChunkPost post_of(std::uint64_t wr) const noexcept {
    const Transfer& x = table_[wr >> chunk_bits];
    const std::uint64_t k = wr & ((std::uint64_t{1} << chunk_bits) - 1);
    const std::uint64_t at = k * chunk_size_;
    const std::uint64_t len = x.length - at < chunk_size_ ? x.length - at : chunk_size_;
    return ChunkPost{wr, x.op, x.local, x.local_offset + at, x.remote_offset + at, static_cast<std::uint32_t>(len)};
  }
  void mark_failed(std::uint32_t t, std::error_code error, const std::string& why) noexcept {
    Transfer& x = table_[t];
    if (!x.busy || x.finished || x.failed) return;
    x.failed = true;
    x.error = error;
    try {
      x.why = why;
    } catch (const std::bad_alloc&) {
      x.why.clear();
    }
    maybe_finish(t);
  }
  // Out of the queue of transfers to post, so that a freed entry is never queued twice, and its
  // chunks out of the retry ring, so that none comes out later as the chunk of the next
  // transfer in its entry.
  void dequeue_failed() noexcept {
    unposted_.remove_if([this](std::uint32_t t) { return table_[t].failed; });
    retry_.remove_if([this](std::uint64_t wr) { return table_[wr >> chunk_bits].failed; });
  }
  void maybe_finish(std::uint32_t t) {
    if (table_[t].in_flight == 0) finish(t);
  }
  void finish(std::uint32_t t) {
    table_[t].finished = true;
    finished_.push(t);
  }

  std::vector<Transfer> table_;
  Ring<std::uint32_t> free_, unposted_, finished_;
  Ring<std::uint64_t> retry_;
  std::uint64_t chunk_size_;
};

}  // namespace verbs::rails::internal
