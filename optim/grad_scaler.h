// Loss scaling for float16 mixed precision, as torch.amp.GradScaler. float16 keeps few exponent
// bits: gradients below about 6e-8 flush to zero. So the loss is multiplied by a large scale
// before backward (every gradient with it), and the gradients are divided by it before the
// optimizer steps. A step whose gradients overflowed (an inf or NaN among them) is skipped and
// the scale halved; after growth_interval steps without one, the scale doubles. bfloat16 has
// float32's exponent range and needs none of this.
//
//   gw::optim::GradScaler scaler;                                  // scale 65536
//   for (auto [x, y] : batches) {
//     opt.zero_grad();
//     Tensor loss;
//     {
//       gw::AutocastGuard amp(gw::DeviceType::CUDA, gw::kFloat16);
//       loss = model->loss(x, y);
//     }
//     scaler.scale(loss).backward();
//     scaler.unscale_(opt);            // optional: to clip the true gradients
//     gw::optim::clip_grad_norm_(model->parameters(), 1.0);
//     scaler.step(opt);                // skipped when a gradient is inf or NaN
//     scaler.update();                 // the scale for the next iteration
//   }
//
// With a power-of-two init_scale (and the default factors) scaling and unscaling are exact for
// float32 gradients; bfloat16 ones are unscaled in float32 and rounded once; float16 gradients
// are refused, as PyTorch refuses them: keep parameters float32 and let autocast compute in
// float16. A failure partway through unscale_ skips that step. Under DDP every rank holds the
// same averaged gradients and decides alike; where ranks hold different parameters (fully_shard,
// pipeline stages) they share the decision through gw::fsdp::ShardedGradScaler
// (fsdp/sharded_grad_scaler.h), which overrides agree().
#pragma once

#include <cstdint>
#include <unordered_map>

#include "core/serialize.h"
#include "core/tensor.h"
#include "optim/optimizer.h"

namespace gw::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;   // the scale after growth_interval good steps
  double backoff_factor = 0.5;  // the scale after a step with inf or NaN gradients
  int64_t growth_interval = 2000;
  bool enabled = true;  // false: every call passes through (scale 1, plain steps)
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale.
  Tensor scale(const Tensor& loss) const;
  // Divides the gradients of `opt`'s parameters by the scale, in place, and notes whether any
  // holds an inf or NaN (one read of a number from the device). Once per optimizer per
  // iteration.
  void unscale_(Optimizer& opt);
  // unscale_ unless done, then opt.step() unless a gradient held an inf or NaN. Returns whether
  // it stepped. Once per optimizer per iteration; an optimizer none of whose parameters has a
  // gradient is refused (nothing was checked).
  bool step(Optimizer& opt);
  // After the iteration's steps: backs the scale off if any step was skipped, else counts a
  // good iteration and grows it after growth_interval of them.
  void update();

  double get_scale() const { return options_.enabled ? scale_ : 1.0; }
  bool is_enabled() const { return options_.enabled; }
  // The scale and the count of good iterations since it changed, as 0-dim float64 tensors
  // ("scale", "growth_tracker"), to checkpoint with the optimizer; load refuses values that do
  // not fit, changing nothing.
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state);

  GradScaler(const GradScaler&) = delete;  // a copy of a ShardedGradScaler would not agree
  GradScaler& operator=(const GradScaler&) = delete;
  virtual ~GradScaler() = default;

 protected:
  // What unscale_ found on this process's gradients of one optimizer: an inf or NaN among them
  // (or a failure partway), and whether there were any. A scaler whose processes hold different
  // gradients makes every process decide alike here (a collective: every process, with the
  // scaler enabled alike, unscales the same optimizers in the same order); this one holds all
  // of them.
  virtual void agree(bool& /*found_inf*/, bool& /*checked*/) {}

 private:
  struct PerOptimizer {
    bool unscaled = false, stepped = false, found_inf = false, checked = false;
  };
  GradScalerOptions options_;
  double scale_;
  int64_t good_steps_ = 0;  // since the scale last changed
  std::unordered_map<const Optimizer*, PerOptimizer> iteration_;
};

}  // namespace gw::optim
