#include "autograd/engine.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "autograd/accumulate_grad.h"
#include "autograd/meta.h"
#include "core/grad_hooks.h"
#include "core/ops.h"
#include "core/trace.h"

namespace gw::autograd {

namespace {

thread_local const LeafSink* t_leaf_sink = nullptr;
// The callbacks of the innermost run_backward on this thread (queue_callback).
thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;

// The synthetic first node of a task: hands the caller's root gradients to the roots.
class GraphRoot final : public Node {
 public:
  GraphRoot(const std::vector<Edge>& roots, std::vector<Tensor> grads) : grads_(std::move(grads)) {
    next_edges = roots;
    num_inputs = 0;
  }
  TensorList apply(TensorList&&) override { return grads_; }
  std::string name() const override { return "GraphRoot"; }

 private:
  std::vector<Tensor> grads_;
};

Tensor accumulate(Tensor acc, Tensor grad) {
  if (!acc.defined()) return grad;
  if (!grad.defined()) return acc;
  // Into acc itself when nothing else can see its memory, as PyTorch's InputBuffer does: no new
  // buffer, and the sum's stores go to lines it has just read. Not into an expanded gradient
  // (its elements share memory), nor into a gradient another edge, a node, the caller or a view
  // also holds, nor (defensively: backward does not record) into one that requires grad.
  if (sole_owner(acc) && acc.is_contiguous() && !acc.requires_grad() &&
      acc.sizes() == grad.sizes() && acc.dtype() == grad.dtype() && acc.device() == grad.device())
    return acc.add_(grad);
  return add(acc, grad);
}

}  // namespace

const LeafSink* current_leaf_sink() { return t_leaf_sink; }

GraphTask::GraphTask(std::shared_ptr<Node> graph_root, ExecuteOptions options)
    : options_(std::move(options)) {
  std::vector<Node*> starts;
  if (graph_root) starts.push_back(graph_root.get());
  for (const auto& r : options_.extra_roots) {
    starts.push_back(r.get());
    pending_[r.get()].dependencies += 1;  // its gradient arrives through add_gradient
  }
  compute_dependencies(starts);
  if (!options_.capture.empty()) {
    captured_.resize(options_.capture.size());
    compute_needed();
  }
  if (graph_root) ready_.push(std::move(graph_root));
}

GraphTask::GraphTask(Gated, ExecuteOptions options) : options_(std::move(options)), gated_(true) {
  GW_CHECK(options_.capture.empty(), InvalidArgumentError,
           "[autograd] a gated backward pass does not capture gradients");
}

bool GraphTask::hold_locked(Node*) const { return false; }
void GraphTask::reached_locked(const std::shared_ptr<Node>&) {}
void GraphTask::delivering_locked(Node*) {}

void GraphTask::start_locked(std::shared_ptr<Node> graph_root) {
  compute_dependencies({graph_root.get()});
  ready_.push(std::move(graph_root));
}

void GraphTask::open_locked(Node* root) {
  pending_[root].dependencies += 1;  // its gradients
  compute_dependencies({root});
}

void GraphTask::compute_dependencies(const std::vector<Node*>& starts) {
  // pending_ doubles as the visited set: a node gets its entry when first reached.
  pending_.reserve(256);
  std::vector<Node*> stack(starts);
  std::sort(stack.begin(), stack.end());
  stack.erase(std::unique(stack.begin(), stack.end()), stack.end());
  for (Node* n : stack) pending_.try_emplace(n);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      auto [it, inserted] = pending_.try_emplace(e.fn.get());
      it->second.dependencies += 1;
      if (!inserted) continue;
      stack.push_back(e.fn.get());
      if (gated_) reached_locked(e.fn);
    }
  }
}

void GraphTask::release_held_locked() {
  std::vector<std::shared_ptr<Node>> still;
  for (auto& node : held_) {
    auto it = pending_.find(node.get());
    // A node given new dependencies comes back when they are met.
    if (it == pending_.end() || it->second.dependencies > 0) continue;
    if (hold_locked(node.get()))
      still.push_back(std::move(node));
    else
      ready_.push(std::move(node));
  }
  held_ = std::move(still);
}

