// verbs-info: the RDMA devices, ports, GID tables and limits as the verbs library sees them, and
// a diagnosis of the setup (--check) that says what is wrong and how to fix it.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/ip_icmp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <verbs/verbs.hpp>

namespace {

constexpr int exit_ok = 0, exit_problems = 1, exit_no_device = 2, exit_usage = 64;

constexpr const char* usage_text =
    "Usage: verbs-info [--json] [--check] [--peer HOST] [-d DEVICE]\n"
    "       verbs-info --topology [--near PLACE] [--json] [-d DEVICE]\n"
    "\n"
    "Lists the RDMA devices, their ports (state, MTU, link layer, speed, netdev), GID tables,\n"
    "the GID the verbs library would choose and why, and the device limits; then how long a\n"
    "request can take to fail with the library's default TransportOptions (verbs::failure_bound).\n"
    "\n"
    "  --check        diagnose the setup instead: each problem with what to do about it\n"
    "  --peer HOST    with --check (implied), compare this host's MTU with HOST's (IPv4) by ICMP\n"
    "                 echo: the reply to a 9000-byte echo comes back in fragments of HOST's MTU\n"
    "  --topology     where each device sits instead, from sysfs alone (nothing is opened): PCI\n"
    "                 address and the bridges above it, NUMA node, netdevs, ports and rates\n"
    "  --near PLACE   with --topology (implied), the devices nearest to PLACE first: a PCI\n"
    "                 address (a GPU's bus id, 0000:3b:00.0), numa:N or cpu:N\n"
    "  --json         the same as JSON on stdout (devices, checks, healthy, defaults; with\n"
    "                 --topology: numa_nodes, devices, near)\n"
    "  -d DEVICE      only this device\n"
    "  -h, --help     this text\n"
    "\n"
    "Exit status: 0 fine; 1 --check found a problem; 2 no RDMA device (or none named DEVICE);\n"
    "64 bad usage.\n"
    "Environment: VERBS_INFO_SYSROOT prefixes the /sys and /dev paths verbs-info reads itself\n"
    "(netdevs, the rdma_cm module and device node; all of --topology); libibverbs always reads\n"
    "the real ones.\n";

// ---- files under the (overridable) system root ------------------------------------------------

std::string sysroot() {
  const char* r = std::getenv("VERBS_INFO_SYSROOT");
  return r != nullptr ? r : "";
}
bool exists(const std::string& path) {
  struct stat st {};
  return ::stat((sysroot() + path).c_str(), &st) == 0;
}
std::optional<std::string> read_line(const std::string& path) {
  std::ifstream in(sysroot() + path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

// ---- what is gathered --------------------------------------------------------------------------

struct Netdev {
  std::string name;
  std::optional<unsigned> mtu;
  std::string operstate;  // "up", "down", "lowerlayerdown", ...
};

struct Port {
  verbs::PortInfo info;
  std::vector<verbs::GidEntry> gids;
  std::optional<verbs::GidChoice> chosen;
  std::string choose_error;
  std::optional<Netdev> netdev;
};

struct InlineProbe {
  std::uint32_t value = 0;
  std::string error;  // set when not even a QP without inline data could be created
};

struct DeviceReport {
  verbs::DeviceInfo info;
  std::string open_error;  // the device is listed but could not be opened
  ibv_device_attr_ex attr{};
  std::vector<Port> ports;
  InlineProbe inline_data;
};

struct Finding {
  std::string id;       // stable, for scripts: "port_down", "no_ipv4_gid", ...
  bool ok = false;
  std::string subject;  // "rxe0 port 1", "rdma_cm"
  std::string message;
  std::string fix;      // empty when ok
};

// The netdev of a port: the one of its chosen GID, else the device's parent (rxe, siw), else the
// PCI function's network interface.
std::optional<Netdev> find_netdev(const std::string& device, const Port& p) {
  std::string name;
  if (p.chosen && !p.chosen->entry.netdev.empty()) name = p.chosen->entry.netdev;
  for (const verbs::GidEntry& g : p.gids)
    if (name.empty() && !g.netdev.empty()) name = g.netdev;
  if (name.empty()) name = read_line("/sys/class/infiniband/" + device + "/parent").value_or("");
  if (name.empty()) {
    std::error_code ec;  // a PCI device lists its network interfaces here
    for (const auto& e : std::filesystem::directory_iterator(sysroot() + "/sys/class/infiniband/" + device + "/device/net", ec)) {
      name = e.path().filename().string();
      break;
    }
  }
  if (name.empty()) return std::nullopt;
  Netdev n{name, std::nullopt, read_line("/sys/class/net/" + name + "/operstate").value_or("unknown")};
  if (auto mtu = read_line("/sys/class/net/" + name + "/mtu")) n.mtu = static_cast<unsigned>(std::stoul(*mtu));
  return n;
}

// max_inline_data is not a device attribute: the largest inline size an RC QP can be created
// with, found by bisection (rxe: 512).
InlineProbe probe_max_inline(const verbs::Device& dev) {
  InlineProbe r;
  try {
    const verbs::ProtectionDomain pd{dev};
    const verbs::CompletionQueue cq{dev, {.depth = 1}};
    const auto try_create = [&](std::uint32_t n) -> std::optional<std::uint32_t> {
      try {
        const verbs::QueuePair qp{pd, cq, {.max_send_wr = 1, .max_recv_wr = 1, .max_inline_data = n}};
        return qp.max_inline_data();
      } catch (const verbs::Error&) {
        return std::nullopt;
      }
    };
    // Without inline data a QP must be possible; if not, its Error says why.
    std::uint32_t lo = verbs::QueuePair{pd, cq, {.max_send_wr = 1, .max_recv_wr = 1}}.max_inline_data();
    std::uint32_t hi = 1u << 16;  // lo works; above hi is not tried
    if (auto top = try_create(hi)) return {std::max(hi, *top), {}};
    while (hi - lo > 1) {
      const std::uint32_t mid = lo + (hi - lo) / 2;
      if (auto got = try_create(mid)) lo = std::max(mid, *got); else hi = mid;
    }
    r.value = lo;
  } catch (const verbs::Error& e) {
    r.error = e.code().message() + " (" + e.context() + ")";
  }
  return r;
}

DeviceReport gather(const verbs::DeviceInfo& info) {
  DeviceReport d{info, {}, {}, {}, {}};
  try {
    const verbs::Device dev = verbs::Device::open(info.name);
    d.attr = dev.attributes();
    for (std::uint8_t n = 1; n <= dev.port_count(); ++n) {
      Port p;
      p.info = dev.port(n);
      p.gids = dev.gid_table(n);
      try {
        p.chosen = dev.choose_gid(n);
      } catch (const verbs::Error& e) {
        p.choose_error = e.context();
      }
      p.netdev = find_netdev(info.name, p);
      d.ports.push_back(std::move(p));
    }
    d.inline_data = probe_max_inline(dev);
  } catch (const verbs::Error& e) {
    d.open_error = std::string(e.code().message()) + " (" + e.context() + ")";
  }
  return d;
}

// ---- names and numbers ---------------------------------------------------------------------------

std::string guid_text(std::uint64_t g) {
  char s[24];
  std::snprintf(s, sizeof s, "%04x:%04x:%04x:%04x", unsigned(g >> 48) & 0xffff, unsigned(g >> 32) & 0xffff,
                unsigned(g >> 16) & 0xffff, unsigned(g) & 0xffff);
  return s;
}
std::string_view node_type_text(ibv_node_type t) { return ibv_node_type_str(t); }
std::string_view link_layer_text(verbs::LinkLayer l) {
  switch (l) {
    case verbs::LinkLayer::infiniband: return "InfiniBand";
    case verbs::LinkLayer::ethernet: return "Ethernet";
    case verbs::LinkLayer::unspecified: break;
  }
  return "unspecified";
}
std::string_view state_text(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
  }
  return "unknown";
}
int width_lanes(std::uint8_t w) {
  switch (w) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
  }
  return 0;
}
// Gb/s per lane and the name of ibv_port_attr::active_speed.
std::pair<double, std::string_view> lane_speed(std::uint32_t s) {
  switch (s) {
    case 1: return {2.5, "SDR"};
    case 2: return {5.0, "DDR"};
    case 4: return {10.0, "QDR"};
    case 8: return {10.0, "FDR10"};
    case 16: return {14.0625, "FDR"};
    case 32: return {25.78125, "EDR"};
    case 64: return {53.125, "HDR"};
    case 128: return {106.25, "NDR"};
  }
  return {0.0, "unknown"};
}
double port_gbps(const verbs::PortInfo& p) { return width_lanes(p.active_width) * lane_speed(p.active_speed).first; }
std::string speed_text(const verbs::PortInfo& p) {
  char s[64];
  std::snprintf(s, sizeof s, "%.4g Gb/s (%dX %s)", port_gbps(p), width_lanes(p.active_width),
                std::string(lane_speed(p.active_speed).second).c_str());
  return s;
}
std::string_view atomic_text(ibv_atomic_cap a) {
  switch (a) {
    case IBV_ATOMIC_NONE: return "none";
    case IBV_ATOMIC_HCA: return "HCA (atomic within this device)";
    case IBV_ATOMIC_GLOB: return "global (atomic with the CPU too)";
  }
  return "unknown";
}
bool has_cap(const ibv_device_attr_ex& a, unsigned flag) { return (a.orig_attr.device_cap_flags & flag) != 0; }
std::string memory_windows_text(const ibv_device_attr_ex& a) {
  if (a.orig_attr.max_mw == 0 || !has_cap(a, IBV_DEVICE_MEM_WINDOW)) return "none";
  std::string s = "type 1";
  if (has_cap(a, IBV_DEVICE_MEM_WINDOW_TYPE_2A)) s += ", type 2A";
  if (has_cap(a, IBV_DEVICE_MEM_WINDOW_TYPE_2B)) s += ", type 2B";
  return s;
}
std::string odp_text(const ibv_device_attr_ex& a) {
  if ((a.odp_caps.general_caps & IBV_ODP_SUPPORT) == 0) return "no";
  std::string s = "yes";
  if ((a.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT) != 0) s += ", implicit";
  const std::uint32_t rc = a.odp_caps.per_transport_caps.rc_odp_caps;
  s += rc == 0 ? "; RC: none" : "; RC:";
  if ((rc & IBV_ODP_SUPPORT_SEND) != 0) s += " send";
  if ((rc & IBV_ODP_SUPPORT_RECV) != 0) s += " recv";
  if ((rc & IBV_ODP_SUPPORT_WRITE) != 0) s += " write";
  if ((rc & IBV_ODP_SUPPORT_READ) != 0) s += " read";
  if ((rc & IBV_ODP_SUPPORT_ATOMIC) != 0) s += " atomic";
  return s;
}

struct Limit {
  const char* name;
  std::uint64_t value;
  const char* what;
};
std::vector<Limit> limits(const ibv_device_attr_ex& a) {
  const ibv_device_attr& o = a.orig_attr;
  return {
      {"max_qp", std::uint64_t(o.max_qp), "queue pairs"},
      {"max_qp_wr", std::uint64_t(o.max_qp_wr), "work requests per send or receive queue"},
      {"max_sge", std::uint64_t(o.max_sge), "scatter/gather entries per send/receive request"},
      {"max_sge_rd", std::uint64_t(o.max_sge_rd), "scatter/gather entries per RDMA read"},
      {"max_cq", std::uint64_t(o.max_cq), "completion queues"},
      {"max_cqe", std::uint64_t(o.max_cqe), "entries per completion queue"},
      {"max_mr", std::uint64_t(o.max_mr), "memory regions"},
      {"max_mr_size", o.max_mr_size, "bytes per memory region"},
      {"max_pd", std::uint64_t(o.max_pd), "protection domains"},
      {"max_mw", std::uint64_t(o.max_mw), "memory windows"},
      {"max_srq", std::uint64_t(o.max_srq), "shared receive queues"},
      {"max_srq_wr", std::uint64_t(o.max_srq_wr), "work requests per SRQ"},
      {"max_srq_sge", std::uint64_t(o.max_srq_sge), "scatter/gather entries per SRQ request"},
      {"max_ah", std::uint64_t(o.max_ah), "address handles"},
      {"max_qp_rd_atom", std::uint64_t(o.max_qp_rd_atom), "outstanding reads/atomics per QP as responder"},
      {"max_qp_init_rd_atom", std::uint64_t(o.max_qp_init_rd_atom), "outstanding reads/atomics per QP as initiator"},
      {"max_pkeys", std::uint64_t(o.max_pkeys), "partition keys"},
  };
}

constexpr const char* inline_note =
    "not a device attribute: probed as the largest max_inline_data an RC QP could be created with";

// ---- diagnosis -------------------------------------------------------------------------------

// The netdev must carry a full RDMA packet: payload of the active MTU plus, in the worst case,
// IPv6 40 + UDP 8 + BTH 12 + extended headers 16 + ICRC 4 (rdma_rxe reserves 80 too).
constexpr unsigned roce_headers = 80;

std::string some_interface() {  // an up, non-loopback interface with an IPv4 address, for advice
  ifaddrs* list = nullptr;
  std::string name = "<interface>";
  if (::getifaddrs(&list) != 0) return name;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next)
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_LOOPBACK) == 0 &&
        (i->ifa_flags & IFF_UP) != 0) {
      name = i->ifa_name;
      break;
    }
  ::freeifaddrs(list);
  return name;
}

