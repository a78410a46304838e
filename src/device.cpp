#include "verbs/device.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <optional>
#include <mutex>
#include <cstring>
#include <span>
#include <string>

#include "detail.hpp"
#include "verbs/completion_queue.hpp"
#include "verbs/queue_pair.hpp"
#include "verbs/shared_receive_queue.hpp"

namespace verbs {
namespace {

struct DeviceList {
  ibv_device** list = nullptr;
  int count = 0;
  int error = 0;
  DeviceList() {
    errno = 0;
    list = ibv_get_device_list(&count);
    if (list == nullptr) error = errno != 0 ? errno : ENOSYS;
  }
  ~DeviceList() {
    if (list != nullptr) ibv_free_device_list(list);
  }
  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;
  [[nodiscard]] std::span<ibv_device*> devices() const { return {list, list == nullptr ? 0u : static_cast<std::size_t>(count)}; }
};

bool kernel_has_rdma() {
  struct stat st {};
  return ::stat("/sys/class/infiniband_verbs", &st) == 0;
}

[[noreturn]] void throw_no_device(std::string_view what, SourceLocation where) {
  std::string text(what);
  if (!kernel_has_rdma()) text += "; this kernel has no RDMA support (/sys/class/infiniband_verbs is missing)";
  text +=
      ". To create a SoftRoCE device on a kernel with rdma_rxe: "
      "`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <interface>` "
      "(the interface needs an IPv4 address); `ibv_devices` lists what is present";
  detail::throw_error(make_error_code(Errc::no_device), text, where);
}

std::shared_ptr<ibv_context> open_context(ibv_device* dev, SourceLocation where) {
  ibv_context* ctx = detail::check_ptr(ibv_open_device(dev), "ibv_open_device", where);
  // (Its async fd is made non-blocking by the context's AsyncHub, which every Device has.)
  return {ctx, [](ibv_context* c) { ibv_close_device(c); }};
}

}  // namespace

std::string_view to_string(GidType t) noexcept {
  switch (t) {
    case GidType::ib: return "IB";
    case GidType::roce_v1: return "RoCE v1";
    case GidType::roce_v2: return "RoCE v2";
  }
  return "unknown";
}

Gid Gid::from_native(const ibv_gid& g) noexcept {
  Gid r;
  std::memcpy(r.raw.data(), g.raw, 16);
  return r;
}
ibv_gid Gid::native() const noexcept {
  ibv_gid g{};
  std::memcpy(g.raw, raw.data(), 16);
  return g;
}
bool Gid::is_zero() const noexcept {
  return std::all_of(raw.begin(), raw.end(), [](std::uint8_t b) { return b == 0; });
}
bool Gid::is_ipv4_mapped() const noexcept {
  return std::all_of(raw.begin(), raw.begin() + 10, [](std::uint8_t b) { return b == 0; }) && raw[10] == 0xff &&
         raw[11] == 0xff;
}
std::string Gid::to_string() const {
  char text[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET6, raw.data(), text, sizeof text);
  return text;
}

std::string Gid::to_wire() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (std::size_t i = 0; i < raw.size(); ++i) {
    out[2 * i] = kDigits[raw[i] >> 4];
    out[2 * i + 1] = kDigits[raw[i] & 0xf];
  }
  return out;
}

std::optional<Gid> Gid::parse(std::string_view text, std::error_code& ec) noexcept {
  ec.clear();
  Gid g;
  const auto nibble = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (text.size() == 32 && std::all_of(text.begin(), text.end(), [&](char c) { return nibble(c) >= 0; })) {
    for (std::size_t i = 0; i < g.raw.size(); ++i)
      g.raw[i] = static_cast<std::uint8_t>(nibble(text[2 * i]) << 4 | nibble(text[2 * i + 1]));
    return g;
  }
  char buf[INET6_ADDRSTRLEN] = {};
  if (text.size() < sizeof buf) {
    std::memcpy(buf, text.data(), text.size());
    if (::inet_pton(AF_INET6, buf, g.raw.data()) == 1) return g;
  }
  ec = make_error_code(Errc::bad_encoding);
  return std::nullopt;
}

