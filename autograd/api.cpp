// The user-facing entry points: Tensor's autograd methods, backward, grad, and hooks.
// The two ways to ask for a gradient, requires_grad_ and TensorOptions::with_requires_grad,
// are where autograd hands core its recorder (core/grad_hooks.h): before anything requires
// grad, so that every op on a tensor that does records.
#include "autograd/autograd.h"

#include <atomic>
#include <utility>

#include "autograd/functions/recorder.h"

namespace gw {

namespace {
void install_recorder() {
  static autograd::Recorder recorder;  // made once, thread-safely
  static const bool installed = (install_grad_recorder(&recorder), true);
  (void)installed;
}
}  // namespace

Tensor& Tensor::requires_grad_(bool requires_grad) {
  if (!requires_grad) {
    checked()->requires_grad = false;
    return *this;
  }
  install_recorder();
  detail::mark_requires_grad(*this, "requires_grad_");
  return *this;
}

TensorOptions TensorOptions::with_requires_grad(bool r) const {
  if (r) install_recorder();
  TensorOptions o = *this;
  o.requires_grad = r;
  return o;
}

namespace {

Tensor root_gradient(const Tensor& t, const Tensor& given, const char* op, size_t i) {
  GW_CHECK(t.requires_grad(), InvalidArgumentError, "[", op, "] element ", i,
           " of tensors does not require grad and does not have a grad_fn");
  if (given.defined()) {
    GW_CHECK(given.sizes() == t.sizes(), ShapeError, "[", op, "] gradient of shape ",
             shape_str(given.sizes()), " given for a tensor of shape ", shape_str(t.sizes()));
    return given;
  }
  GW_CHECK(t.numel() == 1, InvalidArgumentError, "[", op,
           "] grad can be implicitly created only for scalar outputs; tensor ", i, " has shape ",
           shape_str(t.sizes()), ", pass a gradient");
  return ones_like(t);
}

// Where a pass from `outputs` starts: their gradient edges, and the gradients given for them
// (`given`: none, or one each, which the message calls `given_name`), or ones for scalars.
struct Roots {
  std::vector<autograd::Edge> edges;
  std::vector<Tensor> grads;
};
Roots roots_of(const std::vector<Tensor>& outputs, const std::vector<Tensor>& given, const char* op,
               const char* given_name, const char* outputs_name) {
  GW_CHECK(given.empty() || given.size() == outputs.size(), InvalidArgumentError, "[", op, "] got ",
           given.size(), " ", given_name, " for ", outputs.size(), " ", outputs_name);
  Roots roots;
  for (size_t i = 0; i < outputs.size(); ++i) {
    roots.grads.push_back(root_gradient(outputs[i], given.empty() ? Tensor() : given[i], op, i));
    roots.edges.push_back(autograd::gradient_edge(outputs[i]));
  }
  return roots;
}
}  // namespace

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph);
}

Tensor Tensor::grad() const {
  autograd::AutogradMeta* m = autograd::meta_if(*this);
  if (!m) return {};
  std::lock_guard lock(m->mutex);
  return m->grad;
}

void Tensor::set_grad(const Tensor& grad) const {
  GW_CHECK(!grad.defined() || grad.sizes() == sizes(), ShapeError, "[set_grad] gradient of shape ",
           shape_str(grad.sizes()), " for a tensor of shape ", shape_str(sizes()));
  GW_CHECK(!grad.defined() || (grad.dtype() == dtype() && grad.device() == device()),
           InvalidArgumentError, "[set_grad] a ", grad.dtype(), " gradient on ", grad.device(),
           " for a ", dtype(), " tensor on ", device());
  autograd::AutogradMeta& m = autograd::meta(*this);
  std::lock_guard lock(m.mutex);
  m.grad = grad;
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  autograd::AutogradMeta* m = autograd::meta_if(*this);
  return m ? m->grad_fn : nullptr;
}

bool Tensor::is_leaf() const { return grad_fn() == nullptr; }

void Tensor::retain_grad() const {
  GW_CHECK(requires_grad(), InvalidArgumentError,
           "[retain_grad] can't retain_grad on a tensor that does not require grad");
  if (is_leaf()) return;  // leaves keep .grad anyway
  autograd::AutogradMeta& m = autograd::meta(*this);
  if (m.retains_grad) return;
  m.retains_grad = true;
  // The hook holds the meta weakly: it must not keep the tensor's state alive.
  std::weak_ptr<autograd::AutogradMeta> weak_meta = impl()->autograd_meta;
  m.grad_fn->retain_grad_hooks.emplace_back(m.output_nr, [weak_meta](const Tensor& g) -> Tensor {
    if (auto meta = weak_meta.lock()) {
      std::lock_guard lock(meta->mutex);
      meta->grad = meta->grad.defined() ? add(meta->grad, g) : g.clone();
    }
    return {};
  });
}

void Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  GW_CHECK(requires_grad(), InvalidArgumentError,
           "[register_hook] cannot register a hook on a tensor that does not require grad");
  autograd::AutogradMeta& m = autograd::meta(*this);
  if (m.grad_fn) {
    m.grad_fn->pre_hooks.emplace_back(m.output_nr, std::move(hook));
  } else {
    m.leaf_hooks.push_back(std::move(hook));
  }
}

namespace autograd {

void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors,
              bool retain_graph) {
  Roots roots = roots_of(tensors, grad_tensors, "backward", "gradients", "tensors");
  ExecuteOptions options;
  options.keep_graph = retain_graph;
  run_backward(roots.edges, roots.grads, std::move(options));
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const GradOptions& options) {
  Roots roots = roots_of(outputs, options.grad_outputs, "grad", "grad_outputs", "outputs");
  ExecuteOptions exec;
  exec.keep_graph = options.retain_graph;
  for (size_t i = 0; i < inputs.size(); ++i) {
    GW_CHECK(inputs[i].requires_grad(), InvalidArgumentError, "[grad] input ", i,
             " does not require grad");
    exec.capture.push_back(gradient_edge(inputs[i]));
  }
  std::vector<Tensor> result = run_backward(roots.edges, roots.grads, std::move(exec));
  for (size_t i = 0; i < result.size(); ++i) {
    GW_CHECK(result[i].defined() || options.allow_unused, InvalidArgumentError, "[grad] input ", i,
             " was not used to compute the outputs; pass allow_unused = true");
  }
  return result;
}

std::vector<Tensor> backward_input(const std::vector<Tensor>& outputs,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<Tensor>& grad_outputs, WeightGradients& rest) {
  GW_CHECK(rest.empty(), InvalidArgumentError,
           "[backward_input] the WeightGradients given still hold a backward pass's rest (",
           rest.nodes_.size(), " nodes): run it, or pass an empty one");
  Roots roots = roots_of(outputs, grad_outputs, "backward_input", "grad_outputs", "outputs");
  if (inputs.empty()) {  // nothing to capture: all of it is the rest
    rest.nodes_.push_back({make_graph_root(roots.edges, std::move(roots.grads)),
                           {},
                           std::vector<bool>(roots.edges.size(), true)});
    return {};
  }
  ExecuteOptions exec;
  for (size_t i = 0; i < inputs.size(); ++i) {
    GW_CHECK(inputs[i].requires_grad(), InvalidArgumentError, "[backward_input] input ", i,
             " does not require grad");
    GW_CHECK(inputs[i].is_leaf(), InvalidArgumentError, "[backward_input] input ", i,
             " is not a leaf (made by ", inputs[i].grad_fn()->name(),
             "): the pass stops at its inputs, so what lies behind one would be lost");
    exec.capture.push_back(gradient_edge(inputs[i]));
  }
  std::vector<DeferredNode> deferred;  // into `rest` only once the pass succeeded
  exec.defer_rest = &deferred;
  std::vector<Tensor> result = run_backward(roots.edges, roots.grads, std::move(exec));
  rest.nodes_ = std::move(deferred);
  return result;
}

void WeightGradients::run() { run_deferred(std::exchange(nodes_, {})); }

RemovableHandle register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateHook hook) {
  GW_CHECK(leaf.requires_grad() && leaf.is_leaf(), InvalidArgumentError,
           "[register_post_accumulate_grad_hook] expects a leaf tensor that requires grad");
  static std::atomic<uint64_t> next_id{1};
  const uint64_t id = next_id.fetch_add(1, std::memory_order_relaxed);
  AutogradMeta& m = meta(leaf);
  std::lock_guard lock(m.mutex);
  auto hooks = std::make_shared<PostAccumulateHooks>();
  if (m.post_accumulate_hooks) *hooks = *m.post_accumulate_hooks;
  hooks->emplace_back(id, std::move(hook));
  m.post_accumulate_hooks = std::move(hooks);
  return RemovableHandle(leaf.autograd_meta(), id);
}

void RemovableHandle::remove() {
  std::shared_ptr<AutogradMeta> m = meta_.lock();
  meta_.reset();
  if (!m) return;
  std::shared_ptr<const PostAccumulateHooks> old;  // the removed hook dies after the unlock
  std::lock_guard lock(m->mutex);
  old = m->post_accumulate_hooks;
  if (!old) return;
  auto hooks = std::make_shared<PostAccumulateHooks>(*old);
  std::erase_if(*hooks, [&](const auto& entry) { return entry.first == id_; });
  m->post_accumulate_hooks = std::move(hooks);
}

}  // namespace autograd
}  // namespace gw