Finding no_device_finding(const std::string& only, const std::vector<verbs::DeviceInfo>& present) {
  Finding f{"no_device", false, only.empty() ? "devices" : only, "", ""};
  const bool kernel_rdma = exists("/sys/class/infiniband_verbs");
  const std::string iface = some_interface();
  f.message = only.empty() ? "no RDMA device found" : "no RDMA device named " + only;
  if (!present.empty()) {
    std::string names;
    for (const verbs::DeviceInfo& d : present) names += (names.empty() ? "" : ", ") + d.name;
    f.message += " (present: " + names + ")";
    f.fix = "pick one of them with -d, or create " + only + " (SoftRoCE: `rdma link add " + only +
            " type rxe netdev " + some_interface() + "`)";
    return f;
  }
  if (!kernel_rdma)
    f.message += "; this kernel has no RDMA support (/sys/class/infiniband_verbs is missing)";
  f.fix = "create a SoftRoCE device on an Ethernet interface that has an IPv4 address: `modprobe rdma_rxe && "
          "rdma link add rxe0 type rxe netdev " + iface + "` (as root; `ibv_devices` then lists rxe0)";
  if (!kernel_rdma)
    f.fix += ". This kernel needs CONFIG_INFINIBAND and CONFIG_RDMA_RXE for that; without them use another "
             "kernel or a VM with one (in the verbs repository, scripts/rxe-vm runs a command in such a VM)";
  return f;
}