Gid Gid::parse(std::string_view text, SourceLocation where) {
  std::error_code ec;
  if (auto g = parse(text, ec)) return *g;
  detail::throw_error(ec,
                      "Gid::parse: '" + std::string(text) +
                          "' is neither IPv6 text (fe80::1, ::ffff:192.0.2.1 for an IPv4 address) nor rdma-core's "
                          "wire form (32 hex digits, as ibv_rc_pingpong prints)",
                      where);
}

AsyncEvent AsyncEvent::from(const ibv_async_event& e) noexcept {
  AsyncEvent ev;
  ev.raw = e;
  ev.type = e.event_type;
  switch (ev.type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      if (e.element.qp != nullptr) {
        ev.object_context = e.element.qp->qp_context;
        ev.object_qp_num = e.element.qp->qp_num;
      }
      break;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      ev.object_context = e.element.srq != nullptr ? e.element.srq->srq_context : nullptr;
      break;
    case IBV_EVENT_CQ_ERR:
      ev.object_context = e.element.cq != nullptr ? e.element.cq->cq_context : nullptr;
      break;
    default:
      break;
  }
  return ev;
}

std::uint8_t AsyncEvent::port() const noexcept {
  switch (type) {
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
      return static_cast<std::uint8_t>(raw.element.port_num);
    default:
      return 0;
  }
}

bool AsyncEvent::is_qp_event() const noexcept {
  switch (type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return true;
    default:
      return false;
  }
}
bool AsyncEvent::is_srq_event() const noexcept {
  return type == IBV_EVENT_SRQ_ERR || type == IBV_EVENT_SRQ_LIMIT_REACHED;
}
bool AsyncEvent::is_cq_event() const noexcept { return type == IBV_EVENT_CQ_ERR; }
bool AsyncEvent::is_port_event() const noexcept {
  switch (type) {
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
      return true;
    default:
      return false;
  }
}
bool AsyncEvent::is_fatal() const noexcept {
  switch (type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_CQ_ERR:
    case IBV_EVENT_DEVICE_FATAL:
      return true;
    default:
      return false;
  }
}
std::string_view AsyncEvent::type_name() const noexcept { return detail::async_event_type_name(type); }
bool AsyncEvent::concerns(const QueuePair& q) const noexcept {
  return q.native_handle() != nullptr && qp() == q.native_handle() && object_qp_num == q.qp_num();
}
bool AsyncEvent::concerns(const SharedReceiveQueue& s) const noexcept {
  return s.native_handle() != nullptr && srq() == s.native_handle();
}
bool AsyncEvent::concerns(const CompletionQueue& c) const noexcept {
  return c.native_handle() != nullptr && cq() == c.native_handle();
}

std::vector<DeviceInfo> list_devices() {
  const DeviceList l;
  if (l.list == nullptr) {
    if (l.error == ENOSYS) return {};  // no RDMA in this kernel: simply no devices
    detail::throw_errno(l.error, "ibv_get_device_list", SourceLocation::current());
  }
  std::vector<DeviceInfo> out;
  for (ibv_device* d : l.devices())
    out.push_back({ibv_get_device_name(d), be64toh(ibv_get_device_guid(d)), d->node_type});
  return out;
}

Device::Device(std::shared_ptr<ibv_context> ctx, std::string name, SourceLocation where)
    : ctx_(std::move(ctx)), name_(std::move(name)) {
  hub_ = detail::async_hub(ctx_);
  attr_ = hub_->device_attributes(where);
}

Device Device::open(std::string_view name, SourceLocation where) {
  const DeviceList l;
  std::string present;
  for (ibv_device* d : l.devices()) {
    if (name == ibv_get_device_name(d)) return Device(open_context(d, where), std::string(name), where);
    present += present.empty() ? "" : ", ";
    present += ibv_get_device_name(d);
  }
  throw_no_device("no RDMA device named '" + std::string(name) + "' (present: " +
                      (present.empty() ? std::string("none") : present) + ")",
                  where);
}

Device Device::open_first(SourceLocation where) {
  const DeviceList l;
  if (l.devices().empty()) throw_no_device("no RDMA device found", where);
  return Device(open_context(l.devices()[0], where), ibv_get_device_name(l.devices()[0]), where);
}

