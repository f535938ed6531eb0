// A character-level GPT trained on the King James Bible (Debian's bible-kjv), as nanoGPT trains
// its Shakespeare model:
//
//   build/examples/gpt_train [--steps 2000] [--width 128] [--context 128] ...
//   build/tools/gwrun/gwrun --nproc-per-node 2 build/examples/gpt_train --ddp gloo
//   mpirun -np 2 build/examples/gpt_train --ddp mpi
//
// The model is gw::nn::GPT (4 blocks of 4 heads, width 128, context 128, its head tied to the
// token embedding: 0.8M parameters); AdamW with weight decay on the matrices only, a linear
// warm-up and a cosine decay of the learning rate, gradients clipped to norm 1. Every step takes
// --batch-size windows of the training split per rank, drawn by a DistributedSampler (with --ddp
// each rank takes its own share of the same shuffled order, and DDP averages the gradients);
// rank 0 shows a progress bar (loss, tokens/s over all ranks), the validation loss every
// --eval-every steps (over --eval-batches fixed batches of the validation split, shared among
// the ranks), and at the end a passage the model writes (--sample characters).
//
// With --checkpoint-every N, rank 0 saves the model, the optimizer and the step every N steps
// and at the end (one safetensors file, written aside and renamed into place), and a run that
// finds a checkpoint in --checkpoint-dir goes on from it, with the same data order and learning
// rate as if it had not stopped, also on another number of ranks with the same global batch
// (--batch-size x ranks). A checkpoint of another run (its width, layers, steps, ...) or a
// corrupt one is refused with the reason before anything is loaded. Every rank reads the
// checkpoint: across hosts, --checkpoint-dir must be on a shared file system.
//
// --device cuda trains on the GPU; --curve PREFIX writes the training and validation loss as
// PREFIX.csv and PREFIX.svg; --trace FILE writes a timeline; --target LOSS makes the exit status
// say whether the final validation loss reached it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/checkpoint.h"
#include "core/cuda/device.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "ddp/distributed_data_parallel.h"
#include "dist/checkpoint/dist_checkpoint.h"
#include "dist/data/distributed_sampler.h"
#include "dist/process_group/c10d.h"
#include "dist/process_group/init_process_group.h"
#include "examples/common/char_corpus.h"
#include "examples/common/launch.h"
#include "examples/common/progress.h"
#include "nn/functional.h"
#include "nn/transformer.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"

