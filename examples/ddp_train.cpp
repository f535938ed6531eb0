// Data-parallel training of the Fashion-MNIST MLP (or CNN) with DistributedDataParallel:
//
//   build/tools/gwrun/gwrun --nproc-per-node 2 build/examples/ddp_train [--model cnn]
//
// Each rank trains a replica on its shard of every epoch (batch 32 per rank: 64 per step in
// all, as mnist_train's single process), DDP averages the gradients over the Gloo process
// group (or the MPI one: --backend mpi) during backward, and rank 0 shows the progress bar, the
// test accuracy after every epoch and, with --curve PREFIX, the loss curve. At the end every rank
// checks that its parameters are bit-for-bit those of rank 0 and prints the result; the exit status
// says whether they were and whether the test accuracy reached --target (default 0.88).
//
// With --zero, the optimizer's momentum is sharded across the ranks (ZeroRedundancyOptimizer):
// each rank keeps and updates 1/world of it. With --fsdp on, the parameters, gradients and
// momentum are (fully_shard on each layer, then on the model; docs/fsdp.md), and checkpoints
// hold each rank's rows.
//
// With --checkpoint-every N, every rank saves its part of the model, the optimizer's state and
// the position into the distributed checkpoint in --checkpoint-dir (dist/checkpoint) every N
// steps and at each epoch's end, and every rank resumes from it when it is there at start: run
// under gwrun --max-restarts, a job whose rank died goes on from its last checkpoint instead of
// from scratch. The checkpoint loads at any number of ranks (--zero's shards too): a job
// restarted on more or fewer ranks goes on from the same number of samples seen.
//
// With --backend mpi, the gradients travel over MPI (under mpirun or srun --mpi=pmix: shared
// memory between the ranks of a node) instead of Gloo's TCP; nothing else changes:
//
//   mpirun -np 2 build/examples/ddp_train --backend mpi
//
// With --hook, DDP reduces through a communication hook: fp16 or bf16 compression, or PowerSGD
// (--powersgd-rank R, plain averaging for the first --powersgd-start steps); rank 0 then also
// prints how much PowerSGD compressed.
//
// With --device cuda, each rank trains on its GPU (the one its LOCAL_RANK names) and DDP
// averages over NCCL, one process per GPU (--hook fp16|bf16 too; --zero, --fsdp,
// --checkpoint-every and PowerSGD are the CPU's):
//
//   build/tools/gwrun/gwrun --nproc-per-node 2 build/examples/ddp_train --device cuda
//
// With --trace FILE, FILE gets the run's timeline (open it at https://ui.perfetto.dev): each
// rank's forwards, backwards, DDP's buckets and their allreduces on the group's track.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/ops.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/powersgd.h"
#include "dist/checkpoint/dist_checkpoint.h"
#include "dist/optim/zero_redundancy_optimizer.h"
#include "dist/process_group/c10d.h"
#include "dist/process_group/init_process_group.h"
#include "examples/common/fashion_mnist.h"
#include "examples/common/launch.h"
#include "examples/common/models.h"
#include "examples/common/progress.h"
#include "fsdp/fully_shard.h"
#include "nn/functional.h"
#include "optim/sgd.h"

