#include "dist/autograd/smart_task.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace gw::dist::autograd {

SmartTask::SmartTask(std::shared_ptr<Node> graph_root, gw::autograd::ExecuteOptions options,
                     Boundary boundary)
    : GraphTask(Gated{}, std::move(options)), boundary_(std::move(boundary)) {
  std::vector<Node*> candidates;
  if (graph_root) candidates.push_back(graph_root.get());
  for (const auto& r : this->options().extra_roots) candidates.push_back(r.get());
  std::lock_guard lock(mu_);
  compute_reach(candidates);
  if (graph_root) {  // delivered: it runs first, with the caller's gradients
    candidates_[0] = Candidate::kDelivered;
    --unmarked_;
    --undelivered_;
    start_locked(std::move(graph_root));
  }
}

void SmartTask::compute_reach(const std::vector<Node*>& candidates) {
  // One traversal per candidate that stops where it adds nothing: a node reached by more than
  // kMaxReach candidates is "many" and so is everything below it.
  auto add = [](Reach& r, uint32_t c) {
    if (r.many) return false;
    for (uint8_t k = 0; k < r.size; ++k)
      if (r.candidates[k] == c) return false;
    if (r.size == kMaxReach)
      r.many = true;
    else
      r.candidates[r.size++] = c;
    return true;
  };
  candidates_.assign(candidates.size(), Candidate::kUnmarked);
  unmarked_ = undelivered_ = candidates.size();
  std::vector<Node*> stack;
  for (uint32_t c = 0; c < candidates.size(); ++c) {
    candidate_index_.emplace(candidates[c], c);
    add(reach_[candidates[c]], c);
    stack.push_back(candidates[c]);
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const gw::autograd::Edge& e : n->next_edges)
        if (e.valid() && add(reach_[e.fn.get()], c)) stack.push_back(e.fn.get());
    }
  }
}

void SmartTask::mark(const std::shared_ptr<Node>& candidate) {
  std::lock_guard lock(mu_);
  mark_locked(candidate.get(), Candidate::kMarked);
}

void SmartTask::delivering_locked(Node* root) { mark_locked(root, Candidate::kDelivered); }

void SmartTask::mark_locked(Node* candidate, Candidate state) {
  auto it = candidate_index_.find(candidate);
  GW_CHECK(it != candidate_index_.end(), InvalidArgumentError, "[autograd] ", candidate->name(),
           " is not a root of this backward pass");
  Candidate& c = candidates_[it->second];
  if (c == Candidate::kUnmarked) {
    GW_CHECK(!closed_, StateError, "[autograd] ", candidate->name(),
             " was found on the backward path after its pass declared the others unused");
    c = state;
    --unmarked_;
    if (state == Candidate::kDelivered) --undelivered_;
    open_locked(candidate);
    release_held_locked();
  } else if (c == Candidate::kMarked && state == Candidate::kDelivered) {
    c = state;
    --undelivered_;
  }
}

void SmartTask::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  release_held_locked();
}

SmartTask::Candidate SmartTask::least_reaching_locked(Node* node) const {
  const Reach& r = reach_.at(node);
  if (r.many)
    return unmarked_ > 0      ? Candidate::kUnmarked
           : undelivered_ > 0 ? Candidate::kMarked
                              : Candidate::kDelivered;
  Candidate least = Candidate::kDelivered;
  for (uint8_t k = 0; k < r.size; ++k) least = std::min(least, candidates_[r.candidates[k]]);
  return least;
}

bool SmartTask::hold_locked(Node* node) const {
  return !closed_ && unmarked_ > 0 && least_reaching_locked(node) == Candidate::kUnmarked;
}

bool SmartTask::certain_locked(Node* node) const {
  return undelivered_ == 0 || least_reaching_locked(node) == Candidate::kDelivered;
}

void SmartTask::reached_locked(const std::shared_ptr<Node>& node) {
  if (boundary_ && boundary_(*node) && !certain_locked(node.get())) uncertain_.push_back(node);
}

std::vector<std::shared_ptr<gw::autograd::Node>> SmartTask::take_uncertain() {
  std::lock_guard lock(mu_);
  return std::exchange(uncertain_, {});
}

}  // namespace gw::dist::autograd
