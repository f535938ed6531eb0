// gradwire nn — modules, as in torch.nn.
//
// Mental model: a Module owns named parameters (leaf tensors that require grad), buffers
// (state that is saved but not trained, e.g. running statistics) and child modules, each
// registered in order. parameters() walks them depth-first in registration order, which is the
// order optimizers, state_dict and DDP's buckets use. Modules are held by shared_ptr so that
// containers, optimizers and remote references can share them.
//
//   struct Mlp : gw::nn::Module {
//     std::shared_ptr<gw::nn::Linear> fc1, fc2;
//     explicit Mlp(gw::Generator& gen)
//         : fc1(register_module("fc1", std::make_shared<gw::nn::Linear>(784, 128, gen))),
//           fc2(register_module("fc2", std::make_shared<gw::nn::Linear>(128, 10, gen))) {}
//     gw::Tensor forward(const gw::Tensor& x) override { return fc2->forward(fc1->forward(x).relu()); }
//   };
//   auto model = std::make_shared<Mlp>(gen);
//   gw::Tensor loss = gw::nn::functional::cross_entropy(model->forward(x), y);
//   loss.backward();
//   model->save("mlp.safetensors");
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/serialize.h"
#include "core/tensor.h"

namespace gw::nn {

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Single-input modules override this; others define their own forward signature.
  virtual Tensor forward(const Tensor& input);
  // Calls forward through the module's hooks (PyTorch's __call__). As in PyTorch, hooks run on
  // this path only: modules call their children as (*child)(x), and model->forward(x) skips
  // the model's own hooks.
  Tensor operator()(const Tensor& input);

  // Hooks around each call, run in registration order (PyTorch's forward pre-hooks and forward
  // hooks). A pre-hook sees the input and may replace it by returning a defined tensor; a hook
  // sees the input forward got and its output, and may replace the output the same way.
  // fully_shard gathers a unit's parameters in one and frees them in the other.
  using ForwardPreHook = std::function<Tensor(Module& module, const Tensor& input)>;
  using ForwardHook =
      std::function<Tensor(Module& module, const Tensor& input, const Tensor& output)>;
  int64_t register_forward_pre_hook(ForwardPreHook hook);
  int64_t register_forward_hook(ForwardHook hook);
  void remove_hook(int64_t id);  // an id not registered (or removed already): nothing

  // Registers `replacement` as this module's own parameter `name` (no dots) in place of the
  // tensor there, which it returns; a member that holds the old tensor keeps it. fully_shard
  // does this so that parameters() and state_dict() list the shards an optimizer steps on,
  // while forward reads the members it gathers around each call. The replacement must be a
  // leaf.
  Tensor swap_parameter(const std::string& name, const Tensor& replacement);

  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const {
    return children_;
  }

  // Training mode affects Dropout and friends; applies to all submodules.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Clears every parameter's gradient (set to none, as PyTorch 2 does by default).
  void zero_grad();

  // Parameters and buffers by dotted name ("fc1.weight"), as in PyTorch.
  NamedTensors state_dict() const;
  // Copies values into the existing tensors. With strict, missing or unexpected keys and shape
  // mismatches throw naming the key. A tied parameter needs only one of its names, and its
  // names must agree where several are given. Shape mismatches throw even when not strict (as in
  // PyTorch), and nothing is copied unless every check passes.
  void load_state_dict(const NamedTensors& state, bool strict = true);
  // Throws what load_state_dict(state, strict) would throw, and copies nothing.
  void check_state_dict(const NamedTensors& state, bool strict = true) const;
  void save(const std::string& path) const;  // safetensors
  void load(const std::string& path, bool strict = true);

  // Converts every floating parameter and buffer to `dtype` in place, as PyTorch's
  // module.double() does: handles held elsewhere (members, optimizers) see the new values.
  // Gradients are cleared, since they no longer match.
  void to(DType dtype);
  // Moves every parameter and buffer to `device` in place (module.to("cuda")), the same way.
  void to(Device device);

  const std::string& type_name() const { return type_name_; }
  // A PyTorch-like description of the module tree.
  std::string repr() const;

 protected:
  // The registered tensor is made a leaf that requires grad (unless requires_grad is false).
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  // Replaces a registered parameter or buffer (e.g. after loading).
  void set_tensor(const std::string& name, const Tensor& tensor);
  // Makes the registered parameter `name` the tensor `parameter`, a parameter of another module
  // (PyTorch: `lm_head.weight = wte.weight`), and returns it for the member that holds it. The
  // modules then share one tensor: its gradient sums both uses, parameters() lists it once (so
  // an optimizer updates it once) and state_dict() under both names. Throws unless `parameter`
  // is a leaf that requires grad with the replaced one's shape, dtype and device. Tie before an
  // optimizer or DDP takes the parameters: they would keep the replaced tensor.
  Tensor tie_parameter(const std::string& name, const Tensor& parameter);
  // Extra text for repr(), e.g. "in_features=784, out_features=128".
  virtual std::string extra_repr() const { return ""; }
  // A double as Python's repr prints it (0.5, 1e-05), for extra_repr.
  static std::string float_repr(double value);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name, const char* what) const;
  Tensor* find_tensor(const std::string& name);
  void collect(const std::string& prefix, bool params, bool recurse,
               std::vector<std::pair<std::string, Tensor>>& out) const;
  // load_state_dict's checks; returns this module's parameters and buffers by name.
  std::vector<std::pair<std::string, Tensor>> checked_load(const NamedTensors& state,
                                                           bool strict) const;
  // Replaces, in place, each parameter and buffer that `wanted` selects by convert_one of it.
  void convert(const std::function<bool(const Tensor&)>& wanted,
               const std::function<Tensor(const Tensor&)>& convert_one);
  std::string repr_indented(int indent) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::pair<int64_t, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<int64_t, ForwardHook>> hooks_;
  int64_t next_hook_id_ = 0;
};

}  // namespace gw::nn
