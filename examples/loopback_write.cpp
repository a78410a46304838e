// Two queue pairs on one device, connected to each other: one RDMA-writes into the other's
// buffer. The smallest complete use of the core API (docs/core.md).
#include <verbs/verbs.hpp>

#include <cstdio>
#include <cstring>

using namespace std::chrono_literals;

int main() try {
  verbs::Device dev = verbs::Device::open_first();
  verbs::ProtectionDomain pd{dev};
  verbs::CompletionQueue cq{dev, {.depth = 64, .with_channel = true}};

  // The target grants remote write; the source needs no access right at all.
  auto src = verbs::MemoryRegion::allocate(pd, 4096);
  auto dst = verbs::MemoryRegion::allocate(pd, 4096, verbs::Access::local_write | verbs::Access::remote_write);

  verbs::QueuePair a{pd, cq};
  verbs::QueuePair b{pd, cq, {.access = verbs::Access::remote_write}};
  a.connect(b.endpoint());  // in real use, endpoints travel over rdma_cm or a socket
  b.connect(a.endpoint());

  std::memcpy(src.data(), "hello, RDMA", 12);
  a.post_write(src.slice(0, 12), dst.remote(), {.wr_id = 1}).check();
  auto wc = cq.wait_one(5s);
  if (!wc) throw std::runtime_error("no completion within 5 s");
  wc->throw_if_failed();
  std::printf("wr_id %llu: %s\n", static_cast<unsigned long long>(wc->wr_id()),
              reinterpret_cast<const char*>(dst.data()));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "loopback_write: %s\n", e.what());
  return 1;
}
