// gw::dist::autograd — distributed autograd (torch.distributed.autograd).
//
// Mental model (PyTorch's distributed autograd design note,
// pytorch.org/docs/stable/rpc/distributed_autograd.html): inside a Context, every RPC that carries
// tensors requiring grad records a send function on the sender and a recv function on the receiver,
// so the autograd graph continues across workers. backward(context_id, roots) runs it everywhere
// (FAST mode, see dist_engine.h) and returns when every worker that took part is done; gradients
// land in the context of each worker, not in `.grad`, and get_gradients reads them there. Leaving
// the Context releases it on every worker it reached.
//
//   {
//     gw::dist::autograd::Context ctx;
//     Tensor t1 = gw::rand({3, 3}).requires_grad_(), t2 = gw::rand({3, 3}).requires_grad_();
//     Tensor t3 = gw::rpc::rpc_sync("worker1", my_add, t1, t2);
//     Tensor loss = (t3 * t4).sum();
//     gw::dist::autograd::backward(ctx.id(), {loss});
//     auto grads = gw::dist::autograd::get_gradients(ctx.id());   // grads[t1], grads[t4], ...
//   }
//
// These functions use the RPC agent calls go through (rpc/api.h: current_agent()).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "dist/autograd/context.h"
#include "rpc/autograd_hook.h"

namespace gw::dist::autograd {

class Container;

// A distributed autograd context, current on this thread while it lives (torch's
// `with dist_autograd.context() as context_id`). Contexts do not nest on one thread.
class Context {
 public:
  Context();
  // Releases the context here at once, and on every worker it reached in the background (in
  // batches; wait_for_releases() waits for that; failures are logged).
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  uint64_t id() const { return id_; }

 private:
  std::weak_ptr<Container> container_;  // the agent (and its container) may go first
  uint64_t id_;
  rpc::AutogradContextScope scope_;
};

// How backward finds the send functions it waits for (dist_engine.h):
//  - kFast (the default, PyTorch's only mode): all of them. An RPC in the context whose result
//    the loss does not use raises a StateError naming a function left waiting.
//  - kSmart: those on this pass's backward path, found as the pass runs. Unused RPCs (a metric
//    computed remotely, a branch taken in some iterations only, a prefetch) are allowed, and
//    the gradients are local autograd's. When every RPC is used and no received tensor is both
//    sent on and used otherwise, it sends FAST mode's messages; a received tensor that is costs
//    discovery messages, and an unused RPC that shares inputs with the loss a second, short
//    round of messages.
enum class Mode { kFast, kSmart };

struct BackwardOptions {
  bool retain_graph = false;  // keep the graph for another pass in the same context
  Mode mode = Mode::kFast;
};

// Runs the distributed backward pass of `context_id` from `roots` (local scalars) and waits
// until every worker that took part is done. Throws the first error of any worker.
void backward(uint64_t context_id, const std::vector<Tensor>& roots, bool retain_graph = false);
//   gw::dist::autograd::backward(ctx.id(), {loss}, {.mode = gw::dist::autograd::Mode::kSmart});
void backward(uint64_t context_id, const std::vector<Tensor>& roots, BackwardOptions options);

// The gradients accumulated on this worker in `context_id`, by tensor.
GradientMap get_gradients(uint64_t context_id);

// The context of this thread (0: none).
uint64_t current_context_id();
// Whether this worker holds `context_id`, and how many contexts it holds (tests, diagnostics).
bool has_context(uint64_t context_id);
size_t num_contexts();
// Waits until the contexts this worker left are released on every worker they reached.
// Throws TimeoutError after `timeout`.
void wait_for_releases(std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace gw::dist::autograd
