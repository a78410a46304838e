// verbs::rails: one peer over several NICs (rails) and several QPs on each, as one. A large write
// or read is cut into chunks striped over every live QP; a rail that fails is taken out and its
// unfinished chunks go again on the others; the rail is connected again when its path is back.
// An optional layer over verbs::cm (docs/design/rails.md); the core knows nothing of it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "verbs/cm.hpp"
#include "verbs/error.hpp"
#include "verbs/memory_region.hpp"
#include "verbs/queue_pair.hpp"
#include "verbs/topology.hpp"

/// @namespace verbs::rails
/// Many NICs as one: Target (the side whose memory is written and read) and Group (the side that
/// moves data), over rdma_cm connections.
namespace verbs::rails {

using namespace std::chrono_literals;

/// One path to the peer: the local address picks this side's device and port (as rdma_cm routes
/// it), the remote address is the peer's on that path.
struct Rail {
  std::string local_address;   ///< e.g. "192.0.2.2": an address of this host's RDMA netdev
  std::string remote_address;  ///< e.g. "192.0.2.1": the Target's address on the same network
};

/// The IPv4 addresses of a device's netdevs (getifaddrs(3)), in its netdevs' order: a rail's
/// local address on that device, e.g. for the devices Topology::rank() puts nearest the memory.
/// Empty when its netdevs have none.
[[nodiscard]] std::vector<std::string> addresses_of(const DeviceTopology& device);

/// How a Group connects and moves data.
struct GroupOptions {
  std::vector<Rail> rails;              ///< at least one; at most 16
  std::uint16_t port = 0;               ///< the Target's port (the same on every rail)
  int qps_per_rail = 4;                 ///< connections (QPs) on each rail, 1..64
  std::uint32_t chunk_size = 256 * 1024;  ///< bytes per RDMA write or read (4 KiB .. 1 GiB)
  int max_in_flight = 4;                ///< chunks posted and not completed, per QP (1..1024)
  int max_transfers = 64;               ///< transfers in progress at once (1..65535)
  /// Each connection's transport: its failure_bound() is how long a silent rail takes to be
  /// noticed (retry_count 7 is refused: rxe would retry forever).
  TransportOptions transport = {};
  std::chrono::milliseconds connect_timeout = 10s;    ///< each connection attempt
  std::chrono::milliseconds reconnect_interval = 1s;  ///< the first try after a rail fails
  std::chrono::milliseconds reconnect_max = 16s;      ///< the interval doubles up to this
};

/// How a Target listens.
struct TargetOptions {
  /// One listener per address, each on its device: the Target's end of each rail.
  std::vector<std::string> addresses;
  /// The port on every address; 0 takes a free one on the first and the same on the others.
  std::uint16_t port = 0;
  int backlog = 64;                                   ///< as cm::ListenOptions::backlog
  std::chrono::milliseconds handshake_timeout = 10s;  ///< as cm::ListenOptions::handshake_timeout
};

/// A buffer registered on every device of a Group (Group::register_memory): one MemoryRegion
/// per device, made once, for chunks posted on any rail. Movable; a transfer started from it
/// keeps the registrations alive until its Completion is handed out (the Region may be moved or
/// destroyed meanwhile), but the memory itself must stay valid until then.
class Region {
 public:
  /// The memory.
  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return state_->bytes; }
  /// The region on device `i` (Group::device_count()).
  [[nodiscard]] const MemoryRegion& on(std::size_t i) const { return state_->regions.at(i); }

  /// What a Region holds (shared with the transfers that use it).
  struct State {
    std::span<std::byte> bytes;         ///< the memory
    std::vector<MemoryRegion> regions;  ///< one per device of the group, in its order
    const void* owner = nullptr;        ///< the Group's state: a region of another group is refused
  };

 private:
  friend class Group;
  std::shared_ptr<const State> state_;
};

/// How one transfer ended.
struct Completion {
  std::uint64_t id = 0;      ///< what write() or read() returned
  std::error_code error;     ///< empty when every byte arrived
  std::string what;          ///< why it failed, in words; empty on success (or when no memory was left to say it)
  /// True when every byte arrived.
  [[nodiscard]] bool ok() const noexcept { return !error; }
};

/// A rail went down or came back.
struct RailEvent {
  std::size_t rail = 0;   ///< index into GroupOptions::rails
  bool up = false;        ///< true: every QP of the rail is connected again
  std::error_code error;  ///< why it went down (empty for up)
  std::string what;       ///< the same in words: the completion status, the cm event, ...
};

