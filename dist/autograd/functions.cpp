#include "dist/autograd/functions.h"

#include "dist/autograd/dist_engine.h"

namespace gw::dist::autograd {

RecvRpcBackward::RecvRpcBackward(uint64_t context_id, uint64_t message_id, int from,
                                 uint32_t num_tensors)
    : context_id_(context_id), message_id_(message_id), from_(from) {
  num_inputs = num_tensors;
  apply_undefined = true;
}

gw::autograd::TensorList RecvRpcBackward::apply(gw::autograd::TensorList&& grads) {
  Pass* pass = Pass::current();
  GW_CHECK(pass, StateError,
           "[dist_autograd] the graph reaches a tensor received over RPC in "
           "context ",
           context_id_, ": run it with gw::dist::autograd::backward(context_id, roots)");
  pass->send_gradients(from_, context_id_, message_id_, grads);
  return {};
}

}  // namespace gw::dist::autograd
