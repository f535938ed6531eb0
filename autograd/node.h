// The pieces of the tape: a Node is one backward function of the graph recorded during the
// forward pass; its next_edges point at the nodes that produced its inputs (an Edge names
// the node and which of its inputs the gradient feeds). Leaves that require grad end in an
// AccumulateGrad node. The engine (autograd/engine.h) runs nodes in reverse.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace gw::autograd {

class Node;
using TensorList = std::vector<Tensor>;

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

// A tensor kept for the backward pass. It remembers the storage version at save time, so that
// an in-place change before backward is reported instead of silently giving wrong gradients.
// An op's own output is stored without its history: output -> node -> output would be a
// reference cycle. Inputs are kept as they are (their history points backwards, no cycle).
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t, bool is_output = false);
  Tensor unpack(const Node& owner) const;
  bool defined() const { return data_.defined(); }
  void reset() { data_ = Tensor(); }

 private:
  Tensor data_;
  uint64_t version_ = 0;
};

// A gradient hook: returns a replacement gradient, or an undefined tensor to keep it.
using GradHook = std::function<Tensor(const Tensor&)>;

// `hook` applied to `grad`: its replacement, or grad when it returns none. A replacement of
// another shape, dtype or device is refused (InvalidArgumentError naming `where` and both): the
// ops before it would sum or convert it into a wrong gradient without a word.
Tensor run_hook(const GradHook& hook, Tensor grad, const char* where);

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients w.r.t. this node's outputs in, gradients w.r.t. its inputs out (one per edge;
  // undefined where an input needs none).
  virtual TensorList apply(TensorList&& grads) = 0;
  virtual std::string name() const = 0;
  // Frees saved tensors after a backward pass that did not ask to retain the graph.
  virtual void release_variables() {}

  std::vector<Edge> next_edges;
  // Later nodes run first when several are ready (PyTorch's order; DDP relies on it), and a
  // leaf's AccumulateGrad before any of them, as in PyTorch: once a node has run, the gradients
  // it gave leaves are in their .grad before the engine moves on (fully_shard reduces a unit's
  // gradients when the gradient of the unit's input is ready).
  uint64_t sequence_nr() const { return sequence_nr_; }
  // Hooks run on the gradient arriving at input `input_nr` before apply (tensor hooks of
  // non-leaf tensors), in order.
  std::vector<std::pair<uint32_t, GradHook>> pre_hooks;
  // retain_grad's, run after every pre_hook (PyTorch's order): .grad gets the hooked gradient.
  std::vector<std::pair<uint32_t, GradHook>> retain_grad_hooks;
  // Number of gradients the node receives (outputs of the forward op).
  uint32_t num_inputs = 1;
  // Run apply even when every incoming gradient is undefined (distributed autograd's recv
  // functions must always answer their sender). Otherwise such a node is skipped.
  bool apply_undefined = false;
  // A node that needs the gradients of the weights behind it whole when it runs: one whose
  // apply runs a backward pass of its own and gives them itself (activation checkpoint), or
  // one that reduces them (fully_shard's). backward_input, which leaves weights' gradients for
  // later, refuses it.
  virtual bool needs_weight_gradients() const { return false; }
  bool released() const { return released_; }
  void mark_released() { released_ = true; }

 protected:
  // A node that runs before every other ready node (AccumulateGrad).
  struct First {};
  explicit Node(First);

 private:
  uint64_t sequence_nr_;
  bool released_ = false;
};

// Whether the running pass wants the gradient of input `i` from `n`'s apply: the edge leads
// somewhere and, in a pass that computes only some gradients (autograd::grad, backward_input
// and the weight part it leaves), that one. Derivative rules skip the work for the others.
bool wants(const Node& n, size_t i);

// Set by the engine while `node`'s apply runs: the outputs it wants (wants() reads it).
class WantedOutputs {
 public:
  WantedOutputs(const Node* node, const std::vector<bool>* wanted);
  ~WantedOutputs();
  WantedOutputs(const WantedOutputs&) = delete;
  WantedOutputs& operator=(const WantedOutputs&) = delete;

 private:
  const Node* prev_node_;
  const std::vector<bool>* prev_wanted_;
};

// Edge to where the gradient of `t` should flow: its grad_fn, or its AccumulateGrad when it is
// a leaf that requires grad; invalid when t needs no gradient.
Edge gradient_edge(const Tensor& t);

// Connects `node` to the inputs' history and makes `out` its output number `output_nr`.
void set_history(const Tensor& out, const std::shared_ptr<Node>& node, uint32_t output_nr = 0);
std::vector<Edge> collect_edges(std::initializer_list<const Tensor*> inputs);

}  // namespace gw::autograd
