// A test bed of hosts on one machine: Linux network namespaces, each with its own network stack
// and one interface, eth0, cabled (a veth pair) to a bridge that lives in a namespace of its own.
// Host i has 10.77.0.(i+1)/24 and fd77::(i+1)/64 on eth0, and before it an interface (aux0)
// with 10.88.0.(i+1) that no other host can reach; the hosts' names (gwhost0, gwhost1, ...) resolve
// on every host. Nothing outside the bed (the machine's own namespace included) sees its
// traffic. The constructor builds it; the destructor deletes the namespaces, which removes
// their links.
//
//   if (auto why = NetnsBed::unavailable(); !why.empty()) GW_SKIP(why);
//   NetnsBed bed(3);
//   GwrunProcess host1({"--nnodes", "3", "--node-rank", "1", ...}, bed.exec(1));
//   bed.set_link(1, false);  // host 1's cable pulled: no FIN, no RST, silence
//
// Building it needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2's `ip`.
#pragma once

#include <string>
#include <vector>

namespace gw::test {

class NetnsBed {
 public:
  // Empty when a bed can be built here; else one line saying why not (for a skip).
  static std::string unavailable();

  explicit NetnsBed(int hosts);
  ~NetnsBed();
  NetnsBed(const NetnsBed&) = delete;
  NetnsBed& operator=(const NetnsBed&) = delete;

  int hosts() const { return hosts_; }
  std::string ns(int host) const;  // the namespace's name
  std::string ipv4(int host) const { return "10.77.0." + std::to_string(host + 1); }
  std::string ipv6(int host) const { return "fd77::" + std::to_string(host + 1); }
  std::string name(int host) const { return "gwhost" + std::to_string(host); }
  // The command prefix that runs a program on `host`: {"ip", "netns", "exec", ns(host)}.
  std::vector<std::string> exec(int host) const;
  // Plugs or pulls `host`'s cable (its port on the bridge).
  void set_link(int host, bool up);

 private:
  void teardown();

  std::string prefix_;
  int hosts_ = 0;
  int built_ = 0;  // host namespaces made so far
};

}  // namespace gw::test
