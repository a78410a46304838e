// Topology: sysfs under a root, read into DeviceTopology, and the ranking (docs/design/rails.md).
#include "verbs/topology.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <tuple>

#include "verbs/device.hpp"

namespace verbs {

namespace fs = std::filesystem;

namespace {

bool hex_digits(std::string_view s, std::size_t min, std::size_t max, std::uint32_t& out) {
  if (s.size() < min || s.size() > max) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// DDDD:BB:DD.F (domain 4..8 digits, or none when `domain_optional`).
std::optional<PciAddress> parse_bdf(std::string_view s, bool domain_optional) {
  PciAddress a;
  const auto dot = s.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const auto last_colon = s.rfind(':', dot);
  if (last_colon == std::string_view::npos) return std::nullopt;
  std::uint32_t fn = 0, dev = 0, bus = 0, domain = 0;
  if (!hex_digits(s.substr(dot + 1), 1, 1, fn) || fn > 7) return std::nullopt;
  if (!hex_digits(s.substr(last_colon + 1, dot - last_colon - 1), 2, 2, dev) || dev > 31) return std::nullopt;
  const auto head = s.substr(0, last_colon);
  const auto first_colon = head.rfind(':');
  if (first_colon == std::string_view::npos) {
    if (!domain_optional || !hex_digits(head, 2, 2, bus)) return std::nullopt;
  } else if (!hex_digits(head.substr(first_colon + 1), 2, 2, bus) || !hex_digits(head.substr(0, first_colon), 4, 8, domain)) {
    return std::nullopt;
  }
  a.domain = domain;
  a.bus = static_cast<std::uint8_t>(bus);
  a.device = static_cast<std::uint8_t>(dev);
  a.function = static_cast<std::uint8_t>(fn);
  return a;
}

std::optional<std::string> read_line(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

int read_int(const fs::path& p, int fallback) {
  const auto line = read_line(p);
  if (!line) return fallback;
  int v = 0;
  const auto r = std::from_chars(line->data(), line->data() + line->size(), v);
  return r.ec == std::errc() ? v : fallback;
}

// The names in a directory, sorted; empty when it cannot be read.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) out.push_back(it->path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A cpulist ("0-23,48-71") as CPU numbers.
std::vector<int> parse_cpulist(std::string_view s) {
  std::vector<int> out;
  while (!s.empty()) {
    const auto comma = s.find(',');
    const auto part = s.substr(0, comma);
    int lo = 0, hi = 0;
    const auto dash = part.find('-');
    const auto a = part.substr(0, dash);
    if (std::from_chars(a.data(), a.data() + a.size(), lo).ec == std::errc()) {
      hi = lo;
      if (dash != std::string_view::npos) {
        const auto b = part.substr(dash + 1);
        if (std::from_chars(b.data(), b.data() + b.size(), hi).ec != std::errc()) hi = lo;
      }
      for (int c = lo; c <= hi && c - lo < (1 << 16); ++c) out.push_back(c);
    }
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

// Where a sysfs entry sits on the PCI tree: `entry` resolved (its links are relative, so a
// fake tree's stay inside it), then its components
// from pciDDDD:BB down, as long as they are PCI functions. Empty host_bridge: not on PCI.
Topology::PciPath pci_path_of(const fs::path& entry) {
  Topology::PciPath out;
  std::error_code ec;
  const fs::path real = fs::canonical(entry, ec);
  if (ec) return out;
  fs::path function_dir;
  bool in_pci = false;
  fs::path walked;
  for (const auto& part : real) {
    walked /= part;
    const std::string name = part.string();
    // A host bridge (pciDDDD:BB) starts the chain; one nested below a function (Intel VMD's
    // pci10000:e0 under its controller) starts it again: the device sits below that one.
    if (name.size() >= 10 && name.rfind("pci", 0) == 0 && parse_bdf(name.substr(3) + ":00.0", false)) {
      out.host_bridge = name;
      out.chain.clear();
      in_pci = true;
      continue;
    }
    if (!in_pci) continue;
    const auto a = parse_bdf(name, false);
    if (!a) break;
    out.chain.push_back(*a);
    function_dir = walked;
  }
  if (!out.chain.empty()) out.numa_node = read_int(function_dir / "numa_node", -1);
  return out;
}

void add_unique(std::vector<std::string>& v, const std::string& s) {
  if (!s.empty() && std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
}

DeviceTopology read_one(const fs::path& root, const std::string& name) {
  DeviceTopology d;
  d.name = name;
  const fs::path dir = root / "sys/class/infiniband" / name;
  // Ports: state, link layer, rate, the netdev of GID 0.
  for (const auto& p : names_in(dir / "ports")) {
    int num = 0;
    if (std::from_chars(p.data(), p.data() + p.size(), num).ec != std::errc() || num < 1 || num > 255) continue;
    PortTopology port;
    port.port = static_cast<std::uint8_t>(num);
    const fs::path pd = dir / "ports" / p;
    // "4: ACTIVE": the number, then the name.
    const std::string state = read_line(pd / "state").value_or("");
    const auto colon = state.find(':');
    port.state = colon == std::string::npos ? state : state.substr(colon + 1);
    port.state.erase(0, port.state.find_first_not_of(' '));
    port.active = std::atoi(state.c_str()) == 4;
    port.link_layer = read_line(pd / "link_layer").value_or("");
    port.rate = read_line(pd / "rate").value_or("");
    port.rate_gbps = std::strtod(port.rate.c_str(), nullptr);
    port.netdev = read_line(pd / "gid_attrs/ndevs/0").value_or("");
    d.ports.push_back(std::move(port));
  }
  std::sort(d.ports.begin(), d.ports.end(), [](const auto& a, const auto& b) { return a.port < b.port; });
  // Netdevs: the PCI function's (device/net), a soft device's parent, the ports' GID 0.
  for (const auto& n : names_in(dir / "device/net")) add_unique(d.netdevs, n);
  add_unique(d.netdevs, read_line(dir / "parent").value_or(""));
  for (const auto& p : d.ports) add_unique(d.netdevs, p.netdev);
  // The PCI function: the device's own, else its first netdev's (rxe on a virtio NIC).
  auto path = pci_path_of(dir);
  if (path.chain.empty() && !d.netdevs.empty()) {
    path = pci_path_of(root / "sys/class/net" / d.netdevs.front());
    d.pci_from_netdev = !path.chain.empty();
  }
  if (!path.chain.empty()) {
    d.pci = path.chain.back();
    d.bridges.assign(path.chain.begin(), path.chain.end() - 1);
    d.host_bridge = path.host_bridge;
    d.numa_node = path.numa_node;
  }
  return d;
}

std::vector<std::string> device_names(const fs::path& root) { return names_in(root / "sys/class/infiniband"); }

}  // namespace

PciAddress PciAddress::parse(std::string_view text, SourceLocation where) {
  std::error_code ec;
  const auto a = parse(text, ec);
  if (!a) detail::throw_error(ec, "PciAddress::parse: '" + std::string(text) +
                                      "' is not a PCI address (DDDD:BB:DD.F with a domain of 4 to 8 hex digits, "
                                      "e.g. 0000:3b:00.0 or 00000000:3B:00.0, or BB:DD.F)", where);
  return *a;
}

std::optional<PciAddress> PciAddress::parse(std::string_view text, std::error_code& ec) noexcept {
  const auto a = parse_bdf(text, true);
  ec = a ? std::error_code() : make_error_code(Errc::bad_encoding);
  return a;
}

std::string PciAddress::to_string() const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, device, function);  // as sysfs names it
  return buf;
}

std::string_view to_string(Proximity p) noexcept {
  switch (p) {
    case Proximity::same_device: return "same device";
    case Proximity::same_switch: return "same switch";
    case Proximity::same_root_port: return "same root port";
    case Proximity::same_host_bridge: return "same host bridge";
    case Proximity::same_numa_node: return "same NUMA node";
    case Proximity::other_numa_node: return "other NUMA node";
    case Proximity::unknown: break;
  }
  return "unknown";
}

double DeviceTopology::rate_gbps() const noexcept {
  double best_active = 0, best = 0;
  for (const auto& p : ports) {
    best = std::max(best, p.rate_gbps);
    if (p.active) best_active = std::max(best_active, p.rate_gbps);
  }
  return best_active > 0 ? best_active : best;
}

bool DeviceTopology::active() const noexcept {
  return std::any_of(ports.begin(), ports.end(), [](const auto& p) { return p.active; });
}

Place Place::parse(std::string_view text, SourceLocation where) {
  const auto number = [&](std::string_view s) -> std::optional<int> {
    int v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size() || v < 0) return std::nullopt;
    return v;
  };
  if (text.rfind("numa:", 0) == 0) {
    if (const auto n = number(text.substr(5))) return of_numa_node(*n);
  } else if (text.rfind("cpu:", 0) == 0) {
    if (const auto n = number(text.substr(4))) return of_cpu(*n);
  } else if (const auto a = parse_bdf(text, true)) {
    return of_pci(*a);
  }
  detail::throw_error(make_error_code(Errc::bad_encoding),
                      "Place::parse: '" + std::string(text) +
                          "' is not a place: want a PCI address (0000:3b:00.0), numa:N or cpu:N", where);
}

Topology Topology::read(const fs::path& root, SourceLocation where) {
  Topology t;
  std::error_code ec;
  t.root_ = fs::absolute(root, ec);
  if (ec || !fs::is_directory(t.root_ / "sys", ec))
    detail::throw_error(ec ? ec : std::make_error_code(std::errc::no_such_file_or_directory),
                        "Topology::read: " + (root / "sys").string() + " cannot be read", where);
  for (const auto& name : device_names(t.root_)) t.devices_.push_back(read_one(t.root_, name));
  // The NUMA nodes by number (a directory lists node10 before node2), each with its CPUs.
  const fs::path node_dir = t.root_ / "sys/devices/system/node";
  std::vector<std::pair<int, std::vector<int>>> nodes;
  for (const auto& n : names_in(node_dir)) {
    int num = 0;
    if (n.rfind("node", 0) != 0 || std::from_chars(n.data() + 4, n.data() + n.size(), num).ec != std::errc()) continue;
    nodes.emplace_back(num, parse_cpulist(read_line(node_dir / n / "cpulist").value_or("")));
  }
  std::sort(nodes.begin(), nodes.end());
  for (auto& [num, cpus] : nodes) {
    t.nodes_.push_back(num);
    t.node_cpus_.push_back(std::move(cpus));
  }
  return t;
}

const DeviceTopology* Topology::find(std::string_view name) const noexcept {
  for (const auto& d : devices_)
    if (d.name == name) return &d;
  return nullptr;
}

int Topology::numa_node_of_cpu(int cpu) const noexcept {
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (std::find(node_cpus_[i].begin(), node_cpus_[i].end(), cpu) != node_cpus_[i].end()) return nodes_[i];
  return -1;
}

// A node the kernel does not know (-1) is the only node of a machine that has one (or none).
int Topology::effective_node(int node) const noexcept {
  if (node >= 0) return node;
  if (nodes_.size() <= 1) return nodes_.empty() ? 0 : nodes_.front();
  return -1;
}

RankedDevice Topology::closeness(const DeviceTopology& device, const Place& place, SourceLocation where) const {
  RankedDevice r{.device = &device};
  int place_node = -1;
  if (place.pci) {
    const auto bdf = place.pci->to_string();
    const fs::path entry = root_ / "sys/bus/pci/devices" / bdf;
    std::error_code ec;
    if (!fs::exists(entry, ec))
      detail::throw_error(make_error_code(Errc::no_device),
                          "Topology: no PCI device " + bdf + " in " + (root_ / "sys/bus/pci/devices").string(), where);
    const auto target = pci_path_of(entry);
    place_node = target.numa_node;
    if (device.pci && !target.chain.empty() && target.host_bridge == device.host_bridge) {
      std::vector<PciAddress> mine = device.bridges;
      mine.push_back(*device.pci);
      const auto& other = target.chain;
      const PciAddress& a = mine.back();
      const PciAddress& b = other.back();
      if (a.domain == b.domain && a.bus == b.bus && a.device == b.device) {
        r.proximity = Proximity::same_device;
        r.pci_hops = a.function == b.function ? 0 : 1;  // the function itself before its siblings
        return r;
      }
      std::size_t common = 0;
      while (common < mine.size() && common < other.size() && mine[common] == other[common]) ++common;
      r.pci_hops = static_cast<int>(mine.size() - common + other.size() - common);
      r.proximity = common >= 2 ? Proximity::same_switch : common == 1 ? Proximity::same_root_port : Proximity::same_host_bridge;
      return r;
    }
  } else if (place.numa_node) {
    place_node = *place.numa_node;
  } else if (place.cpu) {
    place_node = numa_node_of_cpu(*place.cpu);
    if (place_node < 0 && nodes_.size() > 1) return r;  // a CPU no node lists
  }
  const int dn = effective_node(device.numa_node), pn = effective_node(place_node);
  if (dn < 0 || pn < 0) return r;
  r.proximity = dn == pn ? Proximity::same_numa_node : Proximity::other_numa_node;
  return r;
}

std::vector<RankedDevice> Topology::rank(const Place& place, SourceLocation where) const {
  std::vector<RankedDevice> out;
  out.reserve(devices_.size());
  for (const auto& d : devices_) out.push_back(closeness(d, place, where));
  std::stable_sort(out.begin(), out.end(), [](const RankedDevice& a, const RankedDevice& b) {
    const auto hops = [](const RankedDevice& r) { return r.pci_hops < 0 ? 1 << 20 : r.pci_hops; };
    const auto key = [&](const RankedDevice& r) {
      return std::make_tuple(static_cast<int>(r.proximity), r.device->active() ? 0 : 1, hops(r), -r.device->rate_gbps());
    };
    if (key(a) != key(b)) return key(a) < key(b);
    return a.device->name < b.device->name;
  });
  return out;
}

DeviceTopology read_device_topology(std::string_view name, const fs::path& root, SourceLocation where) {
  const auto names = device_names(root);
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string present;
    for (const auto& n : names) present += (present.empty() ? "" : ", ") + n;
    detail::throw_error(make_error_code(Errc::no_device),
                        "no RDMA device '" + std::string(name) + "' in " + (root / "sys/class/infiniband").string() +
                            (present.empty() ? std::string(" (none there)") : " (there: " + present + ")"),
                        where);
  }
  return read_one(root, std::string(name));
}

DeviceTopology Device::topology(SourceLocation where) const {
  detail::require_not_empty(ctx_ != nullptr, "Device", where);
  return read_device_topology(name_, "/", where);
}

}  // namespace verbs