/// Where a rail stands.
enum class RailState : std::uint8_t {
  up,          ///< every QP connected: the rail carries chunks
  connecting,  ///< its QPs connecting (it carries chunks once all are)
  down,        ///< taken out: what it had posted flushing, then waiting to try again
};

/// What a rail has done since the Group was made.
struct RailCounters {
  std::uint64_t chunks = 0;         ///< chunks that completed on it
  std::uint64_t chunks_failed = 0;  ///< chunks that failed or were flushed on it (posted again elsewhere)
  std::uint64_t failures = 0;       ///< times it went down
  std::uint64_t reconnects = 0;     ///< times it came back up
};

/// The side whose memory is written and read: a listener on each address, one buffer
/// registered on each device and exposed to every connection (cm's `expose`: the slice of that
/// connection's device), and the connections of every Group that connects. Nothing runs in the
/// background: call progress() when fd() is readable or at next_deadline() (or run_for()). One
/// thread at a time.
class Target {
 public:
  /// Listens on every address and registers `buffer` on each of their devices with `access`
  /// (remote_write and/or remote_read: what the groups may do; local_write is added for
  /// remote_write, which needs it). The buffer must outlive the Target; the regions live as long
  /// as it does, so no group's read or write outlives them. Throws cm::ConnectError (phase
  /// listen) as cm::Listener does, Error as MemoryRegion does, and Error(Errc::bad_argument) for
  /// no address, an empty buffer or an access without a remote right.
  Target(const TargetOptions& options, std::span<std::byte> buffer, AccessFlags access,
         SourceLocation where = SourceLocation::current());
  Target(Target&&) noexcept;             ///< moves the target; the source is left empty
  Target& operator=(Target&&) noexcept;  ///< moves the target; the one this held is closed
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;
  /// Closes every connection and listener, then deregisters.
  ~Target();

  /// Accepts the requests that wait, completes handshakes and drops connections that ended,
  /// without blocking. A request whose handshake fails is dropped. Throws cm::ConnectError when
  /// rdma_cm itself fails.
  void progress(SourceLocation where = SourceLocation::current());
  /// progress() for `duration`, sleeping on fd() between.
  void run_for(std::chrono::milliseconds duration, SourceLocation where = SourceLocation::current());
  /// Readable when progress() has something to do (the listeners' and connections' rdma_cm channel).
  [[nodiscard]] int fd() const noexcept;
  /// When progress() must run at the latest if fd() stays silent (a handshake's limit);
  /// time_point::max() when none is in progress.
  [[nodiscard]] std::chrono::steady_clock::time_point next_deadline() const noexcept;
  /// The port every address listens on.
  [[nodiscard]] std::uint16_t port() const noexcept;
  /// Connections established now (over every group and rail).
  [[nodiscard]] std::size_t connections() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// The side that moves data: GroupOptions::rails x qps_per_rail connections to one Target,
/// sharing each local device's PD and CQ. write() and read() cut a transfer into chunks striped
/// over every live QP (at most max_in_flight each), and one Completion says when all of it is
/// done or why it failed. A rail that fails (an error completion, its connection's end) is taken
/// out: its QPs are moved to ERR, what they had posted goes again on the live rails (the same
/// bytes to the same place), a RailEvent says which and why, and it is connected again in
/// progress() after reconnect_interval (doubling to reconnect_max, with jitter). A transfer fails
/// (ENETDOWN) only when no rail is left. Nothing runs in the background: progress() (which
/// poll() and wait() call) does all of it; an event loop calls it when fd() is readable or at
/// next_deadline(). One thread at a time.
class Group {
 public:
  /// Connects every rail's QPs and returns once all are connected, or once `timeout` passes with
  /// at least one (the others go on connecting in progress()). Throws Error(Errc::bad_argument)
  /// for options out of range, and cm::ConnectError (the first rail's failure, naming every
  /// rail's) when none connected.
  [[nodiscard]] static Group connect(const GroupOptions& options, std::chrono::milliseconds timeout = 30s,
                                     SourceLocation where = SourceLocation::current());
  Group(Group&&) noexcept;             ///< moves the group; the source is left empty
  Group& operator=(Group&&) noexcept;  ///< moves the group; the one this held is closed
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  /// Disconnects every QP. Transfers in progress are abandoned (their chunks flush).
  ~Group();

