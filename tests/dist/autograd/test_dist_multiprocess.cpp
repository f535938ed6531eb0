// Distributed autograd between real processes over 127.0.0.1.
#include <catch2/catch.hpp>

#include <signal.h>

#include "core/ops.h"
#include "core/random.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/init_rpc.h"
#include "store/tcp_store.h"
#include "tests/dist/autograd/dist_functions.h"
#include "tests/process_util.h"

using namespace gw;
using namespace gw::dist::autograd;
using namespace gw::dist::autograd::testing;
using namespace std::chrono_literals;

namespace {
// Ranks 1..world_size-1 as dist_autograd_peer processes; this process is rank 0 and owns the
// store.
struct Peers {
  std::shared_ptr<store::TCPStore> store =
      std::make_shared<gw::store::TCPStore>("127.0.0.1", 0, -1, true, std::chrono::seconds(60));
  gw::test::PeerProcesses processes;
  std::unique_ptr<rpc::Agent> agent;

  explicit Peers(int world_size)
      : processes(GW_DIST_AUTOGRAD_PEER, world_size, store->port()) {
    rpc::RpcBackendOptions o;
    o.store = store;
    o.num_worker_threads = 4;
    agent = std::make_unique<rpc::Agent>("worker0", 0, world_size, dist::with_dist(o));
  }
  std::vector<int> wait() { return processes.wait(); }
  ~Peers() {
    if (agent->running()) agent->shutdown(false);
  }
};

Tensor leaf(uint64_t seed) {
  Generator gen(seed);
  return rand({3, 3}, gen).requires_grad_();
}
}  // namespace

TEST_CASE("three processes: nested RPCs give the local gradients; contexts are released",
          "[dist_autograd][process]") {
  Peers peers(3);
  rpc::Agent::Use use(*peers.agent);
  Tensor a = leaf(1), b = leaf(2), t4 = leaf(3);
  {
    Context ctx;
    Tensor t3 = rpc::rpc_sync("worker1", d_add, a, b);  // the design note's example
    Tensor r = rpc::rpc_sync("worker1", d_nested, std::string("worker2"), t3, b);
    backward(ctx.id(), {(r * t4).sum()});
    auto grads = get_gradients(ctx.id());
    Tensor la = a.detach().clone().requires_grad_(), lb = b.detach().clone().requires_grad_();
    Tensor lt4 = t4.detach().clone().requires_grad_();
    Tensor lt3 = la + lb;
    ((lt3 * lb + lt3) * lt4).sum().backward();
    CHECK(allclose(grads.at(a), la.grad()));
    CHECK(allclose(grads.at(b), lb.grad()));
    CHECK(allclose(grads.at(t4), lt4.grad()));
    CHECK(rpc::rpc_sync("worker2", d_num_contexts) == 1);
  }
  wait_for_releases();
  CHECK(rpc::rpc_sync("worker1", d_num_contexts) == 0);
  CHECK(rpc::rpc_sync("worker2", d_num_contexts) == 0);
  peers.agent->shutdown();
  CHECK(peers.wait() == std::vector<int>{0, 0});
}

TEST_CASE("three processes, SMART mode: a received tensor sent on to an unused RPC",
          "[dist_autograd][process][smart]") {
  // x comes from worker1 and goes on to worker2 with b, whose result is unused: worker0 tells
  // worker1 that x's send function is live and holds x's recv; worker1 tells worker0 in turn
  // that the send function of a and b is live; the second wave releases x's recv.
  Peers peers(3);
  rpc::Agent::Use use(*peers.agent);
  Tensor a = leaf(5), b = leaf(6), t4 = leaf(7);
  {
    Context ctx;
    Tensor x = rpc::rpc_sync("worker1", d_add, a, b);
    Tensor unused = rpc::rpc_sync("worker2", d_mul, x, b);
    (void)unused;
    backward(ctx.id(), {(x * t4).sum()}, {.mode = Mode::kSmart});
    auto grads = get_gradients(ctx.id());
    CHECK(allclose(grads.at(a), t4));  // d((a + b) * t4)/da
    CHECK(allclose(grads.at(b), t4));
    CHECK(allclose(grads.at(t4), a + b));
  }
  wait_for_releases();
  CHECK(rpc::rpc_sync("worker1", d_num_contexts) == 0);
  CHECK(rpc::rpc_sync("worker2", d_num_contexts) == 0);
  peers.agent->shutdown();
  CHECK(peers.wait() == std::vector<int>{0, 0});
}

TEST_CASE("a worker dying during backward fails it on the caller, without a hang",
          "[dist_autograd][process]") {
  for (Mode mode : {Mode::kFast, Mode::kSmart}) {
    INFO((mode == Mode::kFast ? "FAST" : "SMART") << " mode");
    Peers peers(2);
    rpc::Agent::Use use(*peers.agent);
    Tensor a = leaf(4);
    Context ctx;
    Tensor r = rpc::rpc_sync("worker1", d_crashing_backward, a);
    // The default timeout is a minute: the error must come from the lost connection.
    auto started = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(backward(ctx.id(), {r.sum()}, {.mode = mode}),
                      Catch::Contains("connection lost"));
    CHECK(std::chrono::steady_clock::now() - started < 30s);
    CHECK(peers.wait() == std::vector<int>{3});  // it exited in its backward function
  }
}
