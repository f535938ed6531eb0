#include "dist/autograd/context.h"

#include "autograd/accumulate_grad.h"
#include "core/ops.h"
#include "dist/autograd/dist_engine.h"

namespace gw::dist::autograd {

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

void DistAutogradContext::remove_send_function(uint64_t message_id) {
  std::lock_guard lock(mu_);
  sends_.erase(message_id);
}

std::shared_ptr<SendRpcBackward> DistAutogradContext::send_function(uint64_t message_id) const {
  std::lock_guard lock(mu_);
  auto it = sends_.find(message_id);
  GW_CHECK(it != sends_.end(), InvalidArgumentError, "[dist_autograd] context ", id_,
           " has no send function for autograd message ", message_id);
  return it->second;
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
  if (inserted) {
    it->second = grad.clone();  // the map's own: a later pass may add to it in place
  } else if (!gw::autograd::sole_owner(it->second)) {
    it->second = it->second + grad;  // someone holds it or a view of it: leave theirs alone
  } else {
    it->second.add_(grad);
  }
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
  // Pass ids grow on the worker that starts them (its id in the top bits): gradients of an
  // older pass (one that failed and was retried) must not start it again.
  uint64_t& newest = newest_pass_[worker_of(pass_id)];
  GW_CHECK(pass_id > newest, StateError, "[dist_autograd.backward] context ", id_,
           ": gradients of backward pass ", pass_id, " arrived after pass ", newest,
           " started");
  GW_CHECK(!pass_ || !pass_->busy(), StateError, "[dist_autograd.backward] context ", id_,
           " already runs a backward pass (", pass_->id(),
           "); passes of one context must not overlap");
  newest = pass_id;
  NodeList sends;
  sends.reserve(sends_.size());
  for (const auto& [id, fn] : sends_) sends.push_back(fn);
  pass_ = make(std::move(sends));
  return pass_;
}

}  // namespace gw::dist::autograd
