#include "autograd/node.h"

#include "autograd/accumulate_grad.h"
#include "autograd/meta.h"

namespace gw::autograd {

Tensor run_hook(const GradHook& hook, Tensor grad, const char* where) {
  Tensor replaced = hook(grad);
  if (!replaced.defined()) return grad;
  GW_CHECK(replaced.sizes() == grad.sizes() && replaced.dtype() == grad.dtype() &&
               replaced.device() == grad.device(),
           InvalidArgumentError, "[", where, "] a gradient hook returned a ",
           shape_str(replaced.sizes()), " ", replaced.dtype(), " tensor on ", replaced.device(),
           " for a ", shape_str(grad.sizes()), " ", grad.dtype(), " gradient on ", grad.device(),
           "; a hook must keep the gradient's shape, dtype and device");
  return replaced;
}

namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
// The node whose apply runs on this thread in a pass that wants only some of its outputs.
thread_local const Node* t_masked_node = nullptr;
thread_local const std::vector<bool>* t_wanted = nullptr;
}  // namespace

bool wants(const Node& n, size_t i) {
  if (!n.next_edges[i].valid()) return false;
  return t_masked_node != &n || (*t_wanted)[i];
}

WantedOutputs::WantedOutputs(const Node* node, const std::vector<bool>* wanted)
    : prev_node_(t_masked_node), prev_wanted_(t_wanted) {
  t_masked_node = node;
  t_wanted = wanted;
}
WantedOutputs::~WantedOutputs() {
  t_masked_node = prev_node_;
  t_wanted = prev_wanted_;
}

Node::Node() : sequence_nr_(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}
Node::Node(First) : sequence_nr_(UINT64_MAX) {}

SavedTensor::SavedTensor(const Tensor& t, bool is_output) {
  if (!t.defined()) return;
  data_ = is_output ? t.detach() : t;
  version_ = t.storage()->version();
}

Tensor SavedTensor::unpack(const Node& owner) const {
  GW_CHECK(data_.defined(), StateError, "[backward] trying to backward through the graph a "
           "second time (the saved tensors of ", owner.name(), " were freed after the first "
           "backward); pass retain_graph=true to the first backward if you need to");
  GW_CHECK(data_.storage()->version() == version_, StateError,
           "[backward] a tensor saved by ", owner.name(), " for the backward pass was modified "
           "by an in-place operation (version ", version_, " when saved, now ",
           data_.storage()->version(), ")");
  return data_;
}

AutogradMeta& meta(const Tensor& t) {
  TensorImpl* impl = t.impl();
  GW_CHECK(impl != nullptr, StateError, "[autograd] use of an undefined tensor");
  if (!impl->has_autograd_meta.load(std::memory_order_acquire)) {
    // Two threads may touch a leaf first at once; creation is rare, one lock is enough.
    static std::mutex creation;
    std::lock_guard lock(creation);
    if (!impl->has_autograd_meta.load(std::memory_order_relaxed)) {
      impl->autograd_meta = std::make_shared<AutogradMeta>();
      impl->has_autograd_meta.store(true, std::memory_order_release);
    }
  }
  return *impl->autograd_meta;
}

AutogradMeta* meta_if(const Tensor& t) {
  TensorImpl* impl = t.impl();
  if (!impl || !impl->has_autograd_meta.load(std::memory_order_acquire)) return nullptr;
  return impl->autograd_meta.get();
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& m = meta(t);
  if (m.grad_fn) return {m.grad_fn, m.output_nr};
  // A leaf: reuse its AccumulateGrad while some graph holds it, so gradients from several
  // uses of one leaf meet in one node.
  std::lock_guard lock(m.mutex);
  std::shared_ptr<Node> acc = m.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m.grad_accumulator = acc;
  }
  return {acc, 0};
}

std::vector<Edge> collect_edges(std::initializer_list<const Tensor*> inputs) {
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor* t : inputs) edges.push_back(gradient_edge(*t));
  return edges;
}

void set_history(const Tensor& out, const std::shared_ptr<Node>& node, uint32_t output_nr) {
  out.impl()->requires_grad = true;
  // `out` was just made by the op: no other thread can see it yet, so no creation lock.
  TensorImpl* impl = out.impl();
  if (!impl->has_autograd_meta.load(std::memory_order_relaxed)) {
    impl->autograd_meta = std::make_shared<AutogradMeta>();
    impl->has_autograd_meta.store(true, std::memory_order_release);
  }
  AutogradMeta& m = *impl->autograd_meta;
  m.grad_fn = node;
  m.output_nr = output_nr;
}

}  // namespace gw::autograd
