// Device: an opened RDMA device (ibv_open_device), its ports and GID table.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <infiniband/verbs.h>

#include "verbs/error.hpp"

namespace verbs {

/// The type of a GID table entry (enum ibv_gid_type).
enum class GidType : std::uint8_t { ib = IBV_GID_TYPE_IB, roce_v1 = IBV_GID_TYPE_ROCE_V1, roce_v2 = IBV_GID_TYPE_ROCE_V2 };
/// "IB", "RoCE v1" or "RoCE v2".
std::string_view to_string(GidType t) noexcept;

/// A 128-bit GID (an IPv6 address on RoCE).
struct Gid {
  std::array<std::uint8_t, 16> raw{};  ///< network byte order

  /// From the C union.
  [[nodiscard]] static Gid from_native(const ibv_gid& g) noexcept;
  /// As the C union.
  [[nodiscard]] ibv_gid native() const noexcept;
  /// True for the all-zero GID (an empty table slot).
  [[nodiscard]] bool is_zero() const noexcept;
  /// True for \::ffff:a.b.c.d, the GID RoCE v2 derives from an IPv4 address.
  [[nodiscard]] bool is_ipv4_mapped() const noexcept;
  /// Text form as IPv6 (\::ffff:192.0.2.1, fe80::...).
  [[nodiscard]] std::string to_string() const;
  /// rdma-core's wire form: 32 lowercase hex digits, the bytes in order, as ibv_rc_pingpong and
  /// the other pingpong tools exchange a GID (their gid_to_wire_gid).
  [[nodiscard]] std::string to_wire() const;
  ///@{
  /// A GID from text: IPv6 text (fe80::1, \::ffff:192.0.2.1; an IPv4 address is written that
  /// way) or rdma-core's wire form (32 hex digits, either case; wire_gid_to_gid). Throws
  /// Error(Errc::bad_encoding) naming the text and both forms; the error_code form returns empty
  /// instead (and clears `ec` on success).
  [[nodiscard]] static Gid parse(std::string_view text, SourceLocation where = SourceLocation::current());
  [[nodiscard]] static std::optional<Gid> parse(std::string_view text, std::error_code& ec) noexcept;
  ///@}
  /// Equal when all 16 bytes are.
  friend bool operator==(const Gid&, const Gid&) = default;
};

/// One valid entry of a port's GID table (ibv_query_gid_ex(3)).
struct GidEntry {
  Gid gid;                     ///< the GID
  std::uint32_t index = 0;     ///< its index: a QP's or AH's sgid_index
  GidType type = GidType::ib;  ///< IB, RoCE v1 or RoCE v2
  std::string netdev;  ///< network interface the entry belongs to (empty on IB)
};

/// Mirrors enum ibv_mtu.
enum class Mtu : std::uint8_t {
  mtu256 = IBV_MTU_256, mtu512 = IBV_MTU_512, mtu1024 = IBV_MTU_1024,
  mtu2048 = IBV_MTU_2048, mtu4096 = IBV_MTU_4096,
};
/// Bytes of an Mtu (256..4096); 0 for a value outside the enum.
[[nodiscard]] constexpr std::uint32_t mtu_bytes(Mtu m) noexcept {
  const auto v = static_cast<unsigned>(m);
  return v >= 1 && v <= 5 ? 128u << v : 0;
}

/// The link layer of a port (IBV_LINK_LAYER_*): RoCE ports are Ethernet.
enum class LinkLayer : std::uint8_t {
  unspecified = IBV_LINK_LAYER_UNSPECIFIED, infiniband = IBV_LINK_LAYER_INFINIBAND, ethernet = IBV_LINK_LAYER_ETHERNET,
};

/// Port attributes (ibv_query_port(3)).
struct PortInfo {
  std::uint8_t port_num = 1;                      ///< 1-based port number
  ibv_port_state state = IBV_PORT_NOP;            ///< IBV_PORT_ACTIVE when usable
  Mtu max_mtu = Mtu::mtu1024;                     ///< largest MTU the port supports
  Mtu active_mtu = Mtu::mtu1024;                  ///< MTU in use (on RoCE: from the netdev MTU)
  LinkLayer link_layer = LinkLayer::unspecified;  ///< Ethernet for RoCE, InfiniBand for IB
  std::uint16_t lid = 0;                          ///< InfiniBand LID; 0 on RoCE
  std::uint32_t gid_table_len = 0;                ///< slots in the GID table, used or not
  std::uint8_t active_width = 0;                  ///< lanes code: 1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X, 16 = 2X
  std::uint32_t active_speed = 0;                 ///< per-lane speed code: 1 = SDR 2.5 Gb/s ... 128 = NDR
  std::uint16_t pkey_table_len = 0;               ///< slots in the P_Key table (Device::pkey_table())
  ibv_port_attr raw{};                            ///< everything ibv_query_port returned

