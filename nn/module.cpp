#include "nn/module.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "autograd/grad_mode.h"
#include "core/ops.h"

namespace gw::nn {

namespace {

// PyTorch reports every bad key at once, quoted and comma-separated.
std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "\"" : ", \"") + k + "\"";
  return out;
}

// Named tensors without repeats: a parameter shared by two submodules is listed once, under
// the first name it is reached by, as PyTorch's named_parameters does.
std::vector<std::pair<std::string, Tensor>> unique(
    std::vector<std::pair<std::string, Tensor>> named) {
  std::unordered_set<const TensorImpl*> seen;
  std::erase_if(named, [&](const auto& nt) { return !seen.insert(nt.second.impl()).second; });
  return named;
}

}  // namespace

Tensor Module::forward(const Tensor&) {
  throw StateError(detail::str("[", type_name_, "] forward(Tensor) is not implemented"));
}

Tensor Module::operator()(const Tensor& input) {
  if (pre_hooks_.empty() && hooks_.empty()) return forward(input);
  // Copies: a hook may register or remove hooks.
  const auto pre_hooks = pre_hooks_;
  const auto hooks = hooks_;
  Tensor x = input;
  for (const auto& [id, hook] : pre_hooks)
    if (Tensor replaced = hook(*this, x); replaced.defined()) x = std::move(replaced);
  Tensor y = forward(x);
  for (const auto& [id, hook] : hooks)
    if (Tensor replaced = hook(*this, x, y); replaced.defined()) y = std::move(replaced);
  return y;
}

int64_t Module::register_forward_pre_hook(ForwardPreHook hook) {
  GW_CHECK(hook != nullptr, InvalidArgumentError, "[", type_name_,
           "] register_forward_pre_hook: the hook is empty");
  pre_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

int64_t Module::register_forward_hook(ForwardHook hook) {
  GW_CHECK(hook != nullptr, InvalidArgumentError, "[", type_name_,
           "] register_forward_hook: the hook is empty");
  hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

void Module::remove_hook(int64_t id) {
  std::erase_if(pre_hooks_, [&](const auto& h) { return h.first == id; });
  std::erase_if(hooks_, [&](const auto& h) { return h.first == id; });
}

// --- registration ---------------------------------------------------------------------------

void Module::check_new_name(const std::string& name, const char* what) const {
  GW_CHECK(!name.empty() && name.find('.') == std::string::npos, InvalidArgumentError, "[",
           type_name_, "] ", what, " name \"", name, "\" must be non-empty and contain no '.'");
  auto has = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  GW_CHECK(!has(parameters_) && !has(buffers_) && !has(children_), InvalidArgumentError, "[",
           type_name_, "] cannot register ", what, " \"", name,
           "\": the name is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "parameter");
  GW_CHECK(tensor.defined(), InvalidArgumentError, "[", type_name_, "] parameter \"", name,
           "\" is an undefined tensor");
  // A parameter is a leaf: history that produced its initial value is not part of the model.
  if (!tensor.is_leaf()) tensor = tensor.detach();
  tensor.requires_grad_(requires_grad);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name(name, "buffer");
  GW_CHECK(tensor.defined(), InvalidArgumentError, "[", type_name_, "] buffer \"", name,
           "\" is an undefined tensor");
  buffers_.emplace_back(name, tensor);
  return tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "submodule");
  GW_CHECK(module != nullptr, InvalidArgumentError, "[", type_name_, "] submodule \"", name,
           "\" is null");
  GW_CHECK(module.get() != this, InvalidArgumentError, "[", type_name_,
           "] a module cannot be its own submodule (\"", name, "\")");
  children_.emplace_back(name, std::move(module));
}

Tensor* Module::find_tensor(const std::string& name) {
  for (auto* list : {&parameters_, &buffers_}) {
    for (auto& [n, t] : *list) {
      if (n == name) return &t;
    }
  }
  return nullptr;
}

void Module::set_tensor(const std::string& name, const Tensor& tensor) {
  Tensor* slot = find_tensor(name);
  GW_CHECK(slot != nullptr, InvalidArgumentError, "[", type_name_,
           "] set_tensor: no parameter or buffer named \"", name, "\"");
  GW_CHECK(tensor.defined(), InvalidArgumentError, "[", type_name_, "] set_tensor: \"", name,
           "\" given an undefined tensor");
  bool is_param = std::any_of(parameters_.begin(), parameters_.end(),
                              [&](const auto& e) { return e.first == name; });
  Tensor t = tensor;
  if (is_param) {
    bool requires_grad = slot->requires_grad();
    if (!t.is_leaf()) t = t.detach();
    t.requires_grad_(requires_grad);
  }
  *slot = t;
}

Tensor Module::swap_parameter(const std::string& name, const Tensor& replacement) {
  auto it = std::find_if(parameters_.begin(), parameters_.end(),
                         [&](const auto& e) { return e.first == name; });
  GW_CHECK(it != parameters_.end(), InvalidArgumentError, "[", type_name_,
           "] swap_parameter: no parameter named \"", name, "\"");
  GW_CHECK(replacement.defined() && replacement.is_leaf(), InvalidArgumentError, "[", type_name_,
           "] swap_parameter(\"", name, "\"): the replacement must be a defined leaf tensor");
  return std::exchange(it->second, replacement);
}

Tensor Module::tie_parameter(const std::string& name, const Tensor& parameter) {
  auto it = std::find_if(parameters_.begin(), parameters_.end(),
                         [&](const auto& e) { return e.first == name; });
  GW_CHECK(it != parameters_.end(), InvalidArgumentError, "[", type_name_,
           "] tie_parameter: no parameter named \"", name, "\"");
  GW_CHECK(parameter.defined(), InvalidArgumentError, "[", type_name_, "] tie_parameter(\"", name,
           "\"): the tensor is undefined");
  GW_CHECK(parameter.is_leaf() && parameter.requires_grad(), InvalidArgumentError, "[", type_name_,
           "] tie_parameter(\"", name,
           "\"): the tensor must be a parameter, a leaf that requires grad (is_leaf ",
           parameter.is_leaf() ? "true" : "false", ", requires_grad ",
           parameter.requires_grad() ? "true" : "false", ")");
  const Tensor& own = it->second;
  GW_CHECK(parameter.sizes() == own.sizes(), ShapeError, "[", type_name_, "] tie_parameter(\"",
           name, "\"): the tensor is ", shape_str(parameter.sizes()),
           ", the parameter it replaces ", shape_str(own.sizes()));
  GW_CHECK(parameter.dtype() == own.dtype() && parameter.device() == own.device(),
           InvalidArgumentError, "[", type_name_, "] tie_parameter(\"", name, "\"): the tensor is ",
           parameter.dtype(), " on ", parameter.device(), ", the parameter it replaces ",
           own.dtype(), " on ", own.device());
  it->second = parameter;
  return parameter;
}

// --- traversal ------------------------------------------------------------------------------

void Module::collect(const std::string& prefix, bool params, bool recurse,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : params ? parameters_ : buffers_) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, child] : children_)
    child->collect(prefix + name + ".", params, true, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", true, recurse, out);
  return unique(std::move(out));
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", false, recurse, out);
  return unique(std::move(out));
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, child] : children_) out.push_back(child);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (const auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
  for (const Tensor& p : parameters()) {
    if (p.grad().defined()) p.set_grad({});
  }
}

