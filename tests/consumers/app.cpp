// A program outside the project that uses every layer of an installed gradwire, built by the
// `consumers` test with nothing but `pkg-config --cflags --libs gradwire` (or CMake's
// find_package(gradwire)). One process: an RPC group of one worker, which calls itself, and a
// process group of one rank. Prints "consumer ok" when every check holds.
#include <cmath>
#include <iostream>
#include <memory>

#include "core/ops.h"
#include "ddp/distributed_data_parallel.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/init_rpc.h"
#include "dist/nn/remote_module.h"
#include "dist/process_group/init_process_group.h"
#include "nn/nn.h"
#include "optim/sgd.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"

namespace {
gw::Tensor twice(gw::Tensor t) { return t * 2; }
GW_RPC_FUNCTION(twice);

bool check(bool ok, const char* what) {
  if (!ok) std::cerr << "consumer check failed: " << what << "\n";
  return ok;
}
}  // namespace

int main() {
  using gw::Tensor;
  bool ok = true;
  // core, autograd
  Tensor x = gw::ones({2, 2}).requires_grad_();
  Tensor y = (gw::matmul(x, x) * 3).sum();
  y.backward();
  ok &= check(y.item<float>() == 24.f && x.grad().sum().item<float>() == 48.f, "autograd");
  // nn, optim
  gw::Generator gen(0);
  auto model = std::make_shared<gw::nn::Linear>(2, 1, true, gen);
  gw::optim::SGD opt(model->parameters(), {.lr = 0.1});
  opt.zero_grad();
  model->forward(gw::ones({4, 2})).sum().backward();
  opt.step();
  // rpc and distributed autograd: worker0 calls itself
  gw::rpc::RpcBackendOptions options;
  options.store = std::make_shared<gw::store::HashStore>();
  gw::dist::init_rpc("worker0", 0, 1, options);
  {
    gw::dist::autograd::Context context;
    Tensor a = gw::full({3}, 1.5).requires_grad_();
    Tensor r = gw::rpc::rpc_sync("worker0", twice, a);
    gw::dist::autograd::backward(context.id(), {r.sum()});
    auto grads = gw::dist::autograd::get_gradients(context.id());
    ok &= check(gw::equal(r, gw::full({3}, 3.0)), "rpc_sync");
    ok &= check(grads.size() == 1 && gw::equal(grads.begin()->second, gw::full({3}, 2.0)),
                "distributed autograd");
  }
  gw::rpc::shutdown();
  // a process group of one rank, and DDP over it
  auto pg = gw::dist::init_process_group("gloo", std::make_shared<gw::store::HashStore>(), 0, 1);
  gw::ddp::DistributedDataParallel ddp(model, pg);
  ddp.forward(gw::ones({4, 2})).sum().backward();
  ok &= check(model->parameters()[0].grad().defined(), "DDP");
  gw::dist::destroy_process_group();
  if (ok) std::cout << "consumer ok\n";
  return ok ? 0 : 1;
}
