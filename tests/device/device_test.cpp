// Device: opening, attributes, ports, the GID table and async events, on a real device.
#include <arpa/inet.h>
#include <endian.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <type_traits>

#include "fixture.hpp"

namespace {

using namespace verbs::test;
using verbs::Errc;
using verbs::GidEntry;
using verbs::GidType;

static_assert(std::is_nothrow_move_constructible_v<verbs::Device> && std::is_nothrow_move_assignable_v<verbs::Device>);
static_assert(std::is_nothrow_swappable_v<verbs::Device>);
static_assert(!std::is_copy_constructible_v<verbs::Device> && !std::is_copy_assignable_v<verbs::Device>);

class Device : public DeviceTest {};

/// The interface that holds the IPv4 address `addr`, or empty.
std::string netdev_with_address(const std::string& addr) {
  in_addr want{};
  if (::inet_pton(AF_INET, addr.c_str(), &want) != 1) return {};
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string name;
  for (const ifaddrs* i = list; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    in_addr have{};
    std::memcpy(&have, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, sizeof have);  // NOLINT
    if (have.s_addr == want.s_addr) name = i->ifa_name;
  }
  ::freeifaddrs(list);
  return name;
}

const char* env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

TEST_F(Device, OpenFirstGivesADeviceThatListDevicesReports) {
  const verbs::Device first = verbs::Device::open_first();
  EXPECT_FALSE(first.name().empty());
  ASSERT_NE(first.native_handle(), nullptr);
  const auto devices = verbs::list_devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices.front().name, first.name());
}

TEST_F(Device, OpenByNameGivesThatDevice) {
  const verbs::Device again = verbs::Device::open(dev->name());
  EXPECT_EQ(again.name(), dev->name());
  EXPECT_NE(again.native_handle(), dev->native_handle()) << "each open makes its own context";
  EXPECT_EQ(again.attributes().orig_attr.node_guid, dev->attributes().orig_attr.node_guid);
  const auto devices = verbs::list_devices();
  const auto it = std::find_if(devices.begin(), devices.end(), [&](const auto& d) { return d.name == dev->name(); });
  ASSERT_NE(it, devices.end());
  EXPECT_EQ(it->node_guid, be64toh(dev->attributes().orig_attr.node_guid)) << "DeviceInfo::node_guid is host order";
}

