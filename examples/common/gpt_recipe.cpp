#include "examples/common/gpt_recipe.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <string>
#include <system_error>

#include "autograd/grad_mode.h"
#include "core/ops.h"
#include "fsdp/fully_shard.h"
#include "nn/functional.h"
#include "optim/clip_grad.h"

namespace gw::examples {

GPTTrainer::GPTTrainer(std::shared_ptr<nn::GPT> model, const GPTRecipe& recipe,
                       std::shared_ptr<dist::ProcessGroup> group, Parallelism parallelism,
                       const PipelineOptions& pipeline, const fsdp::FullyShardOptions& sharding)
    : recipe_(recipe), model_(std::move(model)), group_(group) {
  GW_CHECK(recipe.accumulate >= 1, InvalidArgumentError,
           "[GPTTrainer] accumulate must be at least 1, got ", recipe.accumulate);
  GW_CHECK(recipe.accumulate == 1 || !(group && parallelism == Parallelism::pipeline),
           InvalidArgumentError, "[GPTTrainer] a pipeline cuts the batch into its own ",
           "micro-batches: accumulate must be 1, got ", recipe.accumulate);
  std::vector<Tensor> trained = model_->parameters();
  if (group && parallelism == Parallelism::pipeline) {
    const int ranks = group->size(), rank = group->rank();
    GW_CHECK(!pipeline.shard || (pipeline.data_parallel && pipeline.schedule != "zb"),
             InvalidArgumentError,
             "[GPTTrainer] sharded pipeline stages need a data-parallel group and a schedule "
             "other than zero bubble, whose weight part would come after fully_shard's "
             "reductions (got ",
             pipeline.data_parallel ? "a group" : "none", " and \"", pipeline.schedule, "\")");
    pipeline::Plan plan = pipeline::make_plan(pipeline.schedule, ranks, pipeline.microbatches);
    const int stages = pipeline::stages_of(plan);
    std::vector<std::shared_ptr<pipeline::PipelineStage>> mine;
    trained.clear();
    for (int s = 0; s < stages; ++s) {
      std::shared_ptr<nn::Module> part = model_->stage(s, stages);
      stage_parameters_.push_back(part->parameters());
      if (s % ranks != rank) continue;
      if (pipeline.shard) {  // its blocks, then the stage: each rank keeps 1/replicas of it
        for (const auto& child : part->children())
          if (std::dynamic_pointer_cast<nn::GPTBlock>(child))
            fsdp::fully_shard(child, pipeline.data_parallel);
        sharded_stages_.emplace_back(s, fsdp::fully_shard(part, pipeline.data_parallel));
      }
      for (const Tensor& p : part->parameters()) trained.push_back(p);  // sharded: the shards
      mine.push_back(std::make_shared<pipeline::PipelineStage>(part, s, stages, group));
    }
    data_parallel_ = pipeline.data_parallel;
    pipeline::ScheduleOptions options;
    if (pipeline.shard)  // one reduce-scatter a step, after each stage's last micro-batch
      options.before_backward = [sharded = sharded_stages_](int stage, bool last) {
        for (const auto& [s, unit] : sharded)
          if (s == stage) unit->set_requires_gradient_sync(last);
      };
    else
      options.data_parallel = pipeline.data_parallel;
    pipeline_ = std::make_unique<pipeline::Schedule>(
        mine, std::move(plan),
        [](const Tensor& logits, const Tensor& targets) {
          return nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                               targets.reshape({-1}));
        },
        std::move(options));
    if (pipeline.shard) {  // a model's memory more on each rank; gather_stages fills it
      evaluation_ = std::make_shared<nn::GPT>(model_->options, evaluation_gen_);
      evaluation_->to(model_->wte->weight.device());
      evaluation_->to(model_->wte->weight.dtype());
      evaluation_->eval();
    }
  } else if (group && parallelism == Parallelism::fsdp) {
    for (const auto& block : model_->h->children()) fsdp::fully_shard(block, group, sharding);
    // the embeddings, the final norm, the head
    sharded_ = fsdp::fully_shard(model_, group, sharding);
    replicated_ = sharding.replicate_group != nullptr;
  } else if (group) {
    ddp_ = std::make_unique<ddp::DistributedDataParallel>(model_, std::move(group));
  }
  if (sharded_) trained = model_->parameters();  // the shards
  opt_ = std::make_unique<optim::AdamW>(optim::weight_decay_groups(trained, recipe.weight_decay),
                                        optim::AdamWOptions{.lr = recipe.lr, .betas = {0.9, 0.99}});
  schedule_from(0);
}

void GPTTrainer::schedule_from(int64_t step) {
  schedule_ = std::make_unique<optim::LambdaLR>(
      *opt_, optim::warmup_cosine(recipe_.warmup, recipe_.steps, recipe_.min_lr_factor), step,
      recipe_.lr);
}

