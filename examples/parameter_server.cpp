// Parameter-server training on Fashion-MNIST with distributed autograd:
//
//   build/dist/launcher/gwrun --nproc-per-node 3 build/examples/parameter_server [--epochs 2]
//
// Rank 0 is the parameter server "ps": it owns the model (an MLP, 784-256-128-10) and hands
// each trainer an RRef to it. Ranks 1.. are trainers: each wraps that RRef in a RemoteModule,
// runs the forward pass on the server over RPC, computes the loss locally, and in a distributed
// autograd context runs backward (gradients reach the server's parameters) and steps a
// DistributedOptimizer over the server's parameters. Trainers work on disjoint shards of the
// data at once, without waiting for each other (asynchronous SGD). The server then reports
// the test accuracy; the exit status says whether it reached --target (default 0.85).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "autograd/grad_mode.h"
#include "core/ops.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/nn/remote_module.h"
#include "dist/optim/distributed_optimizer.h"
#include "examples/common/fashion_mnist.h"
#include "examples/common/launch.h"
#include "examples/common/models.h"
#include "examples/common/progress.h"
#include "examples/common/server_mlp.h"
#include "nn/functional.h"
#include "optim/sgd.h"
#include "rpc/rpc.h"

using gw::Tensor;
namespace F = gw::nn::functional;
namespace dist = gw::dist;
namespace rpc = gw::rpc;
namespace dist_autograd = gw::dist_autograd;

// Runs on trainer `index` (of `count`): trains the server's model for `epochs` on its shard.
// Returns the mean loss of its last epoch.
double train(dist::ModuleRRef model, int64_t epochs, int64_t batch_size, double lr, int64_t limit,
             int64_t index, int64_t count) {
  auto data = gw::data::load_fashion_mnist(gw::data::Split::Train, limit);
  gw::data::Loader loader(data, {.batch_size = batch_size,
                                 .seed = 0,
                                 .rank = static_cast<int>(index),
                                 .world_size = static_cast<int>(count)});
  dist::RemoteModule net(std::move(model));
  gw::dist::DistributedOptimizer opt(gw::optim::SGDOptions{.lr = lr, .momentum = 0.9},
                                     net.remote_parameters());
  double epoch_loss = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    std::unique_ptr<gw::examples::ProgressBar> bar;
    if (index == 0)  // progress on the first trainer only
      bar = std::make_unique<gw::examples::ProgressBar>(
          "trainer0 epoch " + std::to_string(epoch + 1), loader.num_batches());
    double sum = 0;
    int64_t seen = 0;
    for (int64_t b = 0; b < loader.num_batches(); ++b) {
      auto [x, y] = loader.batch(epoch, b);
      dist_autograd::Context context;
      Tensor loss = F::cross_entropy(net.forward(x), y);
      dist_autograd::backward(context.id(), {loss});
      opt.step(context.id());
      sum += loss.item<double>();
      seen += y.numel();
      if (bar) bar->update(b + 1, sum / static_cast<double>(b + 1), seen * count);
    }
    if (bar) bar->finish();
    epoch_loss = sum / static_cast<double>(loader.num_batches());
  }
  return epoch_loss;
}
GW_RPC_FUNCTION(train);

namespace {

}  // namespace

int main(int argc, char** argv) {
  const auto args = gw::examples::parse_train_args("parameter_server", argc, argv);
  const gw::dist::LaunchEnv env = gw::examples::launch_env("parameter_server");
  const int rank = env.rank, world_size = env.world_size;
  if (world_size < 2) {
    std::fprintf(stderr, "parameter_server needs a server and a trainer (--nproc-per-node 2+)\n");
    return 2;
  }
  try {
    rpc::init_rpc(rank == 0 ? "ps" : "trainer" + std::to_string(rank - 1));
    if (rank != 0) {
      rpc::shutdown();  // serves the server's calls until everyone is done
      return 0;
    }
    gw::Generator gen(0);
    auto model = std::make_shared<gw::examples::ServerMlp>(gen);
    const dist::ModuleRRef model_rref{std::shared_ptr<gw::nn::Module>(model)};
    const int64_t trainers = world_size - 1;
    std::printf("parameter server: %s\n%lld trainers, SGD lr %g momentum 0.9, batch %lld, "
                "%lld epochs\n",
                model->repr().c_str(), static_cast<long long>(trainers), args.lr,
                static_cast<long long>(args.batch_size), static_cast<long long>(args.epochs));
    std::fflush(stdout);  // before the trainers' progress
    std::vector<gw::Future<double>> runs;
    for (int64_t t = 0; t < trainers; ++t)
      runs.push_back(rpc::rpc_async("trainer" + std::to_string(t), train, model_rref,
                                    args.epochs, args.batch_size, args.lr, args.limit, t,
                                    trainers, rpc::timeout(std::chrono::hours(1))));
    std::vector<double> losses = gw::wait_all(runs);
    for (size_t t = 0; t < losses.size(); ++t)
      std::printf("trainer%zu: mean loss of its last epoch %.4f\n", t, losses[t]);
    const double acc = gw::examples::test_accuracy(
        *model, gw::data::load_fashion_mnist(gw::data::Split::Test), "mlp");
    std::printf("test accuracy %.2f%% (target %.0f%%)\n", acc * 100, args.target * 100);
    rpc::shutdown();
    return acc >= args.target ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parameter_server (rank %d): %s\n", rank, e.what());
    return 1;
  }
}
