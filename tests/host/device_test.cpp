// device.hpp without a device: what a user sees on a host with no RDMA device, and the Gid and
// Mtu helpers. The no-device cases skip on a host that has one (e.g. with SoftRoCE).
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include <verbs/device.hpp>
#include <verbs/completion_queue.hpp>
#include <verbs/queue_pair.hpp>

#include "support/expect.hpp"
#include "support/stub_provider.hpp"
#include "detail.hpp"

namespace {

using verbs::Errc;
using verbs::Gid;

using verbs::test::contains;
using verbs::test::thrown_by;

// Whether the kernel shows an RDMA device, asked without libibverbs so that the answer does
// not depend on the code under test.
bool sysfs_has_rdma_device() {
  std::error_code ec;
  const std::filesystem::path dir = "/sys/class/infiniband";
  return std::filesystem::is_directory(dir, ec) && !std::filesystem::is_empty(dir, ec);
}

constexpr const char* kHasDevice =
    "this host has an RDMA device; these tests describe a host without one (the device tests cover the other case)";

TEST(NoDevice, ListDevicesIsEmptyNotAnError) {
  if (sysfs_has_rdma_device()) GTEST_SKIP() << kHasDevice;
  std::vector<verbs::DeviceInfo> devices;
  ASSERT_NO_THROW(devices = verbs::list_devices());
  EXPECT_TRUE(devices.empty()) << devices.size() << " devices listed, first: " << devices.front().name;
}

TEST(NoDevice, OpenFirstThrowsNoDeviceWithHowToCreateOne) {
  if (sysfs_has_rdma_device() || !verbs::list_devices().empty()) GTEST_SKIP() << kHasDevice;
  const auto e = thrown_by([] { (void)verbs::Device::open_first(); });
  ASSERT_TRUE(e) << "open_first() did not throw verbs::Error";
  EXPECT_EQ(e->code(), Errc::no_device);
  EXPECT_EQ(e->code(), std::errc::no_such_device);
  EXPECT_TRUE(contains(e->what(), "no RDMA device"));
  EXPECT_TRUE(contains(e->what(), "rdma link add"));
}

TEST(NoDevice, OpenByNameThrowsNoDeviceNamingIt) {
  if (sysfs_has_rdma_device() || !verbs::list_devices().empty()) GTEST_SKIP() << kHasDevice;
  const auto e = thrown_by([] { (void)verbs::Device::open("nosuch"); });
  ASSERT_TRUE(e) << "open(\"nosuch\") did not throw verbs::Error";
  EXPECT_EQ(e->code(), Errc::no_device);
  EXPECT_TRUE(contains(e->what(), "'nosuch'"));
  EXPECT_TRUE(contains(e->what(), "present: none"));
  EXPECT_TRUE(contains(e->what(), "rdma link add"));
}

TEST(Device, OpenUnknownNameThrowsNoDeviceListingThosePresent) {
  // Holds with or without devices: the name is one no device has.
  const std::string name = "verbs-test-no-such-device";
  const std::vector<verbs::DeviceInfo> present = verbs::list_devices();
  const auto e = thrown_by([&] { (void)verbs::Device::open(name); });
  ASSERT_TRUE(e) << "open(\"" << name << "\") did not throw verbs::Error";
  EXPECT_EQ(e->code(), Errc::no_device);
  EXPECT_TRUE(contains(e->what(), "'" + name + "'"));
  for (const verbs::DeviceInfo& d : present) EXPECT_TRUE(contains(e->what(), d.name));
}

TEST(Device, OpenErrorsRecordTheCallersLine) {
  int line = 0;
  const auto e = thrown_by([&] {
    line = __LINE__ + 1;
    (void)verbs::Device::open("verbs-test-no-such-device");
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->where().line(), static_cast<unsigned>(line));
  EXPECT_TRUE(contains(e->where().file_name(), "device_test.cpp")) << e->where().file_name();
  EXPECT_TRUE(contains(e->what(), "device_test.cpp:" + std::to_string(line))) << e->what();
}

// ---- Gid ----

Gid gid_from_text(const char* text) {
  Gid g;
  EXPECT_EQ(::inet_pton(AF_INET6, text, g.raw.data()), 1) << text;
  return g;
}

TEST(Gid, DefaultIsZero) {
  EXPECT_TRUE(Gid{}.is_zero());
  EXPECT_EQ(Gid{}.to_string(), "::");
}

TEST(Gid, AnyNonZeroByteMakesItNonZero) {
  for (std::size_t i = 0; i < 16; ++i) {
    Gid g;
    g.raw[i] = 1;
    EXPECT_FALSE(g.is_zero()) << "byte " << i;
  }
}

TEST(Gid, Ipv4MappedIsRecognisedAndPrinted) {
  const Gid g = gid_from_text("::ffff:192.0.2.1");
  EXPECT_TRUE(g.is_ipv4_mapped());
  EXPECT_FALSE(g.is_zero());
  EXPECT_EQ(g.to_string(), "::ffff:192.0.2.1");
}

TEST(Gid, OtherAddressesAreNotIpv4Mapped) {
  for (const char* text :
       {"::", "fe80::1", "::192.0.2.1", "::fffe:192.0.2.1", "1::ffff:192.0.2.1", "64:ff9b::c000:201"})
    EXPECT_FALSE(gid_from_text(text).is_ipv4_mapped()) << text;
  // Only byte 9 differs from the mapped prefix.
  Gid g = gid_from_text("::ffff:192.0.2.1");
  g.raw[9] = 1;
  EXPECT_FALSE(g.is_ipv4_mapped());
}

TEST(Gid, ToStringIsTheIpv6TextForm) {
  EXPECT_EQ(gid_from_text("fe80::1234:5678").to_string(), "fe80::1234:5678");
  EXPECT_EQ(gid_from_text("2001:db8::1").to_string(), "2001:db8::1");
}

TEST(Gid, NativeRoundTripKeepsEveryByte) {
  ibv_gid native{};
  for (std::size_t i = 0; i < 16; ++i) native.raw[i] = static_cast<std::uint8_t>(0xa0 + i);
  const Gid g = Gid::from_native(native);
  for (std::size_t i = 0; i < 16; ++i) EXPECT_EQ(g.raw[i], native.raw[i]) << "byte " << i;
  const ibv_gid back = g.native();
  EXPECT_EQ(std::memcmp(back.raw, native.raw, sizeof native.raw), 0);
  EXPECT_EQ(Gid::from_native(back), g);
}

TEST(Gid, EqualityComparesAllBytes) {
  const Gid a = gid_from_text("fe80::1");
  Gid b = a;
  EXPECT_EQ(a, b);
  b.raw[15] ^= 1;
  EXPECT_NE(a, b);
}

// rdma-core's tools exchange a GID as 32 hex digits (ibv_rc_pingpong's gid_to_wire_gid: each
// 4-byte word of the GID, read in host order, printed as htobe32 of it with %08x): written here
// again, independently of the library, to check against.
std::string rdma_core_wire_gid(const Gid& g) {
  std::uint32_t words[4];
  std::memcpy(words, g.raw.data(), sizeof words);
  std::string out;
  for (const std::uint32_t w : words) {
    char text[9];
    std::snprintf(text, sizeof text, "%08x", htobe32(w));
    out += text;
  }
  return out;
}

TEST(Gid, ParsesIpv6Text) {
  for (const char* text : {"::ffff:192.0.2.1", "fe80::1234:5678", "2001:db8::1", "::"})
    EXPECT_EQ(Gid::parse(text), gid_from_text(text)) << text;
}

TEST(Gid, ParsesAndWritesRdmaCoresWireForm) {
  const Gid g = gid_from_text("fe80::a0b:c0d:e0f:1011");
  const std::string wire = rdma_core_wire_gid(g);
  ASSERT_EQ(wire, "fe800000000000000a0b0c0d0e0f1011");  // the bytes in order, whatever the host's order
  EXPECT_EQ(g.to_wire(), wire);
  EXPECT_EQ(Gid::parse(wire), g);
  EXPECT_EQ(Gid::parse("FE800000000000000A0B0C0D0E0F1011"), g);  // either case
  const Gid mapped = gid_from_text("::ffff:192.0.2.1");
  EXPECT_EQ(mapped.to_wire(), "00000000000000000000ffffc0000201");
  EXPECT_EQ(Gid::parse(mapped.to_wire()), mapped);
}

TEST(Gid, ParseRefusesWhatIsNeitherFormSayingWhy) {
  for (const char* text : {"", "192.0.2.1", "fe80::1%eth0", "fe800000000000000a0b0c0d0e0f101",
                           "fe800000000000000a0b0c0d0e0f10111", "fe800000000000000a0b0c0d0e0f101g", " ::1",
                           "0x800000000000000a0b0c0d0e0f1011"}) {
    const auto e = thrown_by([&] { (void)Gid::parse(text); });
    ASSERT_TRUE(e) << "'" << text << "' was accepted";
    EXPECT_EQ(e->code(), verbs::Errc::bad_encoding) << text;
    EXPECT_TRUE(contains(e->what(), std::string("'") + text + "'")) << e->what();
    EXPECT_TRUE(contains(e->what(), "32 hex digits")) << e->what();
    std::error_code ec;
    EXPECT_FALSE(Gid::parse(text, ec).has_value()) << text;
    EXPECT_EQ(ec, verbs::Errc::bad_encoding) << text;
  }
  std::error_code ec = make_error_code(verbs::Errc::timed_out);
  EXPECT_EQ(Gid::parse("::1", ec), gid_from_text("::1"));
  EXPECT_FALSE(ec) << "a parse that succeeds clears the error_code";
}

// ---- Mtu ----

static_assert(verbs::mtu_bytes(verbs::Mtu::mtu256) == 256);
static_assert(verbs::mtu_bytes(verbs::Mtu::mtu4096) == 4096);

TEST(Mtu, BytesOfEachValue) {
  EXPECT_EQ(verbs::mtu_bytes(verbs::Mtu::mtu256), 256u);
  EXPECT_EQ(verbs::mtu_bytes(verbs::Mtu::mtu512), 512u);
  EXPECT_EQ(verbs::mtu_bytes(verbs::Mtu::mtu1024), 1024u);
  EXPECT_EQ(verbs::mtu_bytes(verbs::Mtu::mtu2048), 2048u);
  EXPECT_EQ(verbs::mtu_bytes(verbs::Mtu::mtu4096), 4096u);
}

TEST(Mtu, ValuesOutsideTheEnumAreZeroBytes) {
  for (const unsigned v : {0u, 6u, 7u, 255u}) EXPECT_EQ(verbs::mtu_bytes(static_cast<verbs::Mtu>(v)), 0u) << v;
}

TEST(GidType, NamesEachType) {
  EXPECT_EQ(verbs::to_string(verbs::GidType::ib), "IB");
  EXPECT_EQ(verbs::to_string(verbs::GidType::roce_v1), "RoCE v1");
  EXPECT_EQ(verbs::to_string(verbs::GidType::roce_v2), "RoCE v2");
}

}  // namespace

// ---- async events and waits on a stub context (support/stub_provider.hpp) ----
namespace {

struct StubAsyncFd {
  verbs_stub::Provider stub;
  int fds[2] = {-1, -1};
  StubAsyncFd() {
    EXPECT_EQ(::pipe(fds), 0);
    stub.vctx.context.async_fd = fds[0];  // never written: no event comes
  }
  ~StubAsyncFd() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  StubAsyncFd(const StubAsyncFd&) = delete;
  StubAsyncFd& operator=(const StubAsyncFd&) = delete;
};

void on_signal(int) {}

// Moving a Device onto another lets go of the old context's hub before the old context: a
// context closed while its hub is still registered (by context address) could hand that hub, and
// the device attributes it keeps, to a new context opened at the same address.
TEST(DeviceAdopt, MoveAssignmentReleasesTheOldHubBeforeTheOldContext) {
  verbs_stub::Provider old_stub;
  verbs_stub::Provider new_stub;
  std::optional<bool> hub_gone_first;
  verbs::Device a = verbs::Device::adopt(std::shared_ptr<ibv_context>(&old_stub.vctx.context, [&](ibv_context* c) {
    const int before = old_stub.device_queries;
    (void)verbs::detail::device_attributes(c, verbs::SourceLocation::current());
    hub_gone_first = old_stub.device_queries == before + 1;  // no hub kept them: the device was asked
  }));
  verbs::Device b = new_stub.device_handle();
  a = std::move(b);
  ASSERT_TRUE(hub_gone_first.has_value()) << "the old context was not released";
  EXPECT_TRUE(*hub_gone_first) << "the old context was released while its hub was still registered";
}

TEST(DeviceAdopt, AdoptingMakesTheAsyncFdNonBlocking) {
  StubAsyncFd s;
  ASSERT_EQ(::fcntl(s.fds[0], F_GETFL) & O_NONBLOCK, 0);
  const verbs::Device dev = s.stub.device_handle();
  EXPECT_EQ(dev.name(), "stub0");
  EXPECT_NE(::fcntl(s.fds[0], F_GETFL) & O_NONBLOCK, 0);
}

TEST(DeviceAdopt, ASignalDoesNotEndTheWaitForAnAsyncEvent) {
  StubAsyncFd s;
  const verbs::Device dev = s.stub.device_handle();
  struct sigaction sa {};
  struct sigaction old {};
  sa.sa_handler = &on_signal;  // no SA_RESTART: poll(2) returns EINTR
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, &old), 0);
  const pthread_t waiter = ::pthread_self();
  std::thread poker([waiter] {
    for (int i = 0; i < 5; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ::pthread_kill(waiter, SIGUSR1);
    }
  });
  const auto start = std::chrono::steady_clock::now();
  const auto ev = dev.wait_async_event(std::chrono::milliseconds(400));
  const auto took = std::chrono::steady_clock::now() - start;
  poker.join();
  ::sigaction(SIGUSR1, &old, nullptr);
  EXPECT_FALSE(ev.has_value());
  EXPECT_GE(took, std::chrono::milliseconds(400)) << "the wait ended at the first signal, as if it had timed out";
}

}  // namespace