std::vector<Finding> diagnose_port(const DeviceReport& d, const Port& p) {
  std::vector<Finding> out;
  const std::string subject = d.info.name + " port " + std::to_string(p.info.port_num);
  const std::string nd = p.netdev ? p.netdev->name : std::string();

  // 1. Port state.
  if (p.info.active()) {
    out.push_back({"port_active", true, subject, "ACTIVE", ""});
  } else {
    Finding f{"port_down", false, subject, "the port is " + std::string(state_text(p.info.state)), ""};
    if (p.netdev && p.netdev->operstate != "up") {
      f.message += " because its netdev " + nd + " is " + p.netdev->operstate;
      f.fix = "bring the interface up: `ip link set " + nd + " up` (and check its cable or peer)";
    } else if (p.info.is_ethernet()) {
      f.fix = "check the link of " + (nd.empty() ? std::string("its netdev") : nd) + ": `ip link show " + nd +
              "`, `rdma link show`";
    } else {
      f.fix = "an InfiniBand port needs a cable and a subnet manager (opensm) to become ACTIVE";
    }
    out.push_back(f);
  }
  if (!p.info.is_ethernet()) return out;  // the rest is about RoCE

  // 2. A RoCE v2 GID with an IPv4 address (what rdma_cm and choose_gid want).
  if (p.chosen && p.chosen->entry.type == verbs::GidType::roce_v2 && p.chosen->entry.gid.is_ipv4_mapped()) {
    out.push_back({"ipv4_gid", true, subject,
                   "GID index " + std::to_string(p.chosen->entry.index) + " " + p.chosen->entry.gid.to_string() +
                       " (RoCE v2" + (nd.empty() ? "" : ", " + nd) + ")",
                   ""});
  } else {
    Finding f{"no_ipv4_gid", false, subject, "no RoCE v2 GID with an IPv4 address", ""};
    f.message += p.chosen ? "; verbs would use index " + std::to_string(p.chosen->entry.index) + " " +
                                p.chosen->entry.gid.to_string() + " (" + p.chosen->reason + ")"
                          : "; " + p.choose_error;
    f.message += ", and rdma_cm cannot reach this port over IPv4";
    f.fix = "give " + (nd.empty() ? std::string("the netdev") : nd) + " an IPv4 address: `ip addr add " +
            "<address>/<prefix> dev " + (nd.empty() ? std::string("<netdev>") : nd) + "`";
    out.push_back(f);
  }

  // 3. The netdev MTU against the active RDMA MTU.
  if (p.netdev && p.netdev->mtu) {
    const unsigned mtu = *p.netdev->mtu, active = verbs::mtu_bytes(p.info.active_mtu);
    const std::string mtus = "netdev " + nd + " MTU " + std::to_string(mtu) + ", active RDMA MTU " +
                             std::to_string(active);
    if (mtu < active + roce_headers) {
      out.push_back({"netdev_mtu_too_small", false, subject,
                     mtus + ": the netdev cannot carry " + std::to_string(active) + "-byte RDMA packets (" +
                         std::to_string(active + roce_headers) + " bytes with RoCE v2 headers)",
                     "raise the MTU: `ip link set " + nd + " mtu " + std::to_string(active + roce_headers) +
                         "` or more (1500 for RDMA MTU 1024, 9000 for 4096)"});
    } else if (mtu < 1500) {
      out.push_back({"netdev_mtu_small", false, subject,
                     mtus + ": the netdev MTU is below Ethernet's 1500, so the active RDMA MTU drops to " +
                         std::to_string(active) + " while peers on a standard network use 1024 or more, and "
                         "their larger packets are dropped here",
                     "`ip link set " + nd + " mtu 1500` (or 9000 on every host for RDMA MTU 4096)"});
    } else {
      out.push_back({"netdev_mtu", true, subject, mtus, ""});
    }
  } else {
    out.push_back({"netdev_unknown", false, subject, "cannot find the netdev of this RoCE port, or read its MTU",
                   "check `rdma link show`; the port needs an Ethernet interface"});
  }
  return out;
}

