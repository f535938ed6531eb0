// gw::dist::RemoteModule — an nn::Module that lives on another worker
// (torch.distributed.nn.RemoteModule).
//
// Mental model: the module is built on the remote worker by a registered constructor and stays
// there; this handle holds an RRef to it. forward() runs the module's forward on its owner over
// RPC, so inside a distributed autograd context the gradients flow back to the remote
// parameters, which remote_parameters() hands out as RRefs for a DistributedOptimizer. It sits
// above rpc (which knows nothing of nn) and uses it like any user code.
//
//   // On every worker:
//   gw::dist::add_module_constructor<gw::nn::Linear, int64_t, int64_t>("Linear");
//   // On worker 0:
//   gw::dist::RemoteModule linear("worker1/cpu", "Linear", int64_t{20}, int64_t{30});
//   gw::Tensor out = linear.forward(gw::randn({128, 20}));             // runs on worker1
//   gw::Future<gw::Tensor> later = linear.forward_async(gw::randn({128, 20}));
//   gw::dist::DistributedOptimizer opt(gw::optim::SGD::options(0.1), linear.remote_parameters());
//
// Several inputs: a module whose forward takes several tensors (and returns a Tensor or a
// std::vector<Tensor>) is called with a list, and answers with the list of its outputs:
//
//   struct Mix : gw::nn::Module { gw::Tensor forward(const gw::Tensor& a, const gw::Tensor& b); };
//   gw::dist::add_module_constructor<Mix>("Mix");
//   gw::dist::RemoteModule mix("worker1", "Mix");
//   gw::Tensor y = mix.forward({a, b})[0];
//
// On a GPU: "worker1/cuda:0" moves the module to that device on its owner, and, as PyTorch's
// RemoteModule does, its forward moves CPU inputs there and brings the outputs back to the CPU
// unless this worker has a device map to the owner (then CUDA outputs travel through it).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeindex>
#include <vector>

#include "core/device.h"
#include "nn/module.h"
#include "rpc/rref.h"

namespace gw::dist {

namespace detail {
using ManyForward = std::function<std::vector<Tensor>(nn::Module&, const std::vector<Tensor>&)>;
// The forward of several inputs of a module type, for its owner to call (see below).
void register_many_forward(std::type_index type, size_t arity, ManyForward forward);

template <typename T>
struct ForwardOf;
template <typename M, typename R, typename... A>
struct ForwardOf<R (M::*)(A...)> {
  static constexpr size_t arity = sizeof...(A);
  static constexpr bool all_tensors = (std::is_same_v<std::remove_cvref_t<A>, Tensor> && ...);
  static constexpr bool returns_tensors =
      std::is_same_v<R, Tensor> || std::is_same_v<R, std::vector<Tensor>>;
};

template <typename M, typename R, typename... A>
struct ForwardOf<R (M::*)(A...) const> : ForwardOf<R (M::*)(A...)> {};
template <typename M, typename R, typename... A>
struct ForwardOf<R (M::*)(A...) noexcept> : ForwardOf<R (M::*)(A...)> {};
template <typename M, typename R, typename... A>
struct ForwardOf<R (M::*)(A...) const noexcept> : ForwardOf<R (M::*)(A...)> {};

// M's forward when it takes two or more tensors (and is not overloaded).
template <typename M>
void register_many_forward_of() {
  if constexpr (requires { &M::forward; }) {
    using F = ForwardOf<decltype(&M::forward)>;
    if constexpr (F::arity >= 2 && F::all_tensors && F::returns_tensors) {
      register_many_forward(typeid(M), F::arity, [](nn::Module& m, const std::vector<Tensor>& in) {
        auto call = [&]<size_t... I>(std::index_sequence<I...>) {
          return static_cast<M&>(m).forward(in[I]...);
        };
        auto out = call(std::make_index_sequence<F::arity>{});
        if constexpr (std::is_same_v<decltype(out), Tensor>)
          return std::vector<Tensor>{out};
        else
          return out;
      });
    }
  }
}
}  // namespace detail

using ModuleRRef = rpc::RRef<std::shared_ptr<nn::Module>>;

// Registers the methods RemoteModule calls on the module's owner ("nn.Module.*"); once per
// process, however often it is called. Every agent started by dist::init_rpc does it
// (dist/init_rpc.h), and so does add_module_constructor.
void register_module_methods();

// Registers `name(A...)`, which builds an M on the worker that runs it, for RemoteModule; and
// M's forward of several tensors, when it has one that is not overloaded.
template <typename M, typename... A>
void add_module_constructor(const std::string& name) {
  register_module_methods();
  detail::register_many_forward_of<M>();
  rpc::functions().add(name, std::function<std::shared_ptr<nn::Module>(A...)>(
                                 [](A... a) -> std::shared_ptr<nn::Module> {
                                   return std::make_shared<M>(std::forward<A>(a)...);
                                 }));
}

class RemoteModule {
 public:
  // `remote_device` is "<worker>/<device>" or "<worker>" (device "cpu"); the device is "cpu",
  // "cuda" (cuda:0) or "cuda:N". `constructor` is the registered name of a function returning
  // std::shared_ptr<nn::Module>.
  template <typename... Args>
  RemoteModule(const std::string& remote_device, const std::string& constructor, Args&&... args)
      : RemoteModule(parse_remote_device(remote_device), constructor, std::forward<Args>(args)...) {
  }

  // A handle on a module that already lives somewhere (e.g. a parameter server's model).
  explicit RemoteModule(ModuleRRef module)
      : owner_(module.owner_name()), module_(std::move(module)) {}

  Tensor forward(const Tensor& input) const { return forward_async(input).wait(); }
  Future<Tensor> forward_async(const Tensor& input) const;
  // A forward of several inputs (or of one, through the same path): the module's outputs.
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) const {
    return forward_async(inputs).wait();
  }
  Future<std::vector<Tensor>> forward_async(const std::vector<Tensor>& inputs) const;
  // RRefs to the module's parameters (and its submodules' with `recurse`), owned remotely.
  std::vector<rpc::RRef<Tensor>> remote_parameters(bool recurse = true) const;
  const ModuleRRef& get_module_rref() const { return module_; }
  Device device() const { return device_; }
  void train(bool on = true) const;
  void eval() const { train(false); }

 private:
  // "<worker>/<device>" split; InvalidArgumentError naming it when it is neither.
  static std::pair<std::string, Device> parse_remote_device(const std::string& remote_device);
  template <typename... Args>
  RemoteModule(std::pair<std::string, Device> where, const std::string& constructor, Args&&... args)
      : owner_(std::move(where.first)),
        device_(where.second),
        module_(rpc::remote<std::shared_ptr<nn::Module>>(owner_, constructor,
                                                         std::forward<Args>(args)...)) {
    if (device_ != kCPU) move_to_device();
  }
  void move_to_device() const;
  // Whether CUDA outputs may come back as they are: a device map to the owner is set.
  bool device_map_set() const;

  std::string owner_;
  Device device_ = kCPU;
  ModuleRRef module_;
};

}  // namespace gw::dist
