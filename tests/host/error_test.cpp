// Errors (error.hpp): the "verbs" and "ibv_wc_status" categories, verbs::Error with its source
// location, the detail:: helpers for the three ways verbs fail, Completion errors and PostResult.
#include <gtest/gtest.h>

#include <cerrno>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <verbs/completion_queue.hpp>
#include <verbs/error.hpp>
#include <verbs/work_request.hpp>

#include "support/expect.hpp"

namespace {

using verbs::Errc;
using verbs::WcStatus;

using verbs::test::contains;
using verbs::test::thrown_by;

constexpr int kFirstErrc = static_cast<int>(Errc::local_out_of_bounds);
constexpr int kLastErrc = static_cast<int>(Errc::flush_unsupported);

static_assert(std::is_error_code_enum_v<Errc>);
static_assert(std::is_error_code_enum_v<WcStatus>);
static_assert(std::is_base_of_v<std::system_error, verbs::Error>);

// ---- categories ----

TEST(VerbsCategory, IsNamedVerbs) { EXPECT_STREQ(verbs::verbs_category().name(), "verbs"); }

TEST(VerbsCategory, EveryErrcHasItsOwnSpecificMessage) {
  const std::string unknown = verbs::verbs_category().message(kLastErrc + 1);
  std::set<std::string> seen;
  for (int v = kFirstErrc; v <= kLastErrc; ++v) {
    const std::string m = verbs::verbs_category().message(v);
    EXPECT_FALSE(m.empty()) << v;
    EXPECT_FALSE(contains(m, "unknown")) << v << ": " << m;
    EXPECT_NE(m, unknown) << v;
    EXPECT_TRUE(seen.insert(m).second) << v << " shares its message \"" << m << '"';
  }
}

// A receive refused in RESET: the message names every way out, to_init() included (a newcomer
// who wanted receives posted before connecting read connect() and activate() only).
TEST(VerbsCategory, BadQpStateNamesEveryTransitionThatHelps) {
  const std::string m = std::error_code(Errc::bad_qp_state).message();
  for (const char* way : {"to_init()", "connect()", "activate()", "RTS", "INIT"})
    EXPECT_TRUE(contains(m, way)) << way;
}

TEST(VerbsCategory, UnknownValueMessageNamesTheNumber) {
  EXPECT_TRUE(contains(verbs::verbs_category().message(kLastErrc + 1), std::to_string(kLastErrc + 1)));
}

TEST(WcCategory, IsNamedAfterIbvWcStatus) { EXPECT_STREQ(verbs::wc_category().name(), "ibv_wc_status"); }

TEST(WcCategory, MessageHasStatusTextAndNumber) {
  for (int v = IBV_WC_SUCCESS; v <= IBV_WC_TM_RNDV_INCOMPLETE; ++v) {
    const std::string m = verbs::wc_category().message(v);
    EXPECT_TRUE(contains(m, ibv_wc_status_str(static_cast<ibv_wc_status>(v))));
    // Appended, not `"(" + to_string(v) + ")"`: g++ 12 at -O3 reports a false -Wrestrict there.
    std::string number = "(";
    number += std::to_string(v);
    number += ')';
    EXPECT_TRUE(contains(m, number));
  }
}

TEST(ErrorCode, ErrcConvertsImplicitly) {
  const std::error_code ec = Errc::timed_out;
  EXPECT_EQ(&ec.category(), &verbs::verbs_category());
  EXPECT_EQ(ec.value(), static_cast<int>(Errc::timed_out));
  EXPECT_EQ(ec.message(), verbs::verbs_category().message(static_cast<int>(Errc::timed_out)));
  EXPECT_TRUE(ec);
}

TEST(ErrorCode, WcStatusConvertsImplicitly) {
  const std::error_code ec = WcStatus::rem_access_err;
  EXPECT_EQ(&ec.category(), &verbs::wc_category());
  EXPECT_EQ(ec.value(), IBV_WC_REM_ACCESS_ERR);
  EXPECT_TRUE(contains(ec.message(), ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)));
}

TEST(ErrorCode, ErrcMapsToPortableConditions) {
  EXPECT_EQ(std::error_code(Errc::timed_out), std::errc::timed_out);
  EXPECT_EQ(std::error_code(Errc::no_device), std::errc::no_such_device);
  EXPECT_NE(std::error_code(Errc::timed_out), std::errc::no_such_device);
  EXPECT_NE(std::error_code(Errc::no_device), std::errc::timed_out);
  EXPECT_EQ(std::error_code(Errc::remote_out_of_bounds), std::errc::result_out_of_range);
  EXPECT_EQ(std::error_code(Errc::bad_argument), std::errc::invalid_argument);
}