double GPTTrainer::step(const Tensor& x, const Tensor& y) {
  const Device device = model_->wte->weight.device();
  opt_->zero_grad();
  double loss = 0;
  // The forward and the loss under autocast (the backward runs outside it either way: autograd
  // turns it off, as PyTorch advises).
  std::optional<AutocastGuard> amp;
  if (pipeline_) {
    if (recipe_.autocast) amp.emplace(device.type, *recipe_.autocast);
    // Every rank passes the batch; the first stage's rank reads the tokens, the last's the
    // targets. The loss is the last stage's mean over the micro-batches, sent to every rank.
    // Each stage's forwards run here, under this thread's autocast; its backwards run here too
    // (autocast off, as in every backward).
    std::vector<double> losses;
    pipeline_->step(x.to(device), y.to(device), &losses);
    amp.reset();
    for (double l : losses) loss += l / static_cast<double>(losses.size());
    loss = reduce_over_ranks(loss, group_.get());  // only the last stage's rank has a loss
    loss = reduce_over_ranks(loss, data_parallel_.get(), dist::ReduceOp::AVG);
  } else {
    const int64_t k = recipe_.accumulate;
    GW_CHECK(x.size(0) % k == 0, InvalidArgumentError, "[GPTTrainer] a batch of ", x.size(0),
             " sequences does not split into ", k, " micro-batches of one size");
    const int64_t rows = x.size(0) / k;
    for (int64_t m = 0; m < k; ++m) {
      const bool last = m + 1 == k;
      std::optional<ddp::DistributedDataParallel::NoSync> no_sync;
      if (ddp_ && !last) no_sync.emplace(*ddp_);
      if (sharded_ && replicated_)
        sharded_->set_requires_all_reduce(last);
      else if (sharded_)
        sharded_->set_requires_gradient_sync(last);
      if (recipe_.autocast) amp.emplace(device.type, *recipe_.autocast);
      const Tensor xm = x.narrow(0, m * rows, rows).to(device);
      const Tensor logits = ddp_ ? ddp_->forward(xm) : (*model_)(xm);
      const Tensor l =
          nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                        y.narrow(0, m * rows, rows).to(device).reshape({-1}));
      amp.reset();
      (k == 1 ? l : l / static_cast<double>(k)).backward();
      loss += l.item<double>() / static_cast<double>(k);
    }
  }
  // Sharded or cut into stages, each parameter (or shard) lives on one rank of these groups: the
  // norm sums over them (the replicas too, when the stages are sharded over them).
  if (recipe_.clip > 0 && (sharded_ || pipeline_)) {
    std::vector<dist::ProcessGroup*> holders{group_.get()};
    if (!sharded_stages_.empty()) holders.push_back(data_parallel_.get());
    fsdp::clip_grad_norm_(opt_->parameters(), recipe_.clip, holders);
  } else if (recipe_.clip > 0)
    optim::clip_grad_norm_(opt_->parameters(), recipe_.clip);
  opt_->step();
  schedule_->step();
  return loss;
}

void GPTTrainer::gather_stages() {
  if (!pipeline_) return;
  autograd::NoGradGuard no_grad;
  const int stages = static_cast<int>(stage_parameters_.size()), ranks = group_->size();
  for (int s = 0; s < stages; ++s) {
    const int root = s % ranks;
    if (!evaluation_) {
      for (Tensor p : stage_parameters_[static_cast<size_t>(s)])
        group_->broadcast(p, {.root = root})->wait();
      continue;
    }
    // Sharded: the stage's rank gathers it whole over its replicas (they all do, each for its
    // pipeline), then sends it down its pipeline into every rank's copy.
    NamedTensors whole;
    for (const auto& [index, unit] : sharded_stages_)
      if (index == s) whole = unit->full_state_dict();
    for (auto [name, p] : evaluation_->stage(s, stages)->named_parameters()) {
      if (root == group_->rank()) p.copy_(whole.at(name));
      group_->broadcast(p, {.root = root})->wait();
    }
  }
}

double reduce_over_ranks(double value, dist::ProcessGroup* group, dist::ReduceOp op) {
  if (!group) return value;
  Tensor total = full({1}, value, TensorOptions(kFloat64).with_device(group->device()));
  group->allreduce(total, {.op = op})->wait();
  return total.item<double>();  // from the group's device
}

std::string exact_text(double x) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);
}

bool same_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  auto number = [](const std::string& s) -> std::optional<double> {
    double x = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
    return x;
  };
  const auto x = number(a), y = number(b);
  return x && y && *x == *y;
}

std::map<std::string, std::string> recipe_metadata(const GPTRecipe& recipe) {
  // Exact: with detail::str's 6 digits --lr 0.0010000004 would pass for 0.001.
  return {{"steps", std::to_string(recipe.steps)},
          {"warmup", std::to_string(recipe.warmup)},
          {"lr", exact_text(recipe.lr)},
          {"min_lr_factor", exact_text(recipe.min_lr_factor)},
          {"weight_decay", exact_text(recipe.weight_decay)},
          {"clip", exact_text(recipe.clip)}};
}

std::vector<int64_t> evenly_spaced_windows(const data::CharWindows& windows, int64_t batches,
                                           int64_t batch) {
  const int64_t n = batches * batch;
  std::vector<int64_t> starts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    starts[static_cast<size_t>(i)] = i * (windows.size() - 1) / std::max<int64_t>(n - 1, 1);
  return starts;
}

double validation_loss(nn::GPT& model, const data::CharWindows& windows, int64_t batches,
                       int64_t batch, dist::ProcessGroup* group) {
  const int rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  GW_CHECK(batch % world == 0, InvalidArgumentError, "[validation_loss] batch ", batch,
           " does not divide among ", world, " ranks");
  const int64_t mine = batch / world;
  const std::vector<int64_t> starts = evenly_spaced_windows(windows, batches, batch);
  const Device device = model.wte->weight.device();
  autograd::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  double sum = 0;
  for (int64_t b = 0; b < batches; ++b) {
    auto [x, y] = windows.batch(starts, b * batch + rank * mine, mine);
    sum += model.loss(x.to(device), y.to(device)).item<double>();
  }
  model.train(was_training);
  return reduce_over_ranks(sum, group) / static_cast<double>(batches * world);
}

}  // namespace gw::examples