Device Device::adopt(std::shared_ptr<ibv_context> ctx) {
  if (!ctx)
    detail::throw_error(make_error_code(Errc::bad_argument), "Device::adopt: no context", SourceLocation::current());
  // Its async fd is made non-blocking, as a Device opened here has it, by the context's AsyncHub
  // (once per context: the cm code adopts its id's context for every connection).
  std::string name = ibv_get_device_name(ctx->device);
  return Device(std::move(ctx), std::move(name));
}

void Device::swap(Device& o) noexcept {
  ctx_.swap(o.ctx_);
  hub_.swap(o.hub_);
  name_.swap(o.name_);
  std::swap(attr_, o.attr_);
}

PortInfo Device::port(std::uint8_t port_num) const {
  detail::require_not_empty(ctx_ != nullptr, "Device::port: the Device", SourceLocation::current());
  return detail::query_port(ctx_.get(), port_num);
}
ForkSafety fork_init(SourceLocation where) {
  // Where the kernel copies pinned pages on fork, there is nothing to do, and ibv_fork_init
  // would still fail with EINVAL once anything is registered (rdma-core 44 to 50).
  if (fork_safety() == ForkSafety::unneeded) return ForkSafety::unneeded;
  if (const int rc = ibv_fork_init(); rc != 0) {
    const int err = detail::rc_to_errno(rc);
    detail::throw_errno(err,
                        err == EINVAL ? "ibv_fork_init: too late, memory is registered already (call fork_init first)"
                                      : "ibv_fork_init",
                        where);
  }
  return fork_safety();
}

ForkSafety fork_safety() noexcept { return static_cast<ForkSafety>(ibv_is_fork_initialized()); }

GidEntry Device::gid(std::uint32_t index, std::uint8_t port_num) const {
  const SourceLocation where = SourceLocation::current();
  detail::require_not_empty(ctx_ != nullptr, "Device::gid: the Device", where);
  const PortInfo p = detail::query_port(ctx_.get(), port_num, where);
  const std::string slot = "GID index " + std::to_string(index) + " of port " + std::to_string(port_num);
  if (index >= p.gid_table_len)
    detail::throw_errno(EINVAL, slot + ": past the table's " + std::to_string(p.gid_table_len) + " slots", where);
  ibv_gid_entry e{};
  if (const int rc = ibv_query_gid_ex(ctx_.get(), port_num, index, &e, 0); rc != 0) {
    const int err = detail::rc_to_errno(rc);
    detail::throw_errno(err, "ibv_query_gid_ex(" + slot + (err == ENODATA ? "): an empty slot" : ")"), where);
  }
  return detail::gid_entry(e);
}

std::uint16_t Device::pkey_index(std::uint16_t pkey, std::uint8_t port_num) const {
  const SourceLocation where = SourceLocation::current();
  detail::require_not_empty(ctx_ != nullptr, "Device::pkey_index: the Device", where);
  (void)detail::query_port(ctx_.get(), port_num, where);  // EINVAL for a port that does not exist
  const int index = ibv_get_pkey_index(ctx_.get(), port_num, htons(pkey));
  if (index < 0) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%04x", static_cast<unsigned>(pkey));
    detail::throw_errno(ENOENT, std::string("ibv_get_pkey_index: P_Key ") + hex + " is not in port " +
                                    std::to_string(port_num) + "'s table",
                        where);
  }
  return static_cast<std::uint16_t>(index);
}

std::vector<std::uint16_t> Device::pkey_table(std::uint8_t port_num) const {
  const SourceLocation where = SourceLocation::current();
  detail::require_not_empty(ctx_ != nullptr, "Device::pkey_table: the Device", where);
  const PortInfo p = detail::query_port(ctx_.get(), port_num, where);
  std::vector<std::uint16_t> out(p.pkey_table_len);
  for (std::uint16_t i = 0; i < p.pkey_table_len; ++i) {
    __be16 key = 0;
    detail::check_rc(ibv_query_pkey(ctx_.get(), port_num, i, &key), "ibv_query_pkey(index " + std::to_string(i) + ")", where);
    out[i] = ntohs(key);
  }
  return out;
}

