// The "simple end to end example" of PyTorch's distributed autograd design note
// (pytorch.org/docs/stable/rpc/distributed_autograd.html), in C++:
//
//   build/tools/gwrun/gwrun --nproc-per-node 2 build/examples/dist_autograd_seed
//
// Each worker, inside a distributed autograd context, creates two random tensors on the other
// worker with remote(), adds them locally after to_here(), runs the distributed backward pass
// and steps a DistributedOptimizer (SGD, lr 0.05) over the two remote tensors. It prints the
// gradients the owner accumulated and checks that each tensor moved by exactly -0.05 x its
// gradient; the exit status says whether the check held on this worker.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/ops.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/init_rpc.h"
#include "dist/optim/distributed_optimizer.h"
#include "examples/common/launch.h"
#include "optim/sgd.h"
#include "rpc/rpc.h"

using gw::Tensor;
namespace rpc = gw::rpc;
namespace dist = gw::dist;

// def random_tensor(): return torch.rand((3, 3), requires_grad=True)
Tensor random_tensor() { return gw::rand({3, 3}).requires_grad_(); }
GW_RPC_FUNCTION(random_tensor);

// The gradient that the owner of `value` accumulated for it in context `context_id`.
Tensor gradient_in_context(int64_t context_id, rpc::RRef<Tensor> value) {
  auto grads = dist::autograd::get_gradients(static_cast<uint64_t>(context_id));
  auto it = grads.find(value.local_value());
  GW_CHECK(it != grads.end(), gw::StateError, "[gradient_in_context] context ", context_id,
           " holds no gradient for this RRef's value");
  return it->second;
}
GW_RPC_FUNCTION(gradient_in_context);

namespace {

std::string fmt(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Returns whether both tensors moved by -0.05 x their gradient.
bool run_process(int rank, int dst_rank) {
  const std::string dst_name = "worker" + std::to_string(dst_rank);
  bool ok = true;
  {
    dist::autograd::Context context;  // with dist_autograd.context() as context_id:
    // Forward pass (create references on remote nodes).
    auto rref1 = rpc::remote(dst_name, random_tensor);
    auto rref2 = rpc::remote(dst_name, random_tensor);
    Tensor loss = rref1.to_here() + rref2.to_here();
    // Backward pass (run distributed autograd).
    dist::autograd::backward(context.id(), {loss.sum()});
    // Build DistributedOptimizer.
    gw::dist::DistributedOptimizer dist_optim(gw::optim::SGD::options(0.05), {rref1, rref2});

    const auto id = static_cast<int64_t>(context.id());
    const Tensor before[2] = {rref1.to_here(), rref2.to_here()};
    const Tensor grad[2] = {rpc::rpc_sync(dst_name, gradient_in_context, id, rref1),
                            rpc::rpc_sync(dst_name, gradient_in_context, id, rref2)};
    // Run the distributed optimizer step.
    dist_optim.step(context.id());
    const Tensor after[2] = {rref1.to_here(), rref2.to_here()};
    for (int i = 0; i < 2; ++i) {
      Tensor moved = after[i] - before[i];
      double error = (moved + grad[i] * 0.05).abs().max().item<double>();
      bool good = gw::allclose(moved, grad[i] * -0.05, 1e-6, 1e-7);
      ok = ok && good;
      std::string values;
      for (float g : grad[i].to_vector<float>()) values += (values.empty() ? "" : " ") + fmt(g);
      std::printf("worker%d: rref%d on %s: gradient [%s], moved by -0.05 x gradient: %s "
                  "(max error %.2g)\n",
                  rank, i + 1, dst_name.c_str(), values.c_str(), good ? "yes" : "NO", error);
    }
  }
  return ok;
}

}  // namespace

int main() {
  const gw::store::LaunchEnv env = gw::examples::launch_env("dist_autograd_seed");
  const int rank = env.rank, world_size = env.world_size;
  try {
    dist::init_rpc("worker{rank}");
    const bool ok = run_process(rank, (rank + 1) % world_size);
    rpc::shutdown();
    std::printf("worker%d: %s\n", rank, ok ? "check passed" : "CHECK FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_autograd_seed (worker%d): %s\n", rank, e.what());
    return 1;
  }
}