  /// Registers `buffer` on every local device (once each: a Region), with `access`
  /// (local_write, which reads into it need, is added). Explicit, like every registration.
  [[nodiscard]] Region register_memory(std::span<std::byte> buffer, AccessFlags access = Access::local_write,
                                       SourceLocation where = SourceLocation::current());

  ///@{
  /// Starts writing `length` bytes from `local` at `local_offset` to the Target's buffer at
  /// `remote_offset` (read: the other way), and returns the transfer's id for its Completion.
  /// Posts what it can at once; progress() posts the rest. Throws Error: remote_out_of_bounds or
  /// local_out_of_bounds for a range outside either buffer, bad_argument for a Region of another
  /// Group, std::errc::permission_denied for what the Target does not allow (it says in the
  /// handshake: a read from a Target without remote_read), and
  /// std::errc::resource_unavailable_try_again when max_transfers are started and their
  /// Completions not yet handed out (take them with poll() or wait() first). With no live rail
  /// the transfer fails at once (its Completion, ENETDOWN).
  std::uint64_t write(const Region& local, std::uint64_t local_offset, std::uint64_t remote_offset,
                      std::uint64_t length, SourceLocation where = SourceLocation::current());
  std::uint64_t read(const Region& local, std::uint64_t local_offset, std::uint64_t remote_offset,
                     std::uint64_t length, SourceLocation where = SourceLocation::current());
  ///@}

  /// Does what has come, without blocking: polls the CQs, posts chunks into the room that freed,
  /// takes failed rails out, steps reconnections. Throws cm::ConnectError when rdma_cm itself
  /// fails, Error when a CQ or a device's async events cannot be read, and std::bad_alloc when
  /// memory runs out; every completion it took from a CQ was counted all the same (when memory
  /// is short, a failure's text or a RailEvent may be left out): call it again.
  void progress(SourceLocation where = SourceLocation::current());
  /// progress(), then the transfers finished since, oldest first, into `out` (the filled part).
  std::span<Completion> poll(std::span<Completion> out, SourceLocation where = SourceLocation::current());
  /// Waits up to `timeout` for transfer `id` (progress() and sleeping on fd() between); its
  /// Completion, or empty on timeout (it goes on). Completions of other transfers that finish
  /// meanwhile stay for poll(). Never blocks past `timeout`. Throws Error(Errc::bad_argument) for
  /// an id that is not in progress.
  [[nodiscard]] std::optional<Completion> wait(std::uint64_t id, std::chrono::milliseconds timeout,
                                               SourceLocation where = SourceLocation::current());
  /// Takes rail `i` out now, as a failure would: its QPs to ERR, what they had posted goes again
  /// on the other rails, a RailEvent (down, ECANCELED), and a reconnection after
  /// reconnect_interval. For draining a NIC by hand (and for tests). Nothing if it is down.
  /// Throws Error(Errc::bad_argument) for a rail that does not exist.
  void take_down(std::size_t i, SourceLocation where = SourceLocation::current());
  /// The rail events since the last call, oldest first (valid until the next call). One that
  /// came while memory ran out may be missing: rail_state() says where a rail stands.
  std::span<const RailEvent> poll_rail_events() noexcept;

  /// Readable when progress() has something to do (an epoll set over the CQs' channels, the
  /// connections' rdma_cm channel and a timer for reconnections).
  [[nodiscard]] int fd() const noexcept;
  /// When progress() must run at the latest if fd() stays silent (a reconnection is due);
  /// time_point::max() when nothing is due.
  [[nodiscard]] std::chrono::steady_clock::time_point next_deadline() const noexcept;

  /// The rails (GroupOptions::rails).
  [[nodiscard]] std::size_t rail_count() const noexcept;
  /// Where rail `i` stands.
  [[nodiscard]] RailState rail_state(std::size_t i) const;
  /// What rail `i` has done (throws std::out_of_range for a rail that does not exist).
  [[nodiscard]] RailCounters rail_counters(std::size_t i) const;
  /// Rails that are up now.
  [[nodiscard]] std::size_t live_rails() const noexcept;
  /// The local devices (one per device the rails' local addresses are on), in order of first use.
  [[nodiscard]] std::size_t device_count() const noexcept;
  /// Bytes of the Target's exposed buffer.
  [[nodiscard]] std::uint64_t remote_size() const noexcept;
  /// How long a silent rail takes at most to be noticed (failure_bound(GroupOptions::transport)).
  [[nodiscard]] std::chrono::milliseconds failure_bound() const noexcept;

  struct Impl;

 private:
  explicit Group(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace verbs::rails