  /// Lanes in use, from active_width (1X, 2X, 4X, 8X, 12X); 0 for a code this library does not know.
  [[nodiscard]] unsigned lanes() const noexcept;
  /// Nominal Gb/s of one lane, from active_speed, as ibv_devinfo names them (SDR 2.5, DDR 5,
  /// QDR 10, FDR10 10, FDR 14, EDR 25, HDR 50, NDR 100); 0 for an unknown code. (XDR is not in
  /// rdma-core 44's 8-bit active_speed: newer versions report it in active_speed_ex.)
  [[nodiscard]] double lane_gbps() const noexcept;
  /// The port's nominal rate: lanes() * lane_gbps() (e.g. 4X EDR: 100 Gb/s); 0 when either is unknown.
  [[nodiscard]] double rate_gbps() const noexcept { return lanes() * lane_gbps(); }

  /// True when the port is ACTIVE.
  [[nodiscard]] bool active() const noexcept { return state == IBV_PORT_ACTIVE; }
  /// True for a RoCE (Ethernet) port.
  [[nodiscard]] bool is_ethernet() const noexcept { return link_layer == LinkLayer::ethernet; }
};

/// The GID the library picks for a port, and why (for diagnostics).
struct GidChoice {
  GidEntry entry;      ///< the GID picked
  std::string reason;  ///< why it was picked, in words
};

/// One entry of ibv_get_device_list(3).
struct DeviceInfo {
  std::string name;                            ///< e.g. "rxe0", "mlx5_0"
  std::uint64_t node_guid = 0;                 ///< host byte order
  ibv_node_type node_type = IBV_NODE_UNKNOWN;  ///< IBV_NODE_CA for a NIC or SoftRoCE
};

/// The RDMA devices present. Empty when there are none (not an error).
/// Throws Error when the device list cannot be read (e.g. ENOSYS without kernel support).
[[nodiscard]] std::vector<DeviceInfo> list_devices();

/// Whether registered memory survives fork(2) in the parent (ibv_is_fork_initialized(3)).
enum class ForkSafety : std::uint8_t {
  disabled = IBV_FORK_DISABLED,  ///< not safe: a page the parent writes after fork() may leave its registration
  enabled = IBV_FORK_ENABLED,    ///< made safe by ibv_fork_init (regions are madvise(MADV_DONTFORK)ed)
  unneeded = IBV_FORK_UNNEEDED,  ///< safe without it: the kernel copies pinned pages for the child (Linux 5.13+)
};
/// ibv_fork_init(3): makes registered memory safe across fork() where the kernel does not
/// already. Where it does (fork_safety() is unneeded) nothing is called, at any time (before
/// rdma-core 51, ibv_fork_init itself failed once memory was registered, even there; 44 is what
/// Debian 12 has). Elsewhere call it before the first registration. Returns fork_safety()
/// after. Throws Error (EINVAL when called too late, ENOMEM). The child of a fork() still shares
/// the parent's device files: it must not use the parent's objects, and should exec (or only
/// _exit) before any verbs of its own.
ForkSafety fork_init(SourceLocation where = SourceLocation::current());
/// ibv_is_fork_initialized(3): whether registered memory is safe across fork() now.
[[nodiscard]] ForkSafety fork_safety() noexcept;

class QueuePair;
class SharedReceiveQueue;
struct DeviceTopology;
class CompletionQueue;
namespace detail {
class AsyncHub;
}  // namespace detail

/// An asynchronous event of a device (ibv_get_async_event(3)), already acknowledged.
///
/// What it concerns is read before the acknowledgement: the object's context (object_context)
/// and, for a QP event, its number (qp_num()). The handles in `raw` (qp(), srq(), cq()) are only
/// compared, never read: the object may be destroyed by the time the event is looked at (an
/// object cannot be destroyed while an event of it is unacknowledged, but it can be after).
struct AsyncEvent {
  ibv_event_type type{};  ///< what happened
  /// As ibv_get_async_event gave it. Acknowledged already, so the object an element points at
  /// may be destroyed by then: read it only while you know the object lives.
  ibv_async_event raw{};
  /// The context given when the object the event concerns was created (QpOptions::context,
  /// SrqOptions::context, a CQ's cq_context), read before the event was acknowledged; null
  /// for port and device events. The library never sets or uses these fields itself.
  void* object_context = nullptr;
  /// The number of the QP a QP event concerns, read before the event was acknowledged; 0 for
  /// other events.
  std::uint32_t object_qp_num = 0;
  /// An event as ibv_get_async_event(3) gave it, before it is acknowledged.
  [[nodiscard]] static AsyncEvent from(const ibv_async_event& e) noexcept;
  /// The event's description (ibv_event_type_str(3)), e.g. "local work queue catastrophic error".
  [[nodiscard]] std::string_view name() const noexcept { return ibv_event_type_str(type); }
  /// The enumerator without its prefix, e.g. "QP_FATAL" for IBV_EVENT_QP_FATAL ("UNKNOWN" for
  /// a type this library does not know).
  [[nodiscard]] std::string_view type_name() const noexcept;
  /// object_context: what leads the event back to its QueuePair, SharedReceiveQueue or CQ.
  [[nodiscard]] void* context() const noexcept { return object_context; }
  /// The port of a port event (PORT_ACTIVE, PORT_ERR, GID_CHANGE, ...); 0 for other events.
  [[nodiscard]] std::uint8_t port() const noexcept;
  /// The QP number of a QP event (object_qp_num); 0 for other events.
  [[nodiscard]] std::uint32_t qp_num() const noexcept { return object_qp_num; }

