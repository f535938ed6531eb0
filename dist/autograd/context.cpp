#include "dist/autograd/context.h"

#include "core/ops.h"
#include "dist/autograd/engine.h"

namespace gw::dist_autograd {

void DistAutogradContext::add_send_function(uint64_t message_id,
                                            std::shared_ptr<SendRpcBackward> fn) {
  std::lock_guard lock(mu_);
  sends_[message_id] = std::move(fn);
}

void DistAutogradContext::add_recv_function(uint64_t message_id,
                                            std::shared_ptr<RecvRpcBackward> fn) {
  std::lock_guard lock(mu_);
  recvs_[message_id] = std::move(fn);
}

std::shared_ptr<SendRpcBackward> DistAutogradContext::send_function(uint64_t message_id) const {
  std::lock_guard lock(mu_);
  auto it = sends_.find(message_id);
  GW_CHECK(it != sends_.end(), InvalidArgumentError, "[dist_autograd] context ", id_,
           " has no send function for autograd message ", message_id);
  return it->second;
}

size_t DistAutogradContext::num_send_functions() const {
  std::lock_guard lock(mu_);
  return sends_.size();
}

size_t DistAutogradContext::num_recv_functions() const {
  std::lock_guard lock(mu_);
  return recvs_.size();
}

void DistAutogradContext::add_known_worker(int worker) {
  std::lock_guard lock(mu_);
  known_workers_.insert(worker);
}

std::set<int> DistAutogradContext::known_workers() const {
  std::lock_guard lock(mu_);
  return known_workers_;
}

void DistAutogradContext::accumulate_grad(const Tensor& leaf, const Tensor& grad) {
  std::lock_guard lock(mu_);
  auto [it, inserted] = grads_.try_emplace(leaf, Tensor());
  // The map owns its gradients: a later pass adds in place, so never keep the caller's tensor.
  if (inserted)
    it->second = grad.clone();
  else
    it->second.add_(grad);
}

GradientMap DistAutogradContext::gradients() const {
  std::lock_guard lock(mu_);
  return grads_;
}

std::shared_ptr<Pass> DistAutogradContext::current_pass() const {
  std::lock_guard lock(mu_);
  return pass_;
}

std::shared_ptr<Pass> DistAutogradContext::pass(
    uint64_t pass_id, const std::function<std::shared_ptr<Pass>(NodeList)>& make) {
  std::lock_guard lock(mu_);
  if (pass_ && pass_->id() == pass_id) return pass_;
  GW_CHECK(!pass_ || !pass_->busy(), StateError, "[dist_autograd.backward] context ", id_,
           " already runs a backward pass; passes of one context must not overlap");
  NodeList sends;
  sends.reserve(sends_.size());
  for (const auto& [id, fn] : sends_) sends.push_back(fn);
  pass_ = make(std::move(sends));
  return pass_;
}

}  // namespace gw::dist_autograd