// ---- verbs::Error ----

// Throws from a known line, so what() and where() can be checked against it.
[[noreturn]] void throw_from_here(int& line) {
  line = __LINE__ + 1;
  throw verbs::Error(Errc::bad_argument, "throw_from_here context");
}

TEST(Error, WhatHasContextReasonAndThrowSite) {
  int line = 0;
  const auto e = thrown_by([&] { throw_from_here(line); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), Errc::bad_argument);
  EXPECT_EQ(e->context(), "throw_from_here context");
  EXPECT_TRUE(contains(e->what(), "throw_from_here context"));
  EXPECT_TRUE(contains(e->what(), std::error_code(Errc::bad_argument).message()));
  EXPECT_TRUE(contains(e->what(), "error_test.cpp:" + std::to_string(line)));
  EXPECT_EQ(e->where().line(), static_cast<unsigned>(line));
  EXPECT_TRUE(contains(e->where().file_name(), "error_test.cpp"));
}

// ---- detail:: helpers: NULL plus errno, a returned errno, -1 plus errno ----

TEST(CheckPtr, ReturnsNonNullPointerUnchanged) {
  int x = 0;
  EXPECT_EQ(verbs::detail::check_ptr(&x, "ibv_fake"), &x);
}

TEST(CheckPtr, NullThrowsErrnoNamingTheVerb) {
  const auto e = thrown_by([] {
    errno = ENOMEM;
    (void)verbs::detail::check_ptr(static_cast<int*>(nullptr), "ibv_fake_alloc");
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::error_code(ENOMEM, std::generic_category()));
  EXPECT_EQ(e->context(), "ibv_fake_alloc");
  EXPECT_TRUE(contains(e->what(), "ibv_fake_alloc"));
}

TEST(CheckPtr, NullWithoutErrnoThrowsEio) {
  const auto e = thrown_by([] {
    errno = 0;
    (void)verbs::detail::check_ptr(static_cast<int*>(nullptr), "ibv_fake_alloc");
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::error_code(EIO, std::generic_category()));
}

TEST(CheckPtr, LocationIsTheCaller) {
  int line = 0;
  const auto e = thrown_by([&] {
    errno = EINVAL;
    line = __LINE__ + 1;
    (void)verbs::detail::check_ptr(static_cast<int*>(nullptr), "ibv_fake_alloc");
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->where().line(), static_cast<unsigned>(line));
  EXPECT_TRUE(contains(e->what(), "error_test.cpp:" + std::to_string(line)));
}

TEST(CheckRc, ZeroDoesNotThrow) {
  errno = EINVAL;  // a stale errno must not matter
  EXPECT_NO_THROW(verbs::detail::check_rc(0, "ibv_fake"));
}

TEST(CheckRc, ReturnedErrnoWinsOverErrno) {
  const auto e = thrown_by([] {
    errno = EPERM;
    verbs::detail::check_rc(EAGAIN, "ibv_fake_modify");
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::error_code(EAGAIN, std::generic_category()));
  EXPECT_EQ(e->context(), "ibv_fake_modify");
}

TEST(CheckRc, MinusOneThrowsErrno) {
  const auto e = thrown_by([] {
    errno = ENOENT;
    verbs::detail::check_rc(-1, "ibv_fake_query");
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::error_code(ENOENT, std::generic_category()));
}

TEST(CheckRc, LocationIsTheCaller) {
  int line = 0;
  const auto e = thrown_by([&] {
    line = __LINE__ + 1;
    verbs::detail::check_rc(EBUSY, "ibv_fake_destroy");
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->where().line(), static_cast<unsigned>(line));
  EXPECT_TRUE(contains(e->what(), "error_test.cpp:" + std::to_string(line)));
}

TEST(RcToErrno, CoversAllThreeConventions) {
  errno = EINVAL;
  EXPECT_EQ(verbs::detail::rc_to_errno(0), 0) << "success, whatever errno holds";
  EXPECT_EQ(verbs::detail::rc_to_errno(ENOMEM), ENOMEM) << "returned errno";
  errno = ENOENT;
  EXPECT_EQ(verbs::detail::rc_to_errno(-1), ENOENT) << "-1 plus errno";
  errno = 0;
  EXPECT_EQ(verbs::detail::rc_to_errno(-EBUSY), EBUSY) << "negative errno without errno set";
  errno = ENOENT;  // stale
  EXPECT_EQ(verbs::detail::rc_to_errno(-EBUSY), EBUSY) << "a negative errno wins over a stale errno";
}

// ---- Completion ----

ibv_wc failed_wc() {
  ibv_wc wc{};
  wc.wr_id = 42;
  wc.status = IBV_WC_REM_ACCESS_ERR;
  wc.qp_num = 0x1234;
  wc.vendor_err = 0x88;
  return wc;
}

TEST(Completion, FailedStatusIsAnErrorCodeInWcCategory) {
  const verbs::Completion c(failed_wc());
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.status(), WcStatus::rem_access_err);
  EXPECT_EQ(c.error_code(), WcStatus::rem_access_err);
  EXPECT_EQ(&c.error_code().category(), &verbs::wc_category());
  EXPECT_TRUE(contains(c.error_code().message(), "remote access error"));
}

TEST(Completion, ThrowIfFailedNamesStatusWrIdAndQp) {
  const verbs::Completion c(failed_wc());
  int line = 0;
  const auto e = thrown_by([&] {
    line = __LINE__ + 1;
    c.throw_if_failed();
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), WcStatus::rem_access_err);
  EXPECT_TRUE(contains(e->what(), "wr_id=42"));
  EXPECT_TRUE(contains(e->what(), "qp_num=4660"));
  EXPECT_TRUE(contains(e->what(), "vendor_err=0x88"));
  EXPECT_TRUE(contains(e->what(), ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)));
  EXPECT_EQ(e->where().line(), static_cast<unsigned>(line));
}

TEST(Completion, SuccessHasNoErrorAndDoesNotThrow) {
  ibv_wc wc{};
  wc.status = IBV_WC_SUCCESS;
  wc.wr_id = 1;
  const verbs::Completion c(wc);
  EXPECT_TRUE(c.ok());
  EXPECT_FALSE(c.error_code());
  EXPECT_NO_THROW(c.throw_if_failed());
}

TEST(Completion, ImmediateIsInHostOrderAndOnlyWhenFlagged) {
  ibv_wc wc{};
  wc.imm_data = htonl(0x01020304u);
  EXPECT_FALSE(verbs::Completion(wc).imm_data().has_value()) << "IBV_WC_WITH_IMM is not set";
  wc.wc_flags = IBV_WC_WITH_IMM;
  EXPECT_EQ(verbs::Completion(wc).imm_data(), 0x01020304u);
}

// ---- PostResult ----

static_assert(verbs::PostResult{}.ok());
static_assert(!verbs::PostResult::rejected(Errc::too_many_sge, 0).ok());
static_assert(!verbs::PostResult::device_error(ENOMEM, 0).ok());

TEST(PostResult, DefaultIsSuccess) {
  const verbs::PostResult r;
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(static_cast<bool>(r));
  EXPECT_FALSE(r.error());
  EXPECT_EQ(r.posted(), 0u);
  EXPECT_NO_THROW(r.check());
}

TEST(PostResult, RejectedCarriesErrcAndIndexWithNothingPosted) {
  const auto r = verbs::PostResult::rejected(Errc::remote_too_small, 3);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(static_cast<bool>(r));
  EXPECT_EQ(r.error(), Errc::remote_too_small);
  EXPECT_EQ(r.failed_index(), 3u);
  EXPECT_EQ(r.posted(), 0u) << "a failed check posts nothing";
}

TEST(PostResult, DeviceErrorCarriesErrnoAndCountsPostedRequests) {
  const auto r = verbs::PostResult::device_error(ENOMEM, 2);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error(), std::error_code(ENOMEM, std::generic_category()));
  EXPECT_EQ(r.failed_index(), 2u);
  EXPECT_EQ(r.posted(), 2u) << "requests before bad_wr went to the device";
}

TEST(PostResult, CheckThrowsWithCodeIndexAndCaller) {
  const auto r = verbs::PostResult::rejected(Errc::atomic_misaligned, 5);
  int line = 0;
  const auto e = thrown_by([&] {
    line = __LINE__ + 1;
    r.check();
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), Errc::atomic_misaligned);
  EXPECT_TRUE(contains(e->what(), "work request 5"));
  EXPECT_EQ(e->where().line(), static_cast<unsigned>(line));
}

TEST(PostResult, CheckOnDeviceErrorNamesIbvPost) {
  const auto e = thrown_by([] { verbs::PostResult::device_error(EINVAL, 1).check(); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::error_code(EINVAL, std::generic_category()));
  EXPECT_TRUE(contains(e->what(), "ibv_post"));
  EXPECT_TRUE(contains(e->what(), "work request 1"));
}

}  // namespace
