#include "cm/event.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

#include "detail.hpp"

namespace verbs::cm {
namespace internal {

[[noreturn]] void fail(int err, Phase phase, const std::string& text, SourceLocation where) {
  throw ConnectError(std::error_code(err, std::generic_category()), phase, text, where);
}

[[noreturn]] void fail_id(int err, Phase phase, const std::string& text, SourceLocation where) {
  throw IdGone(std::error_code(err, std::generic_category()), phase, text, where);
}

[[noreturn]] void fail_no_answer(Phase phase, milliseconds budget, SourceLocation where) {
  fail(ETIMEDOUT, phase, "no answer within " + std::to_string(budget.count()) + " ms (is the peer reachable?)", where);
}

int clamp_ms(milliseconds timeout) { return static_cast<int>(std::clamp<std::int64_t>(timeout.count(), 1, 1 << 30)); }

int ms_until(Clock::time_point deadline) { return detail::poll_ms_until(deadline); }

std::error_code code_of(const std::exception_ptr& e) noexcept {
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return x.code();
  } catch (const Reject&) {
    return std::make_error_code(std::errc::connection_refused);
  } catch (const std::bad_alloc&) {
    return std::make_error_code(std::errc::not_enough_memory);
  } catch (...) {
    return std::make_error_code(std::errc::connection_aborted);
  }
}

Event to_event(const rdma_cm_event* ev) {
  Event e{ev->event, ev->status, ev->id, {}};
  const bool datagram = ev->id != nullptr && ev->id->ps == RDMA_PS_UDP;
  // A SIDR reply that refuses (UNREACHABLE on a UD id) carries the refusing side's data.
  const bool carries_data = e.type == RDMA_CM_EVENT_CONNECT_REQUEST || e.type == RDMA_CM_EVENT_ESTABLISHED ||
                            e.type == RDMA_CM_EVENT_REJECTED || e.type == RDMA_CM_EVENT_CONNECT_RESPONSE ||
                            (datagram && e.type == RDMA_CM_EVENT_UNREACHABLE);
  if (carries_data && ev->param.conn.private_data != nullptr) {
    const auto* p = static_cast<const std::byte*>(ev->param.conn.private_data);
    e.private_data.assign(p, p + ev->param.conn.private_data_len);
  }
  if (e.type == RDMA_CM_EVENT_CONNECT_REQUEST && !datagram) {
    e.responder_resources = ev->param.conn.responder_resources;
    e.initiator_depth = ev->param.conn.initiator_depth;
  }
  // librdmacm puts a join's context where the private data would be.
  if (e.type == RDMA_CM_EVENT_MULTICAST_JOIN || e.type == RDMA_CM_EVENT_MULTICAST_ERROR)
    e.context = ev->param.ud.private_data;
  if (datagram && (e.type == RDMA_CM_EVENT_ESTABLISHED || e.type == RDMA_CM_EVENT_MULTICAST_JOIN)) {
    e.ah_attr = ev->param.ud.ah_attr;
    e.ud_qp_num = ev->param.ud.qp_num;
    e.ud_qkey = ev->param.ud.qkey;
  }
  return e;
}

Event check_event(Event e, rdma_cm_event_type wanted, Phase phase, SourceLocation where,
                  std::optional<rdma_cm_event_type> also) {
  if (e.type == wanted || (also && e.type == *also)) return e;
  const std::string what = std::string(rdma_event_str(e.type)) + " (status " + std::to_string(e.status) + ")";
  switch (e.type) {
    case RDMA_CM_EVENT_REJECTED:
      // The status is the IB CM reject reason (8: invalid service ID, nothing listens there).
      throw ConnectError(std::error_code(ECONNREFUSED, std::generic_category()), phase,
                         e.status == 8 ? "rejected: no listener on that port (" + what + ")"
                                        : "rejected by the peer (" + what +
                                              "; its private data, if any, is in ConnectError::private_data())",
                         e.status, e.private_data, where);
    case RDMA_CM_EVENT_UNREACHABLE: fail(EHOSTUNREACH, phase, "peer unreachable (" + what + ")", where);
    case RDMA_CM_EVENT_ADDR_ERROR:
      fail(e.status == -ENODEV ? ENODEV : (e.status < 0 ? -e.status : EHOSTUNREACH), phase,
           "address resolution failed (" + what + ")", where);
    case RDMA_CM_EVENT_ROUTE_ERROR:
      fail(e.status < 0 ? -e.status : ENETUNREACH, phase, "route resolution failed (" + what + ")", where);
    case RDMA_CM_EVENT_DEVICE_REMOVAL: fail(ENODEV, phase, "the RDMA device was removed (" + what + ")", where);
    default: fail(ECONNABORTED, phase, "unexpected " + what, where);
  }
}

namespace {

/// getaddrinfo(3) of `host`:`port` with `flags`; the errno-style code and the message on failure.
sockaddr_storage address(std::string_view host, std::uint16_t port, int flags, Phase phase, SourceLocation where) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICSERV | flags | (host.empty() ? AI_PASSIVE : 0);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string h(host);
  const std::string p = std::to_string(port);
  if (const int rc = ::getaddrinfo(h.empty() ? nullptr : h.c_str(), p.c_str(), &hints, &res); rc != 0) {
    const bool numeric = (flags & AI_NUMERICHOST) != 0;
    if (numeric && rc == EAI_NONAME)
      fail(EINVAL, phase,
           "'" + h + "' is not a numeric IPv4 or IPv6 address: a call that never blocks does not ask a name server "
           "(look the name up first, or use the blocking form)", where);
    const int err = rc == EAI_SYSTEM ? errno
                    : rc == EAI_AGAIN ? EAGAIN
                    : rc == EAI_NONAME || rc == EAI_NODATA ? EHOSTUNREACH
                    : rc == EAI_MEMORY ? ENOMEM
                                       : EINVAL;
    fail(err, phase, "cannot resolve '" + h + "': " + ::gai_strerror(rc), where);
  }
  sockaddr_storage out{};
  std::memcpy(&out, res->ai_addr, std::min<std::size_t>(res->ai_addrlen, sizeof out));
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

sockaddr_storage numeric_address(std::string_view host, std::uint16_t port, Phase phase, SourceLocation where) {
  return address(host, port, AI_NUMERICHOST, phase, where);
}

sockaddr_storage looked_up_address(std::string_view host, std::uint16_t port, Phase phase, SourceLocation where) {
  return address(host, port, 0, phase, where);
}

bool is_wildcard(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr == htonl(INADDR_ANY);  // NOLINT
  return a.ss_family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr);  // NOLINT
}

void bind_to(rdma_cm_id* id, sockaddr_storage a, const std::string& text, bool wildcard_ok, Phase phase,
             SourceLocation where) {
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)) != 0) fail(errno, phase, "rdma_bind_addr(" + text + ")", where);  // NOLINT
  if (id->verbs == nullptr && !(wildcard_ok && is_wildcard(a)))
    fail(ENODEV, phase, "no RDMA device has the address " + text, where);
}

