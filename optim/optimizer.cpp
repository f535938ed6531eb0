#include "optim/optimizer.h"

namespace gw::optim {

Optimizer::Optimizer(std::vector<Tensor> params, std::string name)
    : params_(std::move(params)), state_(params_.size()), name_(std::move(name)) {}

}  // namespace gw::optim