unsigned PortInfo::lanes() const noexcept {
  switch (active_width) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 0;
  }
}

double PortInfo::lane_gbps() const noexcept {
  switch (active_speed) {
    case 1: return 2.5;
    case 2: return 5.0;
    case 4: return 10.0;
    case 8: return 10.0;  // FDR10
    case 16: return 14.0;
    case 32: return 25.0;
    case 64: return 50.0;
    case 128: return 100.0;
    default: return 0.0;
  }
}

std::vector<GidEntry> Device::gid_table(std::uint8_t port_num) const {
  detail::require_not_empty(ctx_ != nullptr, "Device::gid_table: the Device", SourceLocation::current());
  return detail::query_gid_table(ctx_.get(), port_num);
}
GidChoice Device::choose_gid(std::uint8_t port_num) const {
  detail::require_not_empty(ctx_ != nullptr, "Device::choose_gid: the Device", SourceLocation::current());
  return detail::choose_gid(ctx_.get(), port_num);
}

int Device::async_fd() const noexcept { return hub_ ? hub_->fd() : -1; }

std::span<AsyncEvent> Device::poll_async_events(std::span<AsyncEvent> out, std::error_code& ec) const noexcept {
  ec.clear();
  if (!hub_) {
    ec = make_error_code(Errc::empty_object);
    return {};
  }
  return out.first(hub_->take(out, ec));
}

std::span<AsyncEvent> Device::poll_async_events(std::span<AsyncEvent> out, SourceLocation where) const {
  detail::require_not_empty(ctx_ != nullptr, "Device::poll_async_events: the Device", where);
  std::error_code ec;
  auto got = poll_async_events(out, ec);
  if (ec) detail::throw_error(ec, "ibv_get_async_event", where);
  return got;
}

std::optional<AsyncEvent> Device::wait_async_event(std::chrono::milliseconds timeout) const {
  detail::require_not_empty(ctx_ != nullptr, "Device::wait_async_event: the Device", SourceLocation::current());
  const auto deadline = detail::deadline_after(timeout);
  for (;;) {
    AsyncEvent ev;
    if (!poll_async_events(std::span(&ev, 1)).empty()) return ev;
    // A signal (EINTR) is not the end of the wait, nor is another reader taking the event first.
    const int left = detail::poll_ms_until(deadline);
    if (left <= 0) return std::nullopt;
    pollfd p{hub_->fd(), POLLIN, 0};
    if (::poll(&p, 1, left) < 0 && errno != EINTR) detail::throw_errno(errno, "poll(async_fd)", SourceLocation::current());
  }
}

namespace detail {

GidEntry gid_entry(const ibv_gid_entry& e) {
  GidEntry g;
  g.gid = Gid::from_native(e.gid);
  g.index = e.gid_index;
  g.type = static_cast<GidType>(e.gid_type);
  char name[IF_NAMESIZE] = {};
  if (e.ndev_ifindex != 0 && ::if_indextoname(e.ndev_ifindex, name) != nullptr) g.netdev = name;
  return g;
}

PortInfo query_port(ibv_context* ctx, std::uint8_t port_num, SourceLocation where) {
  PortInfo p;
  check_rc(ibv_query_port(ctx, port_num, &p.raw), "ibv_query_port", where);
  p.port_num = port_num;
  p.state = p.raw.state;
  p.max_mtu = static_cast<Mtu>(p.raw.max_mtu);
  p.active_mtu = static_cast<Mtu>(p.raw.active_mtu);
  p.link_layer = static_cast<LinkLayer>(p.raw.link_layer);
  p.lid = p.raw.lid;
  p.gid_table_len = static_cast<std::uint32_t>(p.raw.gid_tbl_len);
  p.active_width = p.raw.active_width;
  p.active_speed = p.raw.active_speed;
  p.pkey_table_len = p.raw.pkey_tbl_len;
  return p;
}

namespace {

/// Every valid GID entry of every port in one call (ibv_query_gid_table(3): one ioctl, where a
/// scan of rxe's 1024 slots, one ibv_query_gid_ex each, made 1022 that failed with ENODATA);
/// empty where the call is not there (an older kernel, a provider stub).
std::optional<std::vector<ibv_gid_entry>> all_gid_entries(ibv_context* ctx) {
  ibv_device_attr d{};
  if (ibv_query_device(ctx, &d) != 0) return std::nullopt;
  std::size_t slots = 0;
  for (std::uint8_t port = 1; port <= d.phys_port_cnt; ++port) {
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, port, &pa) != 0) return std::nullopt;
    slots += static_cast<std::size_t>(pa.gid_tbl_len);
  }
  std::vector<ibv_gid_entry> all(slots);
  const ssize_t n = slots == 0 ? 0 : ibv_query_gid_table(ctx, all.data(), all.size(), 0);
  if (n < 0) return std::nullopt;
  all.resize(static_cast<std::size_t>(n));
  return all;
}

}  // namespace

