// The parameter server's model, shared by examples/parameter_server and its benchmark: the MLP
// 784-256-128-10 with ReLUs.
//
// Trainers update the weights while another trainer's backward pass still needs the values its
// forward pass used, so each forward works on a snapshot of the weights (the gradient still
// reaches the parameters through the copy), as asynchronous parameter servers do; without it
// autograd's version check rejects the backward ("modified in place"), in PyTorch as here.
// The snapshot is taken under the distributed optimizer's step lock, so that it never sees a
// half-applied step.
#pragma once

#include <memory>

#include "dist/optim/distributed_optimizer.h"
#include "nn/functional.h"
#include "nn/linear.h"

namespace gw::examples {

struct ServerMlp : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2, fc3;
  explicit ServerMlp(Generator& gen)
      : Module("ServerMlp"),
        fc1(register_module("fc1", std::make_shared<nn::Linear>(784, 256, true, gen))),
        fc2(register_module("fc2", std::make_shared<nn::Linear>(256, 128, true, gen))),
        fc3(register_module("fc3", std::make_shared<nn::Linear>(128, 10, true, gen))) {}
  Tensor forward(const Tensor& x) override {
    namespace F = nn::functional;
    Tensor w1, w2, w3, b1, b2, b3;
    {
      std::lock_guard lock(dist::optimizer_step_lock());
      w1 = fc1->weight.clone(), w2 = fc2->weight.clone(), w3 = fc3->weight.clone();
      b1 = fc1->bias.clone(), b2 = fc2->bias.clone(), b3 = fc3->bias.clone();
    }
    return F::linear(F::relu(F::linear(F::relu(F::linear(x, w1, b1)), w2, b2)), w3, b3);
  }
};

}  // namespace gw::examples