  /// A QP event: QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, COMM_EST, SQ_DRAINED, PATH_MIG,
  /// PATH_MIG_ERR, QP_LAST_WQE_REACHED.
  [[nodiscard]] bool is_qp_event() const noexcept;
  /// An SRQ event: SRQ_ERR, SRQ_LIMIT_REACHED.
  [[nodiscard]] bool is_srq_event() const noexcept;
  /// A CQ event: CQ_ERR (on an overrun, completions were lost).
  [[nodiscard]] bool is_cq_event() const noexcept;
  /// A port event: PORT_ACTIVE, PORT_ERR, LID_CHANGE, PKEY_CHANGE, SM_CHANGE, CLIENT_REREGISTER,
  /// GID_CHANGE (port() says which port).
  [[nodiscard]] bool is_port_event() const noexcept;
  /// DEVICE_FATAL: the device is unusable; every object on it must be destroyed.
  [[nodiscard]] bool is_device_event() const noexcept { return type == IBV_EVENT_DEVICE_FATAL; }
  /// The object it concerns (or the device) is in error: QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR
  /// (the QP went to ERR), SRQ_ERR, CQ_ERR, DEVICE_FATAL.
  [[nodiscard]] bool is_fatal() const noexcept;

  /// The ibv_qp of a QP event, null otherwise: to compare, not to read (see above).
  [[nodiscard]] const ibv_qp* qp() const noexcept { return is_qp_event() ? raw.element.qp : nullptr; }
  /// The ibv_srq of an SRQ event, null otherwise: to compare, not to read.
  [[nodiscard]] const ibv_srq* srq() const noexcept { return is_srq_event() ? raw.element.srq : nullptr; }
  /// The ibv_cq of a CQ event, null otherwise: to compare, not to read.
  [[nodiscard]] const ibv_cq* cq() const noexcept { return is_cq_event() ? raw.element.cq : nullptr; }