TEST_F(Device, OpenUnknownNameThrowsNoDeviceNamingThosePresent) {
  const auto e = thrown_error([] { (void)verbs::Device::open("no-such-rdma-device"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), make_error_code(Errc::no_device));
  EXPECT_TRUE(contains(e->what(), "no-such-rdma-device"));
  EXPECT_TRUE(contains(e->what(), dev->name())) << "the message lists the devices present";
}

TEST_F(Device, AttributesDescribeACapableDevice) {
  const ibv_device_attr& a = dev->attributes().orig_attr;
  EXPECT_GE(dev->port_count(), 1);
  EXPECT_EQ(dev->port_count(), a.phys_port_cnt);
  EXPECT_GT(a.max_qp, 0);
  EXPECT_GE(a.max_qp_wr, 128) << "the library's default queue depth must fit";
  EXPECT_GE(a.max_sge, 4) << "the multi-SGE tests need 4";
  EXPECT_GE(a.max_cqe, 1024);
  EXPECT_GT(a.max_mr_size, std::uint64_t{4} << 20);
  EXPECT_NE(a.atomic_cap, IBV_ATOMIC_NONE) << "the atomic tests need atomics";
  EXPECT_GT(a.max_srq, 0);
}

TEST_F(Device, PortOneIsActiveWithAnMtu) {
  const verbs::PortInfo p = dev->port(1);
  EXPECT_TRUE(p.active()) << "port state " << ibv_port_state_str(p.state);
  EXPECT_EQ(p.port_num, 1);
  EXPECT_GE(verbs::mtu_bytes(p.active_mtu), 256u);
  EXPECT_LE(verbs::mtu_bytes(p.active_mtu), verbs::mtu_bytes(p.max_mtu));
  EXPECT_GT(p.gid_table_len, 0u);
  EXPECT_EQ(p.raw.state, p.state);
  if (dev->name().starts_with("rxe")) { EXPECT_TRUE(p.is_ethernet()) << "SoftRoCE is RoCE"; }
}

TEST_F(Device, PortThatDoesNotExistThrows) {
  const auto missing = static_cast<std::uint8_t>(dev->port_count() + 1);
  const auto e = thrown_error([&] { (void)dev->port(missing); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::make_error_code(std::errc::invalid_argument));
  EXPECT_TRUE(contains(e->what(), "ibv_query_port"));
}

// gid_table() reads the whole table in one ibv_query_gid_table; it must say what a scan slot by
// slot says, in index order.
TEST_F(Device, GidTableIsWhatASlotBySlotScanFinds) {
  const std::vector<GidEntry> table = dev->gid_table(1);
  std::vector<std::pair<std::uint32_t, verbs::Gid>> scanned;
  for (std::uint32_t i = 0; i < dev->port(1).gid_table_len; ++i) {
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(dev->native_handle(), 1, i, &e, 0) != 0) continue;
    const verbs::Gid g = verbs::Gid::from_native(e.gid);
    if (!g.is_zero()) scanned.emplace_back(e.gid_index, g);
  }
  ASSERT_EQ(table.size(), scanned.size());
  for (std::size_t k = 0; k < table.size(); ++k) {
    EXPECT_EQ(table[k].index, scanned[k].first);
    EXPECT_EQ(table[k].gid, scanned[k].second) << "index " << table[k].index;
  }
}

// One slot by its index (rdma-core tests/test_device.py queries GIDs and their error paths):
// a valid slot is what gid_table() lists, an empty one is ENODATA (ibv_query_gid would say 0
// and an all-zero GID), one past the table and a port that does not exist are EINVAL.
TEST_F(Device, GidBySlotGivesTheEntryOrSaysWhyNot) {
  const std::vector<GidEntry> table = dev->gid_table(1);
  ASSERT_FALSE(table.empty());
  for (const GidEntry& e : table) {
    const GidEntry one = dev->gid(e.index, 1);
    EXPECT_EQ(one.gid, e.gid) << "index " << e.index;
    EXPECT_EQ(one.index, e.index);
    EXPECT_EQ(one.type, e.type);
    EXPECT_EQ(one.netdev, e.netdev);
  }
  const std::uint32_t len = dev->port(1).gid_table_len;
  std::uint32_t empty = 0;
  while (empty < len && std::any_of(table.begin(), table.end(), [&](const GidEntry& e) { return e.index == empty; }))
    ++empty;
  if (empty < len) {
    const auto e = thrown_error([&] { (void)dev->gid(empty, 1); });
    ASSERT_TRUE(e) << "empty slot " << empty << " gave an entry";
    EXPECT_EQ(e->code(), std::error_code(ENODATA, std::generic_category())) << e->what();
    EXPECT_TRUE(contains(e->what(), "an empty slot")) << e->what();
  }
  const auto past = thrown_error([&] { (void)dev->gid(len, 1); });
  ASSERT_TRUE(past);
  EXPECT_EQ(past->code(), std::make_error_code(std::errc::invalid_argument));
  EXPECT_TRUE(contains(past->what(), "past the table")) << past->what();
  const auto no_port = thrown_error([&] { (void)dev->gid(0, static_cast<std::uint8_t>(dev->port_count() + 1)); });
  ASSERT_TRUE(no_port);
  EXPECT_EQ(no_port->code(), std::make_error_code(std::errc::invalid_argument));
}

// The P_Key table (rdma-core tests/test_device.py queries it): on RoCE one partition, the
// default 0xffff with full membership, in slot 0; every slot reads; a missing port is EINVAL.
TEST_F(Device, PkeyTableHoldsTheDefaultPartition) {
  const verbs::PortInfo p = dev->port(1);
  const std::vector<std::uint16_t> keys = dev->pkey_table(1);
  ASSERT_EQ(keys.size(), p.pkey_table_len);
  ASSERT_FALSE(keys.empty());
  EXPECT_EQ(keys[0], 0xffff) << "slot 0 holds the default partition";
  if (p.is_ethernet()) {
    EXPECT_EQ(std::count(keys.begin(), keys.end(), std::uint16_t{0xffff}), 1);
  }
  const auto e = thrown_error([&] { (void)dev->pkey_table(static_cast<std::uint8_t>(dev->port_count() + 1)); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), std::make_error_code(std::errc::invalid_argument));
}

// rdma-core tests/test_device.py test_get_pkey_index: the default P_Key's slot is the one
// pkey_table() shows it in; a P_Key the table lacks, and a port that does not exist, are refused.
TEST_F(Device, PkeyIndexFindsTheDefaultPartitionWhereTheTableHasIt) {
  const std::vector<std::uint16_t> keys = dev->pkey_table(1);
  const std::uint16_t at = dev->pkey_index(0xffff);
  ASSERT_LT(at, keys.size());
  EXPECT_EQ(keys[at], 0xffff);
  EXPECT_EQ(at, 0) << "the default partition is in slot 0";
  const auto missing = thrown_error([&] { (void)dev->pkey_index(0x1234); });
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->code(), std::make_error_code(std::errc::no_such_file_or_directory)) << missing->what();
  EXPECT_TRUE(contains(missing->what(), "0x1234")) << missing->what();
  const auto port = thrown_error([&] { (void)dev->pkey_index(0xffff, static_cast<std::uint8_t>(dev->port_count() + 1)); });
  ASSERT_TRUE(port);
  EXPECT_EQ(port->code(), std::make_error_code(std::errc::invalid_argument)) << port->what();
}

