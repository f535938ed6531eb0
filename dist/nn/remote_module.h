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
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "rpc/rref.h"

namespace gw::dist {

using ModuleRRef = rpc::RRef<std::shared_ptr<nn::Module>>;

// Registers the methods RemoteModule calls on the module's owner ("nn.Module.*"); once per
// process, however often it is called. Every RPC agent does it (gw_rpc_extend_agent), and so
// does add_module_constructor.
void register_module_methods();

// Registers `name(A...)`, which builds an M on the worker that runs it, for RemoteModule.
template <typename M, typename... A>
void add_module_constructor(const std::string& name) {
  register_module_methods();
  rpc::functions().add(name, std::function<std::shared_ptr<nn::Module>(A...)>(
                                 [](A... a) -> std::shared_ptr<nn::Module> {
                                   return std::make_shared<M>(std::forward<A>(a)...);
                                 }));
}

class RemoteModule {
 public:
  // `remote_device` is "<worker>/<device>" or "<worker>" (device "cpu"); `constructor` is the
  // registered name of a function returning std::shared_ptr<nn::Module>.
  template <typename... Args>
  RemoteModule(const std::string& remote_device, const std::string& constructor, Args&&... args)
      : owner_(parse_worker(remote_device)),
        module_(rpc::remote<std::shared_ptr<nn::Module>>(owner_, constructor,
                                                         std::forward<Args>(args)...)) {}

  // A handle on a module that already lives somewhere (e.g. a parameter server's model).
  explicit RemoteModule(ModuleRRef module)
      : owner_(module.owner_name()), module_(std::move(module)) {}

  Tensor forward(const Tensor& input) const { return forward_async(input).wait(); }
  Future<Tensor> forward_async(const Tensor& input) const;
  // RRefs to the module's parameters (and its submodules' with `recurse`), owned remotely.
  std::vector<rpc::RRef<Tensor>> remote_parameters(bool recurse = true) const;
  const ModuleRRef& get_module_rref() const { return module_; }
  void train(bool on = true) const;
  void eval() const { train(false); }

 private:
  static std::string parse_worker(const std::string& remote_device);

  std::string owner_;
  ModuleRRef module_;
};

}  // namespace gw::dist
