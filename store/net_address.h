// Which address a process listens on and tells its peers, so that the job's other hosts reach it.
//
// Every server of a job (the RPC agent, Gloo's pairs; the TCPStore master binds its host's
// address, see tcp_store.h) listens on one address of its host and publishes it. The right one
// is the address of the interface that routes to the job's master — what the other hosts use to
// reach this host too — unless GW_SOCKET_IFNAME (like GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)
// names the interface. A master on loopback means a job on this host alone: loopback then.
//
//   std::string ip = reachable_address("node1");  // "10.0.0.2": this host's address toward node1
#pragma once

#include <cstdint>
#include <string>

namespace gw::store {

inline constexpr const char* kSocketIfnameEnv = "GW_SOCKET_IFNAME";

// The IP address `host` (a name or an IP literal) resolves to, IPv4 first. Throws
// InvalidArgumentError naming `op` and the host when it does not resolve.
std::string resolve_host(const std::string& host, const char* op);

// Whether `host`, which resolved to `ip`, is a name of this machine mapped to loopback (Debian
// maps the host's names to 127.0.1.1): a name the other hosts resolve to a real address.
bool names_this_host(const std::string& host, const std::string& ip);

// This host's address the job's other hosts reach it on: the GW_SOCKET_IFNAME interface's
// address (of `master`'s family when it has both), else the source address of the route to
// `master`; loopback when `master` is loopback, unless `master` names this host
// (names_this_host), which means the address of the default route (else of the first interface
// that is up). Throws InvalidArgumentError naming the interface (and the ones there are) or
// `master`.
std::string reachable_address(const std::string& master, const char* op);

// The band MASTER_PORT's stand-in comes from for launchers that give none (mpirun, Slurm: a
// port derived from the job's id, the same on every rank; see launch_env.h). hold_free_port
// stays out of it, so that a job launched so and one of gwrun's do not pick alike.
inline constexpr uint16_t kDerivedPortFirst = 20000;
inline constexpr uint16_t kDerivedPortEnd = 30000;

// A port of an address held for a server that will listen on it later, perhaps in another
// process: a socket bound to it alone (no SO_REUSEADDR at bind), then marked SO_REUSEADDR, never
// listening. While it lives, no other process's plain bind (another gwrun's probe, a client's)
// and no bind(0) or outgoing connection of this machine can take the port, yet a server that
// sets SO_REUSEADDR, as TCPStore does, can listen on it. A port merely free a moment ago can be
// taken by a concurrent job before its server binds it.
//
//   HeldPort held = hold_free_port("127.0.0.1", "gwrun");
//   spawn(rank 0 with MASTER_PORT=held.port());   // its TCPStore listens on the held port
class HeldPort {
 public:
  HeldPort(int fd, uint16_t port) : fd_(fd), port_(port) {}
  HeldPort(HeldPort&& other) noexcept;
  HeldPort& operator=(HeldPort&& other) noexcept;
  ~HeldPort();
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;  // owned
  uint16_t port_ = 0;
};

// A port free on `ip`, held (HeldPort). Chosen at random below the kernel's ephemeral range
// (ip_local_port_range) and below kDerivedPortFirst, where no bind(0) of this machine picks;
// the kernel's pick when that leaves no room. Throws IoError naming `op`.
HeldPort hold_free_port(const std::string& ip, const char* op);
// Whether ip:port is bound by another socket of this machine.
bool port_in_use(const std::string& ip, uint16_t port);

// Whether `ip` is an address of this machine (loopback included).
bool is_local_address(const std::string& ip);

// Where a job without a master host (its store given directly) listens: GW_SOCKET_IFNAME's
// address, else loopback.
std::string default_address(const char* op);

}  // namespace gw::store