  /// True when this is a QP event of `qp` (same ibv_qp and QP number). Reads only `qp`.
  [[nodiscard]] bool concerns(const QueuePair& qp) const noexcept;
  /// True when this is an SRQ event of `srq`. Reads only `srq`.
  [[nodiscard]] bool concerns(const SharedReceiveQueue& srq) const noexcept;
  /// True when this is a CQ event of `cq`. Reads only `cq`.
  [[nodiscard]] bool concerns(const CompletionQueue& cq) const noexcept;
};

/// An opened device (ibv_open_device(3)). Move-only; every object made from it keeps the
/// device context alive, so it may be destroyed before them.
class Device {
 public:
  /// Opens the device with this name. Throws Error(Errc::no_device) naming the devices present.
  [[nodiscard]] static Device open(std::string_view name, SourceLocation where = SourceLocation::current());
  /// Opens the first device. Throws Error(Errc::no_device) with how to create SoftRoCE if none.
  [[nodiscard]] static Device open_first(SourceLocation where = SourceLocation::current());
  /// Wraps a context opened elsewhere (e.g. by librdmacm: rdma_cm_id::verbs). The deleter
  /// decides what ends its life; objects made from the Device keep `ctx` alive. Sets the
  /// context's async fd non-blocking (for wait_async_event's timeout), which whoever else
  /// reads that fd then sees too. Throws Error(Errc::bad_argument) for a null `ctx`.
  [[nodiscard]] static Device adopt(std::shared_ptr<ibv_context> ctx);

  ///@{
  /// Move-only: the moved-from Device is empty.
  Device(Device&&) noexcept = default;
  Device& operator=(Device&& o) noexcept {
    // The hub first: it is registered by the context's address, and must be gone before the
    // context can close (and its address be given to another).
    hub_ = std::move(o.hub_);
    ctx_ = std::move(o.ctx_);
    name_ = std::move(o.name_);
    attr_ = o.attr_;
    return *this;
  }
  ///@}
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() = default;
  /// Exchanges two devices.
  void swap(Device& o) noexcept;

