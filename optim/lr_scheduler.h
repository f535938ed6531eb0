// Learning-rate schedules, as torch.optim.lr_scheduler. A scheduler adjusts its optimizer's lr
// each time step() is called (once per epoch, after the optimizer's own steps).
//
//   gw::optim::StepLR sched(opt, {.step_size = 30, .gamma = 0.1});
//   for (int epoch = 0; epoch < 100; ++epoch) { train(opt); sched.step(); }
#pragma once

#include <cstdint>

#include "optim/optimizer.h"

namespace gw::optim {

struct StepLROptions {
  int64_t step_size = 0;  // required: epochs between decays (must be positive)
  double gamma = 0.1;     // the factor applied every step_size epochs
};

// Multiplies the lr by gamma every step_size epochs. Like torch's "chainable" form it scales the
// optimizer's current lr, so changes made by set_lr in between are kept.
class StepLR {
 public:
  StepLR(Optimizer& optimizer, const StepLROptions& options);
  void step();
  int64_t last_epoch() const { return last_epoch_; }
  double get_last_lr() const { return optimizer_.lr(); }

 private:
  Optimizer& optimizer_;
  StepLROptions options_;
  int64_t last_epoch_ = 0;
};

}  // namespace gw::optim