// --- state ----------------------------------------------------------------------------------

NamedTensors Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> all;
  collect("", true, true, all);
  collect("", false, true, all);
  NamedTensors out;
  // Detached views of the live values (as PyTorch's keep_vars=False): no copy, no history.
  for (auto& [name, t] : all) out.emplace(name, t.detach());
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::vector<std::pair<std::string, Tensor>> own = checked_load(state, strict);
  autograd::NoGradGuard no_grad;
  for (auto& [name, dst] : own) {
    auto it = state.find(name);
    if (it != state.end()) dst.copy_(it->second);
  }
}

void Module::check_state_dict(const NamedTensors& state, bool strict) const {
  checked_load(state, strict);
}

std::vector<std::pair<std::string, Tensor>> Module::checked_load(const NamedTensors& state,
                                                                 bool strict) const {
  std::vector<std::pair<std::string, Tensor>> own;
  collect("", true, true, own);
  collect("", false, true, own);

  // Everything is checked before anything is copied, so a failed load leaves the model as it was.
  // A tensor tied under several names (Module::tie_parameter) needs one of them in `state`, as a
  // file that stores it once has it; when several are there, they must hold the same values.
  std::unordered_map<const TensorImpl*, std::string> loaded_as;
  for (const auto& [name, dst] : own) {
    auto it = state.find(name);
    if (it == state.end() || !it->second.defined()) continue;
    auto [first, inserted] = loaded_as.emplace(dst.impl(), name);
    if (inserted) continue;
    const Tensor& a = state.at(first->second);
    const Tensor& b = it->second;
    const bool same_memory = a.storage() == b.storage() &&
                             a.storage_offset() == b.storage_offset() &&
                             a.strides() == b.strides();  // e.g. this model's own state_dict()
    GW_CHECK(a.sizes() != b.sizes() || same_memory ||
                 equal(a.to(kCPU).to(dst.dtype()), b.to(kCPU).to(dst.dtype())),
             InvalidArgumentError, "[load_state_dict] ", type_name_, ": \"", first->second,
             "\" and \"", name,
             "\" are one tied parameter here, but the state dict holds different values (or NaN) "
             "for them");
  }
  std::vector<std::string> missing, unexpected, mismatched;
  std::unordered_set<std::string> own_names;
  for (const auto& [name, dst] : own) {
    own_names.insert(name);
    auto it = state.find(name);
    if (it == state.end()) {
      if (!loaded_as.count(dst.impl())) missing.push_back(name);
    } else if (!it->second.defined() || it->second.sizes() != dst.sizes()) {
      mismatched.push_back(detail::str(
          "size mismatch for ", name, ": copying a tensor of shape ",
          it->second.defined() ? shape_str(it->second.sizes()) : "(undefined)",
          " from the checkpoint, the shape in the current model is ", shape_str(dst.sizes())));
    }
  }
  for (const auto& [name, t] : state) {
    if (!own_names.count(name)) unexpected.push_back(name);
  }
  if (!mismatched.empty()) {
    std::string msg;
    for (const auto& m : mismatched) msg += (msg.empty() ? "" : "; ") + m;
    throw ShapeError(detail::str("[load_state_dict] ", type_name_, ": ", msg));
  }
  if (strict && (!missing.empty() || !unexpected.empty())) {
    std::string msg = detail::str("[load_state_dict] ", type_name_, ":");
    if (!missing.empty()) msg += " missing key(s) " + quoted_list(missing);
    if (!missing.empty() && !unexpected.empty()) msg += ";";
    if (!unexpected.empty()) msg += " unexpected key(s) " + quoted_list(unexpected);
    throw InvalidArgumentError(msg);
  }
  return own;
}

