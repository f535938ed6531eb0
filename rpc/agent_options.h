// An agent's options, resolved: what rpc::Agent's constructor makes of the RpcBackendOptions it
// is given, before it builds anything.
//
// Mental model: options as given -> options resolved. resolve_options() checks them, fills in
// what they leave to the environment or the network (the address to listen on, the failure
// timeout, shared memory), and derives what the transport and the rendezvous store are made
// with. The environment variables that stand in for options are read here, in one place:
// GW_RPC_SHM itself, and GW_JOB_KEY_FILE, GW_ALLOW_UNAUTHENTICATED, GW_TLS_*,
// GW_FAILURE_TIMEOUT and GW_SOCKET_IFNAME through the store/ helpers. Internal to the agent
// (not installed): rpc/agent.h is the options' public face.
//
//   ResolvedOptions r = resolve_options(self, world_size, std::move(options));  // may throw
//   Transport transport(std::move(r.transport), handlers);
//   auto store = store::rendezvous(r.options.init_method, self.id, world_size,
//                                  store::kDefaultStoreTimeout, r.store_security);
#pragma once

#include "rpc/agent.h"
#include "rpc/transport.h"
#include "store/tcp_store.h"

namespace gw::rpc {

struct ResolvedOptions {
  // As given, with `address` an IP address, `failure_timeout` never kFailureTimeoutFromEnv and
  // `shared_memory` set.
  RpcBackendOptions options;
  // The transport's: the job key resolved and the TLS context made, once for both.
  Transport::Options transport;
  // The rendezvous TCPStore's security (when no `store` is given): the same key and limits.
  store::TCPStoreOptions store_security;
};

// Checks `options` for worker `self` of a group of `world_size` and resolves them. Throws
// InvalidArgumentError ("[init_rpc] ...") on a bad name, rank or option, and what the store/
// helpers throw on a bad address, key, TLS setting or GW_FAILURE_TIMEOUT. The first problem is
// the one reported, in this order: name, rank, num_worker_threads, rpc_timeout,
// max_pending_requests_per_peer, address, job key, TLS, failure timeout, shm_ring_bytes.
ResolvedOptions resolve_options(const WorkerInfo& self, int world_size, RpcBackendOptions options);

}  // namespace gw::rpc
