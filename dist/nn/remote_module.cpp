#include "dist/nn/remote_module.h"

#include <mutex>

#include "rpc/autograd_hook.h"

namespace gw::dist {

namespace {
// A program that uses RemoteModule gets gw_dist's agent extension, which registers the methods
// on every worker, owners that never make a RemoteModule included: this reference links it.
[[gnu::used]] void (*const kAgentExtension)(rpc::Agent&) = &gw_rpc_extend_agent;

std::vector<rpc::RRef<Tensor>> parameter_rrefs(std::shared_ptr<nn::Module> module, bool recurse) {
  std::vector<rpc::RRef<Tensor>> out;
  for (const Tensor& p : module->parameters(recurse)) out.emplace_back(p);
  return out;
}
void set_training(std::shared_ptr<nn::Module> module, bool on) { module->train(on); }
}  // namespace

void register_module_methods() {
  static std::once_flag once;
  std::call_once(once, [] {
    rpc::functions().add_class<nn::Module>("nn.Module").add_method("forward", &nn::Module::forward);
    rpc::functions().add("nn.Module.parameter_rrefs", &parameter_rrefs);
    rpc::functions().add("nn.Module.train", &set_training);
  });
}

std::string RemoteModule::parse_worker(const std::string& remote_device) {
  const auto slash = remote_device.find('/');
  const std::string worker = remote_device.substr(0, slash);
  const std::string device = slash == std::string::npos ? "cpu" : remote_device.substr(slash + 1);
  GW_CHECK(!worker.empty(), InvalidArgumentError, "[RemoteModule] remote_device '", remote_device,
           "' must be \"<worker>/<device>\"");
  GW_CHECK(device == "cpu", InvalidArgumentError, "[RemoteModule] device '", device, "' of '",
           remote_device, "' is not supported (only cpu)");
  return worker;
}

Future<Tensor> RemoteModule::forward_async(const Tensor& input) const {
  return module_.rpc_async<Tensor>("forward", input);
}

std::vector<rpc::RRef<Tensor>> RemoteModule::remote_parameters(bool recurse) const {
  return module_.rpc_sync<std::vector<rpc::RRef<Tensor>>>("parameter_rrefs", recurse);
}

void RemoteModule::train(bool on) const { module_.rpc_sync<void>("train", on); }

}  // namespace gw::dist
