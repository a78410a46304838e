// The global operator new, replaced (replaced_new.cpp) for the tests that watch allocation:
// data_path_test.cpp counts it on the data path, rails_alloc_test.cpp makes it fail. Linked only
// into the executables that hold those tests, and never into a ThreadSanitizer build, whose
// runtime defines operator new itself (tests/CMakeLists.txt).
#pragma once

#include <atomic>

namespace verbs::test::replaced_new {

/// While `counting` is true, every allocation (of any thread) adds one to `count`.
extern std::atomic<bool> counting;
extern std::atomic<long> count;
/// While true, every allocation of this thread throws std::bad_alloc.
extern thread_local bool failing;

/// While one lives, every allocation of this thread throws std::bad_alloc.
class NoMemory {
 public:
  NoMemory() noexcept { failing = true; }
  NoMemory(const NoMemory&) = delete;
  NoMemory& operator=(const NoMemory&) = delete;
  ~NoMemory() { failing = false; }
};

}  // namespace verbs::test::replaced_new