std::vector<Finding> diagnose(const std::vector<DeviceReport>& devices) {
  std::vector<Finding> out;
  for (const DeviceReport& d : devices) {
    if (!d.open_error.empty()) {
      out.push_back({"open_failed", false, d.info.name, "cannot open the device: " + d.open_error,
                     "check the permissions of /dev/infiniband/uverbs* (and that the provider library, e.g. "
                     "ibverbs-providers, is installed)"});
      continue;
    }
    for (const Port& p : d.ports)
      for (Finding& f : diagnose_port(d, p)) out.push_back(std::move(f));
  }
  // rdma_cm: the kernel module, and the device node user space talks to (made by rdma_ucm).
  if (!exists("/sys/module/rdma_cm")) {
    out.push_back({"rdma_cm_module_missing", false, "rdma_cm",
                   "the rdma_cm kernel module is not loaded (/sys/module/rdma_cm is missing): connection setup "
                   "with rdma_cm (verbs::cm, rping, ib_*_bw -R) fails",
                   "`modprobe rdma_ucm` (it loads rdma_cm); to load it at boot, add rdma_ucm to "
                   "/etc/modules-load.d/rdma.conf"});
  } else if (!exists("/dev/infiniband/rdma_cm")) {
    out.push_back({"rdma_cm_device_missing", false, "rdma_cm",
                   "/dev/infiniband/rdma_cm is missing: librdmacm cannot reach the kernel's rdma_cm",
                   "`modprobe rdma_ucm` (it creates the device node)"});
  } else {
    out.push_back({"rdma_cm", true, "rdma_cm", "module loaded, /dev/infiniband/rdma_cm present", ""});
  }
  return out;
}

// ---- the peer's MTU (--peer HOST) ---------------------------------------------------------------

// The RDMA MTU rxe (and RoCE generally) derives from a netdev MTU: the largest of 256..4096 that
// leaves room for the RoCE v2 headers.
unsigned rdma_mtu_for(unsigned netdev_mtu) {
  for (unsigned m = 4096; m >= 256; m /= 2)
    if (netdev_mtu >= m + roce_headers) return m;
  return 0;
}

std::uint16_t icmp_checksum(const unsigned char* p, std::size_t n) {
  std::uint32_t sum = 0;
  for (std::size_t i = 0; i + 1 < n; i += 2) sum += static_cast<std::uint32_t>(p[i] << 8 | p[i + 1]);
  if ((n & 1) != 0) sum += static_cast<std::uint32_t>(p[n - 1] << 8);
  while ((sum >> 16) != 0) sum = (sum & 0xffff) + (sum >> 16);
  return htons(static_cast<std::uint16_t>(~sum));
}

// One ICMP echo to `to` with `payload` bytes, fragmented here as needed (no DF), and the answer:
// empty when none came within `wait`; else the size of the largest fragment the reply came in
// (0: the reply was not fragmented). An ICMP socket when this group may have one
// (net.ipv4.ping_group_range), else a raw one (root).
struct EchoReply {
  unsigned largest_fragment = 0;
};
std::optional<EchoReply> echo(const sockaddr_in& to, std::size_t payload, std::chrono::milliseconds wait,
                              std::string& error) {
  bool raw = false;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_ICMP);
  if (fd < 0) {
    fd = ::socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMP);
    raw = true;
  }
  if (fd < 0) {
    error = std::string("cannot open an ICMP socket (") + std::strerror(errno) +
            "): this group may not use ping sockets (sysctl net.ipv4.ping_group_range) and is not root";
    return std::nullopt;
  }
  const int on = 1, dont = IP_PMTUDISC_DONT;
  ::setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &dont, sizeof dont);
  ::setsockopt(fd, IPPROTO_IP, IP_RECVFRAGSIZE, &on, sizeof on);
  const auto id = static_cast<std::uint16_t>(::getpid());
  static std::uint16_t seq = 0;
  const std::uint16_t my_seq = ++seq;
  std::vector<unsigned char> req(sizeof(icmphdr) + payload);
  for (std::size_t i = sizeof(icmphdr); i < req.size(); ++i) req[i] = static_cast<unsigned char>(i);
  icmphdr h{};
  h.type = ICMP_ECHO;
  h.un.echo.id = htons(id);
  h.un.echo.sequence = htons(my_seq);
  std::memcpy(req.data(), &h, sizeof h);
  const std::uint16_t sum = icmp_checksum(req.data(), req.size());
  std::memcpy(req.data() + offsetof(icmphdr, checksum), &sum, sizeof sum);
  std::optional<EchoReply> out;
  if (::sendto(fd, req.data(), req.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to) < 0) {  // NOLINT
    error = std::string("sending an ICMP echo failed: ") + std::strerror(errno);
    ::close(fd);
    return std::nullopt;
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::vector<unsigned char> buf(req.size() + 128);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    iovec v{buf.data(), buf.size()};
    alignas(cmsghdr) char control[128];
    msghdr m{};
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd, &m, 0);
    if (n < 0) continue;
    std::size_t at = 0;  // a raw socket gives the IP header too
    if (raw) {
      if (n < 20) continue;
      at = static_cast<std::size_t>(buf[0] & 0x0f) * 4;
    }
    if (static_cast<std::size_t>(n) < at + sizeof(icmphdr)) continue;
    icmphdr r{};
    std::memcpy(&r, buf.data() + at, sizeof r);
    // A ping socket's replies are its own (the kernel sets and matches the id); a raw socket's
    // must be picked out.
    if (r.type != ICMP_ECHOREPLY || ntohs(r.un.echo.sequence) != my_seq || (raw && ntohs(r.un.echo.id) != id)) continue;
    EchoReply e;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c))
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_RECVFRAGSIZE) {
        int f = 0;
        std::memcpy(&f, CMSG_DATA(c), sizeof f);
        e.largest_fragment = static_cast<unsigned>(f);
      }
    out = e;
    break;
  }
  ::close(fd);
  return out;
}

