// The Fashion-MNIST models the trainers share (mnist_train, ddp_train): the MLP 784-256-128-10
// and a small CNN, and how to feed and evaluate them.
#pragma once

#include <memory>
#include <string>

#include "core/random.h"
#include "examples/common/fashion_mnist.h"
#include "nn/container.h"

namespace gw::examples {

// "mlp" or "cnn", drawn from `gen`.
std::shared_ptr<nn::Sequential> fashion_model(const std::string& kind, Generator& gen);
// Images as the model wants them: flat for the MLP, (N, 1, 28, 28) for the CNN.
Tensor shape_input(const Tensor& x, const std::string& kind);
// Test accuracy in [0, 1], in eval mode and without recording, on the model's device.
double test_accuracy(nn::Module& model, const data::Dataset& test, const std::string& kind,
                     Device device = kCPU);

}  // namespace gw::examples
