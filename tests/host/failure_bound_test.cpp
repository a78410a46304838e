// failure_bound(), ack_timeout_duration() and rnr_timer_duration(): the longest a request can
// take to fail, from TransportOptions. The expected figures are worked out here from the
// specification's definitions (4.096 us x 2^n; the RNR table's doubling pattern), not copied
// from the implementation.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>

#include <verbs/queue_pair.hpp>

namespace {

using namespace std::chrono_literals;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using verbs::Errc;
using verbs::FailureBound;
using verbs::TransportOptions;
using verbs::failure_bound;

// The RNR table as the specification builds it: from code 2 on, the values alternate between
// 2 x 2^k and 3 x 2^k units of 10 us (0.02, 0.03, 0.04, 0.06, 0.08, 0.12 ms ...); code 1 is
// 0.01 ms and code 0, the largest, 655.36 ms.
microseconds spec_rnr(unsigned code) {
  if (code == 0) return 655360us;
  if (code == 1) return 10us;
  const unsigned m = code - 2;
  return microseconds(10 * (m % 2 == 0 ? 2 : 3) * (std::int64_t{1} << (m / 2)));
}

// Rounds up to whole milliseconds, by integer arithmetic on nanoseconds.
milliseconds up(std::int64_t ns) { return milliseconds((ns + 999'999) / 1'000'000); }

Errc thrown(auto&& f) {
  try {
    f();
  } catch (const verbs::Error& e) {
    EXPECT_EQ(e.code().category(), verbs::verbs_category());
    return static_cast<Errc>(e.code().value());
  }
  ADD_FAILURE() << "nothing was thrown";
  return Errc{};
}

// ---- the two tables ----

TEST(FailureBound, RnrTimerTableHasTheSpecificationsValues) {
  // Values as the specification prints them.
  EXPECT_EQ(verbs::rnr_timer_duration(0), 655360us);
  EXPECT_EQ(verbs::rnr_timer_duration(1), 10us);
  EXPECT_EQ(verbs::rnr_timer_duration(5), 60us);
  EXPECT_EQ(verbs::rnr_timer_duration(12), 640us);
  EXPECT_EQ(verbs::rnr_timer_duration(25), 61440us);  // rxe's own table says 61.41 ms here
  EXPECT_EQ(verbs::rnr_timer_duration(30), 327680us);
  EXPECT_EQ(verbs::rnr_timer_duration(31), 491520us);
  for (unsigned c = 0; c <= 31; ++c) EXPECT_EQ(verbs::rnr_timer_duration(static_cast<std::uint8_t>(c)), spec_rnr(c)) << c;
}

TEST(FailureBound, RnrTimerGrowsWithItsCodeFromOneOn) {
  for (std::uint8_t c = 2; c <= 31; ++c)
    EXPECT_GT(verbs::rnr_timer_duration(c), verbs::rnr_timer_duration(c - 1)) << int(c);
  EXPECT_GT(verbs::rnr_timer_duration(0), verbs::rnr_timer_duration(31)) << "0 is the longest";
}

TEST(FailureBound, AckTimeoutIs4096NanosecondsTimesTwoToTheCodeAndZeroIsNone) {
  EXPECT_EQ(verbs::ack_timeout_duration(0), std::nullopt);
  for (std::uint8_t c = 1; c <= 31; ++c) {
    nanoseconds expected(4096);
    for (int i = 0; i < c; ++i) expected *= 2;
    EXPECT_EQ(verbs::ack_timeout_duration(c), expected) << int(c);
  }
  EXPECT_EQ(verbs::ack_timeout_duration(14), nanoseconds(67'108'864));
}

TEST(FailureBound, TablesRefuseCodesOver31) {
  EXPECT_EQ(thrown([] { (void)verbs::rnr_timer_duration(32); }), Errc::bad_argument);
  EXPECT_EQ(thrown([] { (void)verbs::ack_timeout_duration(32); }), Errc::bad_argument);
  EXPECT_EQ(thrown([] { (void)verbs::rnr_timer_duration(255); }), Errc::bad_argument);
}

// ---- the bound ----

TEST(FailureBound, OfTheDefaults) {
  const TransportOptions d{};
  const FailureBound b = failure_bound(d);
  // 7 tries (retry_count 6 + 1), each timeout at most 4 x 4.096 us x 2^14; 6 RNR waits of 491.52 ms.
  const std::int64_t transport_ns = std::int64_t{7} * 4 * (std::int64_t{4096} << 14);
  const std::int64_t rnr_ns = std::int64_t{6} * 491'520'000;
  EXPECT_EQ(b.transport, up(transport_ns));
  EXPECT_EQ(b.rnr, up(rnr_ns));
  EXPECT_EQ(b.total, up(transport_ns + rnr_ns));
  EXPECT_EQ(b.transport, 1880ms);  // 1879.048 ms, rounded up
  EXPECT_EQ(b.rnr, 2950ms);        // 2949.12 ms
  EXPECT_EQ(b.total, 4829ms);      // 4828.168 ms
}

TEST(FailureBound, IsUsableAtCompileTime) {
  constexpr FailureBound b = failure_bound(TransportOptions{.ack_timeout = 12, .retry_count = 3, .rnr_retry_count = 3});
  static_assert(b.transport == milliseconds(269));  // 4 x 4 x 16.777216 ms = 268.435456 ms
  static_assert(b.rnr == milliseconds(1475));       // 3 x 491.52 ms = 1474.56 ms
  static_assert(verbs::rnr_timer_duration(31) == 491520us);
  EXPECT_EQ(b.total, up(std::int64_t{16} * (std::int64_t{4096} << 12) + std::int64_t{3} * 491'520'000));
}

TEST(FailureBound, TheRnrWaitIsThePeersTimer) {
  const TransportOptions mine{.min_rnr_timer = 31, .rnr_retry_count = 5};
  EXPECT_EQ(failure_bound(mine, 12).rnr, up(5 * 640'000));         // 3.2 ms
  EXPECT_EQ(failure_bound(mine, 0).rnr, up(5 * 655'360'000LL));    // 3276.8 ms
  EXPECT_EQ(failure_bound(mine).rnr, failure_bound(mine, 31).rnr) << "without a peer's timer, my own";
  EXPECT_EQ(failure_bound(mine, 12).transport, failure_bound(mine, 0).transport) << "the RNR timer has no say in it";
}

TEST(FailureBound, NoRetriesStillWaitOneTimeoutButNoRnrTimer) {
  const FailureBound b = failure_bound(TransportOptions{.ack_timeout = 10, .retry_count = 0, .rnr_retry_count = 0});
  EXPECT_EQ(b.transport, up(4 * (std::int64_t{4096} << 10)));  // one try: 16.78 ms -> 17 ms
  EXPECT_EQ(b.rnr, 0ms) << "the first RNR NAK fails the request";
  EXPECT_EQ(b.total, b.transport);
}

TEST(FailureBound, Rnr7IsInfiniteAndSoIsTheTotal) {
  const FailureBound b = failure_bound(TransportOptions{.rnr_retry_count = 7});
  EXPECT_EQ(b.rnr, std::nullopt);
  EXPECT_EQ(b.total, std::nullopt);
  EXPECT_EQ(b.transport, failure_bound(TransportOptions{}).transport);
}

TEST(FailureBound, Retry7IsInfiniteAsOnRxe) {
  const FailureBound b = failure_bound(TransportOptions{.retry_count = 7});
  EXPECT_EQ(b.transport, std::nullopt);
  EXPECT_EQ(b.total, std::nullopt);
  EXPECT_EQ(b.rnr, failure_bound(TransportOptions{}).rnr);
}

TEST(FailureBound, AckTimeoutZeroMeansNoTimerSoNoTransportBound) {
  for (std::uint8_t retry = 0; retry <= 7; ++retry) {
    const FailureBound b = failure_bound(TransportOptions{.ack_timeout = 0, .retry_count = retry});
    EXPECT_EQ(b.transport, std::nullopt) << int(retry);
    EXPECT_EQ(b.total, std::nullopt) << int(retry);
    EXPECT_TRUE(b.rnr.has_value()) << int(retry);
  }
}

TEST(FailureBound, GrowsWithEveryInputAndTotalIsAtLeastEachPart) {
  for (std::uint8_t t = 1; t <= 31; ++t)
    for (std::uint8_t r = 0; r <= 6; ++r) {
      const FailureBound b = failure_bound(TransportOptions{.ack_timeout = t, .retry_count = r});
      ASSERT_TRUE(b.transport && b.total) << int(t) << " " << int(r);
      EXPECT_GE(*b.total, *b.transport);
      EXPECT_GE(*b.total, *b.rnr);
      EXPECT_LE(*b.total, *b.transport + *b.rnr) << "rounded up once, not twice";
      // Strictly so where the difference survives rounding up to whole milliseconds: a doubled
      // figure over 1 ms, or one more timeout (4 Tr) of at least 1 ms (ack_timeout 6 on).
      if (t > 1) {
        const auto shorter = *failure_bound(TransportOptions{.ack_timeout = std::uint8_t(t - 1), .retry_count = r}).transport;
        EXPECT_GE(*b.transport, shorter) << int(t) << " " << int(r);
        if (shorter > 1ms) {
          EXPECT_GT(*b.transport, shorter) << int(t) << " " << int(r);
        }
      }
      if (r > 0) {
        const auto fewer = *failure_bound(TransportOptions{.ack_timeout = t, .retry_count = std::uint8_t(r - 1)}).transport;
        EXPECT_GE(*b.transport, fewer) << int(t) << " " << int(r);
        if (t >= 6) {
          EXPECT_GT(*b.transport, fewer) << int(t) << " " << int(r);
        }
      }
    }
  for (std::uint8_t n = 1; n <= 6; ++n)
    EXPECT_GT(*failure_bound(TransportOptions{.rnr_retry_count = n}).rnr,
              *failure_bound(TransportOptions{.rnr_retry_count = std::uint8_t(n - 1)}).rnr) << int(n);
  for (std::uint8_t c = 2; c <= 31; ++c) {
    const auto longer = *failure_bound(TransportOptions{}, c).rnr;
    const auto shorter = *failure_bound(TransportOptions{}, std::uint8_t(c - 1)).rnr;
    EXPECT_GE(longer, shorter) << int(c);
    // 6 retries: strictly longer where the waits differ by a millisecond in all (code 13 on).
    if (6 * (spec_rnr(c) - spec_rnr(c - 1u)) >= 1ms) {
      EXPECT_GT(longer, shorter) << int(c);
    }
  }
}

TEST(FailureBound, LargestInputsDoNotOverflow) {
  const FailureBound b = failure_bound(TransportOptions{.ack_timeout = 31, .retry_count = 6, .rnr_retry_count = 6}, 0);
  // 7 x 4 x 4.096 us x 2^31 = 246290.6 s; 6 x 655.36 ms.
  EXPECT_EQ(b.transport, up(std::int64_t{28} * (std::int64_t{4096} << 31)));
  EXPECT_EQ(b.rnr, up(6 * 655'360'000LL));
  EXPECT_EQ(b.total, up(std::int64_t{28} * (std::int64_t{4096} << 31) + 6 * 655'360'000LL));
  EXPECT_GT(*b.transport, 68h);
}

TEST(FailureBound, OutOfRangeOptionsAreRefused) {
  EXPECT_EQ(thrown([] { (void)failure_bound(TransportOptions{.ack_timeout = 32}); }), Errc::bad_argument);
  EXPECT_EQ(thrown([] { (void)failure_bound(TransportOptions{.retry_count = 8}); }), Errc::bad_argument);
  EXPECT_EQ(thrown([] { (void)failure_bound(TransportOptions{.rnr_retry_count = 8}); }), Errc::bad_argument);
  EXPECT_EQ(thrown([] { (void)failure_bound(TransportOptions{.min_rnr_timer = 32}); }), Errc::bad_argument);
  EXPECT_EQ(thrown([] { (void)failure_bound(TransportOptions{}, 32); }), Errc::bad_argument);
  // The options will set up a QP too: a bad own RNR timer is refused even when the peer's is given.
  EXPECT_EQ(thrown([] { (void)failure_bound(TransportOptions{.min_rnr_timer = 32}, 31); }), Errc::bad_argument);
  try {
    (void)failure_bound(TransportOptions{.retry_count = 9});
    ADD_FAILURE() << "nothing was thrown";
  } catch (const verbs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("retry_count"), std::string::npos) << e.what();
  }
}

}  // namespace
