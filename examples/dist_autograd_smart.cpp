// SMART mode distributed autograd: an RPC whose result the loss does not use.
//
//   build/tools/gwrun/gwrun --nproc-per-node 2 build/examples/dist_autograd_smart
//
// The design note's example of what FAST mode cannot run: worker0 sends b to worker1 twice,
// once for the loss (d = a + b) and once for a value it only looks at (e = b * c, a metric).
//
//   d = rpc_sync("worker1", add, a, b);   // on the backward path
//   e = rpc_sync("worker1", mul, b, c);   // not: printed, never differentiated
//   backward(ctx, {d.sum()})                            -> StateError: FAST mode waits, at b,
//                                                          for e's gradient, which never comes
//   backward(ctx, {d.sum()}, {.mode = Mode::kSmart})    -> a and b get local autograd's
//                                                          gradients; c, off the path, none
//
// worker0 checks SMART mode's gradients against local autograd on the same values; the exit
// status says whether the check held. worker1 only serves.
#include <cstdio>
#include <string>

#include "core/ops.h"
#include "core/random.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/init_rpc.h"
#include "examples/common/launch.h"
#include "rpc/rpc.h"

using gw::Tensor;
namespace rpc = gw::rpc;
namespace dist = gw::dist;

Tensor add(Tensor a, Tensor b) { return a + b; }
GW_RPC_FUNCTION(add);
Tensor mul(Tensor a, Tensor b) { return a * b; }
GW_RPC_FUNCTION(mul);

namespace {

// The gradients of a, b, c after the forward pass above and backward in `mode`.
dist::autograd::GradientMap distributed(const Tensor& a, const Tensor& b, const Tensor& c,
                                        dist::autograd::Mode mode) {
  dist::autograd::Context context;
  Tensor d = rpc::rpc_sync("worker1", add, a, b);
  Tensor e = rpc::rpc_sync("worker1", mul, b, c);
  std::printf("worker0: metric e.mean() = %.4f\n", e.mean().item<double>());
  dist::autograd::backward(context.id(), {d.sum()}, {.mode = mode});
  return dist::autograd::get_gradients(context.id());
}

bool run_driver() {
  gw::manual_seed(7);
  Tensor a = gw::rand({3, 3}).requires_grad_(), b = gw::rand({3, 3}).requires_grad_(),
         c = gw::rand({3, 3}).requires_grad_();

  try {
    distributed(a, b, c, dist::autograd::Mode::kFast);
    std::printf("worker0: FAST mode ran (unexpected)\n");
  } catch (const gw::StateError& e) {
    std::printf("worker0: FAST mode raised: %s\n", e.what());
  }

  const auto grads = distributed(a, b, c, dist::autograd::Mode::kSmart);
  (a + b).sum().backward();  // local autograd on the same values: d's part only
  bool ok = !grads.contains(c);
  std::printf("worker0: SMART mode: c has %s gradient (local autograd: none)\n",
              grads.contains(c) ? "a" : "no");
  for (const auto& [name, t] : {std::pair{"a", a}, std::pair{"b", b}}) {
    const bool same = grads.contains(t) && gw::allclose(grads.at(t), t.grad(), 0, 0);
    ok = ok && same;
    std::printf("worker0: SMART mode: gradient of %s %s local autograd's (sum %.1f)\n", name,
                same ? "equals" : "DIFFERS FROM",
                grads.contains(t) ? grads.at(t).sum().item<double>() : 0.0);
  }
  return ok;
}

}  // namespace

int main() {
  const gw::store::LaunchEnv env = gw::examples::launch_env("dist_autograd_smart");
  try {
    GW_CHECK(env.world_size == 2, gw::InvalidArgumentError,
             "[dist_autograd_smart] runs on 2 workers, got ", env.world_size);
    dist::init_rpc("worker{rank}");
    const bool ok = env.rank == 0 ? run_driver() : true;
    rpc::shutdown();
    std::printf("worker%d: %s\n", env.rank, ok ? "check passed" : "CHECK FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_autograd_smart (worker%d): %s\n", env.rank, e.what());
    return 1;
  }
}
