// Topology: where each RDMA device sits (PCI address, the bridges above it, NUMA node, netdevs,
// ports and their rates), read from sysfs, and a ranking of devices by closeness to memory the
// caller names (a GPU's PCI bus id, a NUMA node, a CPU). No ibv_open_device, no CUDA: sysfs only,
// under a root a test can replace with a fake tree. See docs/design/rails.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "verbs/error.hpp"

namespace verbs {

/// A PCI function's address: domain:bus:device.function, e.g. 0000:3b:00.0.
struct PciAddress {
  std::uint32_t domain = 0;   ///< 16 bits in sysfs; nvidia-smi prints 32 (00000000:3B:00.0)
  std::uint8_t bus = 0;       ///< 0..255
  std::uint8_t device = 0;    ///< 0..31
  std::uint8_t function = 0;  ///< 0..7

  ///@{
  /// From text: `DDDD:BB:DD.F` with a domain of 4 to 8 hex digits (the kernel's 0000:3b:00.0,
  /// CUDA's cudaDeviceGetPCIBusId, nvidia-smi's 00000000:3B:00.0), or `BB:DD.F` (domain 0); hex
  /// digits in either case. Throws Error(Errc::bad_encoding) naming the text and the forms taken;
  /// the error_code form returns empty instead.
  [[nodiscard]] static PciAddress parse(std::string_view text, SourceLocation where = SourceLocation::current());
  [[nodiscard]] static std::optional<PciAddress> parse(std::string_view text, std::error_code& ec) noexcept;
  ///@}
  /// The kernel's form, as sysfs names the device: 0000:3b:00.0 (a VMD domain: 10000:e1:00.0).
  [[nodiscard]] std::string to_string() const;
  /// Equal when every part is.
  friend bool operator==(const PciAddress&, const PciAddress&) = default;
};

/// How near a device is to a place, from nearest to farthest (NCCL's PIX/PXB, PHB, NODE, SYS).
enum class Proximity : std::uint8_t {
  same_device,       ///< the place is a function of the device itself (another port of the NIC)
  same_switch,       ///< both below one PCIe switch (a bridge under the root port)
  same_root_port,    ///< both below one root port, with no switch in common below it
  same_host_bridge,  ///< under one host bridge (pciDDDD:BB), through different root ports
  same_numa_node,    ///< different host bridges, one NUMA node
  other_numa_node,   ///< another NUMA node: traffic crosses the socket link
  unknown,           ///< not enough is known (no PCI path and no NUMA node)
};
/// "same switch", "same root port", ..., "unknown".
[[nodiscard]] std::string_view to_string(Proximity p) noexcept;

/// One port of a device, as sysfs shows it (ports/N).
struct PortTopology {
  std::uint8_t port = 1;     ///< 1-based
  bool active = false;       ///< state is 4: ACTIVE
  std::string state;         ///< e.g. "ACTIVE", "DOWN"
  std::string link_layer;    ///< "InfiniBand" or "Ethernet"
  double rate_gbps = 0;      ///< from ports/N/rate ("100 Gb/sec (4X EDR)"); 0 when unknown
  std::string rate;          ///< that file's text, e.g. "100 Gb/sec (4X EDR)"
  std::string netdev;        ///< the netdev of GID 0 on RoCE; empty on InfiniBand
};

/// Where one RDMA device sits.
struct DeviceTopology {
  std::string name;                 ///< e.g. "mlx5_0", "rxe0"
  /// The PCI function: the device's own, or for a device without one (rxe, siw: soft) its
  /// netdev's. Empty when neither has one.
  std::optional<PciAddress> pci;
  /// True when `pci` is the netdev's, not the device's own (a soft device such as rxe).
  bool pci_from_netdev = false;
  /// The PCI bridges from the root port down to the function (excluded): empty for a function
  /// on the host bridge itself; [root port, switch up, switch down] behind one switch.
  std::vector<PciAddress> bridges;
  std::string host_bridge;          ///< e.g. "pci0000:00"; empty without a PCI function
  int numa_node = -1;               ///< the function's numa_node; -1 when the kernel does not know
  std::vector<std::string> netdevs; ///< the device's network interfaces (RoCE), in sysfs order
  std::vector<PortTopology> ports;  ///< every port, by number
  /// The fastest active port's rate (Gb/s), else the fastest port's; 0 when none is known.
  [[nodiscard]] double rate_gbps() const noexcept;
  /// True when a port is active.
  [[nodiscard]] bool active() const noexcept;
};

/// A place to be near: memory on a PCI device (a GPU), a NUMA node, or a CPU.
struct Place {
  std::optional<PciAddress> pci;  ///< e.g. a GPU's bus id
  std::optional<int> numa_node;   ///< used when `pci` is empty
  std::optional<int> cpu;         ///< used when both are empty: that CPU's NUMA node
  ///@{
  /// A place from its parts.
  [[nodiscard]] static Place of_pci(PciAddress a) noexcept { return Place{a, std::nullopt, std::nullopt}; }
  [[nodiscard]] static Place of_numa_node(int n) noexcept { return Place{std::nullopt, n, std::nullopt}; }
  [[nodiscard]] static Place of_cpu(int c) noexcept { return Place{std::nullopt, std::nullopt, c}; }
  ///@}
  /// From text, as verbs-info --near takes it: a PCI address (PciAddress::parse), `numa:N` or
  /// `cpu:N`. Throws Error(Errc::bad_encoding) naming the text and the forms.
  [[nodiscard]] static Place parse(std::string_view text, SourceLocation where = SourceLocation::current());
};

/// One device of a ranking, and why it is where it is.
struct RankedDevice {
  const DeviceTopology* device = nullptr;   ///< into the Topology ranked: valid while it lives
  Proximity proximity = Proximity::unknown; ///< how near the place
  /// PCI links between the two functions through their deepest common bridge, or the host
  /// bridge: 4 for two endpoints below one switch's two downstream ports; 0 for the function
  /// itself and 1 for another function of the same device (so it ranks first); -1 when they are
  /// under different host bridges, or either has no PCI path.
  int pci_hops = -1;
};

/// Every RDMA device of a machine and where it sits, read from sysfs under a root at once.
class Topology {
 public:
  /// Reads `root`/sys (the real one by default). A machine without RDMA devices gives an empty
  /// list, not an error. Throws Error (the errno) when `root`/sys cannot be read at all.
  [[nodiscard]] static Topology read(const std::filesystem::path& root = "/",
                                     SourceLocation where = SourceLocation::current());
  /// The devices, by name.
  [[nodiscard]] const std::vector<DeviceTopology>& devices() const noexcept { return devices_; }
  /// The device of that name; null when there is none.
  [[nodiscard]] const DeviceTopology* find(std::string_view name) const noexcept;
  /// The NUMA nodes the machine has (sys/devices/system/node/node*); empty when it shows none.
  [[nodiscard]] const std::vector<int>& numa_nodes() const noexcept { return nodes_; }
  /// The NUMA node of a CPU (from each node's cpulist); -1 when no node lists it.
  [[nodiscard]] int numa_node_of_cpu(int cpu) const noexcept;
  /// How near `device` is to `place`, and over how many PCI links. Throws Error(Errc::no_device)
  /// for a PCI address the tree does not have.
  [[nodiscard]] RankedDevice closeness(const DeviceTopology& device, const Place& place,
                                       SourceLocation where = SourceLocation::current()) const;
  /// Every device, nearest to `place` first: by proximity, then a device with an active port
  /// before one without, then fewer PCI hops, then a higher rate, then name. The same tree always
  /// gives the same order.
  /// Throws as closeness() does.
  [[nodiscard]] std::vector<RankedDevice> rank(const Place& place, SourceLocation where = SourceLocation::current()) const;
  /// The root it was read under.
  [[nodiscard]] const std::filesystem::path& root() const noexcept { return root_; }

  /// Where a PCI function sits, resolved under a root (what closeness() compares).
  struct PciPath {
    std::string host_bridge;           ///< pciDDDD:BB
    std::vector<PciAddress> chain;     ///< root port ... the function itself (last)
    int numa_node = -1;                ///< the function's numa_node
  };

 private:
  std::filesystem::path root_;
  std::vector<DeviceTopology> devices_;
  std::vector<int> nodes_;
  std::vector<std::vector<int>> node_cpus_;  // per entry of nodes_
  [[nodiscard]] int effective_node(int node) const noexcept;
};

/// Where the named device sits, read under `root` (Topology::read for one device). Throws
/// Error(Errc::no_device) naming the devices present when there is none of that name.
[[nodiscard]] DeviceTopology read_device_topology(std::string_view name, const std::filesystem::path& root = "/",
                                                  SourceLocation where = SourceLocation::current());

}  // namespace verbs
