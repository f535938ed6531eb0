// A worker that builds one kind of distributed hang on purpose, for the hang doctor's tests
// (test_hang_doctor.cpp), run under gwrun:
//   hang_probe collectives   rank 1 calls allreduce [4096] float32, the others broadcast it
//   hang_probe shapes        rank 1 allreduces [8] float32, the others [4] (GW_DISTRIBUTED_DEBUG)
//   hang_probe silent        rank 1 stops itself (SIGSTOP); the others allreduce
//   hang_probe rpc-cycle     worker r calls worker r+1's `relay`, which calls on, with one
//                            thread per pool: every pool ends up waiting on the next
//   hang_probe barrier       monitored_barrier(1 s); the last rank does not come (exits 0)
//   hang_probe compute       no hang: allreduce, 2 s of computing (nothing pending), allreduce
// Every wait is bounded (collectives and RPCs time out after 60 s; gwrun stops it sooner).
// Prints "raised: <error>" and exits 1 when an operation raised, "completed" and 0 otherwise.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <thread>

#include "core/ops.h"
#include "dist/process_group/init_process_group.h"
#include "rpc/rpc.h"
#include "store/launch_env.h"

namespace {

constexpr auto kTimeout = std::chrono::seconds(60);

int world_size() { return gw::store::detect_launch_env().world_size; }

// The RPC cycle: each hop calls the next worker's relay until `hops` runs out.
int64_t relay(int64_t hops) {
  if (hops == 0) return 0;
  const int me = gw::rpc::get_worker_info().id;
  const std::string next = "worker" + std::to_string((me + 1) % world_size());
  return gw::rpc::rpc_sync<int64_t>(next, "relay", hops - 1) + 1;
}
GW_RPC_FUNCTION(relay);

void run_collectives(const std::string& scenario, int rank) {
  auto pg = gw::dist::init_process_group("gloo", kTimeout);
  if (scenario == "collectives") {
    gw::Tensor t = gw::ones({4096});
    if (rank == 1)
      pg->allreduce(t)->wait();
    else
      pg->broadcast(t, {.root = 0})->wait();
  } else if (scenario == "shapes") {
    gw::Tensor t = gw::ones({rank == 1 ? 8 : 4});
    pg->allreduce(t)->wait();
  } else if (scenario == "silent") {
    if (rank == 1) ::raise(SIGSTOP);  // gwrun's SIGKILL ends it
    gw::Tensor t = gw::ones({16});
    pg->allreduce(t)->wait();
  } else if (scenario == "compute") {
    gw::Tensor t = gw::ones({16});
    pg->allreduce(t)->wait();
    std::this_thread::sleep_for(std::chrono::seconds(2));  // computing: no operation pending
    pg->allreduce(t)->wait();
  } else if (scenario == "barrier") {
    if (rank != pg->size() - 1) pg->monitored_barrier(std::chrono::seconds(1));  // it never comes
  }
  gw::dist::destroy_process_group();
}

}  // namespace

int main(int argc, char** argv) {
  const std::set<std::string> scenarios = {"collectives", "shapes",  "silent",
                                           "rpc-cycle",   "barrier", "compute"};
  if (argc != 2 || !scenarios.contains(argv[1])) {
    std::fprintf(stderr, "usage: hang_probe collectives|shapes|silent|rpc-cycle|barrier|compute\n");
    return 2;
  }
  const std::string scenario = argv[1];
  const int rank = gw::store::detect_launch_env().rank;
  try {
    if (scenario == "rpc-cycle") {
      gw::rpc::RpcBackendOptions options;
      options.num_worker_threads = 1;
      options.rpc_timeout = kTimeout;
      gw::rpc::init_rpc("worker" + std::to_string(rank), options);
      const std::string next = "worker" + std::to_string((rank + 1) % world_size());
      gw::rpc::rpc_sync<int64_t>(next, "relay", int64_t{2});
      gw::rpc::shutdown();
    } else {
      run_collectives(scenario, rank);
    }
  } catch (const std::exception& e) {
    std::printf("raised: %s\n", e.what());
    std::fflush(stdout);
    return 1;
  }
  std::printf("completed\n");
  return 0;
}
