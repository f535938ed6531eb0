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
};

class GraphTask {
 public:
  // `graph_root` (may be null) runs first; options.extra_roots wait for add_gradient.
  GraphTask(std::shared_ptr<Node> graph_root, ExecuteOptions options);

  // Delivers a gradient for input `input_nr` of `node` (thread-safe); the node runs once all
  // its dependencies have arrived.
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

  void compute_dependencies(const std::vector<Node*>& starts);
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
};

// The leaf_sink of the task running on this thread, if it has one.
const LeafSink* current_leaf_sink();

// A GraphTask's first node: hands grads[i] to roots[i].
std::shared_ptr<Node> make_graph_root(const std::vector<Edge>& roots, std::vector<Tensor> grads);

// Runs a whole backward pass: roots[i] receives grads[i]. Returns the captured gradients when
// options.capture is set.
std::vector<Tensor> run_backward(const std::vector<Edge>& roots, const std::vector<Tensor>& grads,
                                 ExecuteOptions options = {});

}  // namespace gw::autograd
