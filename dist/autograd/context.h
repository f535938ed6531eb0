// One distributed autograd context on one worker ("Distributed Autograd Context" in
// PyTorch's distributed autograd design note,
// pytorch.org/docs/stable/rpc/distributed_autograd.html).
//
// It holds what a forward pass recorded here (send and recv functions by autograd_message_id, the
// workers this worker exchanged messages with in the context), the gradients that backward
// passes accumulated for this worker's leaves, and the backward pass currently running here.
// Gradients go to this map, never to `.grad`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "core/tensor.h"
#include "dist/autograd/functions.h"

namespace gw::dist::autograd {

// Context, message and pass ids carry the worker that made them in their top bits.
inline constexpr int kWorkerIdBits = 16;
inline int worker_of(uint64_t id) { return static_cast<int>(id >> (64 - kWorkerIdBits)); }

class Pass;
using GradientMap = TensorMap<Tensor>;

class DistAutogradContext {
 public:
  explicit DistAutogradContext(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }

  void add_send_function(uint64_t message_id, std::shared_ptr<SendRpcBackward> fn);
  void add_recv_function(uint64_t message_id, std::shared_ptr<RecvRpcBackward> fn);
  void remove_send_function(uint64_t message_id);  // its message never left
  // Throws InvalidArgumentError naming the context when there is none for `message_id`.
  std::shared_ptr<SendRpcBackward> send_function(uint64_t message_id) const;

  void add_known_worker(int worker);
  std::set<int> known_workers() const;

  void accumulate_grad(const Tensor& leaf, const Tensor& grad);
  GradientMap gradients() const;

  // The backward pass `pass_id` on this worker: the running one, or a new one that `make`
  // builds from the context's send functions when the previous pass is over. Throws
  // StateError while another pass runs.
  using NodeList = std::vector<std::shared_ptr<gw::autograd::Node>>;
  std::shared_ptr<Pass> current_pass() const;
  std::shared_ptr<Pass> pass(uint64_t pass_id,
                             const std::function<std::shared_ptr<Pass>(NodeList)>& make);

 private:
  const uint64_t id_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<SendRpcBackward>> sends_;
  std::map<uint64_t, std::shared_ptr<RecvRpcBackward>> recvs_;
  std::set<int> known_workers_;
  GradientMap grads_;
  std::shared_ptr<Pass> pass_;
  std::map<uint64_t, uint64_t> newest_pass_;  // by the worker that started it
};

}  // namespace gw::dist::autograd
