// Parameter-server training on Fashion-MNIST with distributed autograd:
//
//   build/tools/gwrun/gwrun --nproc-per-node 3 build/examples/parameter_server [--epochs 2]
//
// Rank 0 is the parameter server "ps": it owns the model (an MLP, 784-256-128-10) and creates,
// over RPC, a Trainer on each other rank (rpc::remote), handing it an RRef to the model. A
// Trainer wraps that RRef in a RemoteModule, runs the forward pass on the server over RPC,
// computes the loss locally, and in a distributed autograd context runs backward (gradients
// reach the server's parameters) and steps a DistributedOptimizer over the server's parameters.
// Trainers work on disjoint shards of the data at once, without waiting for each other
// (asynchronous SGD). The server then reports the test accuracy; the exit status says whether
// it reached --target (default 0.85).
//
// With --checkpoint-every N the server runs the trainers N steps at a time and, while they
// wait, saves the model, every trainer's optimizer state and the position (gw::save_checkpoint)
// into --checkpoint-dir; started again (gwrun --max-restarts after a rank died), it resumes
// from there.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/ops.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/init_rpc.h"
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
namespace dist_autograd = gw::dist::autograd;

namespace {

constexpr uint64_t kDataSeed = 0;

// Trainer `index` of `count`, living on its rank; the server drives it over an RRef.
class Trainer {
 public:
  Trainer(dist::ModuleRRef model, int64_t batch_size, double lr, int64_t limit, int64_t index,
          int64_t count)
      : index_(index),
        count_(count),
        loader_(gw::data::load_fashion_mnist(gw::data::Split::Train, limit),
                {.batch_size = batch_size,
                 .seed = kDataSeed,
                 .rank = static_cast<int>(index),
                 .world_size = static_cast<int>(count)}),
        net_(std::move(model)),
        opt_(gw::optim::SGDOptions{.lr = lr, .momentum = 0.9}, net_.remote_parameters()) {}

  int64_t num_batches() const { return loader_.num_batches(); }

  // Trains on batches [first, last) of `epoch` (clamped to this shard). Returns the mean loss
  // of the epoch's steps run so far by this process.
  double train(int64_t epoch, int64_t first, int64_t last) {
    last = std::min(last, loader_.num_batches());
    if (first == 0 || epoch != epoch_) {  // a new epoch, or the first steps after a resume
      epoch_ = epoch, loss_sum_ = 0, steps_ = 0, seen_ = 0;
      if (index_ == 0)  // progress on the first trainer only
        bar_ = std::make_unique<gw::examples::ProgressBar>(
            "trainer0 epoch " + std::to_string(epoch + 1), loader_.num_batches());
    }
    for (int64_t b = first; b < last; ++b) {
      auto [x, y] = loader_.batch(epoch, b);
      dist::autograd::Context context;
      Tensor loss = F::cross_entropy(net_.forward(x), y);
      dist::autograd::backward(context.id(), {loss});
      opt_.step(context.id());
      loss_sum_ += loss.item<double>();
      ++steps_;
      seen_ += y.numel() * count_;
      if (bar_) bar_->update(b + 1, loss_sum_ / static_cast<double>(steps_), seen_);
    }
    if (bar_ && last == loader_.num_batches()) {
      bar_->finish();
      bar_.reset();
    }
    return steps_ > 0 ? loss_sum_ / static_cast<double>(steps_) : 0;
  }

  gw::NamedTensors optimizer_state() const { return opt_.state_dict(); }
  void load_optimizer_state(gw::NamedTensors state) { opt_.load_state_dict(state); }

