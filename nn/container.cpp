#include "nn/container.h"

#include <string>

namespace gw::nn {

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [name, child] : named_children()) x = (*child)(x);
  return x;
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(size()), std::move(module));
}

std::shared_ptr<Module> Sequential::operator[](size_t index) const {
  GW_CHECK(index < size(), IndexError, "[Sequential] index ", index,
           " is out of range for a Sequential of ", size(), " modules");
  return named_children()[index].second;
}

}  // namespace gw::nn
