#include "rpc/api.h"

#include <mutex>

#include "store/launch_env.h"

namespace gw::rpc {

namespace {
// The process's agent (init_rpc). The one permitted singleton: see DESIGN.md.
std::mutex g_mu;
std::unique_ptr<Agent> g_agent;
}  // namespace

void init_rpc(const std::string& name, int rank, int world_size, RpcBackendOptions options) {
  std::lock_guard lock(g_mu);
  GW_CHECK(!g_agent, StateError, "[init_rpc] RPC is already initialized on this process as '",
           g_agent->get_worker_info().name, "'");
  g_agent = std::make_unique<Agent>(name, rank, world_size, std::move(options));
}

void init_rpc(const std::string& name, RpcBackendOptions options) {
  const store::LaunchEnv env = store::detect_launch_env();
  if (options.init_method == RpcBackendOptions{}.init_method && !options.store)
    options.init_method = env.init_method();
  std::string named = name;
  for (auto at = named.find("{rank}"); at != std::string::npos; at = named.find("{rank}"))
    named.replace(at, 6, std::to_string(env.rank));
  init_rpc(named, env.rank, env.world_size, std::move(options));
}

void shutdown(bool graceful, Milliseconds timeout) {
  GW_CHECK(timeout.count() >= 0 || timeout == kUseDefaultTimeout, InvalidArgumentError,
           "[shutdown] timeout must be >= 0 ms (0 = none), got ", timeout.count());
  std::unique_ptr<Agent> agent;
  {
    std::lock_guard lock(g_mu);
    GW_CHECK(g_agent, StateError, "[shutdown] RPC is not initialized on this process");
    agent = std::move(g_agent);
  }
  agent->shutdown(graceful, timeout);
}

Agent& current_agent() {
  if (Agent* a = Agent::current()) return *a;
  std::lock_guard lock(g_mu);
  GW_CHECK(g_agent, StateError, "[rpc] RPC is not initialized: call gw::rpc::init_rpc first");
  return *g_agent;
}

WorkerInfo get_worker_info() { return current_agent().get_worker_info(); }
WorkerInfo get_worker_info(const std::string& worker_name) {
  return current_agent().get_worker_info(worker_name);
}
std::vector<WorkerInfo> get_worker_infos() { return current_agent().get_worker_infos(); }
void set_rpc_timeout(Milliseconds timeout) { current_agent().set_rpc_timeout(timeout); }
Milliseconds get_rpc_timeout() { return current_agent().rpc_timeout(); }

}  // namespace gw::rpc