void Module::save(const std::string& path) const {
  save_safetensors(path, state_dict(), {{"format", "pt"}});
}

void Module::load(const std::string& path, bool strict) {
  load_state_dict(load_safetensors(path), strict);
}

void Module::convert(const std::function<bool(const Tensor&)>& wanted,
                     const std::function<Tensor(const Tensor&)>& convert_one) {
  std::vector<std::pair<std::string, Tensor>> all;
  collect("", true, true, all);
  collect("", false, true, all);
  for (auto& [name, t] : unique(std::move(all))) {
    if (!wanted(t)) continue;
    Tensor converted;
    {
      autograd::NoGradGuard no_grad;
      converted = convert_one(t.detach()).contiguous();
    }
    if (t.grad().defined()) t.set_grad({});
    t.set_data(converted);  // every handle (members, optimizers) sees the new data
  }
}

void Module::to(DType dtype) {
  GW_CHECK(is_floating(dtype), DTypeError, "[Module::to] ", type_name(),
           ": parameters and buffers convert to floating point dtypes only, got ", dtype);
  convert([&](const Tensor& t) { return t.is_floating_point() && t.dtype() != dtype; },
          [&](const Tensor& t) { return t.to(dtype); });
}

void Module::to(Device device) {
  convert([&](const Tensor& t) { return t.device() != device; },
          [&](const Tensor& t) { return t.to(device); });
}

// --- printing -------------------------------------------------------------------------------

std::string Module::float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // The shortest %.Ng that reads back exactly, laid out the way Python's repr does.
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  std::string s = buf;  // d.ddde[+-]XX
  size_t e = s.find('e');
  std::string mantissa = s.substr(0, e);
  int exponent = std::stoi(s.substr(e + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c >= '0' && c <= '9') digits += c;
  }
  std::string sign = value < 0 ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return sign + m + exp_buf;
  }
  std::string out;
  if (exponent < 0) {
    out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  } else if (static_cast<int>(digits.size()) <= exponent + 1) {
    out = digits + std::string(static_cast<size_t>(exponent + 1) - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(exponent + 1)) + "." +
          digits.substr(static_cast<size_t>(exponent + 1));
  }
  return sign + out;
}

std::string Module::repr_indented(int indent) const {
  // PyTorch's layout: one-line extra_repr inline; otherwise extra lines and "(name): child"
  // lines each on their own line, indented two spaces per level.
  const std::string pad(static_cast<size_t>(indent + 2), ' ');
  std::string extra = extra_repr();
  std::string out = type_name_ + "(";
  if (children_.empty() && extra.find('\n') == std::string::npos) return out + extra + ")";
  size_t start = 0;
  while (!extra.empty() && start <= extra.size()) {
    size_t end = extra.find('\n', start);
    if (end == std::string::npos) end = extra.size();
    out += "\n" + pad + extra.substr(start, end - start);
    start = end + 1;
  }
  for (const auto& [name, child] : children_) {
    out += "\n" + pad + "(" + name + "): " + child->repr_indented(indent + 2);
  }
  return out + "\n" + std::string(static_cast<size_t>(indent), ' ') + ")";
}

std::string Module::repr() const { return repr_indented(0); }

}  // namespace gw::nn
