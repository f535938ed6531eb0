// The backward engine.
//
// One backward call is a GraphTask. The engine first counts, for every node reachable from
// the roots, how many gradients it will receive (its dependencies), so only what the roots
// reach runs. It then executes ready nodes — later-created first — on the calling thread,
// summing gradients that meet at a node before running it. Several GraphTasks may run at once
// on different threads; AccumulateGrad locks the leaf it writes.
//
// Distributed autograd drives the same machinery at a lower level: it adds extra root nodes
// (the send functions of a context), keeps a task open while gradients still arrive from the
// network (`add_gradient` from any thread, then `run`), and sends leaf gradients to a map of
// its own instead of `.grad` (`leaf_sink`).
//
// SMART mode (dist/autograd/engine.h) adds *candidates*: the graph root and the extra roots,
// which start unmarked, and of which only those marked live will ever deliver a gradient. The
// task knows, for every node, which candidates reach it (its reach: up to four, or "many"); it
// counts the dependencies of what marked candidates reach, and holds a node whose dependencies
// are met while an unmarked candidate also reaches it, until that candidate is marked (more
// gradient will come) or the task is closed (none will).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <vector>

#include "autograd/node.h"

namespace gw::autograd {

using LeafSink = std::function<void(const Tensor& leaf, const Tensor& grad)>;

struct ExecuteOptions {
  bool keep_graph = false;  // retain_graph: saved tensors survive for another backward
  // Further nodes whose gradients arrive later (add_gradient); their dependencies are counted
  // as if each had one incoming gradient.
  std::vector<std::shared_ptr<Node>> extra_roots;
  // Receives (leaf, gradient) instead of accumulating into leaf.grad.
  LeafSink leaf_sink;
  // When set, run only what leads to these edges and return their gradients (autograd::grad).
  std::vector<Edge> capture;
  // SMART mode: extra_roots are candidates that count only once marked (mark, add_gradients).
  bool smart = false;
  // SMART mode: the nodes to report through take_uncertain (the recv functions).
  std::function<bool(const Node&)> boundary;
};

class GraphTask {
 public:
  // `graph_root` (may be null) runs first; options.extra_roots wait for add_gradient.
  GraphTask(std::shared_ptr<Node> graph_root, ExecuteOptions options);

  // Delivers a gradient for input `input_nr` of `node` (thread-safe); the node runs once all
  // its dependencies have arrived. Not in SMART mode, where a candidate's gradients come whole.
  void add_gradient(const std::shared_ptr<Node>& node, uint32_t input_nr, Tensor grad);
  // Delivers the gradients of all of `node`'s inputs as one dependency (a message that carries
  // every gradient of a distributed send function).
  void add_gradients(const std::shared_ptr<Node>& node, std::vector<Tensor> grads);
  // Runs ready nodes on the calling thread until none is left.
  void run();
  // True when no node is ready or waiting for gradients.
  bool finished() const;
  bool has_ready() const;
  // Nodes that received some defined gradient but still wait for others: gradient that will
  // be lost if those never come. `example` gets the name of one of them.
  size_t stalled_nodes(std::string* example = nullptr) const;
  // Nodes reached from a marked candidate that have not run yet (held ones included).
  size_t open_nodes(std::string* example = nullptr) const;

  // SMART mode. Marks the extra root `candidate` live: it will receive its gradients (a
  // gradient for an unmarked candidate marks it too). Throws StateError once closed.
  void mark(const std::shared_ptr<Node>& candidate);
  // Declares every unmarked candidate dead: held nodes run without their gradients.
  void close();
  // The boundary nodes first reached since the last call whose gradient is not certain to
  // flow: some candidate reaching them had not received its gradient when they were reached.
  // A node reached only from candidates that did will run, so needs no word from the caller.
  std::vector<std::shared_ptr<Node>> take_uncertain();
  const std::vector<Tensor>& captured() const { return captured_; }
  const ExecuteOptions& options() const { return options_; }

 private:
  struct Pending {
    int dependencies = 0;
    std::vector<Tensor> inputs;
  };
  struct ByPriority {
    bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
      return a->sequence_nr() < b->sequence_nr();
    }
  };

  // SMART mode: the candidates reaching a node, up to kMaxReach of them, or many.
  static constexpr size_t kMaxReach = 4;
  struct Reach {
    uint32_t candidates[kMaxReach] = {};
    uint8_t size = 0;
    bool many = false;
  };
  enum class Candidate : uint8_t { kUnmarked, kMarked, kDelivered };  // in this order

  void compute_dependencies(const std::vector<Node*>& starts);
  void compute_reach(const std::vector<Node*>& candidates);
  void mark_locked(Node* candidate, Candidate state);
  // The least advanced state of the candidates reaching `node` (of all the task's, for "many").
  Candidate least_reaching_locked(Node* node) const;
  bool held_locked(Node* node) const;
  bool certain_locked(Node* node) const;
  void release_held_locked();
  void compute_needed();
  void deliver_locked(Node* node, const std::shared_ptr<Node>& owner, uint32_t input_nr,
                      Tensor grad);
  void accumulate_input_locked(Node* node, uint32_t input_nr, Tensor grad);
  void release_dependency_locked(Node* node, const std::shared_ptr<Node>& owner);
  void execute(const std::shared_ptr<Node>& node, std::vector<Tensor> inputs);

  ExecuteOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<Node*, Pending> pending_;
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, ByPriority>
      ready_;
  std::unordered_map<Node*, bool> needed_;  // only with options.capture
  std::vector<Tensor> captured_;
  // SMART mode.
  std::unordered_map<Node*, Reach> reach_;
  std::unordered_map<Node*, uint32_t> candidate_index_;
  std::vector<Candidate> candidates_;  // by index; 0 is the graph root when there is one
  size_t unmarked_ = 0;
  size_t undelivered_ = 0;  // candidates not yet kDelivered
  bool closed_ = false;
  std::vector<std::shared_ptr<Node>> held_;  // no dependency left, an unmarked candidate reaches
  std::vector<std::shared_ptr<Node>> uncertain_;
};

// The leaf_sink of the task running on this thread, if it has one.
const LeafSink* current_leaf_sink();

// A GraphTask's first node: hands grads[i] to roots[i].
std::shared_ptr<Node> make_graph_root(const std::vector<Edge>& roots, std::vector<Tensor> grads);

// Runs a whole backward pass: roots[i] receives grads[i], then the callbacks its nodes and
// hooks queued. Returns the captured gradients when options.capture is set.
std::vector<Tensor> run_backward(const std::vector<Edge>& roots, const std::vector<Tensor>& grads,
                                 ExecuteOptions options = {});

// Runs `callback` when the backward pass running on this thread has executed its last node,
// before backward() returns (PyTorch's Variable._execution_engine.queue_callback): DDP's
// static_graph reduces there what its first iteration's hooks only counted. Callbacks run in
// the order queued, with recording off, and may queue more; a pass that throws runs none. A
// reentrant pass (a backward run by a node of another, as autograd::checkpoint does) has its
// own callbacks. Outside a pass that runs them (autograd::backward, grad), StateError.
void queue_callback(std::function<void()> callback);

}  // namespace gw::autograd
