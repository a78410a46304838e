// The global operator new and delete, over malloc and free, counting or failing as
// replaced_new.hpp says.
#include "replaced_new.hpp"

#include <cstdlib>
#include <new>

namespace verbs::test::replaced_new {
std::atomic<bool> counting{false};
std::atomic<long> count{0};
thread_local bool failing = false;
}  // namespace verbs::test::replaced_new

void* operator new(std::size_t n) {
  namespace r = verbs::test::replaced_new;
  if (r::failing) throw std::bad_alloc();
  if (r::counting.load(std::memory_order_relaxed)) r::count.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