std::vector<GidEntry> query_gid_table(ibv_context* ctx, std::uint8_t port_num) {
  const PortInfo p = query_port(ctx, port_num);
  std::vector<ibv_gid_entry> entries;
  const std::optional<std::vector<ibv_gid_entry>> all = all_gid_entries(ctx);
  if (all) {
    for (const ibv_gid_entry& e : *all)
      if (e.port_num == port_num) entries.push_back(e);
  } else {
    for (std::uint32_t i = 0; i < p.gid_table_len; ++i) {
      ibv_gid_entry e{};
      // ENODATA marks an empty slot; other failures (e.g. a provider without the ex query)
      // also just leave the entry out.
      if (ibv_query_gid_ex(ctx, port_num, i, &e, 0) == 0) entries.push_back(e);
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const ibv_gid_entry& x, const ibv_gid_entry& y) { return x.gid_index < y.gid_index; });
  std::vector<GidEntry> out;
  for (const ibv_gid_entry& e : entries) {
    GidEntry g = gid_entry(e);
    if (!g.gid.is_zero()) out.push_back(std::move(g));
  }
  return out;
}

namespace {

bool link_local(const Gid& g) { return g.raw[0] == 0xfe && (g.raw[1] & 0xc0) == 0x80; }

// The last choice per (context, port), reused while the table still holds it at that index:
// one ibv_query_gid_ex instead of a scan of the whole table (1024 slots on rxe) per QP.
struct CachedChoice {
  ibv_context* ctx = nullptr;
  std::uint8_t port = 0;
  GidChoice choice;
  std::uint32_t ifindex = 0;  // the entry's netdev, by index: compared without a name lookup per QP
};
std::mutex g_cache_mutex;
std::vector<CachedChoice> g_cache;

// One ioctl per QP: the entry at the cached index is still that GID, of that type, on that netdev
// (by index: if_indextoname would cost three more system calls per QP, and many connections make
// as many QPs).
bool still_there(ibv_context* ctx, std::uint8_t port, const GidEntry& e, std::uint32_t ifindex) {
  ibv_gid_entry now{};
  if (ibv_query_gid_ex(ctx, port, e.index, &now, 0) != 0) return false;
  return Gid::from_native(now.gid) == e.gid && static_cast<GidType>(now.gid_type) == e.type &&
         now.ndev_ifindex == ifindex;
}

}  // namespace

// The port's own netdev: that of the GID at index 0, derived from the port's MAC.
std::string own_netdev(const std::vector<GidEntry>& table) {
  for (const GidEntry& e : table)
    if (e.index == 0) return e.netdev;
  return {};
}

