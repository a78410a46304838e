// The command line the connected examples share, in the style of perftest:
//
//   NAME [-p PORT] [-a BIND_ADDR] [options]     server: no HOST given
//   NAME [-p PORT] [options] HOST               client: connects to the server at HOST
//
// Also the choice of local address, which decides the RDMA device. Deliberately tiny (numbers
// only, with an optional K or M suffix); not part of the library.
#pragma once

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include <verbs/cm.hpp>

namespace example {

/// One numeric option of an example, -X VALUE.
struct Option {
  char flag;
  const char* value_name;  ///< shown in --help, e.g. "ITERS"
  const char* help;
  std::uint64_t* value;    ///< holds the default, replaced when the option is given
  std::uint64_t min = 0;
};

struct Args {
  std::string host;                  ///< the server to connect to; empty: this process is the server
  std::string bind;                  ///< -a: the server's address, the client's source (see local_address)
  std::uint16_t port = 7471;         ///< -p: with the server, 0 picks a free port (printed)
  std::chrono::seconds timeout{30};  ///< -t: the longest any single wait may take
  [[nodiscard]] bool server() const noexcept { return host.empty(); }
};

/// "123", "64K" (KiB) or "1M" (MiB).
inline std::uint64_t parse_number(std::string_view text, char flag) {
  std::uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  std::uint64_t unit = 1;
  if (ec == std::errc{} && p + 1 == end && (*p == 'K' || *p == 'k')) unit = 1024, ++p;
  if (ec == std::errc{} && p + 1 == end && (*p == 'M' || *p == 'm')) unit = 1024 * 1024, ++p;
  if (ec != std::errc{} || p != end || text.empty() || v > UINT64_MAX / unit)
    throw std::invalid_argument("-" + std::string(1, flag) + ": '" + std::string(text) + "' is not a number");
  return v * unit;
}

/// Parses the command line. Prints the help and exits 0 for -h or --help; throws
/// std::invalid_argument for anything it does not understand.
inline Args parse_args(int argc, char** argv, const char* name, const char* about,
                       std::initializer_list<Option> options) {
  Args args;
  std::uint64_t port = args.port, timeout = 30;
  const auto usage = [&] {
    std::printf("Usage: %s [-p PORT] [-a BIND_ADDR] [options]    (server)\n"
                "       %s [-p PORT] [options] HOST              (client)\n\n%s\n\nOptions:\n"
                "  -p PORT       port (default 7471; the server takes any free port with 0)\n"
                "  -a BIND_ADDR  the local address: the server listens on it, the client connects from it\n"
                "                (default: server, the first with an RDMA device; client, the one routed to HOST)\n"
                "  -t SECONDS    the longest any wait for the peer may take (default 30)\n",
                name, name, about);
    for (const Option& o : options)
      std::printf("  -%c %-10s %s (default %llu)\n", o.flag, o.value_name, o.help,
                  static_cast<unsigned long long>(*o.value));
    std::printf("  -h, --help    show this help\n");
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      usage();
      std::exit(0);
    }
    if (arg.size() < 2 || arg[0] != '-') {
      if (!args.host.empty()) throw std::invalid_argument("more than one HOST given (see --help)");
      args.host = arg;
      continue;
    }
    // -X VALUE or -XVALUE
    const char flag = arg[1];
    std::string_view value = arg.substr(2);
    if (value.empty()) {
      if (i + 1 >= argc) throw std::invalid_argument(std::string(arg) + " needs a value (see --help)");
      value = argv[++i];
    }
    if (flag == 'a') {
      args.bind = value;
    } else if (flag == 'p') {
      port = parse_number(value, flag);
    } else if (flag == 't') {
      timeout = parse_number(value, flag);
    } else {
      const Option* o = nullptr;
      for (const Option& x : options)
        if (x.flag == flag) o = &x;
      if (o == nullptr) throw std::invalid_argument("unknown option -" + std::string(1, flag) + " (see --help)");
      *o->value = parse_number(value, flag);
      if (*o->value < o->min)
        throw std::invalid_argument("-" + std::string(1, flag) + " must be at least " + std::to_string(o->min));
    }
  }
  if (port > 65535) throw std::invalid_argument("-p: no such port");
  if (port == 0 && !args.server()) throw std::invalid_argument("-p: the client needs the server's port");
  if (timeout == 0) throw std::invalid_argument("-t: must be at least 1 second");
  args.port = static_cast<std::uint16_t>(port);
  args.timeout = std::chrono::seconds(timeout);
  return args;
}

/// The local address this side uses; it decides the RDMA device. Whatever is made before the
/// connection exists (a PD for a buffer exposed in the handshake, a shared CQ or SRQ) must come
/// from that device: verbs::cm::device_for(local_address(args)).
///   -a given: that address;
///   client:   the address the kernel routes HOST from (connecting a UDP socket sends nothing,
///             it only picks the route);
///   server:   the first local IPv4 address that has an RDMA device.
inline std::string local_address(const Args& args) {
  if (!args.bind.empty()) return args.bind;
  char text[NI_MAXHOST] = {};
  if (!args.server()) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_DGRAM;
    addrinfo* res = nullptr;
    if (const int rc = ::getaddrinfo(args.host.c_str(), "7471", &hints, &res); rc != 0)
      throw std::runtime_error("cannot resolve " + args.host + ": " + ::gai_strerror(rc));
    const int fd = ::socket(res->ai_family, SOCK_DGRAM, 0);
    sockaddr_storage me{};
    socklen_t len = sizeof me;
    const bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0;  // NOLINT
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::freeaddrinfo(res);
    if (!ok) throw std::system_error(err, std::generic_category(), "no route to " + args.host);
    ::getnameinfo(reinterpret_cast<sockaddr*>(&me), len, text, sizeof text, nullptr, 0, NI_NUMERICHOST);  // NOLINT
    return text;
  }
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw std::system_error(errno, std::generic_category(), "getifaddrs");
  std::string found;
  for (const ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    ::getnameinfo(a->ifa_addr, sizeof(sockaddr_in), text, sizeof text, nullptr, 0, NI_NUMERICHOST);
    try {
      (void)verbs::cm::device_for(text);
      found = text;
    } catch (const verbs::Error&) {
      // no RDMA device on this one
    }
  }
  ::freeifaddrs(list);
  if (found.empty()) throw std::runtime_error("no local IPv4 address has an RDMA device (give one with -a)");
  return found;
}

/// The line a script waits for before it starts the clients. Flushed, since stdout is
/// usually a pipe then, and a pipe is not line-buffered.
inline void print_listening(const char* name, const std::string& address, std::uint16_t port) {
  std::printf("%s: listening on %s:%u\n", name, address.c_str(), static_cast<unsigned>(port));
  std::fflush(stdout);
}

}  // namespace example
