// SMART mode's backward task on one worker: a gated gw::autograd::GraphTask
// (autograd/engine.h) that runs only what the gradients known to come reach.
//
// Mental model: the task's *candidates* are the graph root and the extra roots (this worker's
// send functions), which start unmarked; only those marked live will ever deliver a gradient.
// The task knows, for every node, which candidates reach it (its reach: up to four, or "many").
// It counts the dependencies of what marked candidates reach, and holds a node whose
// dependencies are met while an unmarked candidate also reaches it, until that candidate is
// marked (more gradient will come) or the task is closed (none will). Boundary nodes (the recv
// functions) first reached while a candidate reaching them had no gradient yet are *uncertain*:
// the pass tells their senders (take_uncertain), since nothing else will.
//
//   SmartTask task(root, options, is_recv);
//   task.add_gradients(send1, grads);  // marks send1 live and delivers its gradients
//   task.run();                        // runs what only marked candidates reach
//   task.close();                      // no other send function is on the path
//   task.run();                        // held nodes run without the unmarked ones' gradients
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "autograd/engine.h"

namespace gw::dist::autograd {

class SmartTask final : public gw::autograd::GraphTask {
 public:
  using Boundary = std::function<bool(const gw::autograd::Node&)>;
  // `graph_root` (may be null) is delivered at once and runs first; options.extra_roots are the
  // candidates. `boundary` picks the nodes take_uncertain reports.
  SmartTask(std::shared_ptr<gw::autograd::Node> graph_root, gw::autograd::ExecuteOptions options,
            Boundary boundary);

  // Marks the extra root `candidate` live: it will receive its gradients (add_gradients for an
  // unmarked candidate marks it too). Throws StateError once closed.
  void mark(const std::shared_ptr<gw::autograd::Node>& candidate);
  // Declares every unmarked candidate dead: held nodes run without their gradients.
  void close();
  // The boundary nodes first reached since the last call whose gradient is not certain to
  // flow: some candidate reaching them had not received its gradient when they were reached.
  // A node reached only from candidates that did will run, so needs no word from the caller.
  std::vector<std::shared_ptr<gw::autograd::Node>> take_uncertain();

 private:
  using Node = gw::autograd::Node;
  // The candidates reaching a node, up to kMaxReach of them, or many.
  static constexpr size_t kMaxReach = 4;
  struct Reach {
    uint32_t candidates[kMaxReach] = {};
    uint8_t size = 0;
    bool many = false;
  };
  enum class Candidate : uint8_t { kUnmarked, kMarked, kDelivered };  // in this order

  bool hold_locked(Node* node) const override;
  void reached_locked(const std::shared_ptr<Node>& node) override;
  void delivering_locked(Node* root) override;

  void compute_reach(const std::vector<Node*>& candidates);
  void mark_locked(Node* candidate, Candidate state);
  // The least advanced state of the candidates reaching `node` (of all the task's, for "many").
  Candidate least_reaching_locked(Node* node) const;
  bool certain_locked(Node* node) const;

  Boundary boundary_;
  std::unordered_map<Node*, Reach> reach_;
  std::unordered_map<Node*, uint32_t> candidate_index_;
  std::vector<Candidate> candidates_;  // by index; 0 is the graph root when there is one
  size_t unmarked_ = 0;
  size_t undelivered_ = 0;  // candidates not yet kDelivered
  bool closed_ = false;
  std::vector<std::shared_ptr<Node>> uncertain_;
};

}  // namespace gw::dist::autograd