 private:
  int64_t index_, count_;
  gw::data::Loader loader_;
  dist::RemoteModule net_;
  dist::DistributedOptimizer opt_;
  int64_t epoch_ = -1, steps_ = 0, seen_ = 0;
  double loss_sum_ = 0;
  std::unique_ptr<gw::examples::ProgressBar> bar_;
};

const bool kTrainerRegistered = [] {
  rpc::functions()
      .add_class<Trainer>("Trainer")
      .add_constructor<Trainer, dist::ModuleRRef, int64_t, double, int64_t, int64_t, int64_t>(
          "Trainer.new")
      .add_method("num_batches", &Trainer::num_batches)
      .add_method("train", &Trainer::train)
      .add_method("optimizer_state", &Trainer::optimizer_state)
      .add_method("load_optimizer_state", &Trainer::load_optimizer_state);
  return true;
}();

using TrainerRRef = rpc::RRef<std::shared_ptr<Trainer>>;

// Runs `method` on every trainer at once; returns the answers in trainer order.
template <typename M, typename... A>
auto on_all(const std::vector<TrainerRRef>& trainers, M method, const A&... args) {
  const auto kRoundTimeout = rpc::timeout(std::chrono::hours(1));  // a round may be an epoch
  std::vector<decltype(trainers.front().rpc_async(method, args..., kRoundTimeout))> calls;
  for (const auto& t : trainers) calls.push_back(t.rpc_async(method, args..., kRoundTimeout));
  return gw::wait_all(calls);
}

// The optimizer part of a checkpoint: trainer t's state under "trainer<t>/".
gw::NamedTensors trainers_state(const std::vector<TrainerRRef>& trainers) {
  gw::NamedTensors out;
  const auto states = on_all(trainers, &Trainer::optimizer_state);
  for (size_t t = 0; t < states.size(); ++t)
    for (const auto& [key, value] : states[t])
      out.emplace("trainer" + std::to_string(t) + "/" + key, value);
  return out;
}

void load_trainers_state(const std::vector<TrainerRRef>& trainers, const gw::NamedTensors& all) {
  for (size_t t = 0; t < trainers.size(); ++t) {
    const std::string prefix = "trainer" + std::to_string(t) + "/";
    gw::NamedTensors mine;
    for (const auto& [key, value] : all)
      if (key.starts_with(prefix)) mine.emplace(key.substr(prefix.size()), value);
    trainers[t].rpc_sync(&Trainer::load_optimizer_state, mine);
  }
}

int serve(const gw::examples::TrainArgs& args, const gw::examples::CheckpointArgs& checkpoints,
          int64_t trainer_count) {
  gw::Generator gen(0);
  auto model = std::make_shared<gw::examples::ServerMlp>(gen);
  const dist::ModuleRRef model_rref{std::shared_ptr<gw::nn::Module>(model)};
  std::printf(
      "parameter server: %s\n%lld trainers, SGD lr %g momentum 0.9, batch %lld, "
      "%lld epochs\n",
      model->repr().c_str(), static_cast<long long>(trainer_count), args.lr,
      static_cast<long long>(args.batch_size), static_cast<long long>(args.epochs));
  std::fflush(stdout);  // before the trainers' progress
  std::vector<TrainerRRef> trainers;
  for (int64_t t = 0; t < trainer_count; ++t)
    trainers.push_back(rpc::remote<std::shared_ptr<Trainer>>(
        "trainer" + std::to_string(t), "Trainer.new", model_rref, args.batch_size, args.lr,
        args.limit, t, trainer_count));
  const auto batches = on_all(trainers, &Trainer::num_batches);
  const int64_t steps = *std::max_element(batches.begin(), batches.end());

  int64_t first_epoch = 0, first_step = 0;
  if (auto c = checkpoints.load(true)) {
    model->load_state_dict(c->model);
    load_trainers_state(trainers, c->optimizer);
    first_epoch = c->epoch, first_step = c->step;
  }
  // Without checkpoints, one call per epoch; with them, rounds of that many steps, the
  // trainers idle (the model still) while the server saves.
  const int64_t round = checkpoints.every > 0 ? checkpoints.every : steps;
  std::vector<double> losses;  // of the last round, if one ran
  for (int64_t epoch = first_epoch; epoch < args.epochs; ++epoch) {
    for (int64_t b = epoch == first_epoch ? first_step : 0; b < steps; b += round) {
      const int64_t end = std::min(b + round, steps);
      losses = on_all(trainers, &Trainer::train, epoch, b, end);
      if (checkpoints.every == 0) continue;
      const bool epoch_done = end == steps;
      checkpoints.save({.model = model->state_dict(),
                        .optimizer = trainers_state(trainers),
                        .epoch = epoch_done ? epoch + 1 : epoch,
                        .step = epoch_done ? 0 : end,
                        .seed = kDataSeed,
                        .extra = {}});
    }
  }
  for (size_t t = 0; t < losses.size(); ++t)
    std::printf("trainer%zu: mean loss of its last epoch %.4f\n", t, losses[t]);
  const double acc = gw::examples::test_accuracy(
      *model, gw::data::load_fashion_mnist(gw::data::Split::Test), "mlp");
  std::printf("test accuracy %.2f%% (target %.0f%%)\n", acc * 100, args.target * 100);
  return acc >= args.target ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  gw::examples::CheckpointArgs checkpoints("parameter_server");
  gw::examples::TraceArgs trace;
  const auto args = gw::examples::parse_train_args(
      "parameter_server", argc, argv, {},
      [&](const std::string& k, const std::string& v) {
        return checkpoints.parse(k, v) || trace.parse(k, v);
      },
      (std::string(gw::examples::CheckpointArgs::kUsage) + gw::examples::TraceArgs::kUsage)
          .c_str());
  const gw::store::LaunchEnv env = gw::examples::launch_env("parameter_server");
  const int rank = env.rank, world_size = env.world_size;
  if (world_size < 2) {
    std::fprintf(stderr, "parameter_server needs a server and a trainer (--nproc-per-node 2+)\n");
    return 2;
  }
  try {
    trace.start();
    dist::init_rpc(rank == 0 ? "ps" : "trainer" + std::to_string(rank - 1));
    const int status = rank == 0 ? serve(args, checkpoints, world_size - 1) : 0;
    rpc::shutdown();  // a trainer serves the server's calls until everyone is done
    trace.finish(rank, world_size);
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parameter_server (rank %d): %s\n", rank, e.what());
    return 1;
  }
}