namespace {

TEST(AsyncEvent, ContextIsThatOfTheObjectTheEventConcerns) {
  int q = 0, r = 0, c = 0;
  ibv_qp qp{};
  qp.qp_context = &q;
  ibv_srq srq{};
  srq.srq_context = &r;
  ibv_cq cq{};
  cq.cq_context = &c;
  ibv_async_event raw{};
  for (const ibv_event_type t : {IBV_EVENT_QP_FATAL, IBV_EVENT_QP_LAST_WQE_REACHED, IBV_EVENT_QP_ACCESS_ERR}) {
    raw.event_type = t;
    raw.element.qp = &qp;
    const auto ev = verbs::AsyncEvent::from(raw);
    EXPECT_EQ(ev.context(), &q) << ev.name();
    EXPECT_EQ(ev.port(), 0);
  }
  raw.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
  raw.element.srq = &srq;
  EXPECT_EQ(verbs::AsyncEvent::from(raw).context(), &r);
  raw.event_type = IBV_EVENT_CQ_ERR;
  raw.element.cq = &cq;
  const auto cq_event = verbs::AsyncEvent::from(raw);
  cq.cq_context = nullptr;  // the context was taken when the event was read, not later
  EXPECT_EQ(cq_event.context(), &c);
  raw.event_type = IBV_EVENT_PORT_ERR;
  raw.element.port_num = 1;
  EXPECT_EQ(verbs::AsyncEvent::from(raw).context(), nullptr);
  EXPECT_EQ(verbs::AsyncEvent::from(raw).port(), 1);
  raw.event_type = IBV_EVENT_DEVICE_FATAL;
  EXPECT_EQ(verbs::AsyncEvent::from(raw).context(), nullptr);
  EXPECT_EQ(verbs::AsyncEvent::from(raw).port(), 0);
}


// Which kind of event each type is, and which put their object in error.
TEST(AsyncEvent, ClassifiesEachType) {
  struct Row {
    ibv_event_type type;
    bool qp, srq, cq, port, device, fatal;
    std::string_view name;
  };
  const Row rows[] = {
      {IBV_EVENT_QP_FATAL, true, false, false, false, false, true, "QP_FATAL"},
      {IBV_EVENT_QP_REQ_ERR, true, false, false, false, false, true, "QP_REQ_ERR"},
      {IBV_EVENT_QP_ACCESS_ERR, true, false, false, false, false, true, "QP_ACCESS_ERR"},
      {IBV_EVENT_COMM_EST, true, false, false, false, false, false, "COMM_EST"},
      {IBV_EVENT_SQ_DRAINED, true, false, false, false, false, false, "SQ_DRAINED"},
      {IBV_EVENT_PATH_MIG, true, false, false, false, false, false, "PATH_MIG"},
      {IBV_EVENT_PATH_MIG_ERR, true, false, false, false, false, false, "PATH_MIG_ERR"},
      {IBV_EVENT_QP_LAST_WQE_REACHED, true, false, false, false, false, false, "QP_LAST_WQE_REACHED"},
      {IBV_EVENT_SRQ_ERR, false, true, false, false, false, true, "SRQ_ERR"},
      {IBV_EVENT_SRQ_LIMIT_REACHED, false, true, false, false, false, false, "SRQ_LIMIT_REACHED"},
      {IBV_EVENT_CQ_ERR, false, false, true, false, false, true, "CQ_ERR"},
      {IBV_EVENT_PORT_ACTIVE, false, false, false, true, false, false, "PORT_ACTIVE"},
      {IBV_EVENT_PORT_ERR, false, false, false, true, false, false, "PORT_ERR"},
      {IBV_EVENT_LID_CHANGE, false, false, false, true, false, false, "LID_CHANGE"},
      {IBV_EVENT_PKEY_CHANGE, false, false, false, true, false, false, "PKEY_CHANGE"},
      {IBV_EVENT_SM_CHANGE, false, false, false, true, false, false, "SM_CHANGE"},
      {IBV_EVENT_CLIENT_REREGISTER, false, false, false, true, false, false, "CLIENT_REREGISTER"},
      {IBV_EVENT_GID_CHANGE, false, false, false, true, false, false, "GID_CHANGE"},
      {IBV_EVENT_DEVICE_FATAL, false, false, false, false, true, true, "DEVICE_FATAL"},
  };
  for (const Row& r : rows) {
    verbs::AsyncEvent e;
    e.type = r.type;
    EXPECT_EQ(e.is_qp_event(), r.qp) << r.name;
    EXPECT_EQ(e.is_srq_event(), r.srq) << r.name;
    EXPECT_EQ(e.is_cq_event(), r.cq) << r.name;
    EXPECT_EQ(e.is_port_event(), r.port) << r.name;
    EXPECT_EQ(e.is_device_event(), r.device) << r.name;
    EXPECT_EQ(e.is_fatal(), r.fatal) << r.name;
    EXPECT_EQ(e.type_name(), r.name);
  }
  verbs::AsyncEvent odd;
  odd.type = static_cast<ibv_event_type>(31);  // no such event
  EXPECT_EQ(odd.type_name(), "UNKNOWN");
  // Newer rdma-core's DEVICE_SPEED_CHANGE (after WQ_FATAL), named whatever the headers here say.
  verbs::AsyncEvent speed;
  speed.type = static_cast<ibv_event_type>(static_cast<int>(IBV_EVENT_WQ_FATAL) + 1);
  EXPECT_EQ(speed.type_name(), "DEVICE_SPEED_CHANGE");
  EXPECT_FALSE(speed.is_fatal());
}

// An event names its QP by handle and by the number read before the acknowledgement: a QP
// that now has another number (another QP at the same address) is not the one it concerns.
TEST(AsyncEvent, ConcernsOnlyTheObjectItWasRaisedFor) {
  verbs_stub::Provider a, b;
  b.qp.qp_num = 0x456;
  const verbs::QueuePair qa = a.queue_pair();
  const verbs::QueuePair qb = b.queue_pair();
  const verbs::CompletionQueue ca = a.completion_queue();
  const verbs::CompletionQueue cb = b.completion_queue();
  ibv_async_event raw{};
  raw.event_type = IBV_EVENT_QP_FATAL;
  raw.element.qp = &a.qp;
  const auto ev = verbs::AsyncEvent::from(raw);
  EXPECT_EQ(ev.qp_num(), 0x123u);
  EXPECT_EQ(ev.qp(), &a.qp);
  EXPECT_EQ(ev.srq(), nullptr);
  EXPECT_EQ(ev.cq(), nullptr);
  EXPECT_TRUE(ev.concerns(qa));
  EXPECT_FALSE(ev.concerns(qb));
  EXPECT_FALSE(ev.concerns(ca)) << "a QP event is no CQ's";
  a.qp.qp_num = 0x789;  // the number was read when the event was, not now
  EXPECT_EQ(ev.qp_num(), 0x123u);
  EXPECT_FALSE(ev.concerns(a.queue_pair())) << "another QP at the address of the one the event was for";

  raw.event_type = IBV_EVENT_CQ_ERR;
  raw.element.cq = &b.cq;
  const auto cq_ev = verbs::AsyncEvent::from(raw);
  EXPECT_EQ(cq_ev.qp_num(), 0u);
  EXPECT_TRUE(cq_ev.concerns(cb));
  EXPECT_FALSE(cq_ev.concerns(ca));
  EXPECT_FALSE(cq_ev.concerns(qb));

  raw.event_type = IBV_EVENT_PORT_ERR;
  raw.element.port_num = 1;
  const auto port_ev = verbs::AsyncEvent::from(raw);
  EXPECT_EQ(port_ev.qp(), nullptr);
  EXPECT_FALSE(port_ev.concerns(qa));
  EXPECT_FALSE(port_ev.concerns(ca));
  EXPECT_FALSE(verbs::AsyncEvent{}.concerns(verbs::QueuePair(a.queue_pair())));
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

verbs::AsyncEvent event_of(ibv_event_type t, ibv_qp* qp = nullptr) {
  ibv_async_event raw{};
  raw.event_type = t;
  if (qp != nullptr) raw.element.qp = qp;
  else raw.element.port_num = 1;
  return verbs::AsyncEvent::from(raw);
}

// An event read by anyone (a connection's wait()) is kept for poll_async_events, and async_fd()
// is readable while one is: an event loop is woken for events already read.
TEST(DeviceAsyncEvents, KeptEventsMakeTheFdReadableUntilPolled) {
  StubAsyncFd s;
  const verbs::Device dev = s.stub.device_handle();
  ASSERT_GE(dev.async_fd(), 0);
  EXPECT_FALSE(readable(dev.async_fd()));
  std::array<verbs::AsyncEvent, 4> out{};
  EXPECT_TRUE(dev.poll_async_events(out).empty());
  const auto hub = verbs::detail::async_hub(dev.shared_handle());
  hub->deliver(event_of(IBV_EVENT_PORT_ERR));
  hub->deliver(event_of(IBV_EVENT_PORT_ACTIVE));
  hub->deliver(event_of(IBV_EVENT_QP_LAST_WQE_REACHED, &s.stub.qp));
  EXPECT_TRUE(readable(dev.async_fd()));
  auto got = dev.poll_async_events(std::span(out).first(2));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].type, IBV_EVENT_PORT_ERR);
  EXPECT_EQ(got[1].type, IBV_EVENT_PORT_ACTIVE);
  EXPECT_TRUE(readable(dev.async_fd())) << "one event is still kept";
  const auto last = dev.wait_async_event(std::chrono::milliseconds(0));
  ASSERT_TRUE(last);
  EXPECT_EQ(last->type, IBV_EVENT_QP_LAST_WQE_REACHED);
  EXPECT_EQ(last->qp_num(), 0x123u);
  EXPECT_FALSE(readable(dev.async_fd()));
  EXPECT_TRUE(dev.poll_async_events(out).empty());
}

