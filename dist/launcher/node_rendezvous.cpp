#include "dist/launcher/node_rendezvous.h"

#include "core/error.h"
#include "dist/store/net_address.h"
#include "dist/store/tcp_store.h"

namespace gw::launcher {

NodeRendezvous::NodeRendezvous(const LaunchOptions& o) {
  const std::string& endpoint = o.rdzv_endpoint;
  const std::string& host = o.rdzv_host;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.rdzv_timeout_s * 1000));
  dist::TCPStoreOptions store;
  store.port = static_cast<uint16_t>(o.rdzv_port);
  store.world_size = o.nnodes;
  store.timeout = timeout;
  // The node whose address HOST is hosts, unless another gwrun of this machine took the port
  // first; the others connect.
  const std::string ip = dist::resolve_host(host, "gwrun");
  bool hosting = false;
  if (dist::is_local_address(ip)) {
    store.is_master = true;
    // A name of this machine mapped to loopback: the store picks (all interfaces, with a key).
    store.bind_address = dist::names_this_host(host, ip) ? "" : ip;
    try {
      store_ = std::make_shared<dist::TCPStore>(host, store);
      hosting = true;
    } catch (const IoError&) {
      if (!dist::port_in_use(ip, store.port)) throw;
    }
  }
  if (!store_) {
    store.is_master = false;
    store_ = std::make_shared<dist::TCPStore>(host, store);
  }

  // Keys of this job's rendezvous (--rdzv-id): jobs sharing an endpoint do not mix.
  const std::string prefix = "gwrun/" + o.rdzv_id + "/nodes/";
  const std::string kArrived = prefix + "arrived", kComplete = prefix + "complete",
                    kMaster = prefix + "master", kRead = prefix + "read", kAllRead = kRead + "/all";
  node_rank_ = static_cast<int>(store_->add(kArrived, 1)) - 1;
  GW_CHECK(node_rank_ < o.nnodes, StateError, "[gwrun] more nodes than --nnodes ", o.nnodes,
           " joined the rendezvous at ", endpoint);
  if (node_rank_ == o.nnodes - 1) store_->set(kComplete, std::string("1"));
  try {
    store_->wait({kComplete}, timeout);
  } catch (const TimeoutError&) {
    throw TimeoutError(gw::detail::str("[gwrun] rendezvous at ", endpoint, ": ",
                                       store_->add(kArrived, 0), " of ", o.nnodes,
                                       " nodes arrived within ", o.rdzv_timeout_s, " s"));
  }
  if (node_rank_ == 0) {
    const std::string ip = dist::reachable_address(host, "gwrun");
    store_->set(kMaster, ip + "\n" + std::to_string(dist::free_port(ip, "gwrun")));
  }
  store_->wait({kMaster}, timeout);
  const std::string master = store_->get_string(kMaster);
  const auto nl = master.find('\n');
  master_addr_ = master.substr(0, nl);
  master_port_ = std::stoi(master.substr(nl + 1));
  // The hosting node's job may end first (its gwrun exits, and the store with it): not before
  // every node has read the master.
  if (store_->add(kRead, 1) == o.nnodes) store_->set(kAllRead, std::string("1"));
  if (hosting) store_->wait({kAllRead}, timeout);
}

}  // namespace gw::launcher