// Port speed (rdma-core tests/test_device.py checks active width and speed): codes the library
// knows, and a rate. rxe takes them from its netdev's ethtool speed.
// The port's width and lane rate, decoded by the library, against the kernel's own decoding of
// the same attributes (sysfs ports/1/rate: "100 Gb/sec (4X EDR)"; the kernel rounds a lane to
// 0.5 Gb/s, e.g. FDR's 14.0625 to 14).
TEST_F(Device, PortSpeedIsAKnownWidthAndLaneRate) {
  const verbs::PortInfo p = dev->port(1);
  EXPECT_GT(p.lanes(), 0u) << "active_width " << int{p.active_width};
  EXPECT_GT(p.lane_gbps(), 0.0) << "active_speed " << p.active_speed;
  std::ifstream f("/sys/class/infiniband/" + dev->name() + "/ports/1/rate");
  std::string line;
  ASSERT_TRUE(std::getline(f, line)) << "no sysfs rate for " << dev->name();
  double kernel_gbps = 0;
  unsigned kernel_lanes = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "%lf Gb/sec (%uX", &kernel_gbps, &kernel_lanes), 2) << line;
  EXPECT_EQ(p.lanes(), kernel_lanes) << line;
  EXPECT_NEAR(p.rate_gbps(), kernel_gbps, 0.5 * kernel_lanes) << line;
  std::cout << dev->name() << " port 1: " << p.lanes() << "X at " << p.lane_gbps() << " Gb/s a lane: " << p.rate_gbps()
            << " Gb/s (sysfs: " << line << ")\n";
}

TEST_F(Device, GidTableHasRoceV2Ipv4MappedEntryOnTheTestNetdev) {
  if (!dev->port(1).is_ethernet()) GTEST_SKIP() << dev->name() << " port 1 is InfiniBand: GIDs are not IP addresses";
  const std::vector<GidEntry> table = dev->gid_table(1);
  ASSERT_FALSE(table.empty());
  for (const GidEntry& e : table) {
    EXPECT_FALSE(e.gid.is_zero()) << "empty slots are left out (index " << e.index << ")";
    EXPECT_LT(e.index, dev->port(1).gid_table_len);
  }
  EXPECT_TRUE(std::any_of(table.begin(), table.end(), [](const GidEntry& e) { return e.gid.raw[0] == 0xfe; }))
      << "a RoCE port has a link-local fe80:: GID derived from its MAC";

  const auto v4 = std::find_if(table.begin(), table.end(),
                               [](const GidEntry& e) { return e.type == GidType::roce_v2 && e.gid.is_ipv4_mapped(); });
  ASSERT_NE(v4, table.end()) << "no RoCE v2 IPv4-mapped GID: does the netdev have an IPv4 address?";
  EXPECT_FALSE(v4->netdev.empty());
  // scripts/rxe-vm sets VERBS_TEST_ADDR (192.0.2.1 on veth0); VERBS_TEST_NETDEV overrides the
  // interface found for that address.
  const std::string addr = env_or_empty("VERBS_TEST_ADDR");
  if (addr.empty()) return;
  EXPECT_EQ(v4->gid.to_string(), "::ffff:" + addr);
  std::string netdev = env_or_empty("VERBS_TEST_NETDEV");
  if (netdev.empty()) netdev = netdev_with_address(addr);
  EXPECT_FALSE(netdev.empty()) << "no interface has " << addr;
  EXPECT_EQ(v4->netdev, netdev);
  std::cout << "[          ] " << v4->gid.to_string() << " is GID index " << v4->index << " on " << v4->netdev << " ("
            << verbs::to_string(v4->type) << ")\n";
}

