#include "dist/init_rpc.h"

#include <memory>

#include "dist/autograd/context_container.h"
#include "dist/checkpoint/dist_checkpoint.h"
#include "dist/nn/remote_module.h"
#include "dist/optim/distributed_optimizer.h"
#include "rpc/api.h"

namespace gw::dist {

void extend_agent(rpc::Agent& agent) {
  register_local_optimizer();
  register_module_methods();
  checkpoint::detail::register_owner_functions();
  agent.set_autograd_hook(std::make_shared<autograd::Container>(agent));
}

rpc::RpcBackendOptions with_dist(rpc::RpcBackendOptions options) {
  using Extension = void (*)(rpc::Agent&);
  for (const auto& e : options.extensions) {
    const Extension* f = e.target<Extension>();
    if (f && *f == &extend_agent) return options;  // already there: install it once
  }
  options.extensions.push_back(&extend_agent);
  return options;
}

void init_rpc(const std::string& name, int rank, int world_size, rpc::RpcBackendOptions options) {
  rpc::init_rpc(name, rank, world_size, with_dist(std::move(options)));
}

void init_rpc(const std::string& name, rpc::RpcBackendOptions options) {
  rpc::init_rpc(name, with_dist(std::move(options)));
}

}  // namespace gw::dist