  /// The device name, e.g. "rxe0".
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// Device attributes from ibv_query_device_ex(3), read at open.
  [[nodiscard]] const ibv_device_attr_ex& attributes() const noexcept { return attr_; }
  /// On-demand paging: true when the device can register memory with Access::on_demand
  /// (odp_caps.general_caps has IBV_ODP_SUPPORT; rxe of Linux 6.1 cannot).
  [[nodiscard]] bool has_odp() const noexcept { return (attr_.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0; }
  /// Implicit on-demand paging, a region of the whole address space (IBV_ODP_SUPPORT_IMPLICIT).
  [[nodiscard]] bool has_implicit_odp() const noexcept {
    return (attr_.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT) != 0;
  }
  /// Number of physical ports (ports are numbered from 1).
  [[nodiscard]] std::uint8_t port_count() const noexcept { return attr_.orig_attr.phys_port_cnt; }
  /// ibv_query_port(3). Throws Error (EINVAL for a port that does not exist).
  [[nodiscard]] PortInfo port(std::uint8_t port_num = 1) const;
  /// The valid entries of a port's GID table (ibv_query_gid_ex(3)), with type and netdev.
  [[nodiscard]] std::vector<GidEntry> gid_table(std::uint8_t port_num = 1) const;
  /// One slot of a port's GID table (ibv_query_gid_ex(3)). Throws Error: ENODATA for an empty
  /// slot (where ibv_query_gid(3) would say 0 with an all-zero GID), EINVAL for an index past the
  /// table (PortInfo::gid_table_len) or a port that does not exist.
  [[nodiscard]] GidEntry gid(std::uint32_t index, std::uint8_t port_num = 1) const;
  /// A port's P_Key table (ibv_query_pkey(3)), every slot, in host byte order: 0xffff is the
  /// default partition with full membership, the only one on RoCE (a QP's pkey_index picks its
  /// slot); 0 marks an unused slot. Throws Error (EINVAL for a port that does not exist).
  [[nodiscard]] std::vector<std::uint16_t> pkey_table(std::uint8_t port_num = 1) const;
  /// The slot of P_Key `pkey` (host byte order, e.g. 0xffff) in a port's table
  /// (ibv_get_pkey_index(3)): what QpOptions' pkey_index takes. Throws Error: ENOENT when the
  /// table does not hold it, EINVAL for a port that does not exist.
  [[nodiscard]] std::uint16_t pkey_index(std::uint16_t pkey, std::uint8_t port_num = 1) const;
  /// Picks a GID, and says why: on RoCE, RoCE v2 before v1, a routable address before a
  /// link-local (fe80::) one, the port's own netdev before a VLAN or macvlan on it, IPv4-mapped
  /// before global IPv6; on InfiniBand, index 0 (IB ports address by LID; the GID is then only
  /// used with a GRH). The best kind of pick (RoCE v2, IPv4-mapped, own netdev) is remembered
  /// per context and port and checked with one ibv_query_gid_ex, so QPs and AHs do not rescan
  /// the table. Throws Error(Errc::no_device) when the port has no usable GID.
  [[nodiscard]] GidChoice choose_gid(std::uint8_t port_num = 1) const;

  /// Where the device sits (verbs/topology.hpp): its PCI address and bridges, NUMA node,
  /// netdevs, ports and their rates, read from /sys now. Include verbs/topology.hpp to call it.
  /// Throws Error(Errc::no_device) when sysfs does not list the device.
  [[nodiscard]] DeviceTopology topology(SourceLocation where = SourceLocation::current()) const;

  /// @name Async events (ibv_get_async_event(3))
  /// Each device context has one reader of its async events in the process: every Device on the
  /// context (Device::adopt of the same ibv_context, cm::Connection::device(), cm::device_for())
  /// shares it. It reads them from the context's fd, acknowledges each (ibv_ack_async_event(3)),
  /// tells the cm::Connection whose QP an event concerns (and every connection on the context of
  /// DEVICE_FATAL), then keeps every event, routed or not, for poll_async_events(): a connection
  /// that reads an event in its wait() does not take it from you. At most 1024 events are kept;
  /// beyond that the oldest are dropped. Read the events through these calls only, never with
  /// ibv_get_async_event on native_handle() while a Device or Connection on the context lives.
  ///@{
  /// An fd for an event loop: readable while an event is pending, in the context's fd or already
  /// read and kept (an epoll descriptor over both; poll it for POLLIN, never read it). When it is
  /// readable, call poll_async_events(). -1 for an empty Device.
  [[nodiscard]] int async_fd() const noexcept;
  /// Reads every pending event without blocking and returns the oldest ones kept, up to
  /// `out.size()`, acknowledged (the filled part of `out`, empty when there are none: not an
  /// error). Sets `ec` when reading the context's fd fails (errno), or Errc::empty_object.
  std::span<AsyncEvent> poll_async_events(std::span<AsyncEvent> out, std::error_code& ec) const noexcept;
  /// As above; throws Error instead of setting an error_code.
  std::span<AsyncEvent> poll_async_events(std::span<AsyncEvent> out, SourceLocation where = SourceLocation::current()) const;
  /// Waits up to `timeout` for an async event (poll(2) on async_fd()); empty when none came.
  /// Throws Error when reading the fd fails.
  [[nodiscard]] std::optional<AsyncEvent> wait_async_event(std::chrono::milliseconds timeout) const;
  ///@}

  /// False for a moved-from (empty) Device, whose queries and children are refused (Errc::empty_object).
  [[nodiscard]] explicit operator bool() const noexcept { return ctx_ != nullptr; }
  /// The C handle, for calls the wrapper does not cover.
  [[nodiscard]] ibv_context* native_handle() const noexcept { return ctx_.get(); }
  /// Shared ownership of the context, for objects made from this device.
  [[nodiscard]] const std::shared_ptr<ibv_context>& shared_handle() const noexcept { return ctx_; }

 private:
  Device(std::shared_ptr<ibv_context> ctx, std::string name, SourceLocation where = SourceLocation::current());

  std::shared_ptr<ibv_context> ctx_;
  std::shared_ptr<detail::AsyncHub> hub_;  // the context's one async event reader, shared
  std::string name_;
  ibv_device_attr_ex attr_{};
};

/// Exchanges two devices.
inline void swap(Device& a, Device& b) noexcept { a.swap(b); }

}  // namespace verbs
