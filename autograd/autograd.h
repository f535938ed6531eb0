// gradwire autograd — the tape.
//
// Mental model (PyTorch's): mark leaves with requires_grad_(); every op on them records a
// backward Node in the output's grad_fn, pointing at the nodes of its inputs. backward()
// walks that graph from the result, in reverse creation order, and accumulates d(result)/d(leaf)
// into each leaf's .grad. The graph is freed by backward unless retain_graph is set. Under
// NoGradGuard nothing is recorded (optimizer steps, evaluation).
//
//   gw::Tensor w = gw::randn({3, 2}, gen).requires_grad_();
//   gw::Tensor x = gw::ones({4, 3});
//   gw::Tensor loss = gw::matmul(x, w).relu().sum();
//   loss.backward();
//   std::cout << w.grad() << "\n";                     // d loss / d w
//   auto [gx] = gw::autograd::grad({loss2}, {x2});     // returned, .grad untouched (but
//                                                       // a retain_grad input's)
//
// The engine (autograd/engine.h) is also what distributed autograd runs on: extra roots,
// tasks that stay open for gradients arriving later, and leaf gradients sent to a map.
#pragma once

#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/meta.h"
#include "autograd/node.h"
#include "core/ops.h"

namespace gw::autograd {

// Runs backward from several roots at once; grad_tensors[i] is d(loss)/d(tensors[i]) (may be
// omitted for scalar roots).
void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors = {},
              bool retain_graph = false);

struct GradOptions {
  std::vector<Tensor> grad_outputs;  // default: ones for scalar outputs
  bool retain_graph = false;
  bool allow_unused = false;  // an input the outputs do not depend on gets an undefined tensor
};
// d(outputs)/d(inputs) returned rather than accumulated into .grad. As in PyTorch 2, an input's
// hooks (register_hook, retain_grad) run on its gradient, and return what is captured, where
// nothing else runs its node; an input on the way to another gets its gradient as it arrived,
// and the hooks' result flows on.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const GradOptions& options = {});

// The backward pass in two parts, as zero-bubble pipelines run it: the previous stage waits only
// for the first. backward_input returns d(outputs)/d(inputs) (leaves) as grad() does, and
// computes only what leads there: a linear layer on the way gives its input's gradient, not its
// weight's. What backward() would have added to the other leaves' .grad (the weights') is left
// in `rest`, which keeps what that needs: the nodes on the way that owe such a gradient, with
// the gradients they received and their saved tensors (a linear layer's input); the other
// nodes on the way free theirs. rest.run() then accumulates it, once; its nodes go as they run.
// Hooks on tensors and leaves run once, in the part that reaches them; but what runs at the
// end of a backward pass (queue_callback: DDP's and fully_shard's reductions) runs at the end
// of each part. A node that needs the weights' gradients when it runs (Node::
// needs_weight_gradients: an activation checkpoint runs a backward of its own, fully_shard's
// unit reduces them) is refused.
//
//   autograd::WeightGradients rest;
//   Tensor dx = autograd::backward_input({y}, {x}, {dy}, rest)[0];  // send dx on at once
//   ...
//   rest.run();                                                     // later, in a bubble
class WeightGradients {
 public:
  WeightGradients() = default;
  WeightGradients(WeightGradients&&) = default;
  WeightGradients& operator=(WeightGradients&&) = default;
  // Accumulates the deferred gradients into the leaves' .grad; then this is empty.
  void run();
  bool empty() const { return nodes_.empty(); }

 private:
  friend std::vector<Tensor> backward_input(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                            const std::vector<Tensor>&, WeightGradients&);
  std::vector<DeferredNode> nodes_;
};
// `grad_outputs` may be empty for scalar outputs; an input the outputs do not depend on gets an
// undefined gradient. `rest` must be empty (InvalidArgumentError).
std::vector<Tensor> backward_input(const std::vector<Tensor>& outputs,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<Tensor>& grad_outputs, WeightGradients& rest);

// Unregisters the hook it was returned for (PyTorch's RemovableHandle). remove() again, or
// once the tensor is gone, does nothing; dropping the handle leaves the hook registered.
class RemovableHandle {
 public:
  RemovableHandle() = default;
  RemovableHandle(std::weak_ptr<AutogradMeta> meta, uint64_t id)
      : meta_(std::move(meta)), id_(id) {}
  void remove();

 private:
  std::weak_ptr<AutogradMeta> meta_;
  uint64_t id_ = 0;
};

// hook(leaf) runs after the leaf's .grad was updated by a backward pass (DDP's signal that a
// parameter's gradient is ready).
RemovableHandle register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateHook hook);

}  // namespace gw::autograd
