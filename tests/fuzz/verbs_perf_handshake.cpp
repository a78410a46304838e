// verbs-perf's handshake (bench/verbs-perf/handshake.hpp) on a peer's bytes. The first byte
// picks the message: 0 a TCP frame header, 1 a side of the TCP exchange (QP count from the
// second byte), 2 the parameter block, 3 the client's rdma_cm private data as the server gets
// it. Each is decoded, and what is accepted must encode back to the same bytes.
#include <algorithm>

#include "check.hpp"
#include "handshake.hpp"
#include "cm_private_data.hpp"

namespace {

/// decode_params' output encodes back to its input, but for the flag bits and the byte it ignores.
void check_params(std::span<const std::byte> wire, const perf::Config& c) {
  std::vector<std::byte> want(wire.begin(), wire.begin() + perf::kParamsWire);
  want[4] &= std::byte{7};
  want[5] = std::byte{0};
  FUZZ_CHECK(perf::encode_params(c) == want);
}

perf::Config server_for(std::span<const std::byte> wire) {
  perf::Config c;  // a server runs the test the client asks for, or the decode fails early
  if (wire.size() > 3) c.test = static_cast<perf::Test>(std::to_integer<unsigned>(wire[3]) % (static_cast<unsigned>(perf::Test::atomic_lat) + 1));
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  if (size < 2) return -1;
  const auto in = fuzz::input(data, size).subspan(1);
  switch (data[0] % 4) {
    case 0: {
      if (in.size() != 4) return -1;
      const unsigned char len[4] = {data[1], data[2], data[3], data[4]};
      const auto n = fuzz::take(in, 0, 4);
      try {
        FUZZ_CHECK(perf::frame_length(len) == n && n <= perf::kMaxFrame);
      } catch (const perf::Failure&) {
        FUZZ_CHECK(n > perf::kMaxFrame);
      }
      break;
    }
    case 1: {
      const std::size_t qps = std::to_integer<std::size_t>(in[0]) % 4 + 1;
      const auto msg = in.subspan(1);
      try {
        const perf::Side s = perf::decode_side(msg, qps);
        FUZZ_CHECK(s.endpoints.size() == qps);
        FUZZ_CHECK(perf::encode_side(s.endpoints, s.region) == std::vector<std::byte>(msg.begin(), msg.end()));
      } catch (const perf::Failure&) {
      } catch (const verbs::Error& e) {
        FUZZ_CHECK(e.code() == verbs::Errc::bad_encoding);
      }
      break;
    }
    case 2: {
      perf::Config c = server_for(in);
      try {
        perf::decode_params(in, c);
        check_params(in, c);
      } catch (const perf::Failure&) {
      }
      break;
    }
    case 3: {
      // As rdma_cm hands it over: the connection strips an exposed slice first.
      if (in.size() > 56) return -1;  // rdma_cm's limit for a connect request
      const std::vector<std::byte> peer =
          verbs::detail::parse_cm_private_data(std::vector<std::byte>(in.begin(), in.end())).rest;
      perf::Config c = server_for(peer);
      try {
        perf::decode_cm_params(peer, c);
        check_params(peer, c);
      } catch (const perf::Failure&) {
      }
      break;
    }
  }
  return 0;
}
