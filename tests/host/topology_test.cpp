// Topology on fake sysfs trees (tests/host/topology/*.tree) modelled on real machines: a GPU
// server (2 sockets, 8 GPUs and 4 NICs behind PCIe switches), a two-socket RoCE server, and the
// SoftRoCE guest with two wires.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <verbs/topology.hpp>

namespace fs = std::filesystem;
using verbs::PciAddress;
using verbs::Place;
using verbs::Proximity;
using verbs::Topology;

namespace {

// Builds the tree a .tree file describes in a fresh directory, removed with the object.
class FakeSysfs {
 public:
  explicit FakeSysfs(const std::string& tree) {
    char dir[] = "/tmp/verbs-topology-XXXXXX";
    const char* made = ::mkdtemp(dir);
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    root_ = made;
    std::ifstream in(std::string(VERBS_TOPOLOGY_TREES) + "/" + tree);
    if (!in) throw std::runtime_error("no tree " + tree);
    std::map<std::string, std::string> vars;
    std::string line;
    while (std::getline(in, line)) {
      if (line.find_first_not_of(' ') == std::string::npos || line[line.find_first_not_of(' ')] == '#') continue;
      for (std::size_t at; (at = line.find("${")) != std::string::npos;) {
        const auto end = line.find('}', at);
        line.replace(at, end - at + 1, vars.at(line.substr(at + 2, end - at - 2)));
      }
      std::istringstream words(line);
      std::string op, path, rest;
      words >> op;
      words >> path;
      std::getline(words >> std::ws, rest);
      if (op == "set") {
        vars[path] = rest;
      } else if (op == "dir") {
        fs::create_directories(root_ / path);
      } else if (op == "file") {
        fs::create_directories((root_ / path).parent_path());
        std::ofstream(root_ / path) << rest << '\n';
      } else if (op == "link") {
        fs::create_directories((root_ / path).parent_path());
        fs::create_symlink(rest, root_ / path);
      } else if (op == "pci") {
        // A PCI function as the kernel shows it: its directory under sys/devices, its
        // numa_node, and its entry in sys/bus/pci/devices.
        const fs::path dev = root_ / "sys/devices" / path;
        fs::create_directories(dev);
        std::ofstream(dev / "numa_node") << rest << '\n';
        fs::create_directories(root_ / "sys/bus/pci/devices");
        fs::create_symlink("../../../devices/" + path, root_ / "sys/bus/pci/devices" / dev.filename());
      } else {
        throw std::runtime_error("bad line in " + tree + ": " + line);
      }
    }
  }
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;
  ~FakeSysfs() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  [[nodiscard]] const fs::path& root() const { return root_; }

 private:
  fs::path root_;
};

// The names of a ranking, in order.
std::vector<std::string> names(const std::vector<verbs::RankedDevice>& ranked) {
  std::vector<std::string> out;
  for (const auto& r : ranked) out.push_back(r.device->name);
  return out;
}

std::vector<std::string> pci_strings(const std::vector<PciAddress>& v) {
  std::vector<std::string> out;
  for (const auto& a : v) out.push_back(a.to_string());
  return out;
}

}  // namespace

TEST(PciAddress, ParsesTheKernelsCudasAndNvidiaSmisForms) {
  const auto a = PciAddress::parse("0000:3b:00.1");
  EXPECT_EQ(a.domain, 0u);
  EXPECT_EQ(a.bus, 0x3b);
  EXPECT_EQ(a.device, 0);
  EXPECT_EQ(a.function, 1);
  EXPECT_EQ(a.to_string(), "0000:3b:00.1");
  EXPECT_EQ(PciAddress::parse("00000000:3B:00.1"), a);  // nvidia-smi's 8-digit domain, upper case
  EXPECT_EQ(PciAddress::parse("3b:00.1"), a);
  const auto wide = PciAddress::parse("10000:c1:1f.7");  // a VMD domain, as sysfs names it
  EXPECT_EQ(wide.domain, 0x10000u);
  EXPECT_EQ(wide.to_string(), "10000:c1:1f.7");
  EXPECT_EQ(PciAddress::parse("00010000:C1:1F.7"), wide);
}

