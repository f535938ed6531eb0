// How gpt_train trains its GPT, shared with bench/bench_gpt so that the benchmark times the
// trainer's own step: AdamW (betas 0.9, 0.99) with weight decay on the matrices only, a linear
// warm-up then a cosine decay of the learning rate, the gradients clipped by their global norm;
// and the validation loss on fixed windows.
//
//   auto model = std::make_shared<gw::nn::GPT>(options, gen);
//   gw::examples::GPTTrainer trainer(model, {.steps = 2000}, group);  // group: DDP, or nullptr
//   for (int64_t s = 0; s < 2000; ++s) trainer.step(x, y);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "ddp/distributed_data_parallel.h"
#include "examples/common/char_corpus.h"
#include "fsdp/fully_shard.h"
#include "nn/transformer.h"
#include "optim/adamw.h"
#include "optim/lr_scheduler.h"
#include "pipeline/schedule.h"

namespace gw::examples {

struct GPTRecipe {
  int64_t steps = 2000;        // the schedule's length
  int64_t warmup = 100;        // steps of linear warm-up
  double lr = 1e-3;            // the peak learning rate
  double min_lr_factor = 0.1;  // the cosine ends at lr * min_lr_factor
  double weight_decay = 0.1;   // on parameters of two dims or more
  double clip = 1.0;           // the gradients' global norm is clipped to this (0: not clipped)
  // Gradient accumulation: each step's batch in this many micro-batches (forward and backward
  // each, one optimizer step), the ranks' gradients combined at the last: DDP's no_sync, and
  // fully_shard without gradient sync, or under HSDP reduce-scattering each micro-batch and
  // summing over the replicas at the last (set_requires_all_reduce). Not with a pipeline.
  int64_t accumulate = 1;
  // Mixed precision: the forward and the loss under autocast in this 16-bit dtype on the
  // model's device, over float32 parameters (core/autocast.h); unset: float32 throughout.
  std::optional<DType> autocast = std::nullopt;
};

// The recipe as text (name -> value), for a checkpoint's metadata and the PyTorch anchor.
std::map<std::string, std::string> recipe_metadata(const GPTRecipe& recipe);
// The shortest text that reads back as exactly `x` ("0.001", "3e-04"), for the metadata.
std::string exact_text(double x);
// Whether two metadata values are the same: equal texts, or texts of the same double (what
// earlier runs wrote with 6 digits, "0.0003", is the same lr as "3e-04").
bool same_value(const std::string& a, const std::string& b);

// How a trainer with a group spreads the model over its ranks: a whole replica on each (DDP),
// 1/ranks of it (fully_shard on every block, then on the root), or a pipeline of its stages
// (each rank trains its stages on the whole batch, cut into micro-batches).
enum class Parallelism { ddp, fsdp, pipeline };

struct PipelineOptions {
  std::string schedule = "1f1b";  // pipeline::make_plan's names
  int microbatches = 4;
  // 2D: the ranks holding this rank's stages in the other replicas of the pipeline (a
  // DeviceMesh's "dp" group); the stages' gradients are averaged over them. Null: one pipeline.
  std::shared_ptr<dist::ProcessGroup> data_parallel;
  // With data_parallel: each stage is sharded over it instead (fully_shard on its blocks, then
  // on the stage), and evaluation runs on a whole copy (evaluation_model). Not with "zb".
  bool shard = false;
};

class GPTTrainer {
 public:
  // Trains `model` (already on its device); with a group, through DDP or fully_shard over it
  // (with `sharding`'s options), or as a pipeline over it (then the loss of step() is averaged
  // over pipeline.data_parallel too).
  // The schedule starts at step 0 (see schedule_from).
  GPTTrainer(std::shared_ptr<nn::GPT> model, const GPTRecipe& recipe,
             std::shared_ptr<dist::ProcessGroup> group = nullptr,
             Parallelism parallelism = Parallelism::ddp, const PipelineOptions& pipeline = {},
             const fsdp::FullyShardOptions& sharding = {});

  // One step on inputs and targets (N, L) int64 (moved to the model's device); returns this
  // rank's loss (with a group, the ranks' gradients are averaged).
  double step(const Tensor& x, const Tensor& y);
  // Puts the learning rate where step `step` has it, e.g. after resuming at that step.
  void schedule_from(int64_t step);

  nn::GPT& model() { return *model_; }
  optim::AdamW& optimizer() { return *opt_; }
  // With Parallelism::fsdp, the root unit (its checkpoints); otherwise null.
  fsdp::FSDPModule* sharded() { return sharded_.get(); }
  // With Parallelism::pipeline: brings every stage's parameters to every rank (a broadcast from
  // each stage's rank), so that evaluation_model() on each rank is the one trained, to evaluate
  // or sample from. A collective; nothing without a pipeline.
  void gather_stages();
  // The model to evaluate and sample from: model(), but for sharded pipeline stages a whole
  // copy of it that gather_stages fills.
  nn::GPT& evaluation_model() { return evaluation_ ? *evaluation_ : *model_; }

 private:
  GPTRecipe recipe_;
  std::shared_ptr<nn::GPT> model_;
  std::shared_ptr<fsdp::FSDPModule> sharded_;
  std::shared_ptr<dist::ProcessGroup> group_;
  std::unique_ptr<pipeline::Schedule> pipeline_;
  std::shared_ptr<dist::ProcessGroup> data_parallel_;  // with a pipeline: its replicas
  // With sharded stages: this rank's (stage index, unit), and the whole copy to evaluate.
  std::vector<std::pair<int, std::shared_ptr<fsdp::FSDPModule>>> sharded_stages_;
  Generator evaluation_gen_{0};  // its dropout's, which it keeps a pointer to
  std::shared_ptr<nn::GPT> evaluation_;
  std::vector<std::vector<Tensor>> stage_parameters_;  // with a pipeline: by stage
  std::unique_ptr<ddp::DistributedDataParallel> ddp_;
  bool replicated_ = false;  // fully_shard over replicas (HSDP)
  std::unique_ptr<optim::AdamW> opt_;
  std::unique_ptr<optim::LambdaLR> schedule_;
};

// The first `batches` x `batch` windows of `windows.size()`, evenly spaced: the fixed set the
// validation loss is measured on.
std::vector<int64_t> evenly_spaced_windows(const data::CharWindows& windows, int64_t batches,
                                           int64_t batch);

// The model's mean loss over `batches` batches of `batch` windows of `windows`
// (evenly_spaced_windows), in eval mode without gradients; with a group of R ranks, batch is
// the global batch and each rank evaluates its R-th of every batch (batch % R == 0).
double validation_loss(nn::GPT& model, const data::CharWindows& windows, int64_t batches,
                       int64_t batch, dist::ProcessGroup* group = nullptr);

// `value` reduced by `op` over the ranks of `group` (through the group's device: NCCL's is a
// GPU); `value` itself without a group.
double reduce_over_ranks(double value, dist::ProcessGroup* group,
                         dist::ReduceOp op = dist::ReduceOp::SUM);

}  // namespace gw::examples
