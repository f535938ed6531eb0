#include "optim/optimizer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <unordered_set>

#include "autograd/autograd.h"
#include "optim/check.h"

namespace gw::optim {

namespace {

std::string join(const std::vector<std::string>& names) {
  if (names.empty()) return "no state";
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

bool parse_state_key(const std::string& key, size_t& index, std::string& name) {
  constexpr std::string_view kPrefix = "state.";
  if (!key.starts_with(kPrefix)) return false;
  size_t dot = key.find('.', kPrefix.size());
  if (dot == std::string::npos || dot + 1 == key.size()) return false;
  const char* first = key.data() + kPrefix.size();
  const char* last = key.data() + dot;
  auto [end, ec] = std::from_chars(first, last, index);
  if (ec != std::errc() || end != last || std::to_string(index) != std::string(first, last)) {
    return false;
  }
  name = key.substr(dot + 1);
  return true;
}

Optimizer::Optimizer(std::vector<Tensor> params, std::string name)
    : params_(std::move(params)), state_(params_.size()), name_(std::move(name)) {
  GW_CHECK(!params_.empty(), InvalidArgumentError, "[", name_, "] got an empty parameter list");
  std::unordered_set<const TensorImpl*> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    GW_CHECK(p.defined(), InvalidArgumentError, "[", name_, "] parameter ", i, " is undefined");
    GW_CHECK(p.is_floating_point(), DTypeError, "[", name_, "] parameter ", i, " has dtype ",
             p.dtype(), "; only floating point tensors can be optimized");
    GW_CHECK(p.is_leaf(), InvalidArgumentError, "[", name_, "] parameter ", i,
             " is not a leaf (it has a grad_fn); optimize the tensor it is computed from");
    // Listed twice, a parameter would be updated twice per step.
    GW_CHECK(seen.insert(p.impl()).second, InvalidArgumentError, "[", name_, "] parameter ", i,
             " appears more than once in the parameter list");
  }
}

void Optimizer::step() {
  std::vector<std::pair<size_t, Tensor>> grads;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (g.defined()) grads.emplace_back(i, std::move(g));
  }
  update_all(grads);
}

void Optimizer::step(const GradMap& grads) {
  std::vector<std::pair<size_t, Tensor>> found;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = grads.find(params_[i]);
    if (it != grads.end() && it->second.defined()) found.emplace_back(i, it->second);
  }
  update_all(found);
}

void Optimizer::update_all(const std::vector<std::pair<size_t, Tensor>>& grads) {
  for (const auto& [i, g] : grads) {
    const Tensor& p = params_[i];
    GW_CHECK(g.sizes() == p.sizes(), ShapeError, "[", name_, "] gradient for parameter ", i,
             " has shape ", shape_str(g.sizes()), " but the parameter has shape ",
             shape_str(p.sizes()));
    GW_CHECK(g.device() == p.device(), InvalidArgumentError, "[", name_,
             "] gradient for parameter ", i, " is on ", g.device(), " but the parameter is on ",
             p.device());
  }
  autograd::NoGradGuard no_grad;
  std::vector<ParamUpdate> updates;
  updates.reserve(grads.size());
  for (const auto& [i, g] : grads) {
    // detach: a create_graph gradient's history must not leak into the state. A gradient of
    // another floating dtype is converted, as torch's in-place updates would.
    updates.push_back({i, params_[i], g.detach().to(params_[i].dtype())});
  }
  apply(updates);
}

void Optimizer::apply(std::vector<ParamUpdate>& updates) {
  for (ParamUpdate& u : updates) update(u.index, u.param, u.grad);
}

void Optimizer::zero_grad() {
  for (const Tensor& p : params_) {
    // Only touch tensors that have a gradient: set_grad would create autograd state otherwise.
    if (p.grad().defined()) p.set_grad({});
  }
}

void Optimizer::set_lr(double lr) {
  detail::check_at_least(name_.c_str(), "lr", lr);
  lr_ = lr;
}

double Optimizer::increment_step(NamedTensors& state) {
  auto it = state.find("step");
  if (it == state.end()) it = state.emplace("step", scalar_tensor(0.0, kFloat32)).first;
  // A float32 count, as torch keeps it: exact up to 2^24 steps.
  float step = it->second.item<float>() + 1.0f;
  it->second.fill_(step);
  return step;
}

