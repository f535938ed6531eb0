#include "autograd/accumulate_grad.h"

#include "autograd/engine.h"
#include "autograd/meta.h"
#include "core/grad_hooks.h"
#include "core/ops.h"

namespace gw::autograd {

void accumulate_into_grad(const Tensor& leaf, const Tensor& grad) {
  AutogradMeta& m = meta(leaf);
  std::lock_guard lock(m.mutex);
  detail::NoRecordScope no_record;
  if (!m.grad.defined()) {
    // The first gradient becomes .grad without a copy when nothing else can see it; a
    // gradient shared with another leaf or a view must not alias .grad.
    bool exclusive = sole_owner(grad) && grad.is_contiguous() && grad.storage_offset() == 0;
    m.grad = exclusive ? grad : grad.clone();
  } else {
    m.grad.add_(grad);
  }
}

Tensor AccumulateGrad::run_leaf_hooks(Tensor grad) const {
  for (const GradHook& hook : meta(variable).leaf_hooks)
    grad = run_hook(hook, std::move(grad), "backward");
  return grad;
}

TensorList AccumulateGrad::apply(TensorList&& grads) {
  Tensor grad = std::move(grads[0]);
  if (!grad.defined()) return {};
  AutogradMeta& m = meta(variable);
  grad = run_leaf_hooks(std::move(grad));
  GW_CHECK(grad.sizes() == variable.sizes(), InternalError, "[AccumulateGrad] gradient of shape ",
           shape_str(grad.sizes()), " for a leaf of shape ", shape_str(variable.sizes()));
  // A task that collects leaf gradients elsewhere (a distributed autograd context) gets them
  // instead of .grad, and .grad's post-accumulate hooks do not fire.
  if (const LeafSink* sink = current_leaf_sink()) {
    (*sink)(variable, grad);
    return {};
  }
  accumulate_into_grad(variable, grad);
  std::shared_ptr<const PostAccumulateHooks> hooks;
  {
    std::lock_guard lock(m.mutex);
    hooks = m.post_accumulate_hooks;
  }
  if (hooks)
    for (const auto& [id, hook] : *hooks) hook(variable);
  return {};
}

}  // namespace gw::autograd
