// rendezvous: builds the Store a job's ranks meet in, from PyTorch's init_method URLs.
//
//   "env://"              MASTER_ADDR and MASTER_PORT from the environment, TCPStore
//   "tcp://host:port"     TCPStore; rank 0 runs the server ("[::1]:port" for IPv6 literals)
//   "file:///abs/path"    FileStore on that file
//
// Rank 0 is the TCPStore master; port 0 lets it pick a free port (only useful when it can tell
// the others some other way). Bad URLs, variables and ranks are InvalidArgumentErrors naming
// the value.
//
//   auto store = gw::store::rendezvous("env://", rank, world_size);
//   store->set("worker/" + std::to_string(rank), "ready");
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "store/store.h"
#include "store/tcp_store.h"

namespace gw::store {

// `tcp`: the TCPStore's security settings (job key, bind address, limits); its port, master,
// world size and timeout fields come from the URL, rank and `timeout`.
std::shared_ptr<Store> rendezvous(const std::string& init_method, int rank, int world_size,
                                  Milliseconds timeout = kDefaultStoreTimeout,
                                  const TCPStoreOptions& tcp = {});

// The master host `init_method` names (env://: MASTER_ADDR; tcp://host:port: host), or nullopt
// for file://. Throws InvalidArgumentError as rendezvous() does on a bad URL or variable.
std::optional<std::string> rendezvous_host(const std::string& init_method);

// The address a process of the job rendezvousing at `init_method` listens on and publishes
// (store/net_address.h): the one toward its master, or default_address() for file://.
std::string address_toward_master(const std::string& init_method, const char* op);

}  // namespace gw::store
