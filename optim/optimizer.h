// gradwire optim — optimizers, as in torch.optim.
//
// Mental model: an optimizer holds a list of parameters (leaf tensors) and per-parameter state
// (momentum buffers, moment estimates, step counts). step() reads each parameter's .grad and
// updates the parameter in place, with recording off. The functional form step(grads) takes
// the gradients explicitly — the distributed optimizer feeds it the gradients of a distributed
// autograd context, which never touch .grad.
//
//   gw::optim::SGD opt(model->parameters(), gw::optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
//   for (...) { opt.zero_grad(); loss.backward(); opt.step(); }
//   gw::optim::Adam adam(params, {.lr = 1e-3});
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/serialize.h"
#include "core/tensor.h"

namespace gw::optim {

using GradMap = TensorMap<Tensor>;

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params, std::string name);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a .grad; parameters without one are skipped.
  void step();
  // The same with gradients given per parameter (parameters absent from the map are skipped).
  void step(const GradMap& grads);
  void zero_grad();  // sets every .grad to none

  const std::vector<Tensor>& parameters() const { return params_; }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }  // for schedules

  // State tensors by "state.<param index>.<name>" (e.g. "state.0.exp_avg"), plus "lr". The
  // layout mirrors torch.optim's state_dict.
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state);
  const std::string& name() const { return name_; }

 protected:
  // Updates params_[index] with `grad`; runs with recording off.
  virtual void update(size_t index, Tensor& param, const Tensor& grad) = 0;
  // The named state of one parameter, created on first use by the subclass.
  NamedTensors& state(size_t index) { return state_[index]; }

  double lr_ = 0;

 private:
  std::vector<Tensor> params_;
  std::vector<NamedTensors> state_;
  std::string name_;
};

}  // namespace gw::optim
