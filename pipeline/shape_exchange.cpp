#include "pipeline/schedule_impl.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "core/ops.h"
#include "dist/process_group/c10d.h"

namespace gw::pipeline {

namespace {

constexpr int64_t kMaxDims = 8;  // of what a stage or a skip passes on

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

// What the replicas of this rank's stages (ScheduleOptions::data_parallel) must agree on for
// their gradients' averages to pair up, one line each: the order in which the stages average
// (that of their last backwards in this rank's actions), and every stage's parameters in order
// (dtype, shape, whether trained, and which earlier one it is where tied: averaged once, by the
// stage that averages last).
std::string replica_terms(const std::vector<Action>& actions,
                          const std::vector<LocalStage>& stages) {
  std::map<size_t, int> order;  // index of the last backward -> stage
  for (const auto& [stage, index] : last_backwards(actions)) order[index] = stage;
  std::string out = "stages average in the order:";
  for (const auto& [index, stage] : order) out += " " + std::to_string(stage);
  std::map<const TensorImpl*, std::string> seen;
  for (const LocalStage& ls : stages) {
    const std::vector<Tensor> params = ls.stage->module().parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i];
      const std::string name =
          "stage " + std::to_string(ls.stage->index()) + " parameter " + std::to_string(i);
      out += "\n" + name + ": ";
      auto [it, fresh] = seen.emplace(p.impl(), name);
      out += fresh ? gw::detail::str(dtype_name(p.dtype()), " ", shape_str(p.sizes()),
                                     p.requires_grad() ? " trained" : " frozen")
                   : "tied to " + it->second;
    }
  }
  return out;
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
  // With replicas: every replica of this rank's stages, the same terms; a difference is this
  // rank's failure, which the pipeline's other ranks then learn too.
  if (data_parallel) {
    const std::string terms = replica_terms(plan[static_cast<size_t>(rank())], stages);
    const auto replicas = dist::all_gather_bytes(*data_parallel, {terms.begin(), terms.end()});
    for (size_t r = 1; r < replicas.size() && failure.empty(); ++r)
      if (replicas[r] != replicas[0])
        failure = detail::str(
            "replica ", r, " of rank ", rank(),
            "'s stages (ScheduleOptions::data_parallel) differs from replica 0, so that their "
            "gradients' averages would not pair up; the first line where they differ:\n",
            first_difference(replicas[0], replicas[r], "replica 0",
                             "replica " + std::to_string(r)));
  }
  // Every rank: the first failure, and the plans.
  const std::string mine = (failure.empty() ? "0" : "1") + failure;
  // The plan, and whether the rank runs with replicas (and how many): a pipeline whose ranks
  // disagree there would average on some ranks only.
  const std::string plan_text =
      detail::str(to_string(plan), "\nreplicas: ", data_parallel ? data_parallel->size() : 0, "\n");
  const auto reports =
      dist::all_gather_bytes(group(), std::vector<uint8_t>(mine.begin(), mine.end()));
  const auto plans =
      dist::all_gather_bytes(group(), std::vector<uint8_t>(plan_text.begin(), plan_text.end()));
  // The verdict: why this pipeline cannot run, or nothing.
  std::string verdict;
  for (const auto& r : reports)
    if (verdict.empty() && !r.empty() && r[0] == '1') verdict.assign(r.begin() + 1, r.end());
  for (size_t r = 1; r < plans.size() && verdict.empty(); ++r)
    if (plans[r] != plans[0])
      verdict =
          detail::str("rank ", r,
                      " runs another schedule than rank 0; the first line where they "
                      "differ:\n",
                      first_difference(plans[0], plans[r], "rank 0", "rank " + std::to_string(r)));
  // MPI promises tags up to 32767 only. Checked once every rank is known to run this plan, with
  // the same skips: every rank refuses alike, before any step. (In 64 bits: a plan of millions
  // of micro-batches must not wrap around to a small tag.)
  const int64_t m = microbatches;
  const int64_t largest_tag =
      2 + 2 * int64_t{num_stages} * m + 2 * static_cast<int64_t>(skips.size()) * m - 1;
  if (verdict.empty() && largest_tag > 32767)
    verdict =
        detail::str(num_stages, " stages, ", microbatches, " micro-batches and ", skips.size(),
                    " skips need message tags up to ", largest_tag, "; MPI promises 32767");
  // With replicas, every replica's verdict: a pipeline whose replica cannot run does not run
  // either (it would wait on that replica's averages).
  if (data_parallel) {
    const auto verdicts = dist::all_gather_bytes(*data_parallel, {verdict.begin(), verdict.end()});
    for (size_t r = 0; r < verdicts.size() && verdict.empty(); ++r)
      if (!verdicts[r].empty())
        verdict = detail::str("replica ", r, " cannot take its first step: ",
                              std::string(verdicts[r].begin(), verdicts[r].end()));
  }
  GW_CHECK(verdict.empty(), InvalidArgumentError, "[pipeline] ", verdict);
  checked = true;
}

}  // namespace gw::pipeline
