// gwrun's rendezvous across nodes (--rdzv-endpoint HOST:PORT), with the semantics of torchrun's
// c10d rendezvous: every node runs the same gwrun command, in any order; the node whose address
// HOST is hosts a TCPStore on HOST:PORT and the others connect to it; each node receives a node
// rank in the order it arrived, and once --nnodes have arrived, node 0 names the master (its
// address toward HOST and a free port) for every worker's MASTER_ADDR and MASTER_PORT. A node
// that waits longer than --rdzv-timeout for the others fails, saying how many arrived. The store
// proves the job key like any other (GW_JOB_KEY_FILE, the same on every node).
//
//   NodeRendezvous rdzv(options);       // blocks until every node has arrived
//   options.node_rank = rdzv.node_rank();
//   options.master_addr = rdzv.master_addr();  options.master_port = rdzv.master_port();
//   // keep `rdzv` alive while the job runs: the hosting node serves the store from it
#pragma once

#include <memory>
#include <string>

#include "dist/launcher/options.h"
#include "dist/store/store.h"

namespace gw::launcher {

class NodeRendezvous {
 public:
  // Throws TimeoutError ("k of N nodes arrived") after options.rdzv_timeout_s, StateError when
  // more than --nnodes nodes join, InvalidArgumentError on a bad endpoint.
  explicit NodeRendezvous(const LaunchOptions& options);

  int node_rank() const { return node_rank_; }
  const std::string& master_addr() const { return master_addr_; }
  int master_port() const { return master_port_; }

 private:
  std::shared_ptr<dist::Store> store_;  // the hosting node serves it from here, until every
                                        // node has read the master
  int node_rank_ = 0;
  std::string master_addr_;
  int master_port_ = 0;
};

}  // namespace gw::launcher