// The netdev this host reaches `to` through (the route's source address, then its interface);
// `is_local` set when `to` is one of this host's own addresses.
std::optional<Netdev> netdev_towards(const sockaddr_in& to, bool& is_local) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  sockaddr_in probe = to, local{};
  probe.sin_port = htons(4791);
  socklen_t len = sizeof local;
  const bool routed = ::connect(fd, reinterpret_cast<const sockaddr*>(&probe), sizeof probe) == 0 &&  // NOLINT
                      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;            // NOLINT
  ::close(fd);
  if (!routed) return std::nullopt;
  is_local = local.sin_addr.s_addr == to.sin_addr.s_addr;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<Netdev> out;
  for (ifaddrs* i = list; i != nullptr && !out; i = i->ifa_next)
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == local.sin_addr.s_addr) {  // NOLINT
      Netdev n{i->ifa_name, std::nullopt, read_line(std::string("/sys/class/net/") + i->ifa_name + "/operstate").value_or("unknown")};
      if (auto mtu = read_line(std::string("/sys/class/net/") + i->ifa_name + "/mtu")) n.mtu = static_cast<unsigned>(std::stoul(*mtu));
      out = n;
    }
  ::freeifaddrs(list);
  return out;
}

// What the MTU check says of `host`: the largest fragment of the reply to a 9000-byte echo is
// the peer's MTU (the peer fragments its reply at its own; this host's at its own), or the reply
// is whole: the peer's MTU is 9000 or more.
std::vector<Finding> diagnose_peer(const std::string& host) {
  const std::string subject = "peer " + host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr)
    return {{"peer_unknown", false, subject, "cannot resolve " + host + " to an IPv4 address",
             "give an IPv4 address or name (IPv6 peers are not probed)"}};
  sockaddr_in to{};
  std::memcpy(&to, res->ai_addr, sizeof to);
  ::freeaddrinfo(res);
  bool is_local = false;
  const std::optional<Netdev> nd = netdev_towards(to, is_local);
  if (!nd || !nd->mtu)
    return {{"peer_no_route", false, subject, "no route to " + host + " from this host",
             "check `ip route get " + host + "`"}};
  if (is_local) return {{"peer_mtu", true, subject, host + " is this host's own address: nothing to compare", ""}};
  const unsigned mine = *nd->mtu;
  std::string error;
  // Three tries each (an echo can be lost like any packet), 1 s apiece.
  std::optional<EchoReply> small;
  for (int i = 0; i < 3 && !small && error.empty(); ++i) small = echo(to, 56, std::chrono::seconds(1), error);
  if (!small)
    return {{"peer_unreachable", false, subject,
             error.empty() ? host + " answered no ICMP echo in 3 s (down, or echoes filtered): its MTU cannot be compared"
                           : error,
             error.empty() ? "check that " + host + " is up (`ping " + host + "`), or compare `ip link show` on both hosts"
                           : "run as root, or allow this group ICMP sockets: `sysctl net.ipv4.ping_group_range='0 2147483647'`"}};
  constexpr std::size_t probe = 9000 - 28;  // IPv4 20 + ICMP 8
  std::optional<EchoReply> big;
  for (int i = 0; i < 3 && !big && error.empty(); ++i) big = echo(to, probe, std::chrono::seconds(1), error);
  const std::string here = "this host's " + nd->name + " MTU " + std::to_string(mine) + " (RDMA MTU " +
                           std::to_string(rdma_mtu_for(mine)) + ")";
  const std::string fix = "set the same MTU on both hosts' netdevs (`ip link set <netdev> mtu <N>`; 1500 for RDMA "
                          "MTU 1024, 9000 for 4096). verbs connections use the smaller MTU on their own; "
                          "another program's packets of the larger one are dropped or refused";
  if (!big)
    return {{"peer_mtu_mismatch", false, subject,
             host + " answers small echoes but not 9000-byte ones: a netdev or switch on the path drops full-size "
                    "packets (" + here + "; the peer's fragments are larger than this host takes, or the path "
                    "carries less than it claims)",
             fix}};
  const unsigned theirs = big->largest_fragment == 0 ? 9000 : big->largest_fragment;
  const unsigned rdma_theirs = rdma_mtu_for(std::min(theirs, 9000u)), rdma_mine = rdma_mtu_for(mine);
  const std::string there =
      host + "'s replies come back " +
      (big->largest_fragment == 0 ? std::string("whole (its MTU is 9000 or more")
                                  : "in fragments of " + std::to_string(theirs) + " bytes (its MTU is " +
                                        std::to_string(theirs)) +
      ", RDMA MTU " + std::to_string(rdma_theirs) + ")";
  if (rdma_theirs != rdma_mine) return {{"peer_mtu_mismatch", false, subject, there + ", " + here, fix}};
  return {{"peer_mtu", true, subject,
           there + ", " + here + ": the same RDMA MTU both ways", ""}};
}

// ---- the library's defaults -------------------------------------------------------------------------

// "1.88 s" or "17 ms": exact milliseconds, without trailing zeros; "never" when empty.
std::string duration_text(std::optional<std::chrono::milliseconds> d) {
  if (!d) return "never";
  const long long ms = d->count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  std::string frac = std::to_string(1000 + ms % 1000).substr(1);
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  return std::to_string(ms / 1000) + (frac.empty() ? "" : "." + frac) + " s";
}

