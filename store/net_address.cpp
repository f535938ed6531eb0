#include "store/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <system_error>
#include <utility>

#include "core/error.h"

namespace gw::store {
namespace {

std::string numeric(const sockaddr* addr, socklen_t len) {
  char text[INET6_ADDRSTRLEN] = {};
  if (::getnameinfo(addr, len, text, sizeof text, nullptr, 0, NI_NUMERICHOST) != 0) return "";
  std::string s = text;
  if (const auto zone = s.find('%'); zone != std::string::npos) s.resize(zone);  // fe80::1%eth0
  return s;
}

bool is_loopback(const std::string& ip) {
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, ip.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return ::inet_pton(AF_INET6, ip.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

int family_of(const std::string& ip) {
  return ip.find(':') != std::string::npos ? AF_INET6 : AF_INET;
}

// The address of interface `name` (of `family` if it has one, else any), or the interfaces there
// are, for the error.
std::optional<std::string> interface_address(const std::string& name, int family,
                                             std::string* names) {
  ifaddrs* list = nullptr;
  GW_CHECK(::getifaddrs(&list) == 0, IoError, "[", kSocketIfnameEnv,
           "] getifaddrs failed: ", std::strerror(errno));
  std::optional<std::string> found, other;
  std::set<std::string> seen;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int f = i->ifa_addr->sa_family;
    if (f != AF_INET && f != AF_INET6) continue;
    seen.insert(i->ifa_name);
    if (name != i->ifa_name) continue;
    const socklen_t len = f == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (f == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr))
      continue;  // needs a scope id to be reached: not publishable
    auto& slot = f == family ? found : other;
    if (!slot) slot = numeric(i->ifa_addr, len);
  }
  ::freeifaddrs(list);
  if (names)
    for (const auto& n : seen) *names += (names->empty() ? "" : ", ") + n;
  return found ? found : other;
}

// The first address of an interface that is up and not loopback (IPv4 first), if any.
std::optional<std::string> first_interface_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> v4, v6;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP) || !(i->ifa_flags & IFF_RUNNING) ||
        (i->ifa_flags & IFF_LOOPBACK))
      continue;
    if (i->ifa_addr->sa_family == AF_INET && !v4)
      v4 = numeric(i->ifa_addr, sizeof(sockaddr_in));
    else if (i->ifa_addr->sa_family == AF_INET6 && !v6 &&
             !IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr))
      v6 = numeric(i->ifa_addr, sizeof(sockaddr_in6));
  }
  ::freeifaddrs(list);
  return v4 ? v4 : v6;
}

// The source address the kernel would use toward `ip`: a UDP socket's connect() only looks the
// route up, nothing is sent.
std::optional<std::string> route_source(const std::string& ip) {
  sockaddr_storage to{};
  socklen_t len = 0;
  if (family_of(ip) == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&to);
    a->sin_family = AF_INET;
    a->sin_port = htons(9);
    if (::inet_pton(AF_INET, ip.c_str(), &a->sin_addr) != 1) return std::nullopt;
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&to);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(9);
    if (::inet_pton(AF_INET6, ip.c_str(), &a->sin6_addr) != 1) return std::nullopt;
    len = sizeof *a;
  }
  const int fd = ::socket(to.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> out;
  sockaddr_storage local{};
  socklen_t local_len = sizeof local;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), len) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0)
    out = numeric(reinterpret_cast<sockaddr*>(&local), local_len);
  ::close(fd);
  return out;
}

std::string from_ifname(const std::string& ifname, int family, const char* op) {
  std::string names;
  auto ip = interface_address(ifname, family, &names);
  GW_CHECK(ip.has_value(), InvalidArgumentError, "[", op, "] ", kSocketIfnameEnv, "='", ifname,
           "' is not an interface with an IP address here (there are: ", names, ")");
  return *ip;
}

}  // namespace

std::string resolve_host(const std::string& host, const char* op) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &list);
  GW_CHECK(rc == 0 && list != nullptr, InvalidArgumentError, "[", op, "] cannot resolve host '",
           host, "': ", ::gai_strerror(rc));
  std::string v4, any;
  for (const addrinfo* a = list; a != nullptr; a = a->ai_next) {
    const std::string ip = numeric(a->ai_addr, a->ai_addrlen);
    if (any.empty()) any = ip;
    if (v4.empty() && a->ai_family == AF_INET) v4 = ip;
  }
  ::freeaddrinfo(list);
  return v4.empty() ? any : v4;
}

bool names_this_host(const std::string& host, const std::string& ip) {
  in_addr literal{};
  in6_addr literal6{};
  const bool is_literal = ::inet_pton(AF_INET, host.c_str(), &literal) == 1 ||
                          ::inet_pton(AF_INET6, host.c_str(), &literal6) == 1;
  return !is_literal && is_loopback(ip) && ip != "127.0.0.1" && ip != "::1";
}

