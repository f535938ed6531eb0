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
// A task can also be *gated*: a subclass opens its extra roots one at a time (open_locked) as it
// learns that their gradients will come, and may hold a node whose dependencies are met until
// it says otherwise (hold_locked, release_held_locked). Distributed autograd's SMART mode is
// such a task (dist/autograd/smart_task.h); the local engine knows nothing more of it.
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

// A node that a pass capturing gradients ran only in part (ExecuteOptions::defer_rest): the
// gradients it received, and which of its edges it still owes a gradient.
struct DeferredNode {
  std::shared_ptr<Node> node;
  std::vector<Tensor> grads;
  std::vector<bool> owed;
};

struct ExecuteOptions {
  bool keep_graph = false;  // retain_graph: saved tensors survive for another backward
  // Further nodes whose gradients arrive later (add_gradient); their dependencies are counted
  // as if each had one incoming gradient.
  std::vector<std::shared_ptr<Node>> extra_roots;
  // Receives (leaf, gradient) instead of accumulating into leaf.grad.
  LeafSink leaf_sink;
  // When set, run only what leads to these edges and return their gradients (autograd::grad).
  std::vector<Edge> capture;
  // With capture: a node on a path to a captured edge that also has edges leading elsewhere
  // (to weights) computes only the captured paths' gradients, keeps its saved tensors, and
  // lands here; run_deferred later gives the rest.
  std::vector<DeferredNode>* defer_rest = nullptr;
};

class GraphTask {
 public:
  // `graph_root` (may be null) runs first; options.extra_roots wait for add_gradient.
  GraphTask(std::shared_ptr<Node> graph_root, ExecuteOptions options);
  virtual ~GraphTask() = default;
  GraphTask(const GraphTask&) = delete;
  GraphTask& operator=(const GraphTask&) = delete;

  // Delivers a gradient for input `input_nr` of `node` (thread-safe); the node runs once all
  // its dependencies have arrived. Not in a gated task, where a root's gradients come whole.
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
  // Nodes reached from an open root that have not run yet (held ones included).
  size_t open_nodes(std::string* example = nullptr) const;
  const std::vector<Tensor>& captured() const { return captured_; }
  const ExecuteOptions& options() const { return options_; }

 protected:
  // A gated task: the constructor only keeps the options; the subclass starts the graph root
  // (start_locked) and opens the extra roots (open_locked) once it has what its hooks need.
  // No capture.
  struct Gated {};
  GraphTask(Gated, ExecuteOptions options);

  // The hooks of a gated task, each called with mu_ held.
  // Whether `node`, whose dependencies are all met, must wait; a held node is offered again at
  // each release_held_locked.
  virtual bool hold_locked(Node* node) const;
  // `node` was reached for the first time while counting dependencies.
  virtual void reached_locked(const std::shared_ptr<Node>& node);
  // add_gradients is about to deliver `root`'s gradients.
  virtual void delivering_locked(Node* root);

  // What a gated task's subclass does, with mu_ held.
  // Counts the dependencies of what `graph_root` reaches and makes it ready to run first.
  void start_locked(std::shared_ptr<Node> graph_root);
  // Counts the dependencies of what the extra root `root` reaches that nothing counted yet,
  // plus one for `root` itself: its gradients come through add_gradients.
  void open_locked(Node* root);
  // Offers every held node again: those hold_locked lets go become ready.
  void release_held_locked();

  mutable std::mutex mu_;

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
  // With capture, a node that holds a captured edge but is not needed otherwise: it does not
  // run, but its tensor hooks (and a leaf's) do, and what they return is captured, as in
  // PyTorch 2. A node that runs captures the gradient it received, before its hooks.
  bool is_captured_only(Node* node) const;
  void run_captured_hooks(Node& node, std::vector<Tensor> inputs);
  // With capture: which of `node`'s edges lead to a captured edge.
  std::vector<bool> wanted_edges(const Node& node) const;

  ExecuteOptions options_;
  const bool gated_ = false;
  std::unordered_map<Node*, Pending> pending_;
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, ByPriority>
      ready_;
  std::unordered_map<Node*, bool> needed_;  // only with options.capture
  std::vector<Tensor> captured_;
  std::vector<std::shared_ptr<Node>> held_;  // no dependency left, but hold_locked said wait
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

// Whether a backward pass runs on this thread (its nodes, or the callbacks it runs at the end).
// A module called now with grad mode on is being recomputed inside the pass, as
// autograd::checkpoint's node does, not called before it: fully_shard gathers such a call's
// parameters as for the unit's backward.
bool in_backward_pass();

// Runs what a capturing pass deferred (defer_rest): each node again for the gradients it owes,
// and from there the rest of the graph as a backward pass, into the leaves' .grad.
void run_deferred(std::vector<DeferredNode> deferred);

}  // namespace gw::autograd