// How long a request can take to fail with TransportOptions{} towards a peer with the same options:
// the figures users and tests are told to wait for (docs/connections.md, "Defaults that never hang").
std::string defaults_text() {
  const verbs::TransportOptions o{};
  const verbs::FailureBound b = verbs::failure_bound(o);
  const auto ack = verbs::ack_timeout_duration(o.ack_timeout);
  const double ack_ms = ack ? std::chrono::duration<double, std::milli>(*ack).count() : 0.0;
  const double rnr_ms = std::chrono::duration<double, std::milli>(verbs::rnr_timer_duration(o.min_rnr_timer)).count();
  char line[512];
  std::snprintf(line, sizeof line,
                "defaults: a request fails within %s of a peer that stops answering (%d tries of at most 4 x %.1f ms: "
                "ack_timeout %u, retry_count %u) and within %s of a receiver that posts nothing (%u RNR retries x "
                "%.2f ms: rnr_retry_count %u, min_rnr_timer %u), %s if it meets both (verbs::failure_bound)",
                duration_text(b.transport).c_str(), o.retry_count + 1, ack_ms, unsigned(o.ack_timeout),
                unsigned(o.retry_count), duration_text(b.rnr).c_str(), unsigned(o.rnr_retry_count), rnr_ms,
                unsigned(o.rnr_retry_count), unsigned(o.min_rnr_timer), duration_text(b.total).c_str());
  return line;
}

// ---- output ---------------------------------------------------------------------------------------

void print_text(const std::vector<DeviceReport>& devices) {
  for (const DeviceReport& d : devices) {
    std::printf("%s: %s, node GUID %s\n", d.info.name.c_str(), std::string(node_type_text(d.info.node_type)).c_str(),
                guid_text(d.info.node_guid).c_str());
    if (!d.open_error.empty()) {
      std::printf("  cannot open: %s\n\n", d.open_error.c_str());
      continue;
    }
    const ibv_device_attr& o = d.attr.orig_attr;
    std::printf("  firmware %s, vendor 0x%x part %u, hardware 0x%x, %u port(s)\n", o.fw_ver, o.vendor_id,
                o.vendor_part_id, o.hw_ver, unsigned(o.phys_port_cnt));
    for (const Port& p : d.ports) {
      const verbs::PortInfo& i = p.info;
      std::printf("  port %u: %s, link layer %s, MTU active %u / max %u, speed %s", unsigned(i.port_num),
                  std::string(state_text(i.state)).c_str(), std::string(link_layer_text(i.link_layer)).c_str(),
                  verbs::mtu_bytes(i.active_mtu), verbs::mtu_bytes(i.max_mtu), speed_text(i).c_str());
      if (!i.is_ethernet()) std::printf(", LID %u", unsigned(i.lid));
      std::printf(", max message %u bytes\n", i.raw.max_msg_sz);
      if (p.netdev)
        std::printf("    netdev %s: %s, MTU %s\n", p.netdev->name.c_str(), p.netdev->operstate.c_str(),
                    p.netdev->mtu ? std::to_string(*p.netdev->mtu).c_str() : "unknown");
      std::printf("    GID table (%u entries, %zu in use):\n", i.gid_table_len, p.gids.size());
      for (const verbs::GidEntry& g : p.gids)
        std::printf("      %3u  %-40s %-8s %s\n", g.index, g.gid.to_string().c_str(),
                    std::string(verbs::to_string(g.type)).c_str(), g.netdev.c_str());
      if (p.chosen)
        std::printf("    verbs chooses GID %u %s: %s\n", p.chosen->entry.index, p.chosen->entry.gid.to_string().c_str(),
                    p.chosen->reason.c_str());
      else
        std::printf("    verbs chooses no GID: %s\n", p.choose_error.c_str());
    }
    std::printf("  limits:\n");
    for (const Limit& l : limits(d.attr))
      std::printf("    %-20s %-22llu %s\n", l.name, static_cast<unsigned long long>(l.value), l.what);
    if (d.inline_data.error.empty())
      std::printf("    %-20s %-22u inline bytes per send (%s)\n", "max_inline_data", d.inline_data.value, inline_note);
    else
      std::printf("    %-20s %-22s %s (%s)\n", "max_inline_data", "unknown", d.inline_data.error.c_str(), inline_note);
    std::printf("    %-20s %s\n", "atomics", std::string(atomic_text(o.atomic_cap)).c_str());
    std::printf("    %-20s %s\n", "on-demand paging", odp_text(d.attr).c_str());
    std::printf("    %-20s %s\n\n", "memory windows", memory_windows_text(d.attr).c_str());
  }
  std::printf("%s\n", defaults_text().c_str());
}

int print_check(const std::vector<Finding>& findings) {
  int problems = 0;
  for (const Finding& f : findings) {
    if (f.ok) {
      std::printf("ok       %s: %s\n", f.subject.c_str(), f.message.c_str());
    } else {
      ++problems;
      std::printf("PROBLEM  %s: %s [%s]\n         fix: %s\n", f.subject.c_str(), f.message.c_str(), f.id.c_str(),
                  f.fix.c_str());
    }
  }
  if (problems == 0)
    std::printf("verbs-info: healthy: the devices above are ready for verbs and rdma_cm\n");
  else
    std::printf("verbs-info: %d problem(s) found\n", problems);
  return problems;
}

class Json {
 public:
  std::string str() const { return out_.str(); }
  Json& raw(std::string_view s) { out_ << s; first_ = false; return *this; }
  Json& string(std::string_view s) {
    out_ << '"';
    for (const char c : s) {
      switch (c) {
        case '"': out_ << "\\\""; break;
        case '\\': out_ << "\\\\"; break;
        case '\n': out_ << "\\n"; break;
        case '\t': out_ << "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char u[8];
            std::snprintf(u, sizeof u, "\\u%04x", unsigned(c));
            out_ << u;
          } else {
            out_ << c;
          }
      }
    }
    out_ << '"';
    return *this;
  }
  Json& key(std::string_view k) { comma(); string(k); out_ << ':'; first_ = true; return *this; }
  template <typename T>
  Json& field(std::string_view k, const T& v) {
    key(k);
    if constexpr (std::is_same_v<T, bool>) out_ << (v ? "true" : "false");
    else if constexpr (std::is_arithmetic_v<T>) out_ << +v;
    else string(v);
    first_ = false;
    return *this;
  }
  // An element of an array.
  template <typename T>
  Json& value(const T& v) {
    comma();
    if constexpr (std::is_arithmetic_v<T>) out_ << +v;
    else string(v);
    first_ = false;
    return *this;
  }
  Json& open(char c) { comma(); out_ << c; first_ = true; return *this; }
  Json& close(char c) { out_ << c; first_ = false; return *this; }

 private:
  void comma() {
    if (!first_) out_ << ',';
    first_ = false;
  }
  std::ostringstream out_;
  bool first_ = true;
};