void GraphTask::compute_needed() {
  // A node is needed when a path through its next edges reaches a captured edge: only those
  // run in autograd::grad, so nothing accumulates into .grad on the side.
  std::unordered_set<Node*> targets;
  for (const Edge& e : options_.capture) targets.insert(e.fn.get());
  std::function<bool(Node*)> visit = [&](Node* n) -> bool {
    auto it = needed_.find(n);
    if (it != needed_.end()) return it->second;
    needed_[n] = false;  // the graph is acyclic; this only guards repeated visits
    bool needed = false;
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      bool child = visit(e.fn.get());
      needed = needed || child || targets.count(e.fn.get()) > 0;
    }
    needed_[n] = needed;
    return needed;
  };
  std::vector<Node*> nodes;
  for (auto& [node, _] : pending_) nodes.push_back(node);
  for (Node* n : nodes) visit(n);
}

void GraphTask::add_gradient(const std::shared_ptr<Node>& node, uint32_t input_nr, Tensor grad) {
  GW_CHECK(!gated_, InvalidArgumentError,
           "[autograd] a gated backward pass takes a root's gradients whole (add_gradients), "
           "not ",
           node->name(), "'s input ", input_nr, " alone");
  std::lock_guard lock(mu_);
  deliver_locked(node.get(), node, input_nr, std::move(grad));
}

void GraphTask::add_gradients(const std::shared_ptr<Node>& node, std::vector<Tensor> grads) {
  GW_CHECK(grads.size() == node->num_inputs, InvalidArgumentError, "[autograd] ", node->name(),
           " takes ", node->num_inputs, " gradients, got ", grads.size());
  std::lock_guard lock(mu_);
  if (gated_) delivering_locked(node.get());
  for (uint32_t i = 0; i < grads.size(); ++i)
    accumulate_input_locked(node.get(), i, std::move(grads[i]));
  release_dependency_locked(node.get(), node);
}

void GraphTask::deliver_locked(Node* node, const std::shared_ptr<Node>& owner, uint32_t input_nr,
                               Tensor grad) {
  accumulate_input_locked(node, input_nr, std::move(grad));
  release_dependency_locked(node, owner);
}

void GraphTask::accumulate_input_locked(Node* node, uint32_t input_nr, Tensor grad) {
  for (size_t i = 0; i < options_.capture.size(); ++i) {
    const Edge& c = options_.capture[i];
    if (c.fn.get() == node && c.input_nr == input_nr) {
      captured_[i] = accumulate(std::move(captured_[i]), grad);
    }
  }
  Pending& p = pending_[node];
  if (p.inputs.size() < node->num_inputs) p.inputs.resize(node->num_inputs);
  p.inputs[input_nr] = accumulate(std::move(p.inputs[input_nr]), std::move(grad));
}

void GraphTask::release_dependency_locked(Node* node, const std::shared_ptr<Node>& owner) {
  Pending& p = pending_[node];
  if (--p.dependencies == 0) {
    if (gated_ && hold_locked(node)) {
      held_.push_back(owner);
      return;
    }
    auto it = needed_.find(node);
    const bool needed = options_.capture.empty() || (it != needed_.end() && it->second);
    if (needed || is_captured_only(node)) {  // the latter only for its hooks
      ready_.push(owner);
    } else {
      pending_.erase(node);
    }
  }
}

void GraphTask::run() {
  const LeafSink* prev_sink = t_leaf_sink;
  t_leaf_sink = options_.leaf_sink ? &options_.leaf_sink : nullptr;
  struct Restore {
    const LeafSink* prev;
    ~Restore() { t_leaf_sink = prev; }
  } restore{prev_sink};
  // Backward functions compute with recording off (no higher-order graphs), and with autocast
  // off: each runs in the dtypes its forward recorded.
  detail::NoRecordScope no_record;
  AutocastGuard no_autocast(AutocastState{});
  while (true) {
    std::shared_ptr<Node> node;
    std::vector<Tensor> inputs;
    {
      std::lock_guard lock(mu_);
      if (ready_.empty()) return;
      node = ready_.top();
      ready_.pop();
      auto it = pending_.find(node.get());
      if (it != pending_.end()) {
        inputs = std::move(it->second.inputs);
        pending_.erase(it);
      }
    }
    execute(node, std::move(inputs));
  }
}

