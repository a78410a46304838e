// The main() of every gtest executable here, in place of GTest::gtest_main, so that a test
// process's exit status cannot hide what happened in it:
//   0   at least one test passed and none failed
//   1   a test failed, or no test matched the filter (a suite that vanished is not a pass)
//   77  every test that ran chose to skip (GTEST_SKIP): ctest's SKIP_RETURN_CODE
// A process that runs several tests (one per suite, the threaded ones) can pass with some of them
// skipped: so each test's outcome is also appended, one line per test, to the file named by
// VERBS_TEST_RESULTS when it is set ("passed|failed|skipped<TAB>Suite.Test<TAB>why skipped"),
// which scripts/test checks against tests/expected-skips.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

class ResultLog : public testing::EmptyTestEventListener {
 public:
  explicit ResultLog(const char* path) : fd_(::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
    if (fd_ < 0) std::fprintf(stderr, "gtest_main: cannot append to VERBS_TEST_RESULTS=%s\n", path);
  }
  ~ResultLog() override {
    if (fd_ >= 0) ::close(fd_);
  }
  ResultLog(const ResultLog&) = delete;
  ResultLog& operator=(const ResultLog&) = delete;
  bool ok() const { return fd_ >= 0; }

  void OnTestStart(const testing::TestInfo&) override { reason_.clear(); }
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.skipped() || !reason_.empty()) return;
    reason_ = r.message();
    for (char& c : reason_)
      if (c == '\n' || c == '\t') c = ' ';
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    const testing::TestResult& r = *info.result();
    const char* what = r.Failed() ? "failed" : r.Skipped() ? "skipped" : "passed";
    std::string line = std::string(what) + '\t' + info.test_suite_name() + '.' + info.name() + '\t' +
                       (r.Skipped() && !r.Failed() ? reason_ : std::string()) + '\n';
    // One write per line, O_APPEND: lines of processes running at once do not interleave.
    if (fd_ >= 0 && ::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      std::fprintf(stderr, "gtest_main: a line of VERBS_TEST_RESULTS was not written\n");
  }

 private:
  int fd_;
  std::string reason_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (const char* path = std::getenv("VERBS_TEST_RESULTS"); path != nullptr && *path != '\0') {
    auto* log = new ResultLog(path);  // the listener list owns it
    if (!log->ok()) return 1;
    testing::UnitTest::GetInstance()->listeners().Append(log);
  }
  const int rc = RUN_ALL_TESTS();
  if (GTEST_FLAG_GET(list_tests) || rc != 0) return rc;
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  if (unit.test_to_run_count() == 0) {
    std::fprintf(stderr, "gtest_main: no test matched the filter '%s': a suite that is not there fails\n",
                 GTEST_FLAG_GET(filter).c_str());
    return 1;
  }
  if (unit.successful_test_count() == 0 && unit.skipped_test_count() > 0) {
    std::printf("gtest_main: every test that ran skipped (exit 77)\n");
    return 77;
  }
  return 0;
}