std::string print_json(const std::vector<DeviceReport>& devices, const std::vector<Finding>& findings) {
  Json j;
  j.open('{').key("devices").open('[');
  for (const DeviceReport& d : devices) {
    j.open('{').field("name", d.info.name).field("node_type", node_type_text(d.info.node_type));
    j.field("node_guid", guid_text(d.info.node_guid));
    if (!d.open_error.empty()) {
      j.field("open_error", d.open_error).close('}');
      continue;
    }
    const ibv_device_attr& o = d.attr.orig_attr;
    j.field("fw_ver", std::string(o.fw_ver)).field("vendor_id", o.vendor_id).field("vendor_part_id", o.vendor_part_id);
    j.field("hw_ver", o.hw_ver).key("ports").open('[');
    for (const Port& p : d.ports) {
      const verbs::PortInfo& i = p.info;
      j.open('{').field("port", i.port_num).field("state", state_text(i.state));
      j.field("link_layer", link_layer_text(i.link_layer)).field("active_mtu", verbs::mtu_bytes(i.active_mtu));
      j.field("max_mtu", verbs::mtu_bytes(i.max_mtu)).field("width", width_lanes(i.active_width));
      j.field("speed", lane_speed(i.active_speed).second).field("gbps", port_gbps(i)).field("lid", i.lid);
      j.field("max_msg_sz", i.raw.max_msg_sz).field("gid_table_len", i.gid_table_len);
      j.key("netdev");
      if (p.netdev) {
        j.open('{').field("name", p.netdev->name).field("operstate", p.netdev->operstate).key("mtu");
        if (p.netdev->mtu) j.raw(std::to_string(*p.netdev->mtu)); else j.raw("null");
        j.close('}');
      } else {
        j.raw("null");
      }
      j.key("gids").open('[');
      for (const verbs::GidEntry& g : p.gids)
        j.open('{').field("index", g.index).field("gid", g.gid.to_string()).field("type", verbs::to_string(g.type))
            .field("netdev", g.netdev).close('}');
      j.close(']').key("chosen_gid");
      if (p.chosen)
        j.open('{').field("index", p.chosen->entry.index).field("gid", p.chosen->entry.gid.to_string())
            .field("type", verbs::to_string(p.chosen->entry.type)).field("reason", p.chosen->reason).close('}');
      else
        j.open('{').field("error", p.choose_error).close('}');
      j.close('}');
    }
    j.close(']').key("limits").open('{');
    for (const Limit& l : limits(d.attr)) j.field(l.name, l.value);
    j.key("max_inline_data").open('{');
    if (d.inline_data.error.empty()) j.field("value", d.inline_data.value); else j.field("error", d.inline_data.error);
    j.field("probed", true).field("note", inline_note).close('}');
    j.field("atomic_cap", atomic_text(o.atomic_cap)).field("odp", odp_text(d.attr));
    j.field("memory_windows", memory_windows_text(d.attr)).close('}').close('}');
  }
  j.close(']').key("checks").open('[');
  bool healthy = true;
  for (const Finding& f : findings) {
    healthy = healthy && f.ok;
    j.open('{').field("id", f.id).field("ok", f.ok).field("subject", f.subject).field("message", f.message);
    if (!f.ok) j.field("fix", f.fix);
    j.close('}');
  }
  j.close(']').field("healthy", healthy);
  const verbs::TransportOptions o{};
  const verbs::FailureBound b = verbs::failure_bound(o);
  const auto ms = [&j](std::string_view k, std::optional<std::chrono::milliseconds> d) {
    j.key(k);
    if (d) j.raw(std::to_string(d->count())); else j.raw("null");
  };
  j.key("defaults").open('{').key("transport_options").open('{');
  j.field("ack_timeout", o.ack_timeout).field("retry_count", o.retry_count);
  j.field("rnr_retry_count", o.rnr_retry_count).field("min_rnr_timer", o.min_rnr_timer).close('}');
  j.key("ack_timeout_ns");
  if (const auto ack = verbs::ack_timeout_duration(o.ack_timeout)) j.raw(std::to_string(ack->count())); else j.raw("null");
  j.field("rnr_timer_us", verbs::rnr_timer_duration(o.min_rnr_timer).count());
  j.key("failure_bound_ms").open('{');
  ms("transport", b.transport);
  ms("rnr", b.rnr);
  ms("total", b.total);
  j.close('}').field("text", defaults_text()).close('}').close('}');
  return j.str();
}

// ---- --topology: where each device sits, and a ranking by closeness -----------------------------

// The text form: each device's PCI place, NUMA node, netdevs and ports; then the ranking.
void print_topology_text(const verbs::Topology& t, const std::string& only,
                         const std::vector<verbs::RankedDevice>* ranked, std::string_view near) {
  std::printf("NUMA nodes: %zu\n", t.numa_nodes().size());
  for (const verbs::DeviceTopology& d : t.devices()) {
    if (!only.empty() && d.name != only) continue;
    std::printf("%s\n", d.name.c_str());
    if (d.pci) {
      std::string path = d.host_bridge;
      for (const auto& b : d.bridges) path += " > " + b.to_string();
      std::printf("  pci %s%s, below %s\n", d.pci->to_string().c_str(), d.pci_from_netdev ? " (its netdev's)" : "",
                  path.c_str());
    } else {
      std::printf("  pci none (a soft device on a virtual netdev)\n");
    }
    std::printf("  numa node %d%s\n", d.numa_node, d.numa_node < 0 ? " (the kernel does not know)" : "");
    std::string nets;
    for (const auto& n : d.netdevs) nets += (nets.empty() ? "" : ", ") + n;
    std::printf("  netdevs %s\n", nets.empty() ? "none" : nets.c_str());
    for (const auto& p : d.ports)
      std::printf("  port %u %s, %s, %s%s%s\n", p.port, p.state.c_str(), p.link_layer.c_str(),
                  p.rate.empty() ? "rate unknown" : p.rate.c_str(), p.netdev.empty() ? "" : ", netdev ",
                  p.netdev.c_str());
  }
  if (ranked == nullptr) return;
  std::printf("\nnearest to %.*s first:\n", static_cast<int>(near.size()), near.data());
  int i = 0;
  for (const auto& r : *ranked) {
    const std::string hops = r.pci_hops < 0 ? std::string("-") : std::to_string(r.pci_hops);
    std::printf("  %d. %-10s %-17s PCI hops %-3s %6.1f Gb/s %s\n", ++i, r.device->name.c_str(),
                std::string(to_string(r.proximity)).c_str(), hops.c_str(), r.device->rate_gbps(),
                r.device->active() ? "active" : "no active port");
  }
}