TEST(DeviceAsyncEvents, AtMostMaxKeptAreKeptTheOldestDropped) {
  StubAsyncFd s;
  const verbs::Device dev = s.stub.device_handle();
  const auto hub = verbs::detail::async_hub(dev.shared_handle());
  constexpr std::size_t n = verbs::detail::AsyncHub::max_kept;
  hub->deliver(event_of(IBV_EVENT_PORT_ERR));
  for (std::size_t i = 0; i < n; ++i) hub->deliver(event_of(IBV_EVENT_PORT_ACTIVE));
  EXPECT_EQ(hub->kept(), n);
  std::vector<verbs::AsyncEvent> out(n + 1);
  const auto got = dev.poll_async_events(out);
  ASSERT_EQ(got.size(), n);
  EXPECT_EQ(got[0].type, IBV_EVENT_PORT_ACTIVE) << "the oldest (PORT_ERR) was dropped";
}

// Every Device on one context shares its reader: what one reads, the other's poll gives.
TEST(DeviceAsyncEvents, DevicesOnOneContextShareTheReader) {
  StubAsyncFd s;
  const verbs::Device one = s.stub.device_handle();
  const verbs::Device two = s.stub.device_handle();
  EXPECT_EQ(one.async_fd(), two.async_fd());
  verbs::detail::async_hub(one.shared_handle())->deliver(event_of(IBV_EVENT_PORT_ERR));
  std::array<verbs::AsyncEvent, 2> out{};
  ASSERT_EQ(two.poll_async_events(out).size(), 1u);
  EXPECT_TRUE(one.poll_async_events(out).empty());
  verbs::Device moved_from = s.stub.device_handle();
  const verbs::Device taker = std::move(moved_from);
  EXPECT_EQ(moved_from.async_fd(), -1);  // NOLINT(bugprone-use-after-move): what a moved-from Device says
  std::error_code ec;
  EXPECT_TRUE(moved_from.poll_async_events(out, ec).empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(ec, verbs::make_error_code(verbs::Errc::empty_object));
}

struct Heard {
  std::vector<ibv_event_type> types;
  static void on(void* self, const verbs::AsyncEvent& e) noexcept { static_cast<Heard*>(self)->types.push_back(e.type); }
};

// The route of a QP hears its own events (by handle and number) and DEVICE_FATAL, nothing
// else, and nothing once removed; every event is kept for the user all the same.
TEST(DeviceAsyncEvents, AQpsRouteHearsItsEventsAndDeviceFatalOnly) {
  StubAsyncFd s;
  verbs_stub::Provider other;
  const verbs::Device dev = s.stub.device_handle();
  const auto hub = verbs::detail::async_hub(dev.shared_handle());
  Heard heard;
  hub->add_route(&s.stub.qp, s.stub.qp.qp_num, {&Heard::on, &heard});
  hub->deliver(event_of(IBV_EVENT_QP_FATAL, &s.stub.qp));
  hub->deliver(event_of(IBV_EVENT_QP_ACCESS_ERR, &other.qp));
  hub->deliver(event_of(IBV_EVENT_PORT_ERR));
  auto stale = event_of(IBV_EVENT_QP_REQ_ERR, &s.stub.qp);
  stale.object_qp_num = 0x999;  // the QP that was at this address before
  hub->deliver(stale);
  hub->deliver(event_of(IBV_EVENT_DEVICE_FATAL));
  hub->remove_route(&s.stub.qp);
  hub->deliver(event_of(IBV_EVENT_QP_FATAL, &s.stub.qp));
  EXPECT_EQ(heard.types, (std::vector<ibv_event_type>{IBV_EVENT_QP_FATAL, IBV_EVENT_DEVICE_FATAL}));
  std::array<verbs::AsyncEvent, 8> out{};
  EXPECT_EQ(dev.poll_async_events(out).size(), 6u) << "routed events are kept for the user too";
}

}  // namespace

