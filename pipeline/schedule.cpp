#include "pipeline/schedule.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <utility>

#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/trace.h"
#include "pipeline/schedule_impl.h"

namespace gw::pipeline {

// --- the stage ---------------------------------------------------------------------------------

PipelineStage::PipelineStage(std::shared_ptr<nn::Module> module, int stage_index, int num_stages,
                             std::shared_ptr<dist::ProcessGroup> group)
    : module_(std::move(module)),
      index_(stage_index),
      num_stages_(num_stages),
      group_(std::move(group)) {
  GW_CHECK(module_ && group_, InvalidArgumentError,
           "[PipelineStage] the module and the group must not be null");
  GW_CHECK(index_ >= 0 && index_ < num_stages_ && num_stages_ % group_->size() == 0 &&
               index_ % group_->size() == group_->rank(),
           InvalidArgumentError, "[PipelineStage] stage ", index_, " of ", num_stages_,
           " sits on rank ", index_ % std::max(group_->size(), 1), " of a group of ",
           group_->size(), " (whose size must divide the stages), not on rank ", group_->rank());
}

// --- running a plan ----------------------------------------------------------------------------

namespace {

thread_local const Action* t_current_action = nullptr;
thread_local std::map<std::string, Tensor> t_unpipelined_skips;

}  // namespace

thread_local const SkipScope* t_skips = nullptr;

std::vector<Tensor> split_microbatches(const Tensor& batch, int microbatches,
                                       const std::string& what) {
  GW_CHECK(microbatches >= 1 && batch.defined() && batch.dim() >= 1 &&
               batch.size(0) >= microbatches && batch.size(0) % microbatches == 0,
           InvalidArgumentError, what, " must split along dim 0 into ", microbatches,
           " micro-batches of one size, got ",
           batch.defined() ? shape_str(batch.sizes()) : std::string("none"));
  const int64_t rows = batch.size(0) / microbatches;
  std::vector<Tensor> parts;
  for (int i = 0; i < microbatches; ++i) parts.push_back(batch.narrow(0, i * rows, rows));
  return parts;
}

const Action* current_action() { return t_current_action; }

void stash(const std::string& name, const Tensor& t) {
  GW_CHECK(t.defined(), InvalidArgumentError, "[pipeline] stash(\"", name,
           "\"): the tensor is undefined");
  if (!t_skips) {
    t_unpipelined_skips[name] = t;
    return;
  }
  GW_CHECK(t_skips->outgoing->emplace(name, t).second, InvalidArgumentError, "[pipeline] stage ",
           t_skips->stage, " stashes \"", name, "\" twice in one forward");
}

Tensor pop(const std::string& name) {
  auto& table = t_skips ? *t_skips->incoming : t_unpipelined_skips;
  auto it = table.find(name);
  GW_CHECK(it != table.end(), InvalidArgumentError, "[pipeline] ",
           t_skips ? detail::str("stage ", t_skips->stage, " pops") : std::string("pop of"), " \"",
           name, "\", which no ", t_skips ? "earlier stage" : "forward on this thread", " stashed",
           t_skips ? " (or another stage popped already)" : "");
  Tensor t = std::move(it->second);
  table.erase(it);
  return t;
}

dist::WorkPtr Schedule::Impl::send(const Tensor& t, int to_stage, int tag_value) {
  if (rank_of(to_stage) == rank()) {
    local_mail[tag_value] = t.clone();
    return nullptr;
  }
  return group().send(t, rank_of(to_stage), tag_value);
}

void Schedule::Impl::recv(Tensor& t, int from_stage, int tag_value) {
  if (rank_of(from_stage) == rank()) {
    auto it = local_mail.find(tag_value);
    GW_CHECK(it != local_mail.end(), StateError, "[pipeline] stage ", from_stage,
             "'s message (tag ", tag_value, ") was not sent before it is received");
    autograd::NoGradGuard no_grad;
    t.copy_(it->second);
    local_mail.erase(it);
    return;
  }
  group().recv(t, rank_of(from_stage), tag_value)->wait();
}

Schedule::Schedule(std::vector<std::shared_ptr<PipelineStage>> stages, Plan plan, LossFn loss,
                   ScheduleOptions options)
    : impl_(std::make_unique<Impl>()) {
  GW_CHECK(!stages.empty() && loss != nullptr, InvalidArgumentError,
           "[pipeline] Schedule needs this rank's stages and a loss function");
  for (const auto& st : stages)
    GW_CHECK(st != nullptr, InvalidArgumentError, "[pipeline] a stage is null");
  std::sort(stages.begin(), stages.end(),
            [](const auto& a, const auto& b) { return a->index() < b->index(); });
  const int ranks = stages.front()->group().size(), rank = stages.front()->group().rank();
  const int num_stages = stages.front()->num_stages();
  int microbatches = 0;
  for (const auto& actions : plan)
    for (const Action& a : actions) microbatches = std::max(microbatches, a.microbatch + 1);
  GW_CHECK(static_cast<int>(plan.size()) == ranks && stages_of(plan) == num_stages,
           InvalidArgumentError, "[pipeline] the plan is for ", plan.size(), " ranks and ",
           stages_of(plan), " stages; the group has ", ranks, " ranks and the stages say ",
           num_stages);
  check_plan(plan, num_stages, microbatches);
  // This rank's stages: exactly r, r + ranks, ...
  GW_CHECK(static_cast<int>(stages.size()) == num_stages / ranks, InvalidArgumentError,
           "[pipeline] rank ", rank, " holds ", num_stages / ranks, " of the ", num_stages,
           " stages, but was given ", stages.size());
  for (size_t i = 0; i < stages.size(); ++i)
    GW_CHECK(stages[i]->index() == rank + static_cast<int>(i) * ranks &&
                 stages[i]->num_stages() == num_stages,
             InvalidArgumentError, "[pipeline] rank ", rank, "'s stages must be ", rank, ", ",
             rank + ranks, ", ... of ", num_stages, "; got stage ", stages[i]->index(), " of ",
             stages[i]->num_stages());
  for (auto& st : stages) {
    impl_->stages.emplace_back();
    impl_->stages.back().stage = std::move(st);
  }
  impl_->plan = std::move(plan);
  impl_->loss = std::move(loss);
  impl_->microbatches = microbatches;
  impl_->num_stages = num_stages;
  impl_->ranks = ranks;
  impl_->data_parallel = std::move(options.data_parallel);
  impl_->before_backward = std::move(options.before_backward);
}

Schedule::~Schedule() = default;

std::map<int, size_t> last_backwards(const std::vector<Action>& actions) {
  std::map<int, size_t> last;
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].type != ActionType::Forward && actions[i].type != ActionType::BackwardInput)
      last[actions[i].stage] = i;
  return last;
}

