// The global operator new and delete, over malloc and free, counting or failing as
// replaced_new.hpp says. Every form that does not take an alignment is replaced, so that
// nothing newed by the runtime's own forms (a sanitizer's) is freed by these, or the other way.
#include "replaced_new.hpp"

#include <cstdlib>
#include <new>

namespace verbs::test::replaced_new {
std::atomic<bool> counting{false};
std::atomic<long> count{0};
thread_local bool failing = false;
}  // namespace verbs::test::replaced_new

namespace {
void* allocate(std::size_t n) noexcept {
  namespace r = verbs::test::replaced_new;
  if (r::failing) return nullptr;
  if (r::counting.load(std::memory_order_relaxed)) r::count.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
