// The send and recv functions that distributed autograd attaches to the graph at every RPC
// boundary ("Autograd recording during the forward pass" in
// pytorch.org/docs/stable/rpc/distributed_autograd.html).
//
// The sender of tensors that require grad records a SendRpcBackward whose next edges point at
// those tensors' history; the receiver records a RecvRpcBackward as the history of the tensors it
// read. Both are stored in the context under the pair's autograd_message_id. In the backward pass
// the recv function ships its incoming gradients to the sender (see dist_engine.h), where they are
// handed to the send function, which passes them on unchanged.
#pragma once

#include <cstdint>

#include "autograd/node.h"

namespace gw::dist::autograd {

class SendRpcBackward final : public gw::autograd::Node {
 public:
  explicit SendRpcBackward(uint32_t num_tensors) { num_inputs = num_tensors; }
  gw::autograd::TensorList apply(gw::autograd::TensorList&& grads) override {
    return std::move(grads);
  }
  std::string name() const override { return "SendRpcBackward"; }
};

class RecvRpcBackward final : public gw::autograd::Node {
 public:
  RecvRpcBackward(uint64_t context_id, uint64_t message_id, int from, uint32_t num_tensors);
  // Sends `grads` (undefined ones too: the sender waits for this message) to the send function.
  gw::autograd::TensorList apply(gw::autograd::TensorList&& grads) override;
  std::string name() const override { return "RecvRpcBackward"; }
  int from() const { return from_; }
  uint64_t message_id() const { return message_id_; }

 private:
  uint64_t context_id_;
  uint64_t message_id_;
  int from_;
};

}  // namespace gw::dist::autograd