std::string print_topology_json(const verbs::Topology& t, const std::string& only,
                                const std::vector<verbs::RankedDevice>* ranked, std::string_view near) {
  Json j;
  j.open('{').key("numa_nodes").open('[');
  for (int n : t.numa_nodes()) j.value(n);
  j.close(']').key("devices").open('[');
  for (const verbs::DeviceTopology& d : t.devices()) {
    if (!only.empty() && d.name != only) continue;
    j.open('{').field("name", d.name).key("pci");
    if (d.pci) j.value(d.pci->to_string()); else j.raw("null");
    j.field("pci_from_netdev", d.pci_from_netdev).field("host_bridge", d.host_bridge).key("bridges").open('[');
    for (const auto& b : d.bridges) j.value(b.to_string());
    j.close(']').field("numa_node", d.numa_node).key("netdevs").open('[');
    for (const auto& n : d.netdevs) j.value(n);
    j.close(']').field("rate_gbps", d.rate_gbps()).field("active", d.active()).key("ports").open('[');
    for (const auto& p : d.ports) {
      j.open('{').field("port", p.port).field("state", p.state).field("active", p.active);
      j.field("link_layer", p.link_layer).field("rate", p.rate).field("rate_gbps", p.rate_gbps);
      j.field("netdev", p.netdev).close('}');
    }
    j.close(']').close('}');
  }
  j.close(']');
  if (ranked != nullptr) {
    j.key("near").open('{').field("place", near).key("ranking").open('[');
    for (const auto& r : *ranked) {
      j.open('{').field("name", r.device->name).field("proximity", to_string(r.proximity));
      j.field("pci_hops", r.pci_hops).close('}');
    }
    j.close(']').close('}');
  }
  j.close('}');
  return j.str();
}

// verbs-info --topology [--near PLACE] [--json] [-d DEVICE]: sysfs only, no device is opened.
int topology_main(bool json, const std::string& only, const std::string& near) {
  const std::string root = sysroot().empty() ? std::string("/") : sysroot();
  const verbs::Topology t = verbs::Topology::read(root);
  if (!only.empty() && t.find(only) == nullptr) {
    std::fprintf(stderr, "verbs-info: no RDMA device '%s' in %s/sys/class/infiniband\n", only.c_str(),
                 sysroot().c_str());
    return exit_no_device;
  }
  std::optional<std::vector<verbs::RankedDevice>> ranked;
  if (!near.empty()) {
    try {
      ranked = t.rank(verbs::Place::parse(near));
    } catch (const verbs::Error& e) {
      std::fprintf(stderr, "verbs-info: --near: %s\n", e.context().c_str());
      return exit_usage;
    }
  }
  if (json) std::printf("%s\n", print_topology_json(t, only, ranked ? &*ranked : nullptr, near).c_str());
  else print_topology_text(t, only, ranked ? &*ranked : nullptr, near);
  return t.devices().empty() ? exit_no_device : exit_ok;
}

}  // namespace

int main(int argc, char** argv) try {
  bool json = false, check = false, topology = false;
  std::string only, peer, near;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--check") check = true;
    else if ((a == "-d" || a == "--device") && i + 1 < argc) only = argv[++i];
    else if (a == "--peer" && i + 1 < argc) { peer = argv[++i]; check = true; }
    else if (a == "--topology") topology = true;
    else if (a == "--near" && i + 1 < argc) { near = argv[++i]; topology = true; }
    else if (a == "-h" || a == "--help") { std::fputs(usage_text, stdout); return exit_ok; }
    else { std::fprintf(stderr, "verbs-info: unknown argument '%s'\n%s", argv[i], usage_text); return exit_usage; }
  }
  if (topology && check) {
    std::fprintf(stderr, "verbs-info: --topology and --check do not go together\n%s", usage_text);
    return exit_usage;
  }
  if (topology) return topology_main(json, only, near);

  const std::vector<verbs::DeviceInfo> present = verbs::list_devices();
  std::vector<DeviceReport> devices;
  for (const verbs::DeviceInfo& info : present)
    if (only.empty() || info.name == only) devices.push_back(gather(info));

  if (devices.empty()) {
    const Finding f = no_device_finding(only, present);
    std::fprintf(stderr, "verbs-info: %s.\nTo fix: %s\n", f.message.c_str(), f.fix.c_str());
    if (json) std::printf("%s\n", print_json({}, {f}).c_str());
    else if (!check) std::printf("%s\n", defaults_text().c_str());  // they need no device
    return exit_no_device;
  }
  std::vector<Finding> findings = diagnose(devices);
  if (!peer.empty())
    for (Finding& f : diagnose_peer(peer)) findings.push_back(std::move(f));
  if (json) {
    std::printf("%s\n", print_json(devices, findings).c_str());
    if (!check) return exit_ok;
    for (const Finding& f : findings) if (!f.ok) return exit_problems;
    return exit_ok;
  }
  if (check) return print_check(findings) == 0 ? exit_ok : exit_problems;
  print_text(devices);
  return exit_ok;
} catch (const std::exception& e) {
  std::fprintf(stderr, "verbs-info: %s\n", e.what());
  return exit_no_device;
}