namespace {

struct Args {
  gw::nn::GPTOptions model{.context = 128, .layers = 4, .heads = 4, .width = 128};
  int64_t steps = 2000, batch_size = 32, warmup = -1 /* min(100, steps / 10) */, eval_every = 250,
          eval_batches = 20;
  int64_t sample = 500, top_k = 0, threads = 1;
  double lr = 1e-3, min_lr_factor = 0.1, weight_decay = 0.1, clip = 1.0, temperature = 0.8;
  double target = 0;  // > 0: the final validation loss must be at most this
  uint64_t seed = 0;
  std::string ddp, device = "cpu", curve, prompt = "And ";
  gw::examples::CheckpointArgs checkpoint{"gpt_train"};
  gw::examples::TraceArgs trace;
};

constexpr const char* kUsage =
    "usage: gpt_train [--steps N] [--batch-size N (per rank)] [--context N] [--layers N] "
    "[--heads N] [--width N] [--dropout P] [--lr X] [--warmup N] [--min-lr-factor X] "
    "[--weight-decay X] [--clip X] [--eval-every N] [--eval-batches N] [--sample N] "
    "[--prompt TEXT] [--temperature X] [--top-k N] [--seed N] [--threads N] [--ddp gloo|mpi] "
    "[--device cpu|cuda] [--curve PREFIX] [--target LOSS] [--checkpoint-every N] "
    "[--checkpoint-dir DIR] [--trace FILE]\n";

Args parse(int argc, char** argv) {
  Args a;
  bool ok = (argc - 1) % 2 == 0;  // every flag takes a value
  for (int i = 1; ok && i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    const int64_t n = std::atoll(v.c_str());
    const double x = std::atof(v.c_str());
    if (k == "--steps")
      a.steps = n;
    else if (k == "--batch-size")
      a.batch_size = n;
    else if (k == "--context")
      a.model.context = n;
    else if (k == "--layers")
      a.model.layers = n;
    else if (k == "--heads")
      a.model.heads = n;
    else if (k == "--width")
      a.model.width = n;
    else if (k == "--dropout")
      a.model.dropout = x;
    else if (k == "--lr")
      a.lr = x;
    else if (k == "--warmup")
      a.warmup = n;
    else if (k == "--min-lr-factor")
      a.min_lr_factor = x;
    else if (k == "--weight-decay")
      a.weight_decay = x;
    else if (k == "--clip")
      a.clip = x;
    else if (k == "--eval-every")
      a.eval_every = n;
    else if (k == "--eval-batches")
      a.eval_batches = n;
    else if (k == "--sample")
      a.sample = n;
    else if (k == "--prompt" && !v.empty())
      a.prompt = v;
    else if (k == "--temperature")
      a.temperature = x;
    else if (k == "--top-k")
      a.top_k = n;
    else if (k == "--seed")
      a.seed = static_cast<uint64_t>(n);
    else if (k == "--threads")
      a.threads = n;
    else if (k == "--ddp" && (v == "gloo" || v == "mpi"))
      a.ddp = v;
    else if (k == "--device" && (v == "cpu" || v == "cuda"))
      a.device = v;
    else if (k == "--curve")
      a.curve = v;
    else if (k == "--target")
      a.target = x;
    else
      ok = a.checkpoint.parse(k, v) || a.trace.parse(k, v);
  }
  if (!ok) {
    std::fputs(kUsage, stderr);
    std::exit(2);
  }
  if (a.warmup == -1) a.warmup = std::min<int64_t>(100, a.steps / 10);
  // Values the flags parsed to that cannot run, named.
  const char* bad = a.steps < 1                           ? "--steps must be at least 1"
                    : a.batch_size < 1                    ? "--batch-size must be at least 1"
                    : a.warmup < 0 || a.warmup >= a.steps ? "--warmup must be in [0, --steps)"
                    : a.eval_every < 1 || a.eval_batches < 1
                        ? "--eval-every and --eval-batches must be at least 1"
                    : a.sample < 0  ? "--sample must not be negative"
                    : a.threads < 1 ? "--threads must be at least 1"
                    : !(a.lr > 0)   ? "--lr must be positive"
                                    : nullptr;
  if (bad) {
    std::fprintf(stderr, "gpt_train: %s (steps %lld, batch size %lld, warmup %lld, lr %g)\n", bad,
                 static_cast<long long>(a.steps), static_cast<long long>(a.batch_size),
                 static_cast<long long>(a.warmup), a.lr);
    std::exit(2);
  }
  return a;
}

// What a checkpoint must agree with to be resumed: the model's shape, and the steps and their
// global batch (each step's windows are the same at any number of ranks with the same global
// batch, so a run may resume on more or fewer ranks).
std::map<std::string, std::string> run_identity(const Args& a, int64_t vocab, int world) {
  const auto& m = a.model;
  return {
      {"vocab_size", std::to_string(vocab)}, {"context", std::to_string(m.context)},
      {"layers", std::to_string(m.layers)},  {"heads", std::to_string(m.heads)},
      {"width", std::to_string(m.width)},    {"global_batch", std::to_string(a.batch_size * world)},
      {"steps", std::to_string(a.steps)}};
}

// The model, its optimizer and schedule, and the data-parallel wrapper when there is a group.
class Trainer {
 public:
  Trainer(const Args& args, const gw::data::CharCorpus& corpus, gw::Device device,
          std::shared_ptr<gw::dist::ProcessGroup> group)
      : args_(args), device_(device), group_(std::move(group)) {
    gw::nn::GPTOptions options = args.model;
    options.vocab_size = corpus.vocab_size();
    gw::Generator gen(args.seed);  // the same on every rank (and DDP broadcasts rank 0's anyway)
    model_ = std::make_shared<gw::nn::GPT>(options, gen);
    model_->to(device);
    if (group_) ddp_ = std::make_unique<gw::ddp::DistributedDataParallel>(model_, group_);
    opt_ = std::make_unique<gw::optim::AdamW>(
        gw::optim::weight_decay_groups(model_->parameters(), args.weight_decay),
        gw::optim::AdamWOptions{.lr = args.lr, .betas = {0.9, 0.99}});
  }

