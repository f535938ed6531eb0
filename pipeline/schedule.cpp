#include "pipeline/schedule.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/trace.h"
#include "dist/process_group/c10d.h"

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

// Tags: 0 and 1 for the shapes and the skips before the first step (between two ranks they go
// in stage order), then one per receiving stage, micro-batch and direction, then one per skip,
// micro-batch and direction: small, as MPI guarantees only 32767.
constexpr int kShapeTag = 0, kSkipTableTag = 1;
constexpr int64_t kMaxDims = 8;

// What stash and pop work on: the running stage's forward (the schedule's), or outside a
// schedule this thread's own table, so that the same modules also run unpipelined.
struct SkipScope {
  int stage = -1;
  std::map<std::string, Tensor>* incoming = nullptr;  // what pop takes, by name
  std::map<std::string, Tensor>* outgoing = nullptr;  // what stash gives, by name
};
thread_local const SkipScope* t_skips = nullptr;
thread_local std::map<std::string, Tensor> t_unpipelined_skips;

class InSkipScope {
 public:
  explicit InSkipScope(const SkipScope* scope) : prev_(t_skips) { t_skips = scope; }
  ~InSkipScope() { t_skips = prev_; }
  InSkipScope(const InSkipScope&) = delete;
  InSkipScope& operator=(const InSkipScope&) = delete;

 private:
  const SkipScope* prev_;
};

// What a stage passes on, as an int64 tensor: dtype, dims (or -1: the stage failed), sizes, and
// the length of the skips message that follows (skips stashed and not popped yet).
Tensor describe(const Tensor* t, int64_t skips_length) {
  std::vector<int64_t> v(3 + kMaxDims, 0);
  v[1] = -1;
  v[2 + kMaxDims] = skips_length;
  if (t) {
    v[0] = static_cast<int64_t>(t->dtype());
    v[1] = t->dim();
    for (int64_t d = 0; d < t->dim(); ++d) v[static_cast<size_t>(2 + d)] = t->size(d);
  }
  return from_vector<int64_t>(v);
}

}  // namespace

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

// One of this rank's stages, and what it keeps from step to step and within one.
struct LocalStage {
  std::shared_ptr<PipelineStage> stage;
  Shape in_shape, out_shape;
  DType in_dtype = kFloat32, out_dtype = kFloat32;
  std::vector<Tensor> activations, output_grads;  // per micro-batch, kept between steps
  bool allocated = false;                         // those two, at the first step
  std::vector<Tensor> inputs, outputs;            // per micro-batch, within a step
  std::vector<autograd::WeightGradients> weights;  // what each I leaves for its W
  // Skip connections: indices into Impl::skips of those this stage stashes and pops; per
  // micro-batch, the tensors it stashed (within a step), and the buffers it receives popped
  // skips and their gradients into (kept between steps).
  std::vector<int> skips_out, skips_in;
  std::vector<std::vector<Tensor>> stashed, popped, stash_grads;
};

// A skip connection: `name`, stashed by stage `from` and popped by stage `to`.
struct Skip {
  std::string name;
  int from = 0, to = 0;
  Shape shape;
  DType dtype = kFloat32;
};

struct Schedule::Impl {
  std::vector<LocalStage> stages;  // by stage index / ranks
  Plan plan;
  LossFn loss;
  int microbatches = 0, num_stages = 0, ranks = 0;
  bool checked = false;  // the shapes were exchanged and every stage ran them
  bool broken = false;   // a step failed midway: messages of it may still be on their way
  Shape input_shape, target_shape;  // of the first step's micro-batches, kept from then on
  // A stage's messages to a stage on the same rank (one rank only: every stage here).
  std::map<int, Tensor> local_mail;

  dist::ProcessGroup& group() { return stages.front().stage->group(); }
  int rank() { return group().rank(); }
  LocalStage& local(int s) { return stages[static_cast<size_t>(s / ranks)]; }
  int rank_of(int s) const { return s % ranks; }
  std::shared_ptr<dist::ProcessGroup> data_parallel;  // ScheduleOptions::data_parallel
  std::function<void(int, bool)> before_backward;     // ScheduleOptions::before_backward
  std::vector<Skip> skips;  // every stage's, in one order on every rank
  const Skip& skip(int k) const { return skips[static_cast<size_t>(k)]; }
  // A message's tag: the receiving stage, the micro-batch and the direction.
  int tag(int to_stage, int microbatch, bool gradient) const {
    return 2 + (to_stage * microbatches + microbatch) * 2 + (gradient ? 1 : 0);
  }
  int skip_tag(int skip, int microbatch, bool gradient) const {
    return tag(num_stages, 0, false) + (skip * microbatches + microbatch) * 2 + (gradient ? 1 : 0);
  }
  dist::WorkPtr send(const Tensor& t, int to_stage, int tag_value);
  void recv(Tensor& t, int from_stage, int tag_value);
  void exchange_shapes(const Tensor& input, const Tensor& target);
};

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

