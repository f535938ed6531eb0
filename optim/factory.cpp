#include "optim/factory.h"

namespace gw::optim {

namespace {
// Each options struct names its optimizer.
std::unique_ptr<Optimizer> make(std::vector<Tensor> p, const SGDOptions& o) {
  return std::make_unique<SGD>(std::move(p), o);
}
std::unique_ptr<Optimizer> make(std::vector<Tensor> p, const AdamOptions& o) {
  return std::make_unique<Adam>(std::move(p), o);
}
std::unique_ptr<Optimizer> make(std::vector<Tensor> p, const AdamWOptions& o) {
  return std::make_unique<AdamW>(std::move(p), o);
}
std::unique_ptr<Optimizer> make(std::vector<Tensor> p, const AdagradOptions& o) {
  return std::make_unique<Adagrad>(std::move(p), o);
}
std::unique_ptr<Optimizer> make(std::vector<Tensor> p, const RMSpropOptions& o) {
  return std::make_unique<RMSprop>(std::move(p), o);
}
}  // namespace

std::unique_ptr<Optimizer> make_optimizer(std::vector<Tensor> params,
                                          const OptimizerOptions& options) {
  return std::visit([&](const auto& o) { return make(std::move(params), o); }, options);
}

}  // namespace gw::optim