std::optional<GidChoice> choose_roce_gid(const std::vector<GidEntry>& table) {
  const std::string own = own_netdev(table);
  struct Rank {
    int score;
    const GidEntry* entry;
  };
  std::optional<Rank> best;
  for (const GidEntry& e : table) {
    if (e.type == GidType::ib || e.gid.is_zero()) continue;
    // RoCE v2 first, then a routable address, then the port's own netdev, then IPv4 over IPv6.
    int score = e.type == GidType::roce_v2 ? 100 : 0;
    if (!link_local(e.gid)) score += 20;
    if (own.empty() || e.netdev == own) score += 10;
    if (e.gid.is_ipv4_mapped()) score += 5;
    if (!best || score > best->score || (score == best->score && e.index < best->entry->index)) best = Rank{score, &e};
  }
  if (!best) return std::nullopt;
  const GidEntry& e = *best->entry;
  const bool on_own = own.empty() || e.netdev == own;
  const std::string where = on_own ? "" : " on " + e.netdev + ", not the port's own netdev " + own + " (a VLAN or macvlan)";
  std::string reason;
  if (e.type == GidType::roce_v1)
    reason = "only RoCE v1 GIDs on this port (not routable across subnets)" + where;
  else if (e.gid.is_ipv4_mapped())  // the first wording is what verbs-info and the README show
    reason = on_own ? "RoCE v2 with an IPv4-mapped address (routable; what rdma_cm uses for IPv4)"
                    : "RoCE v2 with an IPv4-mapped address" + where;
  else if (!link_local(e.gid))
    reason = "RoCE v2 with a global IPv6 address (routable; the netdev has no IPv4 address)" + where;
  else
    reason = "RoCE v2, link-local only (fe80::): reaches the same Ethernet segment only; give the netdev an IP address" +
             where;
  return GidChoice{e, reason};
}

GidChoice choose_gid(ibv_context* ctx, std::uint8_t port_num, SourceLocation where) {
  return choose_gid(ctx, port_num, query_port(ctx, port_num, where), where);
}

GidChoice choose_gid(ibv_context* ctx, std::uint8_t port_num, const PortInfo& p, SourceLocation where) {
  if (p.is_ethernet()) {
    // Checked outside the lock: other threads creating QPs need not wait for this query.
    std::optional<CachedChoice> cached;
    {
      const std::lock_guard lock(g_cache_mutex);
      for (const CachedChoice& c : g_cache)
        if (c.ctx == ctx && c.port == port_num) cached = c;
    }
    if (cached && still_there(ctx, port_num, cached->choice.entry, cached->ifindex)) return cached->choice;
  }
  const std::vector<GidEntry> table = query_gid_table(ctx, port_num);
  if (!p.is_ethernet()) {
    GidEntry e;
    if (!table.empty()) e = table.front();
    return {e, "InfiniBand port: addressed by LID " + std::to_string(p.lid) + "; GID index " +
                   std::to_string(e.index) + " is used only with a GRH"};
  }
  std::optional<GidChoice> c = choose_roce_gid(table);
  if (!c)
    detail::throw_error(make_error_code(Errc::no_device),
                        "port " + std::to_string(port_num) +
                            " has no usable GID: is its netdev up, with an IP address?",
                        where);
  // Only the best kind of entry is kept: a lesser one is looked for again, since an address
  // added later (an IPv4 one on an IPv6-only port) would be preferred.
  ibv_gid_entry raw{};
  const bool have_raw = ibv_query_gid_ex(ctx, port_num, c->entry.index, &raw, 0) == 0;
  const std::lock_guard lock(g_cache_mutex);
  const auto same = [&](const CachedChoice& x) { return x.ctx == ctx && x.port == port_num; };
  g_cache.erase(std::remove_if(g_cache.begin(), g_cache.end(), same), g_cache.end());
  const std::string own = own_netdev(table);
  if (have_raw && c->entry.type == GidType::roce_v2 && c->entry.gid.is_ipv4_mapped() &&
      (own.empty() || c->entry.netdev == own))
    g_cache.push_back({ctx, port_num, *c, raw.ndev_ifindex});
  return *c;
}


