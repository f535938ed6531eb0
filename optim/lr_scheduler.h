// Learning-rate schedules, as torch.optim.lr_scheduler. A scheduler adjusts its optimizer's lr
// each time step() is called (once per epoch, after the optimizer's own steps).
//
//   gw::optim::StepLR sched(opt, {.step_size = 30, .gamma = 0.1});
//   for (int epoch = 0; epoch < 100; ++epoch) { train(opt); sched.step(); }
//
// LambdaLR sets lr = base_lr * f(step) and is stepped per optimizer step in transformer
// training; warmup_cosine is the usual f: a linear warm-up, then a cosine decay.
//
//   gw::optim::LambdaLR sched(opt, gw::optim::warmup_cosine(100, 5000, 0.1));
//   for (int64_t it = 0; it < 5000; ++it) { train_step(opt); sched.step(); }
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

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

// torch.optim.lr_scheduler.LambdaLR: lr = base_lr * factor(last_epoch), base_lr being the
// optimizer's lr when the scheduler is made; the constructor applies factor(last_epoch). To
// resume, pass the step reached and the base lr (the optimizer's lr is the scheduled one then).
class LambdaLR {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> factor, int64_t last_epoch = 0,
           std::optional<double> base_lr = std::nullopt);
  void step();
  int64_t last_epoch() const { return last_epoch_; }
  double get_last_lr() const { return optimizer_.lr(); }

 private:
  void apply(int64_t epoch);
  Optimizer& optimizer_;
  std::function<double(int64_t)> factor_;
  double base_lr_;
  int64_t last_epoch_ = 0;
};

// A LambdaLR factor as nanoGPT's: (step + 1) / (warmup_steps + 1) for the first warmup_steps
// steps, then a cosine from 1 (at warmup_steps) down to min_factor at total_steps, and
// min_factor after.
std::function<double(int64_t)> warmup_cosine(int64_t warmup_steps, int64_t total_steps,
                                             double min_factor = 0.0);

}  // namespace gw::optim
