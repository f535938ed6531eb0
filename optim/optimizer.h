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
//
// Updates write into the parameter's own storage, so every view or handle of it (a Module's
// member, an RRef's value) sees the new values. The arithmetic follows PyTorch 1.13's
// single-tensor (foreach=False) implementations operation by operation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/serialize.h"
#include "core/tensor.h"

namespace gw::optim {

using GradMap = TensorMap<Tensor>;

// One parameter's part of a step: parameters()[index] and its gradient (detached, converted
// to the parameter's dtype).
struct ParamUpdate {
  size_t index;
  Tensor param;
  Tensor grad;
};

class Optimizer {
 public:
  // Parameters must be defined, floating point leaves, each listed once.
  explicit Optimizer(std::vector<Tensor> params, std::string name);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a .grad; parameters without one are skipped.
  void step();
  // The same with gradients given per parameter (parameters absent from the map are skipped,
  // entries for tensors that are not parameters are ignored). Every gradient is checked before
  // any parameter changes, so a ShapeError leaves the parameters and state untouched.
  void step(const GradMap& grads);
  void zero_grad();  // sets every .grad to none

  const std::vector<Tensor>& parameters() const { return params_; }
  double lr() const { return lr_; }
  void set_lr(double lr);  // for schedules; a negative lr throws InvalidArgumentError

  // State tensors by "state.<param index>.<name>" (e.g. "state.0.exp_avg"), plus "lr" (a 0-dim
  // float64 tensor). The layout mirrors torch.optim's state_dict. The tensors are copies: later
  // steps do not change a dict already taken.
  NamedTensors state_dict() const;
  // Replaces all state (parameters absent from `state` start fresh). Keys, names and shapes are
  // checked before anything changes; errors name the key.
  void load_state_dict(const NamedTensors& state);
  // load_state_dict in two halves, for loads that must change nothing on any rank unless every
  // rank can load (ZeroRedundancyOptimizer's and fully_shard's loads from a checkpoint):
  // prepare_state_dict checks and converts `state`, throwing what load_state_dict would, and
  // changes nothing; take_state_dict installs what this optimizer prepared, and throws only
  // StateError for anything else (a PreparedState never filled, or taken already).
  class PreparedState {
    friend class Optimizer;
    const Optimizer* by_ = nullptr;
    double lr_ = 0;
    std::vector<NamedTensors> state_;  // by parameter
  };
  PreparedState prepare_state_dict(const NamedTensors& state) const;
  void take_state_dict(PreparedState&& prepared);
  const std::string& name() const { return name_; }

 protected:
  // Updates params_[index] with `grad`; runs with recording off.
  virtual void update(size_t index, Tensor& param, const Tensor& grad) = 0;
  // Applies one step's updates, with recording off. The default calls update() for each;
  // optimizers with a fused kernel override it to update many parameters per launch.
  virtual void apply(std::vector<ParamUpdate>& updates);
  // The state names one parameter has once stepped, under the current options. "step" is a
  // 0-dim float32 count (as in torch); every other entry is shaped like the parameter.
  virtual std::vector<std::string> state_names() const = 0;
  // The named state of one parameter, created on first use by the subclass.
  NamedTensors& state(size_t index) { return state_[index]; }
  // Adds one to state["step"] (created at 0 when absent) and returns the new count.
  static double increment_step(NamedTensors& state);

  double lr_ = 0;

 private:
  void update_all(const std::vector<std::pair<size_t, Tensor>>& grads);

  std::vector<Tensor> params_;
  std::vector<NamedTensors> state_;
  std::string name_;
};

// "state.<index>.<name>" split into its parts; false for any other spelling (leading zeros
// included, so that one index has one key).
bool parse_state_key(const std::string& key, size_t& index, std::string& name);

}  // namespace gw::optim