std::string_view async_event_type_name(ibv_event_type type) noexcept {
  switch (type) {
    case IBV_EVENT_CQ_ERR: return "CQ_ERR";
    case IBV_EVENT_QP_FATAL: return "QP_FATAL";
    case IBV_EVENT_QP_REQ_ERR: return "QP_REQ_ERR";
    case IBV_EVENT_QP_ACCESS_ERR: return "QP_ACCESS_ERR";
    case IBV_EVENT_COMM_EST: return "COMM_EST";
    case IBV_EVENT_SQ_DRAINED: return "SQ_DRAINED";
    case IBV_EVENT_PATH_MIG: return "PATH_MIG";
    case IBV_EVENT_PATH_MIG_ERR: return "PATH_MIG_ERR";
    case IBV_EVENT_DEVICE_FATAL: return "DEVICE_FATAL";
    case IBV_EVENT_PORT_ACTIVE: return "PORT_ACTIVE";
    case IBV_EVENT_PORT_ERR: return "PORT_ERR";
    case IBV_EVENT_LID_CHANGE: return "LID_CHANGE";
    case IBV_EVENT_PKEY_CHANGE: return "PKEY_CHANGE";
    case IBV_EVENT_SM_CHANGE: return "SM_CHANGE";
    case IBV_EVENT_SRQ_ERR: return "SRQ_ERR";
    case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ_LIMIT_REACHED";
    case IBV_EVENT_QP_LAST_WQE_REACHED: return "QP_LAST_WQE_REACHED";
    case IBV_EVENT_CLIENT_REREGISTER: return "CLIENT_REREGISTER";
    case IBV_EVENT_GID_CHANGE: return "GID_CHANGE";
    case IBV_EVENT_WQ_FATAL: return "WQ_FATAL";
    default:
      // Newer rdma-core adds events (its headers name more enumerators than these): by value, so
      // that the code builds against older and newer headers alike.
      if (static_cast<int>(type) == static_cast<int>(IBV_EVENT_WQ_FATAL) + 1) return "DEVICE_SPEED_CHANGE";  // rdma-core 62
      return "UNKNOWN";
  }
}

AsyncHub::AsyncHub(std::shared_ptr<ibv_context> ctx) : ctx_(ctx.get()) {
  // Non-blocking async fd, so that wait_async_event can poll it with a timeout.
  if (const int fl = ::fcntl(ctx->async_fd, F_GETFL); fl >= 0 && (fl & O_NONBLOCK) == 0)
    (void)::fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) throw_errno(errno, "epoll_create1 (the device's async_fd)", SourceLocation::current());
  kept_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (kept_fd_ < 0) {
    const int err = errno;
    ::close(epoll_fd_);
    throw_errno(err, "eventfd (the device's async_fd)", SourceLocation::current());
  }
  epoll_event e{};
  e.events = EPOLLIN;
  (void)::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, kept_fd_, &e);
  if (native_fd() >= 0) (void)::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, native_fd(), &e);
}

AsyncHub::~AsyncHub() {
  ::close(epoll_fd_);
  ::close(kept_fd_);
}

void AsyncHub::pump(std::error_code& ec) noexcept {
  ec.clear();
  if (native_fd() < 0) return;
  const std::lock_guard lock(mutex_);
  for (;;) {
    ibv_async_event raw{};
    if (ibv_get_async_event(ctx_, &raw) != 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ec.assign(errno, std::generic_category());
      return;
    }
    // What the event concerns is read before the acknowledgement, which lets its object's
    // destruction go on; routing compares handles only. A QP destroyed after the
    // acknowledgement cannot be replaced by a new one at the same address and registered
    // before the event is routed: add_route waits for this lock.
    const AsyncEvent ev = AsyncEvent::from(raw);
    ibv_ack_async_event(&raw);
    deliver_locked(ev);
  }
}

std::size_t AsyncHub::take(std::span<AsyncEvent> out, std::error_code& ec) noexcept {
  pump(ec);
  const std::lock_guard lock(mutex_);
  const std::size_t n = std::min(out.size(), kept_.size());
  std::copy_n(kept_.begin(), n, out.begin());
  kept_.erase(kept_.begin(), kept_.begin() + static_cast<std::ptrdiff_t>(n));
  if (kept_.empty()) {
    std::uint64_t v = 0;
    (void)!::read(kept_fd_, &v, sizeof v);
  }
  return n;
}

void AsyncHub::deliver(const AsyncEvent& event) noexcept {
  const std::lock_guard lock(mutex_);
  deliver_locked(event);
}

