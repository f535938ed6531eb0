// Schedules as data: the plans of GPipe, 1F1B, interleaved 1F1B and zero bubble, their text,
// and the check that a plan is complete and cannot deadlock (pipeline/schedule.h).
#include <algorithm>
#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace gw::pipeline {

// --- plans -------------------------------------------------------------------------------------

namespace {

void check_sizes(const char* who, int stages, int microbatches) {
  GW_CHECK(stages >= 1 && microbatches >= 1, InvalidArgumentError, "[pipeline] ", who,
           " needs at least one stage and one micro-batch, got ", stages, " stages and ",
           microbatches, " micro-batches");
}

const char* letter(ActionType t) {
  switch (t) {
    case ActionType::Forward:
      return "F";
    case ActionType::Backward:
      return "B";
    case ActionType::BackwardInput:
      return "I";
    case ActionType::BackwardWeight:
      return "W";
  }
  return "?";
}

bool is_backward(ActionType t) {
  return t == ActionType::Backward ||
         t == ActionType::BackwardInput;  // what the previous waits for
}

}  // namespace

std::string to_string(const Action& a, bool with_stage) {
  return letter(a.type) + std::to_string(a.microbatch) +
         (with_stage ? "@" + std::to_string(a.stage) : "");
}

int stages_of(const Plan& plan) {
  int stages = 0;
  for (const auto& actions : plan)
    for (const Action& a : actions) stages = std::max(stages, a.stage + 1);
  return stages;
}

Plan gpipe(int stages, int microbatches) {
  check_sizes("gpipe", stages, microbatches);
  Plan plan(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    auto& actions = plan[static_cast<size_t>(s)];
    for (int mb = 0; mb < microbatches; ++mb) actions.push_back({ActionType::Forward, mb, s});
    for (int mb = microbatches - 1; mb >= 0; --mb) actions.push_back({ActionType::Backward, mb, s});
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
    while (forward < warmup) actions.push_back({ActionType::Forward, forward++, s});
    while (forward < microbatches) {  // steady state: one forward, one backward
      actions.push_back({ActionType::Forward, forward++, s});
      actions.push_back({ActionType::Backward, backward++, s});
    }
    while (backward < microbatches) actions.push_back({ActionType::Backward, backward++, s});
  }
  return plan;
}

Plan interleaved_one_f_one_b(int ranks, int stages_per_rank, int microbatches) {
  check_sizes("interleaved 1f1b", ranks * stages_per_rank, microbatches);
  GW_CHECK(stages_per_rank >= 1 && microbatches % ranks == 0, InvalidArgumentError,
           "[pipeline] interleaved 1F1B runs micro-batches in groups of the ranks: ", microbatches,
           " micro-batches is not a multiple of ", ranks, " ranks");
  const int p = ranks, v = stages_per_rank, total = microbatches * stages_per_rank;
  Plan plan(static_cast<size_t>(p));
  // The k-th forward of a rank: chunk (k / p) % v of micro-batch (k / (p v)) p + k % p; its
  // backwards go through the chunks the other way round.
  auto microbatch_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  for (int r = 0; r < p; ++r) {
    auto& actions = plan[static_cast<size_t>(r)];
    auto forward = [&](int k) {
      actions.push_back({ActionType::Forward, microbatch_of(k), ((k / p) % v) * p + r});
    };
    auto backward = [&](int k) {
      actions.push_back({ActionType::Backward, microbatch_of(k), (v - 1 - (k / p) % v) * p + r});
    };
    const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    int f = 0, b = 0;
    while (f < warmup) forward(f++);
    while (f < total) {
      forward(f++);
      backward(b++);
    }
    while (b < total) backward(b++);
  }
  return plan;
}

