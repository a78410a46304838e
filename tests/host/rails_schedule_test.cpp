// The rails' scheduler (src/rails/schedule.hpp) driven with fake completions: chunking, the
// retry ring, failing transfers, the table. No device.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "rails/schedule.hpp"

using verbs::rails::internal::ChunkPost;
using verbs::rails::internal::Op;
using verbs::rails::internal::Schedule;

namespace {
const int region = 0;  // the local region a transfer names: only carried through
std::uint64_t index_of(std::uint64_t wr_id) { return wr_id & ((std::uint64_t{1} << Schedule::chunk_bits) - 1); }
std::uint64_t chunk_of(const ChunkPost& c) { return index_of(c.wr_id); }
}  // namespace

TEST(RailsSchedule, CutsATransferIntoChunksTheLastOneShort) {
  Schedule s(4, 8, 4096);
  ASSERT_TRUE(s.start(7, Op::write, &region, 100, 5000, 10 * 1024));
  std::vector<ChunkPost> got;
  while (auto c = s.next()) got.push_back(*c);
  ASSERT_EQ(got.size(), 3u);
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(chunk_of(got[k]), k);
    EXPECT_EQ(got[k].local_offset, 100 + k * 4096);
    EXPECT_EQ(got[k].remote_offset, 5000 + k * 4096);
    EXPECT_EQ(got[k].local, &region);
    EXPECT_EQ(got[k].op, Op::write);
  }
  EXPECT_EQ(got[0].length, 4096u);
  EXPECT_EQ(got[2].length, 2048u);
  EXPECT_FALSE(s.has_work());
}

TEST(RailsSchedule, ATransferFinishesOnceEveryChunkCompletedOnce) {
  Schedule s(4, 8, 4096);
  ASSERT_TRUE(s.start(1, Op::read, &region, 0, 0, 3 * 4096));
  const auto a = *s.next(), b = *s.next(), c = *s.next();
  s.completed(b.wr_id, true);
  s.completed(a.wr_id, true);
  EXPECT_FALSE(s.take_finished());
  s.completed(c.wr_id, true);
  const auto f = s.take_finished();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->id, 1u);
  EXPECT_FALSE(f->error);
  EXPECT_EQ(s.active(), 1u);  // until its Completion is handed out
  s.release(f->entry);
  EXPECT_EQ(s.active(), 0u);
}

TEST(RailsSchedule, AFailedChunkGoesAgainBeforeAnyNewOne) {
  Schedule s(4, 8, 4096);
  ASSERT_TRUE(s.start(1, Op::write, &region, 0, 0, 6 * 4096));
  const auto c0 = *s.next(), c1 = *s.next();
  s.completed(c0.wr_id, true);
  s.completed(c1.wr_id, false);  // its rail failed: the same bytes go again to the same place
  EXPECT_EQ(s.retrying(), 1u);
  const auto again = *s.next();
  EXPECT_EQ(again.wr_id, c1.wr_id);
  EXPECT_EQ(again.remote_offset, c1.remote_offset);
  EXPECT_EQ(again.length, c1.length);
  EXPECT_EQ(chunk_of(*s.next()), 2u);
}

TEST(RailsSchedule, TransfersGoInTheOrderTheyStarted) {
  Schedule s(4, 8, 4096);
  ASSERT_TRUE(s.start(1, Op::write, &region, 0, 0, 2 * 4096));
  ASSERT_TRUE(s.start(2, Op::write, &region, 0, 0, 2 * 4096));
  std::vector<std::uint64_t> order;
  while (auto c = s.next()) {
    order.push_back(c->wr_id);
    s.completed(c->wr_id, true);
  }
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order[0] >> Schedule::chunk_bits, order[1] >> Schedule::chunk_bits);
  EXPECT_NE(order[1] >> Schedule::chunk_bits, order[2] >> Schedule::chunk_bits);
  EXPECT_EQ(s.take_finished()->id, 1u);
  EXPECT_EQ(s.take_finished()->id, 2u);
}

TEST(RailsSchedule, FailingEveryTransferWaitsForWhatIsInFlightAndPostsNothingMore) {
  Schedule s(4, 8, 4096);
  ASSERT_TRUE(s.start(1, Op::write, &region, 0, 0, 8 * 4096));
  const auto a = *s.next(), b = *s.next();
  s.completed(a.wr_id, false);  // in the retry ring when every rail goes
  s.fail_all(std::make_error_code(std::errc::network_down), "every rail is down");
  EXPECT_FALSE(s.take_finished());  // b still in flight: a read's data could still land
  EXPECT_FALSE(s.next());           // neither the retried chunk nor the rest
  s.completed(b.wr_id, false);      // flushed
  const auto f = s.take_finished();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->error, std::errc::network_down);
  EXPECT_EQ(f->why, "every rail is down");
  EXPECT_FALSE(s.has_work());
}

TEST(RailsSchedule, AFullTableRefusesAndAZeroLengthTransferEndsAtOnce) {
  Schedule s(2, 4, 4096);
  ASSERT_TRUE(s.start(1, Op::write, &region, 0, 0, 4096));
  ASSERT_TRUE(s.start(2, Op::write, &region, 0, 0, 0));
  EXPECT_FALSE(s.start(3, Op::write, &region, 0, 0, 4096));
  const auto two = s.take_finished();
  EXPECT_EQ(two->id, 2u);
  s.release(two->entry);
  EXPECT_TRUE(s.start(3, Op::write, &region, 0, 0, 4096));
  EXPECT_TRUE(s.in_progress(1));
  EXPECT_TRUE(s.in_progress(3));
  EXPECT_FALSE(s.in_progress(2));
}