// Skips as int64s: per skip its stages, dtype, dims, sizes, and its name's length and bytes.
std::vector<int64_t> encode(const std::vector<Skip>& skips) {
  std::vector<int64_t> v;
  for (const Skip& k : skips) {
    v.insert(v.end(),
             {k.from, k.to, static_cast<int64_t>(k.dtype), static_cast<int64_t>(k.shape.size())});
    for (int64_t d = 0; d < kMaxDims; ++d)
      v.push_back(d < static_cast<int64_t>(k.shape.size()) ? k.shape[static_cast<size_t>(d)] : 0);
    v.push_back(static_cast<int64_t>(k.name.size()));
    for (char c : k.name) v.push_back(static_cast<unsigned char>(c));
  }
  return v;
}

std::vector<Skip> decode(const std::vector<int64_t>& v) {
  std::vector<Skip> skips;
  for (size_t i = 0; i < v.size();) {
    Skip k;
    k.from = static_cast<int>(v.at(i));
    k.to = static_cast<int>(v.at(i + 1));
    k.dtype = static_cast<DType>(v.at(i + 2));
    k.shape = Shape(v.begin() + static_cast<ptrdiff_t>(i + 4),
                    v.begin() + static_cast<ptrdiff_t>(i + 4 + static_cast<size_t>(v.at(i + 3))));
    i += 4 + static_cast<size_t>(kMaxDims);
    const auto length = static_cast<size_t>(v.at(i++));
    for (size_t c = 0; c < length; ++c) k.name += static_cast<char>(v.at(i++));
    skips.push_back(std::move(k));
  }
  return skips;
}

namespace {

// The first line where two plans' texts differ, as "<a_name>: ...\n<b_name>: ...\n", each cut to
// a window around the first character that differs (a line of thousands of micro-batches runs
// to pages).
std::string first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                             const std::string& a_name, const std::string& b_name) {
  size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
  size_t line = at;  // where that line starts, the same in both
  while (line > 0 && a[line - 1] != '\n') --line;
  constexpr size_t kBefore = 60, kShown = 200;
  const size_t from = std::max(line, at > kBefore ? at - kBefore : size_t{0});
  auto window = [&](const std::vector<uint8_t>& text) {
    std::string out = from > line ? "..." : "";
    size_t i = from;
    for (; i < text.size() && i < from + kShown && text[i] != '\n'; ++i)
      out += static_cast<char>(text[i]);
    if (i < text.size() && text[i] != '\n') out += "...";
    return out;
  };
  return a_name + ": " + window(a) + "\n" + b_name + ": " + window(b) + "\n";
}

}  // namespace