Plan zero_bubble(int stages, int microbatches, int pending_weights) {
  check_sizes("zb", stages, microbatches);
  if (pending_weights == 0) pending_weights = stages;
  GW_CHECK(pending_weights >= 1, InvalidArgumentError,
           "[pipeline] zero_bubble needs at least one micro-batch allowed to wait for its W, got ",
           pending_weights);
  const int p = stages, m = microbatches;
  // Each action's length: F, I and W one unit each, but on the first stage, whose input needs no
  // gradient, I is empty and W is the whole backward.
  auto length = [](int s, ActionType t) {
    if (s > 0 || t == ActionType::Forward) return 1;
    return t == ActionType::BackwardInput ? 0 : 2;
  };
  Plan plan(static_cast<size_t>(p));
  // When each F and I ends (-1: not yet run), where each stage is, and when it is free.
  std::vector<std::vector<int>> f_end(p, std::vector<int>(m, -1)),
      i_end(p, std::vector<int>(m, -1));
  std::vector<int> next_f(p, 0), next_i(p, 0), next_w(p, 0), free_at(p, 0);
  for (int t = 0, left = 3 * p * m; left > 0; ++t) {
    GW_CHECK(t < 8 * p * m + 8, StateError, "[pipeline] zero_bubble: no plan for ", p,
             " stages and ", m, " micro-batches");
    auto arrived = [t](int end) { return end >= 0 && end <= t; };
    for (int s = 0; s < p; ++s) {
      while (free_at[s] <= t && left > 0) {
        const int i = next_i[s], f = next_f[s], w = next_w[s];
        // An I whose gradient arrived (or the last stage's, after its forward) comes first.
        const bool i_ready =
            i < f && arrived(f_end[s][i]) && (s == p - 1 || arrived(i_end[s + 1][i]));
        // Activations held as 1F1B holds them: from F to I, but on the first stage, whose I
        // frees nothing, to W.
        const bool holds_room = s == 0 ? f - w < p : f - i < p - s;
        const bool f_ready =
            f < m && (s == 0 || arrived(f_end[s - 1][f])) && holds_room && i - w < pending_weights;
        Action a;
        if (i_ready) {
          a = {ActionType::BackwardInput, next_i[s]++, s};
          i_end[s][i] = t + length(s, a.type);
        } else if (f_ready) {
          a = {ActionType::Forward, next_f[s]++, s};
          f_end[s][f] = t + length(s, a.type);
        } else if (w < i) {
          a = {ActionType::BackwardWeight, next_w[s]++, s};
        } else {
          break;  // idle this unit
        }
        plan[static_cast<size_t>(s)].push_back(a);
        free_at[s] = t + length(s, a.type);
        --left;
      }
    }
  }
  return plan;
}

Plan make_plan(const std::string& name, int ranks, int microbatches) {
  if (name == "gpipe") return gpipe(ranks, microbatches);
  if (name == "1f1b") return one_f_one_b(ranks, microbatches);
  if (name == "interleaved") return interleaved_one_f_one_b(ranks, 2, microbatches);
  if (name == "zb") return zero_bubble(ranks, microbatches);
  throw InvalidArgumentError(
      detail::str("[pipeline] unknown schedule \"", name, "\" (gpipe, 1f1b, interleaved or zb)"));
}

std::string to_string(const Plan& plan) {
  bool one_per_rank = true;
  for (size_t r = 0; r < plan.size(); ++r)
    for (const Action& a : plan[r]) one_per_rank = one_per_rank && a.stage == static_cast<int>(r);
  std::string out;
  for (size_t r = 0; r < plan.size(); ++r) {
    out += (one_per_rank ? "stage " : "rank ") + std::to_string(r) + ":";
    for (const Action& a : plan[r]) out += " " + to_string(a, !one_per_rank);
    out += "\n";
  }
  return out;
}

