// What the host tests of the posting paths (QueuePair::post, SendBatch) post on the provider
// stub: slices that name no real memory (the stub reads none) and the QP's granted capacity.
#pragma once

#include <cstdint>

#include <infiniband/verbs.h>

#include <verbs/memory_region.hpp>

namespace verbs_stub {

inline const verbs::LocalSlice kSrc{0x1000, 64, 0x11};
inline const verbs::RemoteSlice kDst{.addr = 0x20000, .length = 128, .rkey = 0x22};
inline const verbs::LocalSlice kResult{0x4000, 8, 0x44};
inline const verbs::RemoteSlice kTarget{.addr = 0x30008, .length = 8, .rkey = 0x33};

/// A 16-deep QP's capacity with `send_sge` send SGEs and `inline_data` inline bytes.
inline ibv_qp_cap caps(std::uint32_t send_sge, std::uint32_t inline_data = 0) {
  return {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = send_sge, .max_recv_sge = 1,
          .max_inline_data = inline_data};
}

}  // namespace verbs_stub
