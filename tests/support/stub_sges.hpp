// Every scatter/gather entry the provider stub is handed, copied out while the post runs (the
// stub itself keeps the first SGE of the last send only): for the host tests of what a request
// carries once the caller's array of slices is gone or reused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <verbs/memory_region.hpp>

#include "support/stub_provider.hpp"

namespace verbs_stub {

/// While it lives, the stub's post_send and post_recv also record each request's SGEs (one
/// vector per request, in the order posted), then do what the stub does. One at a time.
class SgeRecorder {
 public:
  explicit SgeRecorder(Provider& p) : p_(p) {
    current_() = this;
    p.vctx.context.ops.post_send = &send_;
    p.vctx.context.ops.post_recv = &recv_;
  }
  SgeRecorder(const SgeRecorder&) = delete;
  SgeRecorder& operator=(const SgeRecorder&) = delete;
  ~SgeRecorder() {
    p_.vctx.context.ops.post_send = &Provider::post_send;
    p_.vctx.context.ops.post_recv = &Provider::post_recv;
    current_() = nullptr;
  }

  std::vector<std::vector<ibv_sge>> sends;  ///< the SGEs of each send-queue request posted
  std::vector<std::vector<ibv_sge>> recvs;  ///< the SGEs of each receive posted

 private:
  static SgeRecorder*& current_() {
    static SgeRecorder* r = nullptr;
    return r;
  }
  template <typename Wr>
  static void record_(std::vector<std::vector<ibv_sge>>& into, const Wr* wr) {
    for (; wr != nullptr; wr = wr->next)
      into.emplace_back(wr->sg_list, wr->sg_list + (wr->num_sge > 0 ? wr->num_sge : 0));
  }
  static int send_(ibv_qp* q, ibv_send_wr* wr, ibv_send_wr** bad) {
    if (Provider::of(q->context).post_rc == 0) record_(current_()->sends, wr);
    return Provider::post_send(q, wr, bad);
  }
  static int recv_(ibv_qp* q, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    if (Provider::of(q->context).post_rc == 0) record_(current_()->recvs, wr);
    return Provider::post_recv(q, wr, bad);
  }

  Provider& p_;
};

/// `got` (SGEs the provider was handed) names exactly the slices `want`, in order.
inline ::testing::AssertionResult same_sges(const std::vector<ibv_sge>& got, std::span<const verbs::LocalSlice> want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " SGEs, not " << want.size();
  for (std::size_t i = 0; i < want.size(); ++i) {
    const ibv_sge& g = got[i];
    if (g.addr != want[i].addr() || g.length != want[i].length() || g.lkey != want[i].lkey()) {
      std::ostringstream m;  // one stream: AssertionResult's << would drop std::hex between its pieces
      m << std::hex << std::showbase << "SGE " << i << " is {addr " << g.addr << ", length " << g.length << ", lkey "
        << g.lkey << "}, not {addr " << want[i].addr() << ", length " << want[i].length() << ", lkey "
        << want[i].lkey() << "}";
      return ::testing::AssertionFailure() << m.str();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace verbs_stub
