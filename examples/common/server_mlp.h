// The parameter server's model, shared by examples/parameter_server and its benchmark: the MLP
// 784-256-128-10 with ReLUs.
//
// Trainers update the weights while another trainer's backward pass still needs the values its
// forward pass used, so each forward works on a snapshot of the weights (the gradient still
// reaches the parameters through the copy), as asynchronous parameter servers do; without it
// autograd's version check rejects the backward ("modified in place"), in PyTorch as here.
// The biases are not saved for backward and are used as they are.
#pragma once

#include <memory>

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
    auto layer = [](const Tensor& h, const nn::Linear& l) {
      return F::linear(h, l.weight.clone(), l.bias);
    };
    return layer(F::relu(layer(F::relu(layer(x, *fc1)), *fc2)), *fc3);
  }
};

}  // namespace gw::examples
