#include "rpc/remote_module.h"

namespace gw::rpc {

namespace {
std::vector<RRef<Tensor>> parameter_rrefs(std::shared_ptr<nn::Module> module, bool recurse) {
  std::vector<RRef<Tensor>> out;
  for (const Tensor& p : module->parameters(recurse)) out.emplace_back(p);
  return out;
}
void set_training(std::shared_ptr<nn::Module> module, bool on) { module->train(on); }

// The methods RemoteModule calls on the owner, with the module as `self`: registered for owners
// that never make a RemoteModule themselves (gw_rpc_remote_module_linked is what the build's -u
// flag names to link this file).
const bool kRegistered = [] {
  functions().add_class<nn::Module>("nn.Module").add_method("forward", &nn::Module::forward);
  functions().add("nn.Module.parameter_rrefs", &parameter_rrefs);
  functions().add("nn.Module.train", &set_training);
  return true;
}();
}  // namespace

extern "C" const bool gw_rpc_remote_module_linked;
const bool gw_rpc_remote_module_linked = kRegistered;

std::string RemoteModule::parse_worker(const std::string& remote_device) {
  const auto slash = remote_device.find('/');
  const std::string worker = remote_device.substr(0, slash);
  const std::string device = slash == std::string::npos ? "cpu" : remote_device.substr(slash + 1);
  GW_CHECK(!worker.empty(), InvalidArgumentError, "[RemoteModule] remote_device '",
           remote_device, "' must be \"<worker>/<device>\"");
  GW_CHECK(device == "cpu", InvalidArgumentError, "[RemoteModule] device '", device, "' of '",
           remote_device, "' is not supported (only cpu)");
  return worker;
}

Future<Tensor> RemoteModule::forward_async(const Tensor& input) const {
  return module_.rpc_async<Tensor>("forward", input);
}

std::vector<RRef<Tensor>> RemoteModule::remote_parameters(bool recurse) const {
  return module_.rpc_sync<std::vector<RRef<Tensor>>>("parameter_rrefs", recurse);
}

void RemoteModule::train(bool on) const { module_.rpc_sync<void>("train", on); }

}  // namespace gw::rpc