  gw::nn::GPT& model() { return *model_; }

  // Puts the learning rate where step `step` has it (after resuming, the step reached).
  void schedule_from(int64_t step) {
    schedule_ = std::make_unique<gw::optim::LambdaLR>(
        *opt_, gw::optim::warmup_cosine(args_.warmup, args_.steps, args_.min_lr_factor), step,
        args_.lr);
  }

  // One step on a batch; returns its loss (this rank's; the ranks' gradients are averaged).
  double step(const gw::Tensor& x, const gw::Tensor& y) {
    opt_->zero_grad();
    const gw::Tensor logits = ddp_ ? ddp_->forward(x.to(device_)) : model_->forward(x.to(device_));
    gw::Tensor loss = gw::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                        y.to(device_).reshape({-1}));
    loss.backward();
    gw::optim::clip_grad_norm_(model_->parameters(), args_.clip);
    opt_->step();
    schedule_->step();
    return loss.item<double>();
  }

  double lr() const { return opt_->lr(); }

  gw::Checkpoint checkpoint(int64_t step, std::map<std::string, std::string> identity) const {
    return {.model = model_->state_dict(),
            .optimizer = opt_->state_dict(),
            .epoch = 0,
            .step = step,
            .seed = args_.seed,
            .extra = std::move(identity)};
  }

  // Loads `c` after checking that it is this run's; throws naming what differs, before
  // anything is loaded. (load_state_dict checks every tensor before it copies one.)
  void restore(const gw::Checkpoint& c, const std::map<std::string, std::string>& identity) {
    for (const auto& [key, want] : identity) {
      auto it = c.extra.find(key);
      GW_CHECK(it != c.extra.end() && it->second == want, gw::InvalidArgumentError,
               "[gpt_train] the checkpoint in ", args_.checkpoint.dir, " is of another run: its ",
               key, " is ", it == c.extra.end() ? std::string("missing") : it->second,
               ", this run's ", want);
    }
    GW_CHECK(c.step >= 0 && c.step <= args_.steps && c.seed == args_.seed, gw::InvalidArgumentError,
             "[gpt_train] the checkpoint in ", args_.checkpoint.dir, " is at step ", c.step,
             " of seed ", c.seed, "; this run has ", args_.steps, " steps of seed ", args_.seed);
    model_->load_state_dict(c.model);
    opt_->load_state_dict(c.optimizer);
  }

 private:
  const Args& args_;
  gw::Device device_;
  std::shared_ptr<gw::dist::ProcessGroup> group_;
  std::shared_ptr<gw::nn::GPT> model_;
  std::unique_ptr<gw::ddp::DistributedDataParallel> ddp_;
  std::unique_ptr<gw::optim::AdamW> opt_;
  std::unique_ptr<gw::optim::LambdaLR> schedule_;
};

// The sum of `value` over the ranks (itself without a group).
double sum_over_ranks(double value, gw::dist::ProcessGroup* group) {
  if (!group) return value;
  gw::Tensor total = gw::full({1}, value, gw::kFloat64);
  group->allreduce(total)->wait();
  return total.item<double>();
}