TEST_F(Device, ChooseGidPicksTheRoceV2Ipv4EntryAndSaysWhy) {
  const verbs::GidChoice c = dev->choose_gid(1);
  EXPECT_FALSE(c.reason.empty());
  if (!dev->port(1).is_ethernet()) return;
  EXPECT_EQ(c.entry.type, GidType::roce_v2);
  EXPECT_TRUE(c.entry.gid.is_ipv4_mapped()) << c.entry.gid.to_string();
  EXPECT_TRUE(contains(c.reason, "IPv4"));
  const auto table = dev->gid_table(1);
  const auto same =
      std::find_if(table.begin(), table.end(), [&](const GidEntry& e) { return e.index == c.entry.index; });
  ASSERT_NE(same, table.end());
  EXPECT_EQ(same->gid, c.entry.gid);
  EXPECT_EQ(same->netdev, c.entry.netdev);

  // A queue pair addresses itself with the chosen GID unless told otherwise.
  verbs::CompletionQueue cq(*dev);
  const verbs::QueuePair qp(*pd, cq);
  EXPECT_EQ(qp.gid_index(), c.entry.index);
  EXPECT_EQ(qp.endpoint().gid, c.entry.gid);
}

// Changes the network setup for real, so only in the throwaway VM of scripts/rxe-vm: veth0
// loses its IPv4 address and gets a global IPv6 one. choose_gid must then take the global
// address (fe80:: is not routable), and must not keep the IPv4-mapped GID it chose before.
bool in_rxe_vm() {
  char host[64] = {};
  return ::gethostname(host, sizeof host - 1) == 0 && std::string(host) == "rxe-vm" && ::access("/run/rxe-vm", F_OK) == 0;
}

bool run(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

/// Waits up to 5 s for the port's chosen GID to satisfy `want`.
template <typename Want>
std::optional<verbs::GidChoice> chosen_when(const verbs::Device& d, Want want) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  std::optional<verbs::GidChoice> c;
  do {
    try {
      c = d.choose_gid(1);
      if (want(*c)) return c;
    } catch (const verbs::Error&) {
      c.reset();
    }
    std::this_thread::sleep_for(50ms);
  } while (std::chrono::steady_clock::now() < deadline);
  return c;
}

TEST_F(Device, OnAnIpv6OnlyPortChooseGidTakesTheGlobalAddress) {
  if (!in_rxe_vm()) GTEST_SKIP() << "changes the network setup: runs only in the scripts/rxe-vm VM";
  const std::string addr = env_or_empty("VERBS_TEST_ADDR");
  const std::string netdev = netdev_with_address(addr);
  ASSERT_FALSE(netdev.empty());
  const auto before = dev->choose_gid(1);
  ASSERT_TRUE(before.entry.gid.is_ipv4_mapped());
  struct Restore {
    std::string addr, netdev;
    ~Restore() {
      run("ip -6 addr del 2001:db8::1/64 dev " + netdev);
      run("ip addr add " + addr + "/24 dev " + netdev);
    }
  } restore{addr, netdev};
  ASSERT_TRUE(run("ip -6 addr add 2001:db8::1/64 dev " + netdev + " nodad"));
  ASSERT_TRUE(run("ip addr del " + addr + "/24 dev " + netdev));
  const auto c = chosen_when(*dev, [](const verbs::GidChoice& g) { return !g.entry.gid.is_ipv4_mapped(); });
  ASSERT_TRUE(c) << "no usable GID without the IPv4 address";
  EXPECT_EQ(c->entry.gid.to_string(), "2001:db8::1") << c->reason;
  EXPECT_EQ(c->entry.type, GidType::roce_v2);
}

TEST_F(Device, WaitAsyncEventTimesOutEmpty) {
  const auto start = std::chrono::steady_clock::now();
  const auto ev = dev->wait_async_event(300ms);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(ev) << "unexpected async event " << ev->name();
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 2300ms);
}

TEST_F(Device, MovedAndSwappedDevicesKeepWorking) {
  verbs::Device other = verbs::Device::open(dev->name());
  ibv_context* const ctx = other.native_handle();
  verbs::Device moved(std::move(other));
  EXPECT_EQ(moved.native_handle(), ctx);
  EXPECT_TRUE(moved.port(1).active());
  ibv_context* const mine = dev->native_handle();
  swap(moved, *dev);
  EXPECT_EQ(dev->native_handle(), ctx);
  EXPECT_EQ(moved.native_handle(), mine);
  EXPECT_EQ(moved.name(), dev->name());
  const verbs::ProtectionDomain pd2(moved);  // the swapped-in context is fully usable
  EXPECT_NE(pd2.native_handle(), nullptr);
}

}  // namespace
