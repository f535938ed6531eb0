// Model-parallel training on Fashion-MNIST: one MLP split across two workers, driven by a third.
//
//   build/tools/gwrun/gwrun --nproc-per-node 3 build/examples/model_parallel [--epochs 2]
//
// worker1 holds the first half of the model (784-256-128 with ReLUs), worker2 the second half
// (128-10), each as a RemoteModule; worker0 holds the data. Each step sends a batch through
// worker1 and the activations through worker2, computes the loss on worker0, runs the
// distributed backward pass through both workers and steps a DistributedOptimizer over both
// halves' parameters. The exit status says whether the test accuracy reached --target
// (default 0.85).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/ops.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/init_rpc.h"
#include "dist/nn/remote_module.h"
#include "dist/optim/distributed_optimizer.h"
#include "examples/common/fashion_mnist.h"
#include "examples/common/launch.h"
#include "examples/common/progress.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/functional.h"
#include "nn/linear.h"
#include "optim/sgd.h"
#include "rpc/rpc.h"

using gw::Tensor;
namespace F = gw::nn::functional;
namespace nn = gw::nn;
namespace dist = gw::dist;
namespace rpc = gw::rpc;
namespace dist_autograd = gw::dist::autograd;

namespace {

// The two halves, each seeded so that a run is reproducible.
struct FirstHalf : nn::Sequential {
  explicit FirstHalf(int64_t seed) : FirstHalf(gw::Generator(static_cast<uint64_t>(seed))) {}
  explicit FirstHalf(gw::Generator gen)
      : nn::Sequential(std::make_shared<nn::Linear>(784, 256, true, gen),
                       std::make_shared<nn::ReLU>(),
                       std::make_shared<nn::Linear>(256, 128, true, gen),
                       std::make_shared<nn::ReLU>()) {}
};
struct SecondHalf : nn::Sequential {
  explicit SecondHalf(int64_t seed) : SecondHalf(gw::Generator(static_cast<uint64_t>(seed))) {}
  explicit SecondHalf(gw::Generator gen)
      : nn::Sequential(std::make_shared<nn::Linear>(128, 10, true, gen)) {}
};
const bool kRegistered = [] {
  dist::add_module_constructor<FirstHalf, int64_t>("FirstHalf");
  dist::add_module_constructor<SecondHalf, int64_t>("SecondHalf");
  return true;
}();

// The model as worker0 sees it: two remote halves.
struct SplitModel {
  dist::RemoteModule first{"worker1/cpu", "FirstHalf", int64_t{1}};
  dist::RemoteModule second{"worker2/cpu", "SecondHalf", int64_t{2}};
  Tensor forward(const Tensor& x) const { return second.forward(first.forward(x)); }
  std::vector<rpc::RRef<Tensor>> parameters() const {
    auto params = first.remote_parameters();
    for (auto& p : second.remote_parameters()) params.push_back(p);
    return params;
  }
};

double accuracy(const SplitModel& model, const gw::data::Dataset& test) {
  Tensor logits = model.forward(test.images);  // outside a context: nothing is recorded
  return gw::eq(gw::argmax(logits, 1), test.labels).to(gw::DType::Float64).mean().item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  (void)kRegistered;
  const auto args = gw::examples::parse_train_args("model_parallel", argc, argv);
  const gw::store::LaunchEnv env = gw::examples::launch_env("model_parallel");
  const int rank = env.rank, world_size = env.world_size;
  if (world_size != 3) {
    std::fprintf(stderr, "model_parallel runs on 3 workers (--nproc-per-node 3)\n");
    return 2;
  }
  try {
    dist::init_rpc("worker{rank}");
    if (rank != 0) {
      rpc::shutdown();  // serve the halves until worker0 is done
      return 0;
    }
    auto train = gw::data::load_fashion_mnist(gw::data::Split::Train, args.limit);
    auto test = gw::data::load_fashion_mnist(gw::data::Split::Test);
    SplitModel model;
    gw::dist::DistributedOptimizer opt(gw::optim::SGDOptions{.lr = args.lr, .momentum = 0.9},
                                       model.parameters());
    gw::data::Loader loader(train, {.batch_size = args.batch_size, .seed = 0});
    std::printf("worker1: Linear(784, 256), ReLU, Linear(256, 128), ReLU; worker2: Linear(128, "
                "10)\nSGD lr %g momentum 0.9, batch %lld, %lld epochs\n",
                args.lr, static_cast<long long>(args.batch_size),
                static_cast<long long>(args.epochs));
    double acc = 0;
    for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
      gw::examples::ProgressBar bar("epoch " + std::to_string(epoch + 1), loader.num_batches());
      double sum = 0;
      int64_t seen = 0;
      for (int64_t b = 0; b < loader.num_batches(); ++b) {
        auto [x, y] = loader.batch(epoch, b);
        dist::autograd::Context context;
        Tensor loss = F::cross_entropy(model.forward(x), y);
        dist::autograd::backward(context.id(), {loss});
        opt.step(context.id());
        sum += loss.item<double>();
        seen += y.numel();
        bar.update(b + 1, sum / static_cast<double>(b + 1), seen);
      }
      bar.finish();
      acc = accuracy(model, test);
      std::printf("epoch %lld: test accuracy %.2f%%\n", static_cast<long long>(epoch + 1),
                  acc * 100);
    }
    std::printf("test accuracy %.2f%% (target %.0f%%)\n", acc * 100, args.target * 100);
    rpc::shutdown();
    return acc >= args.target ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_parallel (rank %d): %s\n", rank, e.what());
    return 1;
  }
}
