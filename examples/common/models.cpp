#include "examples/common/models.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "core/ops.h"
#include "nn/nn.h"

namespace gw::examples {

std::shared_ptr<nn::Sequential> fashion_model(const std::string& kind, Generator& gen) {
  using namespace nn;
  auto model = std::make_shared<Sequential>();
  if (kind == "mlp") {
    model->push_back(std::make_shared<Linear>(784, 256, true, gen));
    model->push_back(std::make_shared<ReLU>());
    model->push_back(std::make_shared<Linear>(256, 128, true, gen));
    model->push_back(std::make_shared<ReLU>());
    model->push_back(std::make_shared<Linear>(128, 10, true, gen));
  } else {
    Conv2dOptions same{.padding = {1, 1}};
    model->push_back(std::make_shared<Conv2d>(1, 16, std::array<int64_t, 2>{3, 3}, same, true, gen));
    model->push_back(std::make_shared<ReLU>());
    model->push_back(std::make_shared<MaxPool2d>(std::array<int64_t, 2>{2, 2}));
    model->push_back(std::make_shared<Conv2d>(16, 32, std::array<int64_t, 2>{3, 3}, same, true, gen));
    model->push_back(std::make_shared<ReLU>());
    model->push_back(std::make_shared<MaxPool2d>(std::array<int64_t, 2>{2, 2}));
    model->push_back(std::make_shared<Flatten>());
    model->push_back(std::make_shared<Linear>(32 * 7 * 7, 128, true, gen));
    model->push_back(std::make_shared<ReLU>());
    model->push_back(std::make_shared<Linear>(128, 10, true, gen));
  }
  return model;
}

// Images as the model wants them: flat for the MLP, (N,1,28,28) for the CNN.
Tensor shape_input(const Tensor& x, const std::string& kind) {
  return kind == "cnn" ? x.view({-1, 1, 28, 28}) : x;
}

double test_accuracy(nn::Module& model, const data::Dataset& test, const std::string& kind,
                     Device device) {
  autograd::NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0;
  for (int64_t start = 0; start < test.size(); start += 1000) {
    int64_t n = std::min<int64_t>(1000, test.size() - start);
    Tensor logits = model(shape_input(test.images.narrow(0, start, n), kind).to(device));
    correct +=
        eq(argmax(logits, 1), test.labels.narrow(0, start, n).to(device)).sum().item<int64_t>();
  }
  model.train();
  return static_cast<double>(correct) / static_cast<double>(test.size());
}

}  // namespace gw::examples
