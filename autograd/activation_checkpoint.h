// Activation checkpointing: trade compute for memory (torch.utils.checkpoint.checkpoint with
// use_reentrant=True).
//
// Mental model: checkpoint(fn, inputs) runs fn with recording off, so none of its intermediate
// tensors is kept, and records one node in their place. When backward reaches that node, it runs
// fn again on the saved inputs with recording on and runs a backward pass of its own — a
// reentrant one, on the same thread — through that recomputation, which accumulates into the
// .grad of the parameters fn uses and hands the inputs' gradients on to the outer pass.
//
//   auto block = std::make_shared<gw::nn::Linear>(512, 512, true, gen);
//   auto segment = [&](const gw::Tensor& x) { return block->forward(x).relu(); };
//   gw::Tensor h = gw::autograd::checkpoint(segment, stem->forward(x));
//   loss(head->forward(h)).backward();   // block's activations are recomputed here
//
// What follows from the reentrant pass, as in PyTorch:
// - A parameter used inside the segment and outside it (or in two segments) accumulates once
//   per pass, so its post-accumulate hook fires more than once per backward. DDP counts on one
//   firing per parameter unless told the graph is static (DDPOptions::static_graph).
// - Only inputs that require grad connect the segment to the outer graph: if none does, the
//   outputs do not require grad and fn's parameters get no gradient.
// - retain_graph works (fn is run again by each backward); autograd::grad through a segment
//   does not reach the parameters inside it (they accumulate into .grad), as in PyTorch; a
//   distributed autograd pass that reaches a segment raises StateError (its gradients would
//   go to .grad, not to the context).
// - The recomputation draws the random numbers the first run drew (PyTorch's
//   preserve_rng_state): the states of gw::default_generator() and of the generators named in
//   the options (a segment's Dropout modules draw from the one they were made with) are saved
//   before the first run, set for the recomputation, and put back after it. The generators
//   must outlive the backward. As in PyTorch, a thread that draws from one of them while
//   another thread's backward recomputes may see its draws undone or replayed.
#pragma once

#include <functional>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"

namespace gw::autograd {

using CheckpointFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct CheckpointOptions {
  // false: the recomputation draws on from where the generators are then (cheaper by a few
  // copies of 48 bytes; right only for a segment that draws nothing).
  bool preserve_rng_state = true;
  // Generators the segment draws from besides the default one, e.g. its Dropout modules'.
  std::vector<Generator*> generators = {};
};

// fn(inputs), its intermediates recomputed in backward instead of kept.
std::vector<Tensor> checkpoint(CheckpointFunction fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options = {});
// One input, one output.
Tensor checkpoint(std::function<Tensor(const Tensor&)> fn, const Tensor& input,
                  const CheckpointOptions& options = {});

}  // namespace gw::autograd