std::string address_text(const sockaddr* sa) {
  if (sa == nullptr || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6)) return {};
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);  // NOLINT
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    return std::string(text) + ":" + std::to_string(ntohs(in->sin_port));
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);  // NOLINT
  ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
  // Appended, not "[" + std::string(text): g++ 12 at -O3 warns (-Wrestrict) about the latter.
  std::string out(1, '[');
  out += text;
  out += "]:";
  out += std::to_string(ntohs(in6->sin6_port));
  return out;
}

void set_bind_options(rdma_cm_id* id, bool reuse_address, std::optional<bool> ipv6_only, Phase phase,
                      SourceLocation where) {
  if (reuse_address) {
    int one = 1;
    if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one) != 0)
      fail(errno, phase, "rdma_set_option(REUSEADDR)", where);
  }
  if (ipv6_only) {
    int only = *ipv6_only ? 1 : 0;
    if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &only, sizeof only) != 0)
      fail(errno, phase, "rdma_set_option(AFONLY)", where);
  }
}

namespace {

/// librdmacm's list of devices (rdma_get_devices(3)), which holds a reference to each device's
/// context until rdma_free_devices(3); one for every Device of cm while any lives (asking for
/// it syncs librdmacm's list with the system's and opens every device: not once per connection).
std::shared_ptr<ibv_context*> devices_with(ibv_context* ctx, Phase phase, SourceLocation where) {
  struct Cache {
    std::mutex mutex;
    std::weak_ptr<ibv_context*> list;
  };
  static auto* cache = new Cache;  // NOLINT(cppcoreguidelines-owning-memory): Devices may outlive static destruction
  const auto has = [ctx](const std::shared_ptr<ibv_context*>& l) {
    for (ibv_context** c = l.get(); *c != nullptr; ++c)
      if (*c == ctx) return true;
    return false;
  };
  const std::lock_guard lock(cache->mutex);
  if (auto l = cache->list.lock(); l && has(l)) return l;
  errno = 0;
  std::shared_ptr<ibv_context*> l(rdma_get_devices(nullptr), [](ibv_context** p) {
    if (p != nullptr) rdma_free_devices(p);
  });
  if (!l) fail(errno != 0 ? errno : ENOMEM, phase, "rdma_get_devices", where);
  if (!has(l)) fail(ENODEV, phase, "the RDMA device of this address is gone", where);
  cache->list = l;  // (a device added since the last list: that list lives on with its Devices)
  return l;
}

}  // namespace

Device device_of(ibv_context* ctx, Phase phase, SourceLocation where) {
  if (ctx == nullptr) fail(ENODEV, phase, "no RDMA device for this address", where);
  // librdmacm keeps each device's context open while something holds a reference to it: an id
  // on it, or the list rdma_get_devices(3) returns (a device removed meanwhile is closed only
  // once the last goes). The Device holds the list.
  auto list = devices_with(ctx, phase, where);
  return Device::adopt(std::shared_ptr<ibv_context>(ctx, [list = std::move(list)](ibv_context*) {}));
}

}  // namespace internal

std::string_view to_string(Phase p) noexcept {
  switch (p) {
    case Phase::resolve_address: return "address resolution";
    case Phase::resolve_route: return "route resolution";
    case Phase::connect: return "connect";
    case Phase::listen: return "listen";
    case Phase::accept: return "accept";
    case Phase::established: return "established connection";
  }
  return "unknown";
}

ConnectError::ConnectError(std::error_code code, Phase phase, std::string_view context, SourceLocation where)
    : Error(code, "rdma_cm " + std::string(to_string(phase)) + ": " + std::string(context), where), phase_(phase) {}

ConnectError::ConnectError(std::error_code code, Phase phase, std::string_view context, int status,
                           std::span<const std::byte> private_data, SourceLocation where)
    : ConnectError(code, phase, context, where) {
  status_ = status;
  if (!private_data.empty())
    private_data_ = std::make_shared<const std::vector<std::byte>>(private_data.begin(), private_data.end());
}

Reject::Reject(std::span<const std::byte> private_data, const std::string& why) : std::runtime_error(why) {
  if (private_data.size() > max_reject_private_data)
    throw std::length_error("cm::Reject: " + std::to_string(private_data.size()) + " bytes of private data exceed the " +
                            std::to_string(max_reject_private_data) + "-byte limit of a reject");
  data_ = std::make_shared<const std::vector<std::byte>>(private_data.begin(), private_data.end());
}

}  // namespace verbs::cm
