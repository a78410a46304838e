// cm::Datagram without a device: what is refused before anything is made, and its value
// semantics.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#include <verbs/cm_datagram.hpp>

namespace {

static_assert(std::is_nothrow_move_constructible_v<verbs::cm::Datagram>);
static_assert(std::is_nothrow_move_assignable_v<verbs::cm::Datagram>);
static_assert(!std::is_copy_constructible_v<verbs::cm::Datagram>);
static_assert(std::is_nothrow_destructible_v<verbs::cm::Datagram>);
static_assert(!std::is_copy_constructible_v<verbs::cm::DatagramPeer>, "it holds an AddressHandle");
static_assert(std::is_nothrow_move_constructible_v<verbs::cm::DatagramPeer>);

template <typename F>
verbs::cm::ConnectError refusal(F&& f) {
  try {
    f();
  } catch (const verbs::cm::ConnectError& e) {
    return e;
  }
  ADD_FAILURE() << "nothing was thrown";
  return {std::error_code{}, verbs::cm::Phase::listen, ""};
}

TEST(CmDatagramOptions, AQpOfAnotherTypeIsRefusedBeforeAnythingIsMade) {
  const auto e = refusal([] { verbs::cm::Datagram d("192.0.2.1", 0, {.qp = {.type = verbs::QpType::rc}}); });
  EXPECT_EQ(e.code(), std::errc::invalid_argument);
  EXPECT_EQ(e.phase(), verbs::cm::Phase::listen);
  EXPECT_NE(std::string(e.what()).find("a Datagram is a UD QP"), std::string::npos) << e.what();
}

TEST(CmDatagramOptions, AWildcardAddressIsRefusedSinceTheQpNeedsOneDevice) {
  for (const char* wild : {"0.0.0.0", "::", ""}) {
    const auto e = refusal([&] { verbs::cm::Datagram d(wild, 0); });
    EXPECT_EQ(e.code(), std::errc::invalid_argument) << wild;
    EXPECT_NE(std::string(e.what()).find("one RDMA device"), std::string::npos) << e.what();
  }
}

TEST(CmDatagramOptions, TheQKeyIsRdmaCmsForUdp) {
  EXPECT_EQ(verbs::cm::datagram_qkey, 0x01234567u);
  EXPECT_EQ(verbs::cm::multicast_qp_num, 0xffffffu);
}

}  // namespace