namespace {

namespace dcp = gw::dist::checkpoint;

struct Args : gw::examples::TrainArgs {
  std::string model = "mlp", curve, backend, hook = "none", device = "cpu";  // backend: --device's
  int64_t powersgd_rank = 1, powersgd_start = 10;
  double lr_decay = 0.6;
  bool zero = false;
  bool fsdp = false;  // shard the model (fully_shard) instead of replicating it
  gw::examples::CheckpointArgs checkpoint{"ddp_train"};
  gw::examples::TraceArgs trace;
};

Args parse(int argc, char** argv) {
  Args a;
  auto extra = [&](const std::string& k, const std::string& v) {
    if (k == "--model" && (v == "mlp" || v == "cnn")) a.model = v;
    else if (k == "--curve") a.curve = v;
    else if (k == "--backend" && (v == "gloo" || v == "mpi"))
      a.backend = v;
    else if (k == "--device" && (v == "cpu" || v == "cuda"))
      a.device = v;
    else if (k == "--lr-decay") a.lr_decay = std::atof(v.c_str());
    else if (k == "--hook" && (v == "none" || v == "fp16" || v == "bf16" || v == "powersgd" ||
                               v == "batched-powersgd"))
      a.hook = v;
    else if (k == "--powersgd-rank")
      a.powersgd_rank = std::atoll(v.c_str());
    else if (k == "--powersgd-start")
      a.powersgd_start = std::atoll(v.c_str());
    else if (k == "--zero" && (v == "on" || v == "off"))
      a.zero = v == "on";
    else if (k == "--fsdp" && (v == "on" || v == "off"))
      a.fsdp = v == "on";
    else
      return a.checkpoint.parse(k, v) || a.trace.parse(k, v);
    return true;
  };
  static_cast<gw::examples::TrainArgs&>(a) = gw::examples::parse_train_args(
      "ddp_train", argc, argv, {.epochs = 5, .batch_size = 32, .lr = 0.02, .target = 0.88}, extra,
      (std::string(" [--model mlp|cnn] [--device cpu|cuda (nccl)] [--backend gloo|mpi]"
                   " [--lr-decay X] [--curve PATH]"
                   " [--hook none|fp16|bf16|powersgd|batched-powersgd] [--powersgd-rank R]"
                   " [--powersgd-start ITER] [--zero on|off] [--fsdp on|off]") +
       gw::examples::CheckpointArgs::kUsage + gw::examples::TraceArgs::kUsage)
          .c_str());
  const char* bad =
      a.fsdp && (a.zero || a.hook != "none")
          ? "--fsdp shards the optimizer's state and reduces the gradients itself: drop --zero "
            "and --hook"
      : a.device == "cuda" && !a.backend.empty()
          ? "--device cuda trains over NCCL: drop --backend (gloo and mpi are the CPU's)"
      : a.device == "cuda" && (a.fsdp || a.zero || a.checkpoint.every > 0 ||
                               a.hook.find("powersgd") != std::string::npos)
          ? "--device cuda runs DDP with --hook none|fp16|bf16: --fsdp, --zero, "
            "--checkpoint-every and PowerSGD run on the CPU"
          : nullptr;
  if (bad) {
    std::fprintf(stderr, "ddp_train: %s\n", bad);
    std::exit(2);
  }
  if (a.backend.empty()) a.backend = a.device == "cuda" ? "nccl" : "gloo";
  return a;
}

// --hook: the communication hook DDP reduces the gradients with; PowerSGD's state, for its
// statistics.
std::shared_ptr<gw::ddp::PowerSGDState> register_hook(gw::ddp::DistributedDataParallel& model,
                                                      const Args& args) {
  if (args.hook == "fp16") model.register_comm_hook(gw::ddp::hooks::fp16_compress());
  if (args.hook == "bf16") model.register_comm_hook(gw::ddp::hooks::bf16_compress());
  if (args.hook.find("powersgd") == std::string::npos) return nullptr;
  auto state = std::make_shared<gw::ddp::PowerSGDState>(gw::ddp::PowerSGDOptions{
      .matrix_approximation_rank = args.powersgd_rank, .start_powerSGD_iter = args.powersgd_start});
  model.register_comm_hook(args.hook == "powersgd" ? gw::ddp::hooks::powersgd(state)
                                                   : gw::ddp::hooks::batched_powersgd(state));
  return state;
}

// SGD with momentum 0.9: on every rank whole, or with --zero sharded across the ranks, or with
// --fsdp on the model's shards (`sharded`: the root unit).
class Optimizer {
 public:
  Optimizer(const Args& args, gw::nn::Module& model, std::shared_ptr<gw::dist::ProcessGroup> pg,
            gw::fsdp::FSDPModule* sharded)
      : group_(pg), sharded_(sharded) {
    const gw::optim::SGDOptions options{.lr = args.lr, .momentum = 0.9};
    if (args.zero)
      zero_ = std::make_unique<gw::dist::ZeroRedundancyOptimizer>(model.parameters(), options,
                                                                  std::move(pg));
    else
      plain_ = std::make_unique<gw::optim::SGD>(model.parameters(), options);
  }
  void zero_grad() { zero_ ? zero_->zero_grad() : plain_->zero_grad(); }
  void step() { zero_ ? zero_->step() : plain_->step(); }
  double lr() const { return zero_ ? zero_->lr() : plain_->lr(); }
  void set_lr(double lr) { zero_ ? zero_->set_lr(lr) : plain_->set_lr(lr); }
  // What a checkpoint holds of it: the plain optimizer's state, which every rank holds (and one
  // writes), or each rank's ranges of it.
  dcp::ShardedState state() const {
    if (sharded_) return sharded_->sharded_optimizer_state(*plain_, "optim.");
    return zero_ ? zero_->sharded_state_dict("optim.") : dcp::whole(plain_->state_dict(), "optim.");
  }
  // A collective: a rank that cannot load makes every rank raise.
  void load(const dcp::Reader& ckpt) {
    if (sharded_)
      sharded_->load_optimizer_state(*plain_, ckpt, "optim.");
    else if (zero_)
      zero_->load_state_dict(ckpt, "optim.");
    else
      dcp::on_every_rank(*group_, [&] { plain_->load_state_dict(ckpt.read_all("optim.")); });
  }