int Schedule::microbatches() const { return impl_->microbatches; }

void Schedule::step(const Tensor& input, const Tensor& target, std::vector<double>* losses) {
  Impl& im = *impl_;
  const int m = im.microbatches, last = im.num_stages - 1;
  GW_CHECK(!im.broken, StateError, "[pipeline] an earlier step failed midway on rank ", im.rank(),
           ": its messages may still be on their way, so this schedule runs no more steps");
  im.broken = true;  // until this step ends
  if (!im.checked) {
    // A batch or plan the shape exchange refuses is refused on every rank alike, after its
    // last collective: nothing is in flight, and the next step may try again. Any other
    // failure (a peer gone, a timeout) may leave messages on their way.
    try {
      im.exchange_shapes(input, target);
    } catch (const InvalidArgumentError&) {
      im.broken = false;
      throw;
    }
  }
  const auto started = std::chrono::steady_clock::now();
  double busy = 0;
  // Times the work of action `a` (after its input arrived, before its output leaves), on the
  // stage's track of the timeline.
  auto timed = [&](const Action& a, const auto& work) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t t0_us = trace::enabled() ? trace::now_us() : 0;
    t_current_action = &a;
    struct Clear {
      ~Clear() { t_current_action = nullptr; }
    } clear;
    work();
    busy += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (trace::enabled())
      trace::complete(
          "pipeline", to_string(a, false), t0_us, trace::now_us(),
          trace::track("pipeline stage " + std::to_string(a.stage)),
          detail::str("{\"stage\": ", a.stage, ", \"microbatch\": ", a.microbatch, "}"));
  };
  auto split = [&](const Tensor& t, const char* what) {
    return split_microbatches(t, m, detail::str("[pipeline] rank ", im.rank(), "'s ", what));
  };
  const bool has_first = im.rank_of(0) == im.rank(), has_last = im.rank_of(last) == im.rank();
  const std::vector<Tensor> inputs = has_first ? split(input, "input") : std::vector<Tensor>{};
  const std::vector<Tensor> targets = has_last ? split(target, "target") : std::vector<Tensor>{};
  // The stages exchanged the first step's shapes: later micro-batches must have them.
  auto same_as_first = [&](const std::vector<Tensor>& parts, Shape& first, const char* what) {
    if (parts.empty()) return;
    if (first.empty()) first = parts[0].sizes();
    GW_CHECK(parts[0].sizes() == first, InvalidArgumentError, "[pipeline] rank ", im.rank(), "'s ",
             what, " micro-batches are ", shape_str(parts[0].sizes()), "; the pipeline's are ",
             shape_str(first), " since its first step");
  };
  same_as_first(inputs, im.input_shape, "input");
  same_as_first(targets, im.target_shape, "target");
  for (LocalStage& ls : im.stages) {
    ls.inputs.assign(static_cast<size_t>(m), Tensor());
    ls.outputs.assign(static_cast<size_t>(m), Tensor());
    ls.weights.clear();
    ls.weights.resize(static_cast<size_t>(m));
    ls.stashed.assign(static_cast<size_t>(m), {});
    if (ls.allocated) continue;
    ls.allocated = true;
    auto receiving = [](const Shape& shape, DType dtype) {
      Tensor a = empty(shape, dtype);
      if (is_floating(dtype)) a.requires_grad_();
      return a;
    };
    for (int i = 0; i < m; ++i) {
      if (!ls.stage->is_first()) ls.activations.push_back(receiving(ls.in_shape, ls.in_dtype));
      if (!ls.stage->is_last()) ls.output_grads.push_back(empty(ls.out_shape, ls.out_dtype));
      ls.popped.emplace_back();
      for (int k : ls.skips_in)
        ls.popped.back().push_back(receiving(im.skip(k).shape, im.skip(k).dtype));
      ls.stash_grads.emplace_back();
      for (int k : ls.skips_out)
        ls.stash_grads.back().push_back(empty(im.skip(k).shape, im.skip(k).dtype));
    }
  }

  std::vector<dist::WorkPtr> sends;
  auto send = [&](const Tensor& t, int to_stage, int tag) {
    if (dist::WorkPtr w = im.send(t, to_stage, tag)) sends.push_back(std::move(w));
  };
  // With replicas: each stage's gradients, averaged over them once its last backward ran.
  const std::vector<Action>& actions = im.plan[static_cast<size_t>(im.rank())];
  std::map<int, size_t> last_backward = last_backwards(actions);
  // A parameter that several of this rank's stages share (a tied weight) is averaged once, by
  // the stage whose last backward comes last: until then another stage still adds into its
  // .grad, which an average already running would race with (or, copied flat, overwrite).
  std::map<const TensorImpl*, size_t> averaged_by;  // parameter -> that last backward's index
  if (im.data_parallel)
    for (const LocalStage& ls : im.stages)
      for (const Tensor& p : ls.stage->module().parameters()) {
        size_t& at = averaged_by[p.impl()];
        at = std::max(at, last_backward[ls.stage->index()]);
      }
  std::vector<dist::WorkPtr> averages;
  auto average = [&](PipelineStage& stage) {
    std::map<DType, std::vector<Tensor>> grads;
    for (const Tensor& p : stage.module().parameters()) {
      if (!p.requires_grad() || averaged_by[p.impl()] != last_backward[stage.index()]) continue;
      Tensor g = p.grad();
      if (!g.defined() || !g.is_contiguous()) {
        g = g.defined() ? g.contiguous() : zeros_like(p);
        p.set_grad(g);
      }
      grads[g.dtype()].push_back(g);
    }
    for (auto& [dtype, same] : grads)
      averages.push_back(im.data_parallel->allreduce_coalesced(same, {.op = dist::ReduceOp::AVG}));
  };
  for (size_t index = 0; index < actions.size(); ++index) {
    const Action& a = actions[index];
    LocalStage& ls = im.local(a.stage);
    PipelineStage& stage = *ls.stage;
    const auto mb = static_cast<size_t>(a.microbatch);
    if (im.before_backward && a.type != ActionType::Forward)
      im.before_backward(a.stage, last_backward[a.stage] == index);
    Tensor& x = ls.inputs[mb];
    Tensor& y = ls.outputs[mb];  // the last stage's: its loss, divided
    switch (a.type) {
      case ActionType::Forward: {
        if (stage.is_first()) {
          x = inputs[mb];
        } else {
          x = ls.activations[mb];
          x.set_grad(Tensor());
          im.recv(x, a.stage - 1, im.tag(a.stage, a.microbatch, false));
        }
        // The skips it pops, received; those it stashes, collected.
        std::map<std::string, Tensor> incoming, outgoing;
        for (size_t j = 0; j < ls.skips_in.size(); ++j) {
          const int k = ls.skips_in[j];
          Tensor& buffer = ls.popped[mb][j];
          buffer.set_grad(Tensor());
          im.recv(buffer, im.skip(k).from, im.skip_tag(k, a.microbatch, false));
          incoming[im.skip(k).name] = buffer;
        }
        const SkipScope scope{a.stage, &incoming, &outgoing};
        timed(a, [&] {
          InSkipScope in_scope(&scope);
          y = stage.module()(x);
          if (!stage.is_last()) return;
          Tensor l = im.loss(y, targets[mb]);
          if (losses) losses->push_back(l.item<double>());
          y = l / static_cast<double>(m);  // what its backward starts from
        });
        // Everything it passes on is checked before any of it leaves.
        GW_CHECK(stage.is_last() || (y.sizes() == ls.out_shape && y.dtype() == ls.out_dtype),
                 InvalidArgumentError, "[pipeline] stage ", a.stage, " gave ", shape_str(y.sizes()),
                 " ", y.dtype(), " for micro-batch ", mb, " but passed ", shape_str(ls.out_shape),
                 " ", ls.out_dtype, " before: the micro-batches' shapes must not change");
        for (int k : ls.skips_out) {
          const Skip& skip = im.skip(k);
          auto it = outgoing.find(skip.name);
          GW_CHECK(it != outgoing.end() && it->second.sizes() == skip.shape &&
                       it->second.dtype() == skip.dtype,
                   InvalidArgumentError, "[pipeline] stage ", a.stage, " stashed \"", skip.name,
                   "\" as ", shape_str(skip.shape), " ", skip.dtype, " before the first step, but ",
                   it == outgoing.end() ? std::string("not in micro-batch ") + std::to_string(mb)
                                        : detail::str(shape_str(it->second.sizes()), " ",
                                                      it->second.dtype(), " in micro-batch ", mb));
          ls.stashed[mb].push_back(it->second);
          outgoing.erase(it);
        }
        GW_CHECK(outgoing.empty(), InvalidArgumentError, "[pipeline] stage ", a.stage,
                 " stashed \"", outgoing.empty() ? "" : outgoing.begin()->first,
                 "\" in micro-batch ", mb, " but not before the first step: no stage pops it");
        if (!stage.is_last())
          send(y.detach().contiguous(), a.stage + 1, im.tag(a.stage + 1, a.microbatch, false));
        for (size_t j = 0; j < ls.skips_out.size(); ++j) {
          const int k = ls.skips_out[j];
          send(ls.stashed[mb][j].detach().contiguous(), im.skip(k).to,
               im.skip_tag(k, a.microbatch, false));
        }
        break;
      }
      case ActionType::Backward:
      case ActionType::BackwardInput: {
        const bool whole = a.type == ActionType::Backward;
        // What the backward starts from: the output and the stashed skips that need a
        // gradient, with the gradients the later stages sent for them.
        std::vector<Tensor> outputs, grad_outputs;
        if (y.requires_grad()) {
          outputs.push_back(y);
          grad_outputs.emplace_back();  // the last stage's loss: a scalar, ones
        }
        if (!stage.is_last()) {
          Tensor& g = ls.output_grads[mb];  // d loss / d y
          im.recv(g, a.stage + 1, im.tag(a.stage, a.microbatch, true));
          if (!grad_outputs.empty()) grad_outputs.back() = g;
        }
        for (size_t j = 0; j < ls.skips_out.size(); ++j) {
          const int k = ls.skips_out[j];
          if (!is_floating(im.skip(k).dtype)) continue;
          Tensor& g = ls.stash_grads[mb][j];
          im.recv(g, im.skip(k).to, im.skip_tag(k, a.microbatch, true));
          if (ls.stashed[mb][j].requires_grad()) {
            outputs.push_back(ls.stashed[mb][j]);
            grad_outputs.push_back(g);
          }
        }
        // ... and what the earlier stages wait for: the gradients of its input and its popped
        // skips.
        std::vector<Tensor> inputs;
        if (!stage.is_first() && x.requires_grad()) inputs.push_back(x);
        for (const Tensor& p : ls.popped[mb])
          if (p.requires_grad()) inputs.push_back(p);
        std::vector<Tensor> grads(inputs.size());
        timed(a, [&] {
          if (outputs.empty()) return;
          if (whole) {
            autograd::backward(outputs, grad_outputs);
            for (size_t i = 0; i < inputs.size(); ++i) grads[i] = inputs[i].grad();
          } else {
            grads = autograd::backward_input(outputs, inputs, grad_outputs, ls.weights[mb]);
          }
        });
        auto send_back = [&](const Tensor& grad, const Shape& shape, DType dtype, int to_stage,
                             int tag_value) {
          send(grad.defined() ? grad.contiguous() : zeros(shape, dtype), to_stage, tag_value);
        };
        size_t next = 0;
        if (!stage.is_first()) {
          send_back(x.requires_grad() ? grads[next++] : Tensor(), ls.in_shape, ls.in_dtype,
                    a.stage - 1, im.tag(a.stage - 1, a.microbatch, true));
          if (whole) x.set_grad(Tensor());  // the send holds what it sends
        }
        for (size_t j = 0; j < ls.skips_in.size(); ++j) {
          const int k = ls.skips_in[j];
          Tensor& p = ls.popped[mb][j];
          if (!p.requires_grad()) continue;
          send_back(grads[next++], im.skip(k).shape, im.skip(k).dtype, im.skip(k).from,
                    im.skip_tag(k, a.microbatch, true));
          if (whole) p.set_grad(Tensor());
        }
        x = Tensor();  // the graph's other activations go with them (W keeps its own)
        y = Tensor();
        ls.stashed[mb].clear();
        break;
      }
      case ActionType::BackwardWeight:
        timed(a, [&] { ls.weights[mb].run(); });
        break;
    }
    if (im.data_parallel && last_backward[a.stage] == index) average(stage);
  }
  for (auto& w : sends) w->wait();
  for (auto& w : averages) w->wait();
  im.broken = false;
  last_step_ = {std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
                busy};
}

}  // namespace gw::pipeline