// ---- the GID choice, on tables as RoCE ports have them ----
namespace {

using verbs::GidEntry;
using verbs::GidType;

GidEntry gid_entry(std::uint32_t index, const char* text, GidType type, const char* netdev) {
  GidEntry e;
  in6_addr a{};
  EXPECT_EQ(::inet_pton(AF_INET6, text, &a), 1) << text;
  std::memcpy(e.gid.raw.data(), &a, 16);
  e.index = index;
  e.type = type;
  e.netdev = netdev;
  return e;
}

constexpr GidType v1 = GidType::roce_v1;
constexpr GidType v2 = GidType::roce_v2;

TEST(ChooseGid, Ipv4MappedRoceV2OnTheOwnNetdevFirst) {
  const auto c = verbs::detail::choose_roce_gid({gid_entry(0, "fe80::1", v1, "eth0"), gid_entry(1, "fe80::1", v2, "eth0"),
                                                 gid_entry(2, "::ffff:192.0.2.1", v1, "eth0"),
                                                 gid_entry(3, "::ffff:192.0.2.1", v2, "eth0")});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->entry.index, 3u);
  EXPECT_TRUE(c->reason.starts_with("RoCE v2 with an IPv4-mapped address (routable")) << c->reason;
}

TEST(ChooseGid, AnIpv6OnlyPortGetsItsGlobalAddressNotLinkLocal) {
  const auto c = verbs::detail::choose_roce_gid({gid_entry(0, "fe80::1", v2, "eth0"), gid_entry(1, "2001:db8::1", v2, "eth0")});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->entry.gid.to_string(), "2001:db8::1") << "fe80:: is not routable";
  EXPECT_TRUE(verbs::test::contains(c->reason, "global IPv6")) << c->reason;
}