 private:
  std::shared_ptr<gw::dist::ProcessGroup> group_;
  gw::fsdp::FSDPModule* sharded_;
  std::unique_ptr<gw::optim::SGD> plain_;
  std::unique_ptr<gw::dist::ZeroRedundancyOptimizer> zero_;
};

// Whether every rank's parameters equal rank 0's, bit for bit: rank 0's are broadcast and
// compared on each rank, and the verdicts are combined with a MIN allreduce.
bool identical_on_all_ranks(gw::nn::Module& model, gw::dist::ProcessGroup& pg) {
  int64_t same = 1;
  for (const gw::Tensor& p : model.parameters()) {
    gw::Tensor theirs = p.detach().clone();
    pg.broadcast(theirs, {.root = 0})->wait();
    same = same && gw::equal(theirs, p.detach());
  }
  gw::Tensor verdict = gw::full({1}, static_cast<double>(same), gw::kInt64).to(pg.device());
  pg.allreduce(verdict, {.op = gw::dist::ReduceOp::MIN})->wait();
  return verdict.item<int64_t>() == 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  // Under MPI the group knows the ranks; otherwise the launcher's variables say (and a bad set
  // of them ends the program with one line).
  int rank = 0, world = 1;
  if (args.backend != "mpi") rank = gw::examples::launch_env("ddp_train").rank;  // for errors
  try {
    args.trace.start();
    auto pg = gw::dist::init_process_group(args.backend);  // ranks, master: from the launcher
    rank = pg->rank();
    world = pg->size();
    const gw::Device device = pg->device();  // NCCL's: the rank's GPU
    auto train = gw::data::load_fashion_mnist(gw::data::Split::Train, args.limit);
    auto test = gw::data::load_fashion_mnist(gw::data::Split::Test);
    // DDP starts every replica from rank 0's; fully_shard keeps each rank's rows of its own copy,
    // so every rank draws the same.
    gw::Generator gen(static_cast<uint64_t>(args.fsdp ? 0 : rank));
    std::shared_ptr<gw::nn::Module> module = gw::examples::fashion_model(args.model, gen);
    module->to(device);
    std::unique_ptr<gw::ddp::DistributedDataParallel> ddp;
    std::shared_ptr<gw::fsdp::FSDPModule> sharded;
    std::shared_ptr<gw::ddp::PowerSGDState> powersgd;
    if (args.fsdp) {
      for (const auto& layer : module->children())  // a unit per layer with parameters
        if (!layer->parameters().empty()) gw::fsdp::fully_shard(layer, pg);
      sharded = gw::fsdp::fully_shard(module, pg);
    } else {
      ddp = std::make_unique<gw::ddp::DistributedDataParallel>(module, pg);
      powersgd = register_hook(*ddp, args);
    }
    auto model_state = [&] {  // this rank's, for the distributed checkpoint
      return sharded ? sharded->sharded_state_dict("model.")
                     : dcp::whole(module->state_dict(), "model.");
    };
    Optimizer opt(args, *module, pg, sharded.get());
    constexpr uint64_t kDataSeed = 0;
    gw::data::Loader loader(
        train,
        {.batch_size = args.batch_size, .seed = kDataSeed, .rank = rank, .world_size = world});
    // Resuming: every rank reads its part of the checkpoint, whatever the number of ranks that
    // saved it (rank 0 decides whether there is one, so that all agree). The position is the
    // samples seen in the epoch: every epoch's order is the same at any world size, and a step
    // takes the next batch_size * world samples of it.
    int64_t first_epoch = 0, first_step = 0;
    const bool resume =
        args.checkpoint.every > 0 &&
        gw::dist::broadcast_bytes(
            *pg,
            {static_cast<uint8_t>(std::filesystem::exists(args.checkpoint.dir + "/index.json"))},
            0)[0] != 0;
    if (resume) {
      std::optional<dcp::Reader> ckpt;
      dcp::on_every_rank(*pg, [&] { ckpt.emplace(args.checkpoint.dir); });
      dcp::load(*ckpt, model_state(), *pg);
      opt.load(*ckpt);
      const auto& meta = ckpt->metadata();
      first_epoch = std::stoll(meta.at("epoch"));
      first_step = std::stoll(meta.at("samples")) / (args.batch_size * world);
      if (rank == 0)
        std::printf("resuming from %s at epoch %lld, step %lld (saved by %d ranks)\n",
                    args.checkpoint.dir.c_str(), static_cast<long long>(first_epoch + 1),
                    static_cast<long long>(first_step), ckpt->world_size());
    }
    auto checkpoint = [&](int64_t epoch, int64_t step) {  // every rank writes its part
      if (args.checkpoint.every == 0) return;
      dcp::ShardedState state = model_state();
      state.merge(opt.state());
      dcp::save(args.checkpoint.dir, state, *pg,
                {{"epoch", std::to_string(epoch)},
                 {"samples", std::to_string(step * args.batch_size * world)}});  // in the epoch
      if (rank == 0)
        std::printf("checkpoint saved: epoch %lld, step %lld\n", static_cast<long long>(epoch + 1),
                    static_cast<long long>(step));
      std::fflush(stdout);
    };
    if (rank == 0) {
      std::printf(
          "%s\n%s on %d ranks (%s%s), SGD lr %g momentum 0.9%s, batch %lld per rank, "
          "%lld epochs\n",
          module->repr().c_str(), args.fsdp ? "FSDP" : "DDP", world, args.backend.c_str(),
          device.is_cpu() ? "" : (", " + device.str()).c_str(), args.lr,
          args.zero ? " sharded across the ranks (ZeRO)" : "",
          static_cast<long long>(args.batch_size), static_cast<long long>(args.epochs));
      std::fflush(stdout);
    }
    std::vector<double> losses;
    double acc = 0;
    for (int64_t epoch = first_epoch; epoch < args.epochs; ++epoch) {
      opt.set_lr(args.lr * std::pow(args.lr_decay, static_cast<double>(epoch)));  // StepLR's
      std::unique_ptr<gw::examples::ProgressBar> bar;
      if (rank == 0)
        bar = std::make_unique<gw::examples::ProgressBar>("epoch " + std::to_string(epoch + 1),
                                                          loader.num_batches());
      int64_t seen = 0;
      for (int64_t b = epoch == first_epoch ? first_step : 0; b < loader.num_batches(); ++b) {
        auto [images, labels] = loader.batch(epoch, b);
        const gw::Tensor x = images.to(device), y = labels.to(device);
        opt.zero_grad();
        gw::Tensor loss = gw::nn::functional::cross_entropy(
            ddp ? ddp->forward(gw::examples::shape_input(x, args.model))
                : (*module)(gw::examples::shape_input(x, args.model)),
            y);
        loss.backward();  // the gradients are averaged across ranks here
        opt.step();
        losses.push_back(loss.item<double>());
        seen += y.numel() * world;
        if (bar) bar->update(b + 1, losses.back(), seen);
        if (args.checkpoint.every > 0 && (b + 1) % args.checkpoint.every == 0 &&
            b + 1 < loader.num_batches())
          checkpoint(epoch, b + 1);
      }
      if (bar) bar->finish();
      acc = gw::examples::test_accuracy(*module, test, args.model, device);
      if (rank == 0)
        std::printf("epoch %lld: test accuracy %.2f%% (lr %g)\n", static_cast<long long>(epoch + 1),
                    acc * 100, opt.lr());
      checkpoint(epoch + 1, 0);
    }
    if (first_epoch >= args.epochs)  // resumed after the last epoch's checkpoint
      acc = gw::examples::test_accuracy(*module, test, args.model, device);
    if (powersgd && rank == 0)
      std::printf("PowerSGD rank %lld: %.1fx fewer numbers on the wire than the gradients\n",
                  static_cast<long long>(args.powersgd_rank), powersgd->compression_stats().rate());
    // Sharded, each rank holds other rows: nothing to compare.
    const bool identical = sharded || identical_on_all_ranks(*module, *pg);
    if (sharded)
      std::printf("rank %d: holds 1/%d of the parameters\n", rank, world);
    else
      std::printf("rank %d: parameters identical to rank 0's: %s\n", rank,
                  identical ? "yes" : "NO");
    if (rank == 0) {
      std::printf("test accuracy %.2f%% (target %.0f%%)\n", acc * 100, args.target * 100);
      if (!args.curve.empty()) {
        gw::examples::write_loss_curve(args.curve, losses, "Fashion-MNIST DDP " + args.model);
        std::printf("wrote %s.csv and %s.svg\n", args.curve.c_str(), args.curve.c_str());
      }
    }
    gw::dist::destroy_process_group();
    args.trace.finish(rank, world);
    return identical && acc >= args.target ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_train (rank %d): %s\n", rank, e.what());
    return 1;
  }
}
