#include "dist/nn/remote_module.h"

#include <map>
#include <mutex>

#include "rpc/agent.h"
#include "rpc/autograd_hook.h"

namespace gw::dist {

namespace {

std::vector<rpc::RRef<Tensor>> parameter_rrefs(std::shared_ptr<nn::Module> module, bool recurse) {
  std::vector<rpc::RRef<Tensor>> out;
  for (const Tensor& p : module->parameters(recurse)) out.emplace_back(p);
  return out;
}
void set_training(std::shared_ptr<nn::Module> module, bool on) { module->train(on); }

struct ManyForwards {
  std::mutex mu;
  std::map<std::type_index, std::pair<size_t, detail::ManyForward>> by_type;  // arity, forward
};
ManyForwards& many_forwards() {
  static ManyForwards forwards;
  return forwards;
}

// On the owner: the module to `device`, in place.
void to_device(std::shared_ptr<nn::Module> module, std::string device) {
  const Device d = Device::parse(device);
  try {
    module->to(d);
  } catch (const std::exception& e) {
    throw InvalidArgumentError(
        gw::detail::str("[RemoteModule] cannot place the module on ", device, ": ", e.what()));
  }
}

// On the owner: the module's forward of `inputs`, moved to its device `device` first; its
// outputs back on the CPU unless `outputs_on_device` (the caller has a device map to here).
std::vector<Tensor> remote_forward(std::shared_ptr<nn::Module> module, std::vector<Tensor> inputs,
                                   std::string device, bool outputs_on_device) {
  const Device d = Device::parse(device);
  if (d != kCPU)
    for (Tensor& t : inputs)
      if (t.defined() && t.device() == kCPU) t = t.to(d);
  std::optional<std::pair<size_t, detail::ManyForward>> many;
  {
    auto& forwards = many_forwards();
    std::lock_guard lock(forwards.mu);
    if (auto it = forwards.by_type.find(typeid(*module)); it != forwards.by_type.end())
      many = it->second;
  }
  std::vector<Tensor> out;
  if (many) {
    GW_CHECK(inputs.size() == many->first, InvalidArgumentError, "[RemoteModule] the forward of ",
             module->type_name(), " takes ", many->first, " inputs, got ", inputs.size());
    out = many->second(*module, inputs);
  } else {
    GW_CHECK(inputs.size() == 1, InvalidArgumentError, "[RemoteModule] the forward of ",
             module->type_name(), " takes one input, got ", inputs.size(),
             " (a forward of several tensors is registered by add_module_constructor<M>, when "
             "M::forward is not overloaded)");
    out.push_back(module->forward(inputs[0]));
  }
  if (d != kCPU && !outputs_on_device)
    for (Tensor& t : out)
      if (t.defined()) t = t.to(kCPU);
  return out;
}
}  // namespace

void detail::register_many_forward(std::type_index type, size_t arity, ManyForward forward) {
  auto& forwards = many_forwards();
  std::lock_guard lock(forwards.mu);
  forwards.by_type.insert_or_assign(type, std::make_pair(arity, std::move(forward)));
}

void register_module_methods() {
  static std::once_flag once;
  std::call_once(once, [] {
    rpc::functions().add_class<nn::Module>("nn.Module").add_method("forward", &nn::Module::forward);
    rpc::functions().add("nn.Module.parameter_rrefs", &parameter_rrefs);
    rpc::functions().add("nn.Module.train", &set_training);
    rpc::functions().add("nn.Module.to_device", &to_device);
    rpc::functions().add("nn.Module.remote_forward", &remote_forward);
  });
}

std::pair<std::string, Device> RemoteModule::parse_remote_device(const std::string& remote_device) {
  const auto slash = remote_device.find('/');
  const std::string worker = remote_device.substr(0, slash);
  const std::string device = slash == std::string::npos ? "cpu" : remote_device.substr(slash + 1);
  GW_CHECK(!worker.empty(), InvalidArgumentError, "[RemoteModule] remote_device '", remote_device,
           "' must be \"<worker>/<device>\"");
  try {
    return {worker, Device::parse(device)};
  } catch (const InvalidArgumentError&) {
    throw InvalidArgumentError(gw::detail::str("[RemoteModule] device '", device, "' of '",
                                               remote_device,
                                               "' is not one (\"cpu\", \"cuda\" or \"cuda:N\")"));
  }
}

void RemoteModule::move_to_device() const { module_.rpc_sync<void>("to_device", device_.str()); }

bool RemoteModule::device_map_set() const {
  const auto& maps = rpc::current_agent().options().device_maps;
  auto it = maps.find(owner_);
  return it != maps.end() && !it->second.empty();
}

Future<Tensor> RemoteModule::forward_async(const Tensor& input) const {
  if (device_ == kCPU) return module_.rpc_async<Tensor>("forward", input);
  return forward_async(std::vector<Tensor>{input}).then([](Future<std::vector<Tensor>>& f) {
    return f.wait().at(0);
  });
}

Future<std::vector<Tensor>> RemoteModule::forward_async(const std::vector<Tensor>& inputs) const {
  return module_.rpc_async<std::vector<Tensor>>("remote_forward", inputs, device_.str(),
                                                device_ != kCPU && device_map_set());
}

std::vector<rpc::RRef<Tensor>> RemoteModule::remote_parameters(bool recurse) const {
  return module_.rpc_sync<std::vector<rpc::RRef<Tensor>>>("parameter_rrefs", recurse);
}

void RemoteModule::train(bool on) const { module_.rpc_sync<void>("train", on); }

}  // namespace gw::dist