TEST(ChooseGid, ThePortsOwnNetdevComesBeforeAVlanOrMacvlanOnIt) {
  const auto c = verbs::detail::choose_roce_gid({gid_entry(0, "fe80::1", v2, "eth0"),
                                                 gid_entry(1, "::ffff:10.1.0.1", v2, "eth0.100"),
                                                 gid_entry(2, "fe80::2", v2, "eth0.100"),
                                                 gid_entry(3, "::ffff:192.0.2.1", v2, "eth0")});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->entry.index, 3u);
  EXPECT_EQ(c->entry.netdev, "eth0");
}

TEST(ChooseGid, OnlyAVlanAddressIsTakenAndSaidSo) {
  const auto c = verbs::detail::choose_roce_gid({gid_entry(0, "fe80::1", v2, "eth0"),
                                                 gid_entry(1, "::ffff:10.1.0.1", v2, "eth0.100")});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->entry.index, 1u) << "a routable address on a VLAN beats link-local on the port";
  EXPECT_TRUE(verbs::test::contains(c->reason, "eth0.100")) << c->reason;
}

TEST(ChooseGid, LinkLocalOnlyIsTheLastRoceV2ChoiceAndSaysSo) {
  const auto c = verbs::detail::choose_roce_gid({gid_entry(0, "fe80::1", v2, "eth0"), gid_entry(1, "fe80::1", v1, "eth0")});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->entry.index, 0u);
  EXPECT_TRUE(verbs::test::contains(c->reason, "link-local")) << c->reason;
}

