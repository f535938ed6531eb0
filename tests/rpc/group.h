// Threads as ranks: N RPC agents in this process, rendezvousing through one HashStore.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "rpc/agent.h"
#include "store/hash_store.h"

namespace gw::rpc::testing {

struct Group {
  std::shared_ptr<gw::store::HashStore> store = std::make_shared<gw::store::HashStore>();
  std::vector<std::unique_ptr<Agent>> agents;

  // The options tests start from: a small pool, since several agents share this process.
  static RpcBackendOptions small_options() {
    RpcBackendOptions o;
    o.num_worker_threads = 4;
    return o;
  }

  explicit Group(int n, RpcBackendOptions options = small_options())
      : Group(n, [&options](int) { return options; }) {}
  // Rank r starts with options_of(r).
  Group(int n, const std::function<RpcBackendOptions(int)>& options_of) {
    // Each constructor waits for the others to publish their address: start them together.
    std::vector<std::future<std::unique_ptr<Agent>>> starting;
    for (int r = 0; r < n; ++r) {
      RpcBackendOptions options = options_of(r);
      options.store = store;
      starting.push_back(std::async(std::launch::async, [r, n, options] {
        return std::make_unique<Agent>("worker" + std::to_string(r), r, n, options);
      }));
    }
    for (auto& s : starting) agents.push_back(s.get());
  }
  ~Group() { shutdown(); }

  Agent& operator[](int r) { return *agents[r]; }

  // Graceful shutdown of every agent, concurrently (each waits for the others).
  void shutdown() {
    std::vector<std::future<void>> done;
    for (auto& a : agents)
      if (a->running()) done.push_back(std::async(std::launch::async, [&a] { a->shutdown(true); }));
    for (auto& d : done) d.get();
  }
};

}  // namespace gw::rpc::testing
