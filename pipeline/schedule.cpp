#include "pipeline/schedule.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <utility>

#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/trace.h"
#include "dist/process_group/c10d.h"

namespace gw::pipeline {

// --- plans -------------------------------------------------------------------------------------

namespace {

void check_sizes(const char* who, int stages, int microbatches) {
  GW_CHECK(stages >= 1 && microbatches >= 1, InvalidArgumentError, "[pipeline] ", who,
           " needs at least one stage and one micro-batch, got ", stages, " stages and ",
           microbatches, " micro-batches");
}

std::string text(const Action& a) {
  return (a.type == ActionType::Forward ? "F" : "B") + std::to_string(a.microbatch);
}

}  // namespace

Plan gpipe(int stages, int microbatches) {
  check_sizes("gpipe", stages, microbatches);
  Plan plan(static_cast<size_t>(stages));
  for (auto& actions : plan) {
    for (int mb = 0; mb < microbatches; ++mb) actions.push_back({ActionType::Forward, mb});
    for (int mb = microbatches - 1; mb >= 0; --mb) actions.push_back({ActionType::Backward, mb});
  }
  return plan;
}

Plan one_f_one_b(int stages, int microbatches) {
  check_sizes("1f1b", stages, microbatches);
  Plan plan(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    auto& actions = plan[static_cast<size_t>(s)];
    const int warmup = std::min(stages - s - 1, microbatches);
    int forward = 0, backward = 0;
    while (forward < warmup) actions.push_back({ActionType::Forward, forward++});
    while (forward < microbatches) {  // steady state: one forward, one backward
      actions.push_back({ActionType::Forward, forward++});
      actions.push_back({ActionType::Backward, backward++});
    }
    while (backward < microbatches) actions.push_back({ActionType::Backward, backward++});
  }
  return plan;
}

Plan make_plan(const std::string& name, int stages, int microbatches) {
  if (name == "gpipe") return gpipe(stages, microbatches);
  if (name == "1f1b") return one_f_one_b(stages, microbatches);
  throw InvalidArgumentError(
      detail::str("[pipeline] unknown schedule \"", name, "\" (gpipe or 1f1b)"));
}

std::string to_string(const Plan& plan) {
  std::string out;
  for (size_t s = 0; s < plan.size(); ++s) {
    out += "stage " + std::to_string(s) + ":";
    for (const Action& a : plan[s]) out += " " + text(a);
    out += "\n";
  }
  return out;
}

void check_plan(const Plan& plan, int stages, int microbatches) {
  check_sizes("check_plan", stages, microbatches);
  GW_CHECK(static_cast<int>(plan.size()) == stages, InvalidArgumentError,
           "[pipeline] the plan has ", plan.size(), " stages, the pipeline ", stages);
  const auto n = static_cast<size_t>(microbatches);
  // Each stage: every forward and backward once, each backward after its forward.
  for (int s = 0; s < stages; ++s) {
    std::vector<int> forwards(n, 0), backwards(n, 0);
    for (const Action& a : plan[static_cast<size_t>(s)]) {
      GW_CHECK(a.microbatch >= 0 && a.microbatch < microbatches, InvalidArgumentError,
               "[pipeline] stage ", s, "'s ", text(a), " names a micro-batch outside 0..",
               microbatches - 1);
      const auto mb = static_cast<size_t>(a.microbatch);
      if (a.type == ActionType::Forward) {
        ++forwards[mb];
      } else {
        GW_CHECK(forwards[mb] == 1, InvalidArgumentError, "[pipeline] stage ", s, " runs ", text(a),
                 " before its forward");
        ++backwards[mb];
      }
    }
    for (size_t mb = 0; mb < n; ++mb)
      GW_CHECK(forwards[mb] == 1 && backwards[mb] == 1, InvalidArgumentError, "[pipeline] stage ",
               s, " runs micro-batch ", mb, "'s forward ", forwards[mb], " times and its backward ",
               backwards[mb], " times; once each, for ", microbatches, " micro-batches");
  }
  // Simulated: sends never block, a receive waits for its sender. Each round runs at least one
  // action, so at most 2 * stages * microbatches rounds.
  std::vector<std::vector<bool>> forward_done(static_cast<size_t>(stages), std::vector<bool>(n)),
      backward_done(static_cast<size_t>(stages), std::vector<bool>(n));
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  auto ready = [&](int s, const Action& a) {
    const auto mb = static_cast<size_t>(a.microbatch);
    if (a.type == ActionType::Forward) return s == 0 || forward_done[s - 1][mb];
    return s == stages - 1 || backward_done[s + 1][mb];  // its own forward ran (checked above)
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      const auto& actions = plan[static_cast<size_t>(s)];
      auto& i = next[static_cast<size_t>(s)];
      while (i < actions.size() && ready(s, actions[i])) {
        const Action& a = actions[i++];
        (a.type == ActionType::Forward ? forward_done : backward_done)[s][a.microbatch] = true;
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int s = 0; s < stages; ++s) {
    const auto& actions = plan[static_cast<size_t>(s)];
    const size_t i = next[static_cast<size_t>(s)];
    if (i == actions.size()) continue;
    const Action& a = actions[i];
    stuck += detail::str(stuck.empty() ? "" : "; ", "stage ", s, " waits in ", text(a),
                         " for stage ", a.type == ActionType::Forward ? s - 1 : s + 1);
  }
  GW_CHECK(stuck.empty(), InvalidArgumentError, "[pipeline] the plan deadlocks: ", stuck, "\n",
           to_string(plan));
}

// --- the stage ---------------------------------------------------------------------------------

PipelineStage::PipelineStage(std::shared_ptr<nn::Module> module, int stage_index, int num_stages,
                             std::shared_ptr<dist::ProcessGroup> group)
    : module_(std::move(module)),
      index_(stage_index),
      num_stages_(num_stages),
      group_(std::move(group)) {
  GW_CHECK(module_ && group_, InvalidArgumentError,
           "[PipelineStage] the module and the group "
           "must not be null");
  GW_CHECK(num_stages_ == group_->size() && index_ == group_->rank(), InvalidArgumentError,
           "[PipelineStage] stage ", index_, " of ", num_stages_, " must sit on rank ", index_,
           " of a group of ", num_stages_, " (rank ", group_->rank(), " of ", group_->size(), ")");
}

// --- running a plan ----------------------------------------------------------------------------

namespace {

// Tags: a micro-batch's activation and its gradient travel apart; the shapes before either.
int tag_of(int microbatch, ActionType type) {
  return 2 * microbatch + (type == ActionType::Backward ? 1 : 0);
}
constexpr int kShapeTag = 1 << 20;
constexpr int64_t kMaxDims = 8;

// What a stage passes on, as an int64 tensor: dtype, dims (or -1: the stage failed), sizes.
Tensor describe(const Tensor* t) {
  std::vector<int64_t> v(2 + kMaxDims, 0);
  v[1] = -1;
  if (t) {
    v[0] = static_cast<int64_t>(t->dtype());
    v[1] = t->dim();
    for (int64_t d = 0; d < t->dim(); ++d) v[static_cast<size_t>(2 + d)] = t->size(d);
  }
  return from_vector<int64_t>(v);
}

}  // namespace

struct Schedule::Impl {
  std::shared_ptr<PipelineStage> stage;
  Plan plan;
  LossFn loss;
  int microbatches = 0;
  bool checked = false;  // the shapes were exchanged and every stage ran them
  Shape in_shape, out_shape;
  DType in_dtype = kFloat32, out_dtype = kFloat32;
  // Kept from step to step: each micro-batch's received activation and output gradient.
  std::vector<Tensor> activations, output_grads;

  int rank() const { return stage->index(); }
  dist::ProcessGroup& group() { return stage->group(); }
  void exchange_shapes(const Tensor& input, const Tensor& target);
};

// Before the first step: stage by stage, what each passes on (a forward of the first
// micro-batch's shape, in eval mode and without gradients, so that nothing is drawn or
// recorded), then every rank learns whether every stage could run, and whether every rank runs
// the same plan. Any failure is raised on every rank, naming the first stage that failed.
void Schedule::Impl::exchange_shapes(const Tensor& input, const Tensor& target) {
  const int s = rank();
  std::string failure;
  Tensor output;
  bool previous_failed = false;
  if (!stage->is_first()) {
    Tensor meta = empty({2 + kMaxDims}, kInt64);
    group().recv(meta, s - 1, kShapeTag)->wait();
    const std::vector<int64_t> v = meta.to_vector<int64_t>();
    previous_failed = v[1] < 0;
    if (!previous_failed) {
      in_dtype = static_cast<DType>(v[0]);
      in_shape = Shape(v.begin() + 2, v.begin() + 2 + v[1]);
    }
  }
  if (!previous_failed) {
    try {
      autograd::NoGradGuard no_grad;
      nn::Module& m = stage->module();
      const bool training = m.is_training();
      m.eval();
      struct Restore {
        nn::Module& m;
        bool training;
        ~Restore() { m.train(training); }
      } restore{m, training};
      Tensor x;
      if (stage->is_first()) {
        GW_CHECK(input.defined() && input.dim() >= 1 && input.size(0) % microbatches == 0,
                 InvalidArgumentError,
                 "[pipeline] the first stage's input must split along dim 0 "
                 "into ",
                 microbatches, " micro-batches, got ",
                 input.defined() ? shape_str(input.sizes()) : std::string("none"));
        x = input.narrow(0, 0, input.size(0) / microbatches);
      } else {
        x = zeros(in_shape, in_dtype);
      }
      output = m(x);
      if (stage->is_last()) {
        GW_CHECK(target.defined() && target.dim() >= 1 && target.size(0) % microbatches == 0,
                 InvalidArgumentError,
                 "[pipeline] the last stage's target must split along dim 0 "
                 "into ",
                 microbatches, " micro-batches, got ",
                 target.defined() ? shape_str(target.sizes()) : std::string("none"));
        loss(output, target.narrow(0, 0, target.size(0) / microbatches));
      }
    } catch (const std::exception& e) {
      failure =
          detail::str("stage ", s, " cannot run ",
                      stage->is_first() ? "its input"
                                        : detail::str("what stage ", s - 1, " passes (",
                                                      shape_str(in_shape), " ", in_dtype, ")"),
                      ": ", e.what());
      output = Tensor();
    }
  }
  if (!stage->is_last())
    group().send(describe(output.defined() ? &output : nullptr), s + 1, kShapeTag)->wait();
  if (output.defined()) {
    out_shape = output.sizes();
    out_dtype = output.dtype();
  }
  // Every rank: the first failure, and the plans.
  std::string mine = (failure.empty() ? "0" : "1") + failure;
  const std::string plan_text = to_string(plan);
  const auto reports =
      dist::all_gather_bytes(group(), std::vector<uint8_t>(mine.begin(), mine.end()));
  const auto plans =
      dist::all_gather_bytes(group(), std::vector<uint8_t>(plan_text.begin(), plan_text.end()));
  for (const auto& r : reports)
    GW_CHECK(r.empty() || r[0] != '1', InvalidArgumentError, "[pipeline] ",
             std::string(r.begin() + 1, r.end()));
  for (size_t r = 1; r < plans.size(); ++r)
    GW_CHECK(plans[r] == plans[0], InvalidArgumentError, "[pipeline] rank ", r,
             " runs another schedule than rank 0:\nrank 0:\n",
             std::string(plans[0].begin(), plans[0].end()), "rank ", r, ":\n",
             std::string(plans[r].begin(), plans[r].end()));
  checked = true;
}

Schedule::Schedule(std::shared_ptr<PipelineStage> stage, Plan plan, LossFn loss)
    : impl_(std::make_unique<Impl>()) {
  GW_CHECK(stage != nullptr && loss != nullptr, InvalidArgumentError,
           "[pipeline] Schedule needs a stage and a loss function");
  GW_CHECK(!plan.empty() && !plan[0].empty(), InvalidArgumentError, "[pipeline] the plan is empty");
  int microbatches = 0;
  for (const Action& a : plan[0]) microbatches = std::max(microbatches, a.microbatch + 1);
  check_plan(plan, stage->num_stages(), microbatches);
  impl_->stage = std::move(stage);
  impl_->plan = std::move(plan);
  impl_->loss = std::move(loss);
  impl_->microbatches = microbatches;
  microbatches_ = microbatches;
}

Schedule::~Schedule() = default;

void Schedule::step(const Tensor& input, const Tensor& target, std::vector<double>* losses) {
  Impl& im = *impl_;
  PipelineStage& stage = *im.stage;
  const int s = stage.index(), m = im.microbatches;
  if (!im.checked) im.exchange_shapes(input, target);
  const auto started = std::chrono::steady_clock::now();
  double busy = 0;
  const int track = trace::enabled() ? trace::track("pipeline stage " + std::to_string(s)) : 0;
  // Times the work of action `a` (after its input arrived, before its output leaves).
  auto timed = [&](const Action& a, const auto& work) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t t0_us = trace::enabled() ? trace::now_us() : 0;
    work();
    busy += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (trace::enabled())
      trace::complete("pipeline", text(a), t0_us, trace::now_us(), track,
                      detail::str("{\"stage\": ", s, ", \"microbatch\": ", a.microbatch, "}"));
  };
  auto split = [&](const Tensor& t, const char* what) {
    GW_CHECK(t.defined() && t.dim() >= 1 && t.size(0) % m == 0, InvalidArgumentError,
             "[pipeline] stage ", s, "'s ", what, " must split along dim 0 into ", m,
             " micro-batches, got ", t.defined() ? shape_str(t.sizes()) : std::string("none"));
    std::vector<Tensor> parts;
    const int64_t n = t.size(0) / m;
    for (int i = 0; i < m; ++i) parts.push_back(t.narrow(0, i * n, n));
    return parts;
  };
  const std::vector<Tensor> inputs =
      stage.is_first() ? split(input, "input") : std::vector<Tensor>{};
  const std::vector<Tensor> targets =
      stage.is_last() ? split(target, "target") : std::vector<Tensor>{};
  if (im.activations.empty()) {
    for (int i = 0; i < m; ++i) {
      if (!stage.is_first()) {
        Tensor a = empty(im.in_shape, im.in_dtype);
        if (is_floating(im.in_dtype)) a.requires_grad_();
        im.activations.push_back(a);
      }
      if (!stage.is_last()) im.output_grads.push_back(empty(im.out_shape, im.out_dtype));
    }
  }

  // A micro-batch's state between its forward and its backward.
  std::vector<Tensor> stage_inputs(static_cast<size_t>(m)), stage_outputs(static_cast<size_t>(m));
  std::vector<dist::WorkPtr> sends;
  for (const Action& a : im.plan[static_cast<size_t>(s)]) {
    const auto mb = static_cast<size_t>(a.microbatch);
    const int tag = tag_of(a.microbatch, a.type);
    if (a.type == ActionType::Forward) {
      Tensor x;
      if (stage.is_first()) {
        x = inputs[mb];
      } else {
        x = im.activations[mb];
        x.set_grad(Tensor());
        stage.group().recv(x, s - 1, tag)->wait();
      }
      Tensor y;
      timed(a, [&] {
        y = stage.module()(x);
        if (!stage.is_last()) return;
        Tensor l = im.loss(y, targets[mb]);
        if (losses) losses->push_back(l.item<double>());
        y = l / static_cast<double>(m);  // what its backward starts from
      });
      if (!stage.is_last()) {
        GW_CHECK(y.sizes() == im.out_shape && y.dtype() == im.out_dtype, InvalidArgumentError,
                 "[pipeline] stage ", s, " gave ", shape_str(y.sizes()), " ", y.dtype(),
                 " for micro-batch ", mb, " but passed ", shape_str(im.out_shape), " ",
                 im.out_dtype, " before: the micro-batches' shapes must not change");
        sends.push_back(stage.group().send(y.detach().contiguous(), s + 1, tag));
      }
      stage_inputs[mb] = x;
      stage_outputs[mb] = y;
    } else {
      if (stage.is_last()) {
        timed(a, [&] { stage_outputs[mb].backward(); });
      } else {
        Tensor& g = im.output_grads[mb];
        stage.group().recv(g, s + 1, tag)->wait();
        timed(a, [&] {
          if (stage_outputs[mb].requires_grad()) autograd::backward({stage_outputs[mb]}, {g});
        });
      }
      if (!stage.is_first()) {
        Tensor gx = stage_inputs[mb].grad();
        sends.push_back(stage.group().send(
            gx.defined() ? gx.contiguous() : zeros(im.in_shape, im.in_dtype), s - 1, tag));
      }
      stage_inputs[mb] = Tensor();
      stage_outputs[mb] = Tensor();
    }
  }
  for (auto& w : sends) w->wait();
  last_step_ = {std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
                busy};
}

}  // namespace gw::pipeline