std::vector<bool> GraphTask::wanted_edges(const Node& node) const {
  std::vector<bool> wanted(node.next_edges.size(), false);
  for (size_t i = 0; i < wanted.size(); ++i) {
    const Edge& e = node.next_edges[i];
    if (!e.valid()) continue;
    auto it = needed_.find(e.fn.get());
    wanted[i] = it != needed_.end() && it->second;
    for (const Edge& c : options_.capture)
      wanted[i] = wanted[i] || (c.fn == e.fn && c.input_nr == e.input_nr);
  }
  return wanted;
}

bool GraphTask::is_captured_only(Node* node) const {
  if (options_.capture.empty()) return false;
  if (auto it = needed_.find(node); it != needed_.end() && it->second) return false;
  return std::any_of(options_.capture.begin(), options_.capture.end(),
                     [node](const Edge& c) { return c.fn.get() == node; });
}

namespace {
// A node's tensor hooks over the gradients it received (resized to its inputs): its pre_hooks
// in order, then retain_grad's, as PyTorch runs them whatever the order they were registered in.
void run_tensor_hooks(Node& node, std::vector<Tensor>& inputs) {
  inputs.resize(node.num_inputs);
  for (const auto* hooks : {&node.pre_hooks, &node.retain_grad_hooks}) {
    for (const auto& [input_nr, hook] : *hooks) {
      if (input_nr < inputs.size() && inputs[input_nr].defined())
        inputs[input_nr] = run_hook(hook, std::move(inputs[input_nr]), "backward");
    }
  }
}
}  // namespace

void GraphTask::run_captured_hooks(Node& node, std::vector<Tensor> inputs) {
  run_tensor_hooks(node, inputs);
  if (auto* leaf = dynamic_cast<AccumulateGrad*>(&node); leaf && inputs[0].defined())
    inputs[0] = leaf->run_leaf_hooks(std::move(inputs[0]));
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < options_.capture.size(); ++i) {
    const Edge& c = options_.capture[i];
    if (c.fn.get() == &node && c.input_nr < inputs.size()) captured_[i] = inputs[c.input_nr];
  }
}

void GraphTask::execute(const std::shared_ptr<Node>& node, std::vector<Tensor> inputs) {
  if (is_captured_only(node.get())) return run_captured_hooks(*node, std::move(inputs));
  run_tensor_hooks(*node, inputs);
  bool any_defined = node->num_inputs == 0 || node->apply_undefined;
  for (const Tensor& g : inputs) any_defined = any_defined || g.defined();
  // A capturing pass asks a node only for the gradients on the captured paths; one that owes
  // others is deferred whole when the options say so.
  std::vector<bool> wanted;
  bool deferred = false;
  if (!options_.capture.empty()) {
    wanted = wanted_edges(*node);
    std::vector<bool> owed(wanted.size());
    for (size_t i = 0; i < owed.size(); ++i) {
      owed[i] = node->next_edges[i].valid() && !wanted[i];
      deferred = deferred || owed[i];
    }
    deferred = deferred && any_defined && options_.defer_rest != nullptr;
    GW_CHECK(options_.defer_rest == nullptr || !any_defined || !node->needs_weight_gradients(),
             InvalidArgumentError, "[backward_input] ", node->name(),
             " needs its weights' gradients when it runs (it runs a backward pass of its own, "
             "or reduces them), so they cannot be left for later: run the whole backward instead");
    if (deferred) {
      std::lock_guard lock(mu_);
      options_.defer_rest->push_back({node, inputs, std::move(owed)});
    }
  }
  TensorList outputs;
  if (any_defined) {
    WantedOutputs scope(wanted.empty() ? nullptr : node.get(), &wanted);
    outputs = node->apply(std::move(inputs));
  }
  if (!options_.keep_graph && !deferred) node->release_variables();
  outputs.resize(node->next_edges.size());
  for (size_t i = 0; i < wanted.size(); ++i)
    if (!wanted[i]) outputs[i] = Tensor();  // computed anyway by a rule that does not ask
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < node->next_edges.size(); ++i) {
    const Edge& e = node->next_edges[i];
    if (e.valid()) deliver_locked(e.fn.get(), e.fn, e.input_nr, std::move(outputs[i]));
  }
}

