// A worker for the failure tests across hosts (test_multihost.cpp), run under gwrun on each
// host: sets up, says "ready", waits until the test has cut a host off and says "go" through
// the FIFO <fifo>.<rank>, then tries one operation with the others and reports how long it took
// to raise:
//   liveness_probe rpc|autograd|allreduce|store <fifo>
// rpc: rpc_sync to a worker (worker1; worker1 calls worker0) it reached before;
// autograd: a distributed backward through such a call;
// allreduce: an allreduce of the default (Gloo) process group;
// store: rank 0 hosts the job's TCPStore and leaves after "go"; the others wait on it for a key
// that never comes (their store connections' keepalive must notice the silence).
// Prints "raised after S s: <error>" and exits 1, or "completed" and exits 0.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "core/ops.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/init_rpc.h"
#include "dist/process_group/init_process_group.h"
#include "rpc/rpc.h"
#include "store/launch_env.h"
#include "store/rendezvous.h"

namespace {

using Clock = std::chrono::steady_clock;

void wait_for_go(const std::string& fifo, int rank) {
  std::printf("rank %d ready\n", rank);
  std::fflush(stdout);
  std::ifstream go(fifo + "." + std::to_string(rank));  // blocks until the test opens it
  std::string word;
  go >> word;
}

int report(Clock::time_point since, const std::exception* e) {
  const double s = std::chrono::duration<double>(Clock::now() - since).count();
  if (e == nullptr) {
    std::printf("completed after %.2f s\n", s);
    return 0;
  }
  std::printf("raised after %.2f s: %s\n", s, e->what());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: liveness_probe rpc|autograd|allreduce|store <fifo>\n");
    return 2;
  }
  const std::string scenario = argv[1], fifo = argv[2];
  const int rank = gw::store::detect_launch_env().rank;
  try {
    if (scenario == "store") {
      const gw::store::LaunchEnv env = gw::store::detect_launch_env();
      auto store = gw::store::rendezvous(env.init_method(), rank, env.world_size);
      store->add("liveness_probe/joined", 1);
      store->wait({"liveness_probe/joined"});  // connected
      wait_for_go(fifo, rank);
      if (rank == 0) return 0;
      const auto start = Clock::now();
      try {
        store->wait({"liveness_probe/never"}, std::chrono::minutes(10));
        return report(start, nullptr);
      } catch (const std::exception& e) {
        return report(start, &e);
      }
    }
    if (scenario == "allreduce") {
      auto pg = gw::dist::init_process_group("gloo");
      gw::Tensor t = gw::ones({1 << 16});
      pg->allreduce(t)->wait();  // connected
      wait_for_go(fifo, rank);
      const auto start = Clock::now();
      int code = 0;
      try {
        pg->allreduce(t)->wait();
        code = report(start, nullptr);
      } catch (const std::exception& e) {
        code = report(start, &e);
      }
      gw::dist::destroy_process_group();
      return code;
    }
    gw::dist::init_rpc("worker{rank}");
    const std::string target = rank == 1 ? "worker0" : "worker1";
    const gw::Tensor x = gw::ones({4}).requires_grad_(true);
    gw::rpc::rpc_sync<gw::Tensor>(target, "mul", x, x);  // connected both ways
    // autograd: the forward pass now, so that only the backward pass meets the cut.
    std::optional<gw::dist::autograd::Context> context;
    gw::Tensor y;
    if (scenario == "autograd") {
      context.emplace();
      y = gw::rpc::rpc_sync<gw::Tensor>(target, "mul", x, x);
    }
    wait_for_go(fifo, rank);
    const auto start = Clock::now();
    int code = 0;
    try {
      if (scenario == "rpc")
        gw::rpc::rpc_sync<gw::Tensor>(target, "mul", x, x);
      else
        gw::dist::autograd::backward(context->id(), {y.sum()});
      code = report(start, nullptr);
    } catch (const std::exception& e) {
      code = report(start, &e);
    }
    // The others are unreachable: a local shutdown.
    gw::rpc::shutdown(/*graceful=*/false);
    return code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "liveness_probe: %s\n", e.what());
    return 3;
  }
}
