// Sequential: children run one after another, each on the previous one's output. Children are
// named "0", "1", ... so state_dict keys read "0.weight", as in PyTorch.
//
//   auto model = std::make_shared<gw::nn::Sequential>(
//       std::make_shared<gw::nn::Linear>(784, 256, gen), std::make_shared<gw::nn::ReLU>(),
//       std::make_shared<gw::nn::Linear>(256, 10, gen));
//   model->push_back(std::make_shared<gw::nn::Dropout>(0.1, gen));
//   gw::Tensor logits = model->forward(x);
#pragma once

#include <memory>
#include <vector>

#include "nn/module.h"

namespace gw::nn {

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);
  template <typename M, typename... Ms>
  explicit Sequential(std::shared_ptr<M> first, std::shared_ptr<Ms>... rest)
      : Sequential(std::vector<std::shared_ptr<Module>>{std::move(first), std::move(rest)...}) {}

  // The input itself when empty.
  Tensor forward(const Tensor& input) override;

  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return named_children().size(); }
  bool empty() const { return size() == 0; }
  std::shared_ptr<Module> operator[](size_t index) const;
  // The child at index as an M (an InvalidArgumentError when it is not one).
  template <typename M>
  std::shared_ptr<M> at(size_t index) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[index]);
    GW_CHECK(m != nullptr, InvalidArgumentError, "[Sequential] child ", index, " is a ",
             (*this)[index]->type_name(), ", not the requested type");
    return m;
  }
};

}  // namespace gw::nn