bool GraphTask::finished() const {
  std::lock_guard lock(mu_);
  return ready_.empty() && pending_.empty();
}

bool GraphTask::has_ready() const {
  std::lock_guard lock(mu_);
  return !ready_.empty();
}

size_t GraphTask::stalled_nodes(std::string* example) const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [node, p] : pending_) {
    bool some = false;
    for (const Tensor& g : p.inputs) some = some || g.defined();
    if (p.dependencies > 0 && some) {
      if (n++ == 0 && example) *example = node->name();
    }
  }
  return n;
}

size_t GraphTask::open_nodes(std::string* example) const {
  std::lock_guard lock(mu_);
  if (example && !pending_.empty()) *example = pending_.begin()->first->name();
  return pending_.size();
}

std::shared_ptr<Node> make_graph_root(const std::vector<Edge>& roots, std::vector<Tensor> grads) {
  return std::make_shared<GraphRoot>(roots, std::move(grads));
}

std::vector<Tensor> run_backward(const std::vector<Edge>& roots, const std::vector<Tensor>& grads,
                                 ExecuteOptions options) {
  trace::Scope span("autograd", "backward");
  GraphTask task(std::make_shared<GraphRoot>(roots, grads), std::move(options));
  std::vector<std::function<void()>> callbacks;
  struct Scope {  // a reentrant pass queues to its own list, and restores its caller's
    std::vector<std::function<void()>>* prev = t_callbacks;
    ~Scope() { t_callbacks = prev; }
  } scope;
  t_callbacks = &callbacks;
  task.run();
  detail::NoRecordScope no_record;
  AutocastGuard no_autocast(AutocastState{});      // the callbacks end the backward (DDP, FSDP)
  for (size_t i = 0; i < callbacks.size(); ++i) {  // a callback may queue more
    auto callback = std::move(callbacks[i]);
    callback();
  }
  return task.captured();
}

namespace {

// A deferred node's owed gradients: its apply runs the node again on the gradients it received
// then, asking only for the edges it owes. Its one input takes nothing (it is a root).
class OwedGradients final : public Node {
 public:
  explicit OwedGradients(DeferredNode d) : d_(std::move(d)), name_(d_.node->name() + " (rest)") {
    num_inputs = 1;
    apply_undefined = true;
    next_edges.resize(d_.node->next_edges.size());
    for (size_t i = 0; i < next_edges.size(); ++i)
      if (d_.owed[i]) next_edges[i] = d_.node->next_edges[i];
  }
  // Runs once: the node, its saved tensors and the gradients it kept go as soon as it ran.
  TensorList apply(TensorList&&) override {
    std::shared_ptr<Node> node = std::move(d_.node);
    TensorList grads = std::move(d_.grads), out;
    {
      WantedOutputs scope(node.get(), &d_.owed);
      out = node->apply(std::move(grads));
    }
    node->release_variables();
    out.resize(d_.owed.size());
    for (size_t i = 0; i < out.size(); ++i)
      if (!d_.owed[i]) out[i] = Tensor();
    return out;
  }
  std::string name() const override { return name_; }

 private:
  DeferredNode d_;
  std::string name_;
};

}  // namespace

void run_deferred(std::vector<DeferredNode> deferred) {
  std::vector<Edge> roots;
  // Made last for the node that ran first, so that they run in the order they were deferred.
  for (auto it = deferred.rbegin(); it != deferred.rend(); ++it)
    roots.push_back({std::make_shared<OwedGradients>(std::move(*it)), 0});
  std::reverse(roots.begin(), roots.end());
  run_backward(roots, std::vector<Tensor>(roots.size()), {});
}

bool in_backward_pass() { return t_callbacks != nullptr; }

void queue_callback(std::function<void()> callback) {
  GW_CHECK(t_callbacks != nullptr, StateError,
           "[queue_callback] no backward pass that runs callbacks is running on this thread");
  GW_CHECK(callback, InvalidArgumentError, "[queue_callback] the callback is empty");
  t_callbacks->push_back(std::move(callback));
}

}  // namespace gw::autograd