TEST(ChooseGid, RoceV1OnlyAndNothing) {
  const auto c = verbs::detail::choose_roce_gid({gid_entry(0, "fe80::1", v1, "eth0"), gid_entry(1, "::ffff:192.0.2.1", v1, "eth0")});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->entry.index, 1u);
  EXPECT_TRUE(verbs::test::contains(c->reason, "RoCE v1")) << c->reason;
  EXPECT_FALSE(verbs::detail::choose_roce_gid({}));
}

// PortInfo's rate from ibv_port_attr's codes (as ibv_devinfo names them).
TEST(PortInfo, RateIsLanesTimesTheLaneSpeed) {
  const auto port = [](std::uint8_t width, std::uint32_t speed) {
    verbs::PortInfo p;
    p.active_width = width;
    p.active_speed = speed;
    return p;
  };
  EXPECT_DOUBLE_EQ(port(2, 32).rate_gbps(), 100.0) << "4X EDR";
  EXPECT_DOUBLE_EQ(port(1, 1).rate_gbps(), 2.5) << "1X SDR";
  EXPECT_DOUBLE_EQ(port(8, 4).rate_gbps(), 120.0) << "12X QDR";
  EXPECT_DOUBLE_EQ(port(16, 64).rate_gbps(), 100.0) << "2X HDR";
  EXPECT_DOUBLE_EQ(port(4, 128).rate_gbps(), 800.0) << "8X NDR";
  EXPECT_EQ(port(2, 16).lanes(), 4u);
  EXPECT_DOUBLE_EQ(port(2, 16).lane_gbps(), 14.0) << "FDR";
  EXPECT_DOUBLE_EQ(port(2, 8).lane_gbps(), 10.0) << "FDR10";
  EXPECT_DOUBLE_EQ(port(2, 256).lane_gbps(), 0.0) << "XDR: not an 8-bit active_speed code";
  EXPECT_EQ(port(3, 32).lanes(), 0u) << "not a width code";
  EXPECT_DOUBLE_EQ(port(2, 3).rate_gbps(), 0.0) << "not a speed code";
}

}  // namespace