std::string reachable_address(const std::string& master, const char* op) {
  const std::string master_ip = resolve_host(master, op);
  if (const char* ifname = std::getenv(kSocketIfnameEnv); ifname != nullptr && *ifname != '\0')
    return from_ifname(ifname, family_of(master_ip), op);
  if (is_loopback(master_ip)) {
    // A name of this machine mapped to loopback (Debian's 127.0.1.1): the other hosts know it
    // by a real address — the one of the default route, else of the first interface up.
    if (names_this_host(master, master_ip)) {
      if (auto ip = route_source("192.0.2.1")) return *ip;  // TEST-NET-1: a route lookup only
      if (auto ip = first_interface_address()) return *ip;
    }
    return master_ip;
  }
  auto ip = route_source(master_ip);
  GW_CHECK(ip.has_value() && !ip->empty(), InvalidArgumentError, "[", op, "] no route to master '",
           master, "' (", master_ip, "); set ", kSocketIfnameEnv, " to the interface to use");
  return *ip;
}

namespace {
// Binds a new socket to ip:port (0: the kernel picks) with no SO_REUSEADDR, so that it fails
// while any other socket is bound there; the error, else the socket and the port bound.
std::error_code bind_alone(const std::string& ip, uint16_t& port, int& fd_out) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (family_of(ip) == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    if (::inet_pton(AF_INET, ip.c_str(), &a->sin_addr) != 1)
      return std::make_error_code(std::errc::invalid_argument);
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    if (::inet_pton(AF_INET6, ip.c_str(), &a->sin6_addr) != 1)
      return std::make_error_code(std::errc::invalid_argument);
    len = sizeof *a;
  }
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {errno, std::generic_category()};
  std::error_code ec;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    ec = {errno, std::generic_category()};
  else
    port = ntohs(addr.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                                           : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  if (ec)
    ::close(fd);
  else
    fd_out = fd;
  return ec;
}

std::error_code bind_probe(const std::string& ip, uint16_t port) {
  int fd = -1;
  const std::error_code ec = bind_alone(ip, port, fd);
  if (!ec) ::close(fd);
  return ec;
}

// The first port of the kernel's ephemeral range, from which it picks for bind(0) and for
// outgoing connections (Linux's default, if unreadable).
int ephemeral_ports_start() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (range >> low >> high && low > 0 && low <= high) return low;
  return 32768;
}
}  // namespace

HeldPort::HeldPort(HeldPort&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}

HeldPort& HeldPort::operator=(HeldPort&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
  }
  return *this;
}

HeldPort::~HeldPort() {
  if (fd_ >= 0) ::close(fd_);
}

HeldPort hold_free_port(const std::string& ip, const char* op) {
  // Below the ephemeral range and the derived ports' band: only a process naming this very port
  // could want it.
  constexpr int kFloor = 10000, kMinWindow = 1000, kTries = 64;
  const int end = std::min<int>(ephemeral_ports_start(), kDerivedPortFirst);
  int fd = -1;
  uint16_t port = 0;
  bool bound = false;
  if (end - kFloor >= kMinWindow) {
    std::mt19937 gen(std::random_device{}());
    std::uniform_int_distribution<int> pick(kFloor, end - 1);
    for (int i = 0; i < kTries && !bound; ++i) {
      port = static_cast<uint16_t>(pick(gen));
      bound = !bind_alone(ip, port, fd);
    }
  }
  if (!bound) {
    port = 0;  // the kernel's pick, in the ephemeral range
    const std::error_code ec = bind_alone(ip, port, fd);
    GW_CHECK(!ec, IoError, "[", op, "] cannot find a free port on ", ip, ": ", ec.message());
  }
  const int on = 1;  // now the port's server, which sets it too, may bind beside us
  HeldPort held(fd, port);
  GW_CHECK(::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0, IoError, "[", op,
           "] cannot hold port ", port, " of ", ip, ": ", std::strerror(errno));
  return held;
}

bool port_in_use(const std::string& ip, uint16_t port) {
  return bind_probe(ip, port) == std::errc::address_in_use;
}

bool is_local_address(const std::string& ip) {
  if (is_loopback(ip)) return true;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (const ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int f = i->ifa_addr->sa_family;
    if (f == AF_INET || f == AF_INET6)
      found = numeric(i->ifa_addr, f == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6)) == ip;
  }
  ::freeifaddrs(list);
  return found;
}

std::string default_address(const char* op) {
  if (const char* ifname = std::getenv(kSocketIfnameEnv); ifname != nullptr && *ifname != '\0')
    return from_ifname(ifname, AF_INET, op);
  return "127.0.0.1";
}

}  // namespace gw::store