TEST(PciAddress, RefusesWhatIsNotOneSayingWhatItTakes) {
  for (const char* bad : {"", "3b:00", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "000:3b:00.0",
                          "000000000:3b:00.0", "0000:3b:0.0", "zz:00.0", "0000:3b:00.0 ", "0000-3b:00.0"}) {
    std::error_code ec;
    EXPECT_FALSE(PciAddress::parse(bad, ec)) << bad;
    EXPECT_EQ(ec, verbs::Errc::bad_encoding) << bad;
  }
  try {
    (void)PciAddress::parse("0000:3b:00.9");
    FAIL() << "no throw";
  } catch (const verbs::Error& e) {
    EXPECT_EQ(e.code(), verbs::Errc::bad_encoding);
    EXPECT_NE(std::string(e.what()).find("'0000:3b:00.9'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("00000000:3B:00.0"), std::string::npos) << e.what();
  }
}

TEST(Topology, PlacesParseFromVerbsInfosText) {
  EXPECT_EQ(Place::parse("0000:05:00.0").pci, PciAddress::parse("0000:05:00.0"));
  EXPECT_EQ(Place::parse("numa:1").numa_node, 1);
  EXPECT_EQ(Place::parse("cpu:40").cpu, 40);
  for (const char* bad : {"numa:", "numa:-1", "cpu:x", "gpu:0", "numa:1 "}) {
    try {
      (void)Place::parse(bad);
      ADD_FAILURE() << bad << " parsed";
    } catch (const verbs::Error& e) {
      EXPECT_EQ(e.code(), verbs::Errc::bad_encoding);
      EXPECT_NE(std::string(e.what()).find("numa:N or cpu:N"), std::string::npos) << e.what();
    }
  }
}

TEST(Topology, GpuServerReadsEachNicsPathNodeNetdevAndPorts) {
  FakeSysfs tree("gpu_server.tree");
  const auto t = Topology::read(tree.root());
  ASSERT_EQ(t.devices().size(), 5u);
  EXPECT_EQ(t.numa_nodes(), (std::vector<int>{0, 1}));
  const auto* nic = t.find("mlx5_0");
  ASSERT_NE(nic, nullptr);
  ASSERT_TRUE(nic->pci);
  EXPECT_EQ(nic->pci->to_string(), "0000:05:00.0");
  EXPECT_FALSE(nic->pci_from_netdev);
  EXPECT_EQ(pci_strings(nic->bridges), (std::vector<std::string>{"0000:00:01.1", "0000:01:00.0", "0000:02:02.0"}));
  EXPECT_EQ(nic->host_bridge, "pci0000:00");
  EXPECT_EQ(nic->numa_node, 0);
  EXPECT_EQ(nic->netdevs, (std::vector<std::string>{"ibp5s0"}));
  ASSERT_EQ(nic->ports.size(), 1u);
  EXPECT_TRUE(nic->ports[0].active);
  EXPECT_EQ(nic->ports[0].state, "ACTIVE");
  EXPECT_EQ(nic->ports[0].link_layer, "InfiniBand");
  EXPECT_EQ(nic->ports[0].rate, "200 Gb/sec (4X HDR)");
  EXPECT_DOUBLE_EQ(nic->rate_gbps(), 200);
  const auto* storage = t.find("mlx5_4");
  ASSERT_NE(storage, nullptr);
  EXPECT_FALSE(storage->active());
  EXPECT_EQ(storage->ports[0].state, "DOWN");
  EXPECT_EQ(pci_strings(storage->bridges), (std::vector<std::string>{"0000:00:05.1"}));
  EXPECT_EQ(t.find("mlx5_3")->numa_node, 1);
  EXPECT_EQ(t.find("mlx5_3")->host_bridge, "pci0000:c0");
  EXPECT_EQ(t.find("nope"), nullptr);
}

TEST(Topology, GpuServerRanksTheNicBelowEachGpusSwitchFirst) {
  FakeSysfs tree("gpu_server.tree");
  const auto t = Topology::read(tree.root());
  const std::map<std::string, std::string> nic_of_gpu = {
      {"0000:03:00.0", "mlx5_0"}, {"0000:04:00.0", "mlx5_0"}, {"0000:13:00.0", "mlx5_1"}, {"0000:14:00.0", "mlx5_1"},
      {"0000:83:00.0", "mlx5_2"}, {"0000:84:00.0", "mlx5_2"}, {"0000:c3:00.0", "mlx5_3"}, {"0000:c4:00.0", "mlx5_3"}};
  for (const auto& [gpu, nic] : nic_of_gpu) {
    const auto ranked = t.rank(Place::of_pci(PciAddress::parse(gpu)));
    ASSERT_EQ(ranked.size(), 5u);
    EXPECT_EQ(ranked[0].device->name, nic) << gpu;
    EXPECT_EQ(ranked[0].proximity, Proximity::same_switch) << gpu;
    EXPECT_EQ(ranked[0].pci_hops, 4) << gpu;  // GPU up to the switch's downstream port, up to its upstream port, down twice
  }
  // GPU 0: its switch's NIC; the other socket-0 NICs through the host bridge (the active one
  // first, though farther); socket 1's last.
  const auto gpu0 = t.rank(Place::of_pci(PciAddress::parse("0000:03:00.0")));
  EXPECT_EQ(names(gpu0), (std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_4", "mlx5_2", "mlx5_3"}));
  EXPECT_EQ(gpu0[1].proximity, Proximity::same_host_bridge);
  EXPECT_EQ(gpu0[1].pci_hops, 8);
  EXPECT_EQ(gpu0[2].proximity, Proximity::same_host_bridge);
  EXPECT_EQ(gpu0[2].pci_hops, 6);
  EXPECT_EQ(gpu0[3].proximity, Proximity::other_numa_node);
  EXPECT_EQ(gpu0[3].pci_hops, -1);
  // GPU 4 (socket 1, host bridge pci0000:80): the NIC on socket 1's other host bridge is on its
  // NUMA node; socket 0's active NICs before its inactive one.
  const auto gpu4 = t.rank(Place::of_pci(PciAddress::parse("0000:83:00.0")));
  EXPECT_EQ(names(gpu4), (std::vector<std::string>{"mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1", "mlx5_4"}));
  EXPECT_EQ(gpu4[1].proximity, Proximity::same_numa_node);
  EXPECT_EQ(gpu4[2].proximity, Proximity::other_numa_node);
}

TEST(Topology, GpuServerRanksByNumaNodeAndByCpu) {
  FakeSysfs tree("gpu_server.tree");
  const auto t = Topology::read(tree.root());
  EXPECT_EQ(t.numa_node_of_cpu(40), 1);
  EXPECT_EQ(t.numa_node_of_cpu(70), 0);
  EXPECT_EQ(t.numa_node_of_cpu(500), -1);
  const std::vector<std::string> node1 = {"mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1", "mlx5_4"};
  EXPECT_EQ(names(t.rank(Place::of_numa_node(1))), node1);
  EXPECT_EQ(names(t.rank(Place::of_cpu(40))), node1);
  const auto node0 = t.rank(Place::of_cpu(70));
  EXPECT_EQ(names(node0), (std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_4", "mlx5_2", "mlx5_3"}));
  EXPECT_EQ(node0[0].proximity, Proximity::same_numa_node);
  EXPECT_EQ(node0[3].proximity, Proximity::other_numa_node);
  // A CPU no node lists, on a machine of two nodes: nothing is known.
  for (const auto& r : t.rank(Place::of_cpu(500))) EXPECT_EQ(r.proximity, Proximity::unknown) << r.device->name;
}

TEST(Topology, APciAddressTheTreeDoesNotHaveIsRefusedNamingIt) {
  FakeSysfs tree("gpu_server.tree");
  const auto t = Topology::read(tree.root());
  try {
    (void)t.rank(Place::of_pci(PciAddress::parse("0000:99:00.0")));
    FAIL() << "no throw";
  } catch (const verbs::Error& e) {
    EXPECT_EQ(e.code(), verbs::Errc::no_device);
    EXPECT_NE(std::string(e.what()).find("0000:99:00.0"), std::string::npos) << e.what();
  }
}

TEST(Topology, TwoSocketServerTellsFunctionsPortsAndAnUnknownNode) {
  FakeSysfs tree("two_socket.tree");
  const auto t = Topology::read(tree.root());
  EXPECT_EQ(names(t.rank(Place::of_numa_node(0))), (std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "irdma0"}));
  const auto* m2 = t.find("mlx5_2");
  ASSERT_NE(m2, nullptr);
  ASSERT_EQ(m2->ports.size(), 2u);
  EXPECT_TRUE(m2->active());
  EXPECT_FALSE(m2->ports[1].active);
  EXPECT_DOUBLE_EQ(m2->rate_gbps(), 25);
  EXPECT_EQ(m2->netdevs, (std::vector<std::string>{"ens2f0np0"}));
  EXPECT_EQ(t.find("irdma0")->numa_node, -1);
  // The dual-port NIC's second function: itself first, its sibling next (one device).
  const auto f1 = t.rank(Place::of_pci(PciAddress::parse("0000:3b:00.1")));
  EXPECT_EQ(names(f1), (std::vector<std::string>{"mlx5_1", "mlx5_0", "mlx5_2", "irdma0"}));
  EXPECT_EQ(f1[0].proximity, Proximity::same_device);
  EXPECT_EQ(f1[0].pci_hops, 0);
  EXPECT_EQ(f1[1].proximity, Proximity::same_device);
  EXPECT_EQ(f1[1].pci_hops, 1);
  // A GPU on socket 1's other host bridge: the socket-1 NIC by NUMA node; irdma0's node is
  // unknown on a two-node machine, so it comes last.
  const auto gpu = t.rank(Place::of_pci(PciAddress::parse("0000:d8:00.0")));
  EXPECT_EQ(names(gpu), (std::vector<std::string>{"mlx5_2", "mlx5_0", "mlx5_1", "irdma0"}));
  EXPECT_EQ(gpu[0].proximity, Proximity::same_numa_node);
  EXPECT_EQ(gpu[1].proximity, Proximity::other_numa_node);
  EXPECT_EQ(gpu[3].proximity, Proximity::unknown);
}

TEST(Topology, SoftRoceGuestTakesEachDevicesPlaceFromItsNetdev) {
  FakeSysfs tree("softroce_vm.tree");
  const auto t = Topology::read(tree.root());
  ASSERT_EQ(t.devices().size(), 3u);
  const auto* rxe1 = t.find("rxe1");
  ASSERT_NE(rxe1, nullptr);
  ASSERT_TRUE(rxe1->pci);
  EXPECT_EQ(rxe1->pci->to_string(), "0000:00:03.0");
  EXPECT_TRUE(rxe1->pci_from_netdev);
  EXPECT_TRUE(rxe1->bridges.empty());
  EXPECT_EQ(rxe1->host_bridge, "pci0000:00");
  EXPECT_EQ(rxe1->netdevs, (std::vector<std::string>{"eth1"}));
  const auto* rxe2 = t.find("rxe2");
  ASSERT_NE(rxe2, nullptr);
  EXPECT_FALSE(rxe2->pci);
  EXPECT_EQ(rxe2->netdevs, (std::vector<std::string>{"veth0"}));
  // Near eth1's NIC: rxe1, then rxe0 through the host bridge, then rxe2 by node (-1 on a
  // one-node machine is that node).
  const auto near1 = t.rank(Place::of_pci(PciAddress::parse("0000:00:03.0")));
  EXPECT_EQ(names(near1), (std::vector<std::string>{"rxe1", "rxe0", "rxe2"}));
  EXPECT_EQ(near1[1].proximity, Proximity::same_host_bridge);
  EXPECT_EQ(near1[1].pci_hops, 2);
  EXPECT_EQ(near1[2].proximity, Proximity::same_numa_node);
  const auto cpu = t.rank(Place::of_cpu(1));
  EXPECT_EQ(names(cpu), (std::vector<std::string>{"rxe0", "rxe1", "rxe2"}));
  for (const auto& r : cpu) EXPECT_EQ(r.proximity, Proximity::same_numa_node) << r.device->name;
}

TEST(Topology, ANicBehindVmdSitsBelowItsOwnHostBridgeNotTheController) {
  FakeSysfs tree("vmd.tree");
  const auto t = Topology::read(tree.root());
  const auto* nic = t.find("mlx5_0");
  ASSERT_NE(nic, nullptr);
  ASSERT_TRUE(nic->pci);
  EXPECT_EQ(nic->pci->to_string(), "10000:e1:00.0");
  EXPECT_EQ(nic->host_bridge, "pci10000:e0");
  EXPECT_EQ(pci_strings(nic->bridges), (std::vector<std::string>{"10000:e0:06.0"}));
  const auto near_nvme = t.rank(Place::of_pci(PciAddress::parse("10000:e2:00.0")));
  ASSERT_EQ(near_nvme.size(), 1u);
  EXPECT_EQ(near_nvme[0].proximity, Proximity::same_host_bridge);
  EXPECT_EQ(near_nvme[0].pci_hops, 4);
  EXPECT_EQ(t.rank(Place::of_pci(PciAddress::parse("10000:e1:00.0")))[0].proximity, Proximity::same_device);
}

TEST(Topology, ADeviceNotThereIsRefusedNamingThoseThatAre) {
  FakeSysfs tree("softroce_vm.tree");
  EXPECT_EQ(verbs::read_device_topology("rxe1", tree.root()).netdevs, (std::vector<std::string>{"eth1"}));
  try {
    (void)verbs::read_device_topology("mlx5_0", tree.root());
    FAIL() << "no throw";
  } catch (const verbs::Error& e) {
    EXPECT_EQ(e.code(), verbs::Errc::no_device);
    EXPECT_NE(std::string(e.what()).find("(there: rxe0, rxe1, rxe2)"), std::string::npos) << e.what();
  }
}

TEST(Topology, ATreeWithoutRdmaIsEmptyAndNoTreeIsAnError) {
  char dir[] = "/tmp/verbs-topology-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const fs::path root = dir;
  EXPECT_THROW((void)Topology::read(root), verbs::Error);  // no sys/ at all
  fs::create_directories(root / "sys/class");
  const auto t = Topology::read(root);
  EXPECT_TRUE(t.devices().empty());
  EXPECT_TRUE(t.numa_nodes().empty());
  fs::remove_all(root);
}