void AsyncHub::deliver_locked(const AsyncEvent& event) noexcept {
  if (event.is_device_event()) {
    for (const auto& [qp, t] : routes_) t.route.fn(t.route.self, event);
  } else if (event.is_qp_event()) {
    if (const auto it = routes_.find(event.qp()); it != routes_.end() && it->second.qp_num == event.qp_num())
      it->second.route.fn(it->second.route.self, event);
  }
  try {
    if (kept_.size() >= max_kept) kept_.pop_front();
    kept_.push_back(event);
  } catch (const std::bad_alloc&) {
    return;  // out of memory: the event is lost for poll_async_events, not for its route
  }
  const std::uint64_t one = 1;
  (void)!::write(kept_fd_, &one, sizeof one);
}

void AsyncHub::add_route(const ibv_qp* qp, std::uint32_t qp_num, AsyncRoute route) {
  const std::lock_guard lock(mutex_);
  routes_[qp] = Target{qp_num, route};
}

void AsyncHub::remove_route(const ibv_qp* qp) noexcept {
  const std::lock_guard lock(mutex_);
  routes_.erase(qp);
}

std::size_t AsyncHub::kept() const noexcept {
  const std::lock_guard lock(mutex_);
  return kept_.size();
}

std::size_t AsyncHub::routes() const noexcept {
  const std::lock_guard lock(mutex_);
  return routes_.size();
}

namespace {
/// The hubs of the contexts that Devices use (weak: a hub lives as long as a Device on its
/// context). Never destroyed: Devices may outlive static destruction.
struct HubRegistry {
  std::mutex mutex;
  std::unordered_map<const ibv_context*, std::weak_ptr<AsyncHub>> hubs;
};
HubRegistry& hub_registry() {
  static auto* registry = new HubRegistry;  // NOLINT(cppcoreguidelines-owning-memory): see above
  return *registry;
}
}  // namespace

ibv_device_attr_ex AsyncHub::device_attributes(SourceLocation where) {
  {
    const std::lock_guard lock(mutex_);
    if (attributes_) return *attributes_;
  }
  ibv_device_attr_ex a{};
  check_rc(ibv_query_device_ex(ctx_, nullptr, &a), "ibv_query_device_ex", where);
  const std::lock_guard lock(mutex_);
  attributes_ = a;
  return a;
}

ibv_device_attr_ex device_attributes(ibv_context* ctx, SourceLocation where) {
  std::shared_ptr<AsyncHub> hub;
  {
    HubRegistry& r = hub_registry();
    const std::lock_guard lock(r.mutex);
    if (const auto it = r.hubs.find(ctx); it != r.hubs.end()) hub = it->second.lock();
  }
  if (hub) return hub->device_attributes(where);
  ibv_device_attr_ex a{};
  check_rc(ibv_query_device_ex(ctx, nullptr, &a), "ibv_query_device_ex", where);
  return a;
}

std::shared_ptr<AsyncHub> async_hub(const std::shared_ptr<ibv_context>& ctx) {
  HubRegistry& r = hub_registry();
  const ibv_context* key = ctx.get();
  {
    const std::lock_guard lock(r.mutex);
    if (const auto it = r.hubs.find(key); it != r.hubs.end())
      if (auto hub = it->second.lock()) return hub;
  }
  // Made without the registry's lock: its deleter takes the lock, and runs if the control block
  // cannot be allocated (or below, when another thread made one meanwhile), so neither may
  // happen while the lock is held. The registry's entry goes with the hub, unless a new hub
  // took it meanwhile.
  std::shared_ptr<AsyncHub> fresh(new AsyncHub(ctx), [key](AsyncHub* h) {
    delete h;  // NOLINT(cppcoreguidelines-owning-memory)
    HubRegistry& reg = hub_registry();
    const std::lock_guard l(reg.mutex);
    if (const auto it = reg.hubs.find(key); it != reg.hubs.end() && it->second.expired()) reg.hubs.erase(it);
  });
  std::shared_ptr<AsyncHub> existing;
  {
    const std::lock_guard lock(r.mutex);
    std::weak_ptr<AsyncHub>& slot = r.hubs[key];
    existing = slot.lock();
    if (!existing) {
      slot = fresh;
      return fresh;
    }
  }
  return existing;  // `fresh` goes here, after the lock
}

}  // namespace detail
}  // namespace verbs
