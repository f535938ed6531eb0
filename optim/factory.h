// One value for "any optimizer's options", and the optimizer it describes. The distributed
// optimizer takes such a value and builds the same local optimizer on every owner of a
// parameter.
//
//   gw::optim::OptimizerOptions opts = gw::optim::AdamOptions{.lr = 1e-3};
//   std::unique_ptr<gw::optim::Optimizer> opt = gw::optim::make_optimizer(params, opts);
#pragma once

#include <memory>
#include <variant>
#include <vector>

#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/adamw.h"
#include "optim/rmsprop.h"
#include "optim/sgd.h"

namespace gw::optim {

using OptimizerOptions =
    std::variant<SGDOptions, AdamOptions, AdamWOptions, AdagradOptions, RMSpropOptions>;

std::unique_ptr<Optimizer> make_optimizer(std::vector<Tensor> params,
                                          const OptimizerOptions& options);

}  // namespace gw::optim