TEST(RailsSchedule, AnEntryFreedAfterAFailureIsQueuedOnceWhenReused) {
  // A failed transfer leaves the queue of transfers to post at once: reusing its entry many times
  // never queues it twice (the queue holds as many entries as the table).
  Schedule s(1, 4, 4096);
  for (std::uint64_t id = 1; id <= 50; ++id) {
    ASSERT_TRUE(s.start(id, Op::write, &region, 0, 0, 4 * 4096)) << id;
    const auto c = *s.next();
    s.fail_all(std::make_error_code(std::errc::network_down), "down");
    s.completed(c.wr_id, false);
    const auto f = s.take_finished();
    ASSERT_TRUE(f) << id;
    EXPECT_EQ(f->id, id);
    s.release(f->entry);
    EXPECT_FALSE(s.has_work()) << id;
  }
  ASSERT_TRUE(s.start(99, Op::write, &region, 0, 0, 2 * 4096));
  int chunks = 0;
  while (auto c = s.next()) {
    ++chunks;
    s.completed(c->wr_id, true);
  }
  EXPECT_EQ(chunks, 2);
  EXPECT_EQ(s.take_finished()->id, 99u);
}

TEST(RailsSchedule, AFailedTransfersChunksWaitingToGoAgainAreNotPostedForTheNextOneInItsEntry) {
  // A chunk of T flushed by a failed rail waits in the retry ring; then another of T's chunks is
  // refused (a request error): T fails, finishes, and its entry goes to V. V's chunks are V's
  // own: T's waiting chunk must not come out as V's.
  Schedule s(1, 4, 4096);
  ASSERT_TRUE(s.start(1, Op::write, &region, 0, 0, 2 * 4096));
  const auto c0 = *s.next(), c1 = *s.next();
  s.completed(c1.wr_id, false);  // flushed: waits to go again
  s.fail(static_cast<std::uint32_t>(c0.wr_id >> Schedule::chunk_bits), std::make_error_code(std::errc::permission_denied),
         "refused");
  s.completed(c0.wr_id, false);
  const auto f = s.take_finished();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->error, std::errc::permission_denied);
  s.release(f->entry);
  ASSERT_TRUE(s.start(2, Op::write, &region, 0, 0, 4096));  // one chunk, in T's entry
  const auto v = s.next();
  ASSERT_TRUE(v);
  EXPECT_EQ(chunk_of(*v), 0u);
  EXPECT_EQ(v->length, 4096u);
  EXPECT_FALSE(s.next()) << "a chunk of the failed transfer came out as the new one's";
  s.completed(v->wr_id, true);
  const auto g = s.take_finished();
  ASSERT_TRUE(g);
  EXPECT_EQ(g->id, 2u);
  EXPECT_FALSE(g->error);
}

TEST(RailsSchedule, AFinishedTransferHoldsItsEntryUntilReleased) {
  // The table bounds the transfers started and not yet handed to the caller: finished ones too.
  Schedule s(1, 4, 4096);
  ASSERT_TRUE(s.start(1, Op::write, &region, 0, 0, 0));
  const auto f = s.take_finished();
  ASSERT_TRUE(f);
  EXPECT_FALSE(s.start(2, Op::write, &region, 0, 0, 4096));
  s.release(f->entry);
  EXPECT_TRUE(s.start(2, Op::write, &region, 0, 0, 4096));
}

TEST(RailsSchedule, UnderRandomFailuresEveryChunkCompletesExactlyOnceWithinTheRing) {
  // 3 slots x 2 in flight; each completion fails with probability 0.3. The ring never holds more
  // than the slots' room, and every chunk of every transfer completes successfully exactly once.
  constexpr std::uint32_t slots = 3, room = 2, capacity = slots * room;
  Schedule s(8, capacity, 4096);
  std::mt19937 rng(12345);
  std::map<std::uint32_t, std::uint64_t> id_at;              // table entry -> transfer id
  std::map<std::uint64_t, std::uint64_t> chunks_of;          // transfer id -> chunks
  std::map<std::pair<std::uint64_t, std::uint64_t>, int> ok;  // (id, chunk) -> successes
  std::vector<std::uint64_t> in_flight;
  std::uint64_t started = 0, finished = 0;
  for (int step = 0; step < 20000 && finished < 40; ++step) {
    if (started < 40 && s.active() < 8 && rng() % 4 == 0) {
      const std::uint64_t length = (1 + rng() % 9) * 4096 - (rng() % 2) * 100;
      const auto t = s.start(++started, Op::write, &region, 0, 0, length);
      ASSERT_TRUE(t);
      id_at[*t] = started;
      chunks_of[started] = (length + 4095) / 4096;
    }
    while (in_flight.size() < capacity) {
      const auto c = s.next();
      if (!c) break;
      in_flight.push_back(c->wr_id);
    }
    ASSERT_LE(s.retrying() + in_flight.size(), capacity);
    if (!in_flight.empty()) {
      const std::size_t i = rng() % in_flight.size();
      const std::uint64_t wr = in_flight[i];
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
      const bool success = rng() % 10 >= 3;
      if (success) ++ok[{id_at.at(static_cast<std::uint32_t>(wr >> Schedule::chunk_bits)), index_of(wr)}];
      s.completed(wr, success);
    }
    while (auto f = s.take_finished()) {
      EXPECT_FALSE(f->error);
      s.release(f->entry);
      ++finished;
      for (std::uint64_t k = 0; k < chunks_of.at(f->id); ++k)
        EXPECT_EQ((ok[{f->id, k}]), 1) << "transfer " << f->id << " chunk " << k;
    }
  }
  EXPECT_EQ(finished, 40u);
  EXPECT_TRUE(in_flight.empty());
}