// Before the first step: stage by stage, what each passes on (a forward of the first
// micro-batch's shape, in eval mode and without gradients, so that nothing is drawn or
// recorded), then every rank learns whether every stage could run, and whether every rank runs
// the same plan. Any failure is raised on every rank, naming the first stage that failed.
void Schedule::Impl::exchange_shapes(const Tensor& input, const Tensor& target) {
  std::string failure;
  std::vector<Skip> popped;  // by this rank's stages, with the stage that stashed each
  skips.clear();
  for (LocalStage& ls : stages) {
    ls.skips_out.clear();
    ls.skips_in.clear();
  }
  for (LocalStage& ls : stages) {  // in stage order: a chain across the ranks
    PipelineStage& stage = *ls.stage;
    const int s = stage.index();
    bool previous_failed = false;
    std::vector<Skip> carried;  // stashed by earlier stages, not popped yet
    if (!stage.is_first()) {
      Tensor meta = empty({3 + kMaxDims}, kInt64);
      recv(meta, s - 1, kShapeTag);
      const std::vector<int64_t> v = meta.to_vector<int64_t>();
      previous_failed = v[1] < 0 || v[1] > kMaxDims;
      if (!previous_failed) {
        ls.in_dtype = static_cast<DType>(v[0]);
        ls.in_shape = Shape(v.begin() + 2, v.begin() + 2 + v[1]);
      }
      if (v[2 + kMaxDims] > 0) {
        Tensor table = empty({v[2 + kMaxDims]}, kInt64);
        recv(table, s - 1, kSkipTableTag);
        carried = decode(table.to_vector<int64_t>());
      }
    }
    Tensor output;
    if (!previous_failed && failure.empty()) {
      try {
        autograd::NoGradGuard no_grad;
        nn::Module& m = stage.module();
        // Every module's mode, to restore each (some may be in eval mode on purpose).
        struct Restore {
          std::vector<std::pair<nn::Module*, bool>> modes;
          ~Restore() {
            for (auto& [module, training] : modes) module->train(training);  // parents first
          }
        } restore;
        std::vector<nn::Module*> walk{&m};
        while (!walk.empty()) {
          nn::Module* mod = walk.back();
          walk.pop_back();
          restore.modes.emplace_back(mod, mod->is_training());
          for (const auto& child : mod->children()) walk.push_back(child.get());
        }
        m.eval();
        Tensor x;
        if (stage.is_first()) {
          x = split_microbatches(input, microbatches, "the first stage's input")[0];
        } else {
          x = zeros(ls.in_shape, ls.in_dtype);
        }
        // What it may pop: every skip carried to it, as zeros of the skip's shape.
        std::map<std::string, Tensor> incoming, outgoing;
        for (const Skip& k : carried) incoming[k.name] = zeros(k.shape, k.dtype);
        const SkipScope scope{s, &incoming, &outgoing};
        {
          InSkipScope in_scope(&scope);
          output = m(x);
        }
        GW_CHECK(stage.is_last() || output.dim() <= kMaxDims, InvalidArgumentError,
                 "its output has ", output.dim(), " dims; a stage passes at most ", kMaxDims);
        if (stage.is_last()) {
          loss(output, split_microbatches(target, microbatches, "the last stage's target")[0]);
        }
        // What it popped leaves the carried list for the routes; what it stashed joins it.
        std::vector<Skip> left;
        for (Skip& k : carried) {
          if (incoming.count(k.name)) {
            left.push_back(std::move(k));
          } else {
            k.to = s;
            popped.push_back(std::move(k));
          }
        }
        for (auto& [name, t] : outgoing) {
          for (const Skip& k : left)
            GW_CHECK(k.name != name, InvalidArgumentError, "it stashes \"", name,
                     "\", which stage ", k.from, " stashed and no stage popped yet");
          GW_CHECK(t.dim() <= kMaxDims, InvalidArgumentError, "its skip \"", name, "\" has ",
                   t.dim(), " dims; a skip passes at most ", kMaxDims);
          left.push_back({name, s, -1, t.sizes(), t.dtype()});
        }
        carried = std::move(left);
      } catch (const std::exception& e) {
        failure = detail::str("stage ", s, " cannot run ",
                              stage.is_first()
                                  ? std::string("its input")
                                  : detail::str("what stage ", s - 1, " passes (",
                                                shape_str(ls.in_shape), " ", ls.in_dtype, ")"),
                              ": ", e.what());
        output = Tensor();
      }
    }
    if (stage.is_last() && failure.empty() && !carried.empty())
      failure = detail::str("no stage pops \"", carried.front().name, "\", which stage ",
                            carried.front().from, " stashes");
    if (!stage.is_last()) {
      const std::vector<int64_t> table = encode(carried);
      dist::WorkPtr w =
          send(describe(output.defined() ? &output : nullptr, static_cast<int64_t>(table.size())),
               s + 1, kShapeTag);
      if (w) w->wait();
      if (!table.empty()) {
        w = send(from_vector<int64_t>(table), s + 1, kSkipTableTag);
        if (w) w->wait();
      }
    }
    if (output.defined()) {
      ls.out_shape = output.sizes();
      ls.out_dtype = output.dtype();
    }
  }
  // Every rank: the skips' routes, which their popping stages learnt.
  std::vector<int64_t> routes = encode(popped);
  std::vector<uint8_t> route_bytes(routes.size() * sizeof(int64_t));
  if (!routes.empty()) std::memcpy(route_bytes.data(), routes.data(), route_bytes.size());
  for (const auto& bytes : dist::all_gather_bytes(group(), route_bytes)) {
    std::vector<int64_t> v(bytes.size() / sizeof(int64_t));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
    for (Skip& k : decode(v)) skips.push_back(std::move(k));
  }
  std::sort(skips.begin(), skips.end(), [](const Skip& a, const Skip& b) {
    return std::tie(a.from, a.to, a.name) < std::tie(b.from, b.to, b.name);
  });
  for (int k = 0; k < static_cast<int>(skips.size()); ++k) {
    const Skip& skip = skips[static_cast<size_t>(k)];
    if (rank_of(skip.from) == rank()) local(skip.from).skips_out.push_back(k);
    if (rank_of(skip.to) == rank()) local(skip.to).skips_in.push_back(k);
  }
  // Every rank: the first failure, and the plans.
  const std::string mine = (failure.empty() ? "0" : "1") + failure;
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
             " runs another schedule than rank 0; the first line where they differ:\n",
             first_difference(plans[0], plans[r], "rank 0", "rank " + std::to_string(r)));
  // MPI promises tags up to 32767 only. Checked once every rank is known to run this plan, with
  // the same skips: every rank refuses alike, before any step. (In 64 bits: a plan of millions
  // of micro-batches must not wrap around to a small tag.)
  const int64_t m = microbatches;
  const int64_t largest_tag =
      2 + 2 * int64_t{num_stages} * m + 2 * static_cast<int64_t>(skips.size()) * m - 1;
  GW_CHECK(largest_tag <= 32767, InvalidArgumentError, "[pipeline] ", num_stages, " stages, ",
           microbatches, " micro-batches and ", skips.size(), " skips need message tags up to ",
           largest_tag, "; MPI promises 32767");
  checked = true;
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
  std::map<int, size_t> last_backward;  // stage -> index in `actions`
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].type != ActionType::Forward && actions[i].type != ActionType::BackwardInput)
      last_backward[actions[i].stage] = i;
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
