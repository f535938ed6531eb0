// RpcBackendOptions as given -> as the agent uses them (rpc/agent_options.h).
#include "rpc/agent_options.h"

#include <cstdlib>
#include <regex>
#include <string_view>

#include "rpc/shm.h"
#include "store/job_key.h"
#include "store/liveness.h"
#include "store/net_address.h"
#include "store/rendezvous.h"
#include "store/tls.h"

namespace gw::rpc {

namespace {

void check_name(const std::string& name) {
  static const std::regex kValid("[A-Za-z0-9_:\\-]+");
  GW_CHECK(!name.empty() && name.size() < 128 && std::regex_match(name, kValid),
           InvalidArgumentError, "[init_rpc] worker name '", name,
           "' must be 1-127 characters of letters, digits, '_', ':' or '-'");
}

// The IP address the agent listens on and publishes: the one the options name (a host name is
// resolved), else the one the other hosts reach this one on (store/net_address.h).
std::string listen_address(const RpcBackendOptions& o) {
  constexpr const char* kOp = "init_rpc";
  if (!o.address.empty()) return store::resolve_host(o.address, kOp);
  return o.store ? store::default_address(kOp) : store::address_toward_master(o.init_method, kOp);
}

// Shared memory unless the options say otherwise, or, when they say nothing, GW_RPC_SHM=0.
bool use_shared_memory(const std::optional<bool>& given) {
  if (given) return *given;
  const char* env = std::getenv("GW_RPC_SHM");
  return env == nullptr || std::string_view(env) != "0";
}

// 0 (TCP only) needs no check; a ring must be whole pages, within what rpc/shm.h maps.
void check_shm_ring_bytes(uint64_t bytes) {
  if (bytes == 0) return;
  GW_CHECK(bytes >= shm::kMinRingBytes && bytes <= shm::kMaxRingBytes && bytes % 4096 == 0,
           InvalidArgumentError, "[init_rpc] shm_ring_bytes ", bytes,
           " must be a multiple of 4096 in [", shm::kMinRingBytes, ", ", shm::kMaxRingBytes, "]");
}

// The rendezvous TCPStore proves the same key as the transport's connections (resolved once,
// so that both agree), under the same limits. TLS goes as given: the store makes its own
// context of it.
store::TCPStoreOptions store_security(const RpcBackendOptions& o, const store::JobKey& key) {
  store::TCPStoreOptions s;
  s.job_key = key;
  s.allow_unauthenticated = o.allow_unauthenticated;
  s.handshake_timeout = o.handshake_timeout;
  s.max_unauthenticated_connections = o.max_unauthenticated_connections;
  s.tls = o.tls;
  return s;
}

}  // namespace

ResolvedOptions resolve_options(const WorkerInfo& self, int world_size, RpcBackendOptions options) {
  check_name(self.name);
  GW_CHECK(world_size > 0 && self.id >= 0 && self.id < world_size, InvalidArgumentError,
           "[init_rpc] rank ", self.id, " is outside [0, world_size=", world_size, ")");
  GW_CHECK(options.num_worker_threads > 0, InvalidArgumentError,
           "[init_rpc] num_worker_threads must be positive, got ", options.num_worker_threads);
  GW_CHECK(options.rpc_timeout.count() >= 0, InvalidArgumentError,
           "[init_rpc] rpc_timeout must be >= 0 ms (0 = none), got ", options.rpc_timeout.count());
  GW_CHECK(options.max_pending_requests_per_peer > 0, InvalidArgumentError,
           "[init_rpc] max_pending_requests_per_peer must be positive, got ",
           options.max_pending_requests_per_peer);
  // From here on, each step may read the environment or the network, and may throw: the order
  // decides which of several problems is reported.
  options.address = listen_address(options);
  Transport::Options net;
  net.self_name = self.name;
  net.self_id = self.id;
  net.address = options.address;
  net.max_frame_bytes = options.max_frame_bytes;
  net.key = store::resolve_job_key(options.job_key, options.address, options.allow_unauthenticated,
                                   "init_rpc");
  net.handshake_timeout = options.handshake_timeout;
  net.max_unauthenticated = options.max_unauthenticated_connections;
  net.tls = store::make_tls_context(options.tls, "init_rpc");
  options.failure_timeout = store::failure_timeout(options.failure_timeout, "init_rpc");
  net.failure_timeout = options.failure_timeout;
  options.shared_memory = use_shared_memory(options.shared_memory);
  net.shm_ring_bytes = *options.shared_memory ? options.shm_ring_bytes : 0;
  check_shm_ring_bytes(net.shm_ring_bytes);
  store::TCPStoreOptions security = store_security(options, net.key);
  return {std::move(options), std::move(net), std::move(security)};
}

}  // namespace gw::rpc