void check_plan(const Plan& plan, int stages, int microbatches) {
  check_sizes("check_plan", stages, microbatches);
  const int ranks = static_cast<int>(plan.size());
  GW_CHECK(ranks >= 1 && stages % ranks == 0, InvalidArgumentError, "[pipeline] ", stages,
           " stages do not spread evenly over the plan's ", ranks, " ranks");
  const auto n = static_cast<size_t>(microbatches);
  // count[type][stage][mb]; each stage's actions on its rank, in order.
  std::vector<std::vector<std::vector<int>>> count(
      4, std::vector<std::vector<int>>(static_cast<size_t>(stages), std::vector<int>(n, 0)));
  auto counted = [&](ActionType t, int s, int mb) -> int& {
    return count[static_cast<size_t>(t)][static_cast<size_t>(s)][static_cast<size_t>(mb)];
  };
  for (int r = 0; r < ranks; ++r)
    for (const Action& a : plan[static_cast<size_t>(r)]) {
      GW_CHECK(a.stage >= 0 && a.stage < stages && a.stage % ranks == r, InvalidArgumentError,
               "[pipeline] rank ", r, " runs ", to_string(a),
               ", a stage that is not its own (stage s "
               "runs on rank s % ",
               ranks, ")");
      GW_CHECK(a.microbatch >= 0 && a.microbatch < microbatches, InvalidArgumentError,
               "[pipeline] rank ", r, "'s ", to_string(a), " names a micro-batch outside 0..",
               microbatches - 1);
      const bool after =
          a.type == ActionType::Forward || counted(ActionType::Forward, a.stage, a.microbatch) == 1;
      GW_CHECK(after && (a.type != ActionType::BackwardWeight ||
                         counted(ActionType::BackwardInput, a.stage, a.microbatch) == 1),
               InvalidArgumentError, "[pipeline] rank ", r, " runs ", to_string(a), " before its ",
               a.type == ActionType::BackwardWeight ? "I" : "forward");
      ++counted(a.type, a.stage, a.microbatch);
    }
  for (int s = 0; s < stages; ++s)
    for (int mb = 0; mb < microbatches; ++mb) {
      const int f = counted(ActionType::Forward, s, mb), b = counted(ActionType::Backward, s, mb),
                i = counted(ActionType::BackwardInput, s, mb),
                w = counted(ActionType::BackwardWeight, s, mb);
      GW_CHECK(f == 1 && ((b == 1 && i == 0 && w == 0) || (b == 0 && i == 1 && w == 1)),
               InvalidArgumentError, "[pipeline] stage ", s, " runs micro-batch ", mb,
               "'s forward ", f, " times and its backward ", b, " times (I ", i, ", W ", w,
               "); a forward, and a backward or an I and a W, once each for ", microbatches,
               " micro-batches");
    }
  // Simulated: sends never block, a receive waits for its sender. Each round runs at least one
  // action, so at most as many rounds as actions.
  std::vector<std::vector<bool>> forward_done(static_cast<size_t>(stages), std::vector<bool>(n)),
      backward_done(static_cast<size_t>(stages), std::vector<bool>(n));
  std::vector<size_t> next(static_cast<size_t>(ranks), 0);
  auto ready = [&](const Action& a) {
    const auto mb = static_cast<size_t>(a.microbatch);
    if (a.type == ActionType::Forward) return a.stage == 0 || forward_done[a.stage - 1][mb];
    if (a.type == ActionType::BackwardWeight) return true;  // after its I, on this rank
    return a.stage == stages - 1 || backward_done[a.stage + 1][mb];
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < ranks; ++r) {
      const auto& actions = plan[static_cast<size_t>(r)];
      auto& i = next[static_cast<size_t>(r)];
      while (i < actions.size() && ready(actions[i])) {
        const Action& a = actions[i++];
        if (a.type == ActionType::Forward) forward_done[a.stage][a.microbatch] = true;
        if (is_backward(a.type)) backward_done[a.stage][a.microbatch] = true;
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int r = 0; r < ranks; ++r) {
    const auto& actions = plan[static_cast<size_t>(r)];
    const size_t i = next[static_cast<size_t>(r)];
    if (i == actions.size()) continue;
    const Action& a = actions[i];
    const int from = a.type == ActionType::Forward ? a.stage - 1 : a.stage + 1;
    stuck += detail::str(stuck.empty() ? "" : "; ", ranks == stages ? "stage " : "rank ", r,
                         " waits in ", to_string(a, ranks != stages), " for stage ", from);
  }
  GW_CHECK(stuck.empty(), InvalidArgumentError, "[pipeline] the plan deadlocks: ", stuck, "\n",
           to_string(plan));
}

}  // namespace gw::pipeline