// The mean loss over eval_batches fixed batches of batch_size * world windows of the validation
// split, evenly spaced through it (the same set at any world size); each rank evaluates its
// rows of every batch.
double validation_loss(gw::nn::GPT& model, const gw::data::CharWindows& val, const Args& args,
                       gw::Device device, gw::dist::ProcessGroup* group) {
  const int rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  const int64_t global_batch = args.batch_size * world, windows = args.eval_batches * global_batch;
  std::vector<int64_t> starts(static_cast<size_t>(windows));
  for (int64_t i = 0; i < windows; ++i)
    starts[static_cast<size_t>(i)] = i * (val.size() - 1) / std::max<int64_t>(windows - 1, 1);
  gw::autograd::NoGradGuard no_grad;
  model.eval();
  double sum = 0;
  for (int64_t b = 0; b < args.eval_batches; ++b) {
    auto [x, y] = val.batch(starts, b * global_batch + rank * args.batch_size, args.batch_size);
    sum += model.loss(x.to(device), y.to(device)).item<double>();
  }
  model.train();
  return sum_over_ranks(sum, group) / static_cast<double>(args.eval_batches * world);
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  if (args.ddp == "gloo") gw::examples::launch_env("gpt_train");  // one line on a bad launcher
  int rank = 0, world = 1;
  try {
    args.trace.start();
    gw::set_num_threads(static_cast<int>(args.threads));
    std::shared_ptr<gw::dist::ProcessGroup> group;
    if (!args.ddp.empty()) {
      group = gw::dist::init_process_group(args.ddp);  // ranks, master: from the launcher
      rank = group->rank();
      world = group->size();
    }
    GW_CHECK(args.device == "cpu" || gw::cuda::is_available(), gw::InvalidArgumentError,
             "[gpt_train] --device cuda, but there is no GPU: ", gw::cuda::no_device_reason());
    const gw::Device device = args.device == "cuda" ? gw::cuda_device(0) : gw::kCPU;

    const gw::data::CharCorpus corpus = gw::data::load_bible_kjv();
    const gw::data::CharWindows train(corpus, gw::data::CorpusSplit::Train, args.model.context);
    const gw::data::CharWindows val(corpus, gw::data::CorpusSplit::Validation, args.model.context);
    gw::dist::DistributedSampler sampler(
        train.size(), {.num_replicas = world, .rank = rank, .seed = args.seed, .drop_last = true});
    const int64_t steps_per_epoch = sampler.num_samples() / args.batch_size;

    Trainer trainer(args, corpus, device, group);
    const auto identity = run_identity(args, corpus.vocab_size(), world);

    // Resuming: rank 0 says whether there is a checkpoint, so that all ranks agree; every rank
    // loads it, and when one cannot, every rank stops.
    int64_t first = 0;
    const bool exists = args.checkpoint.every > 0 &&
                        std::filesystem::exists(args.checkpoint.dir + "/checkpoint.safetensors");
    const bool resume =
        group ? gw::dist::broadcast_bytes(*group, {static_cast<uint8_t>(exists)}, 0)[0] != 0
              : exists;
    if (resume) {
      auto load = [&] {
        std::optional<gw::Checkpoint> c = gw::load_checkpoint(args.checkpoint.dir);
        GW_CHECK(c.has_value(), gw::IoError, "[gpt_train] no checkpoint in ", args.checkpoint.dir,
                 " on rank ", rank);
        trainer.restore(*c, identity);
        first = c->step;
      };
      group ? gw::dist::checkpoint::on_every_rank(*group, load) : load();
      if (rank == 0)
        std::printf("resuming from %s at step %lld\n", args.checkpoint.dir.c_str(),
                    static_cast<long long>(first));
    }
    trainer.schedule_from(first);

    const int64_t tokens_per_step = args.batch_size * args.model.context * world;
    if (rank == 0) {
      int64_t count = 0;
      for (const gw::Tensor& p : trainer.model().parameters()) count += p.numel();
      std::printf(
          "%s\n%.2fM parameters; %zu characters of text, vocabulary of %lld; %s%s\n"
          "AdamW lr %g (warm-up %lld, cosine to %g), weight decay %g, clip %g; %lld steps of "
          "%lld tokens\n",
          trainer.model().repr().c_str(), static_cast<double>(count) / 1e6, corpus.text.size(),
          static_cast<long long>(corpus.vocab_size()), args.device.c_str(),
          group ? (", DDP on " + std::to_string(world) + " ranks (" + args.ddp + ")").c_str() : "",
          args.lr, static_cast<long long>(args.warmup), args.lr * args.min_lr_factor,
          args.weight_decay, args.clip, static_cast<long long>(args.steps),
          static_cast<long long>(tokens_per_step));
      std::fflush(stdout);
    }

    auto save = [&](int64_t step) {
      if (rank != 0) return;
      gw::save_checkpoint(args.checkpoint.dir, trainer.checkpoint(step, identity));
      std::printf("checkpoint saved: step %lld\n", static_cast<long long>(step));
      std::fflush(stdout);
    };
    std::vector<double> losses;
    std::vector<gw::examples::LossPoint> val_losses;
    std::unique_ptr<gw::examples::ProgressBar> bar;
    if (rank == 0)
      bar = std::make_unique<gw::examples::ProgressBar>("train", args.steps - first, "tokens");
    std::vector<int64_t> order;
    double final_val = std::nan("");
    for (int64_t s = first; s < args.steps; ++s) {
      const int64_t epoch = s / steps_per_epoch, b = s % steps_per_epoch;
      if (order.empty() || b == 0) {
        sampler.set_epoch(epoch);
        order = sampler.indices();
      }
      auto [x, y] = train.batch(order, b * args.batch_size, args.batch_size);
      // The loss of the whole global batch (the ranks' means, averaged), as one process sees it.
      losses.push_back(sum_over_ranks(trainer.step(x, y), group.get()) / world);
      if (bar) bar->update(s + 1 - first, losses.back(), (s + 1 - first) * tokens_per_step);
      const bool last = s + 1 == args.steps;
      if ((s + 1) % args.eval_every == 0 || last) {
        final_val = validation_loss(trainer.model(), val, args, device, group.get());
        val_losses.push_back({static_cast<int64_t>(losses.size()) - 1, final_val});
        if (bar) bar->finish();
        if (rank == 0) {
          std::printf("step %lld: train loss %.4f, val loss %.4f, lr %.3g\n",
                      static_cast<long long>(s + 1), losses.back(), final_val, trainer.lr());
          std::fflush(stdout);
        }
      }
      if (args.checkpoint.every > 0 && ((s + 1) % args.checkpoint.every == 0 || last)) save(s + 1);
    }
    if (bar) bar->finish();
    if (first == args.steps) {  // resumed after the last step
      final_val = validation_loss(trainer.model(), val, args, device, group.get());
      if (rank == 0) std::printf("val loss %.4f\n", final_val);
    }

    if (rank == 0 && args.sample > 0) {
      gw::Generator gen(args.seed);
      const std::vector<int64_t> text =
          trainer.model().generate(corpus.encode(args.prompt), args.sample, gen,
                                   {.temperature = args.temperature, .top_k = args.top_k});
      std::printf("--- a sample (%lld characters, temperature %g) ---\n%s\n---\n",
                  static_cast<long long>(args.sample), args.temperature,
                  corpus.decode(text).c_str());
    }
    if (rank == 0 && !args.curve.empty()) {
      gw::examples::write_loss_curve(args.curve, losses, "char-GPT on the King James Bible",
                                     val_losses);
      std::printf("wrote %s.csv and %s.svg\n", args.curve.c_str(), args.curve.c_str());
    }
    const bool reached = args.target <= 0 || final_val <= args.target;
    if (rank == 0 && args.target > 0)
      std::printf("val loss %.4f (target %.4f): %s\n", final_val, args.target,
                  reached ? "reached" : "NOT reached");
    if (group) gw::dist::destroy_process_group();
    args.trace.finish(rank, world);
    return reached ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_train (rank %d): %s\n", rank, e.what());
    return 1;
  }
}