NamedTensors Optimizer::state_dict() const {
  NamedTensors out;
  out.emplace("lr", scalar_tensor(lr_, kFloat64));
  for (size_t i = 0; i < state_.size(); ++i) {
    for (const auto& [name, t] : state_[i]) {
      out.emplace("state." + std::to_string(i) + "." + name, t.detach().clone());
    }
  }
  return out;
}

void Optimizer::load_state_dict(const NamedTensors& dict) {
  take_state_dict(prepare_state_dict(dict));
}

void Optimizer::take_state_dict(PreparedState&& prepared) {
  GW_CHECK(prepared.by_ == this, StateError, "[", name_,
           "] take_state_dict: the state was not prepared by this optimizer");
  lr_ = prepared.lr_;
  state_ = std::move(prepared.state_);
  prepared.by_ = nullptr;  // taken once: a second take throws
}

Optimizer::PreparedState Optimizer::prepare_state_dict(const NamedTensors& dict) const {
  const std::string op = "[" + name_ + "] load_state_dict: ";
  const std::vector<std::string> names = state_names();

  auto lr_it = dict.find("lr");
  GW_CHECK(lr_it != dict.end(), InvalidArgumentError, op, "missing key \"lr\"");
  GW_CHECK(lr_it->second.defined() && lr_it->second.numel() == 1, ShapeError, op,
           "key \"lr\" must hold one element");
  double lr = lr_it->second.item<double>();
  // What set_lr takes: finite and not negative.
  GW_CHECK(lr >= 0 && std::isfinite(lr), InvalidArgumentError, op,
           "key \"lr\" holds an invalid lr: ", lr);

  // Everything is checked and converted into `loaded` first, so a bad dict changes nothing.
  std::vector<NamedTensors> loaded(params_.size());
  for (const auto& [key, t] : dict) {
    if (key == "lr") continue;
    size_t index = 0;
    std::string name;
    GW_CHECK(parse_state_key(key, index, name), InvalidArgumentError, op, "unexpected key \"", key,
             "\" (keys are \"lr\" and \"state.<index>.<name>\")");
    GW_CHECK(index < params_.size(), IndexError, op, "key \"", key, "\" names parameter ", index,
             " but the optimizer has ", params_.size(), " parameters");
    GW_CHECK(std::find(names.begin(), names.end(), name) != names.end(), InvalidArgumentError, op,
             "unexpected key \"", key, "\": ", name_, " keeps ", join(names), " per parameter");
    GW_CHECK(t.defined(), InvalidArgumentError, op, "key \"", key, "\" holds no tensor");
    const Tensor& p = params_[index];
    if (name == "step") {
      GW_CHECK(t.numel() == 1, ShapeError, op, "key \"", key, "\" has shape ", shape_str(t.sizes()),
               " but a step count has one element");
      // A negative, fractional or NaN count would make the next step's bias correction NaN.
      const double steps = t.item<double>();
      GW_CHECK(steps >= 0 && std::isfinite(steps) && steps == std::floor(steps),
               InvalidArgumentError, op, "key \"", key, "\" holds step count ", steps,
               ", not a whole number >= 0");
      loaded[index][name] = t.detach().reshape({}).to(kFloat32).clone();
    } else {
      GW_CHECK(t.sizes() == p.sizes(), ShapeError, op, "key \"", key, "\" has shape ",
               shape_str(t.sizes()), " but parameter ", index, " has shape ", shape_str(p.sizes()));
      GW_CHECK(t.is_floating_point(), DTypeError, op, "key \"", key, "\" has dtype ", t.dtype(),
               "; optimizer state is floating point");
      loaded[index][name] = t.detach().to(p.dtype()).to(p.device()).clone();
    }
  }
  // A parameter's state is all there or absent (not stepped yet): half of it cannot be resumed.
  for (size_t i = 0; i < loaded.size(); ++i) {
    if (loaded[i].empty()) continue;
    for (const std::string& name : names) {
      GW_CHECK(loaded[i].contains(name), InvalidArgumentError, op, "missing key \"state.", i, ".",
               name, "\" (parameter ", i, " has other state)");
    }
  }
  PreparedState prepared;
  prepared.by_ = this;
  prepared.lr_ = lr;
  prepared.state_ = std::move(loaded);
  return prepared;
}

}  // namespace gw::optim
