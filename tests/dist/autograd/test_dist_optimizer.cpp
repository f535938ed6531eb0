// DistributedOptimizer, RemoteModule and RRef::backward, with ranks as threads.
#include <catch2/catch.hpp>

#include <future>

#include "core/ops.h"
#include "core/random.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/nn/remote_module.h"
#include "dist/optim/distributed_optimizer.h"
#include "nn/functional.h"
#include "nn/linear.h"
#include "optim/sgd.h"
#include "tests/dist/autograd/dist_functions.h"
#include "tests/dist/autograd/dist_group.h"
#include "tests/skip.h"
#ifdef GW_HAVE_CUDA
#include "tests/cuda/cuda_test_util.h"
#endif

using namespace gw;
using namespace gw::dist::autograd;
using namespace gw::dist::autograd::testing;
using Group = gw::dist::testing::DistGroup;

namespace {
Tensor grad_on_owner(uint64_t ctx, const rpc::RRef<Tensor>& r) {
  return rpc::rpc_sync(r.owner_name(), d_grad_of, static_cast<int64_t>(ctx), r);
}

// The distributed autograd design note's end-to-end example on one worker, checking the update it
// makes.
bool run_spec_example(const std::string& dst) {
  Context ctx;
  auto rref1 = rpc::remote(dst, d_random_tensor);
  auto rref2 = rpc::remote(dst, d_random_tensor);
  Tensor loss = rref1.to_here() + rref2.to_here();
  backward(ctx.id(), {loss.sum()});
  dist::DistributedOptimizer opt(optim::SGD::options(0.05), {rref1, rref2});
  Tensor before1 = rref1.to_here(), before2 = rref2.to_here();
  Tensor g1 = grad_on_owner(ctx.id(), rref1), g2 = grad_on_owner(ctx.id(), rref2);
  opt.step(ctx.id());
  return allclose(g1, ones({3, 3})) && allclose(g2, ones({3, 3})) &&
         allclose(rref1.to_here(), before1 - g1 * 0.05) &&
         allclose(rref2.to_here(), before2 - g2 * 0.05);
}
}  // namespace

TEST_CASE("the design note's end-to-end example: both workers at once", "[dist_optimizer]") {
  Group g(2);
  std::vector<std::future<bool>> runs;
  for (int rank = 0; rank < 2; ++rank)
    runs.push_back(std::async(std::launch::async, [&g, rank] {
      rpc::Agent::Use use(g[rank]);
      return run_spec_example("worker" + std::to_string((rank + 1) % 2));
    }));
  for (auto& r : runs) CHECK(r.get());
}

TEST_CASE("DistributedOptimizer steps local and remote parameters", "[dist_optimizer]") {
  Group g(3);
  rpc::Agent::Use use(g[0]);
  Tensor mine = rand({3, 3}).requires_grad_();
  rpc::RRef<Tensor> local(mine);
  Context ctx;
  auto remote1 = rpc::remote("worker1", d_random_tensor);
  auto remote2 = rpc::remote("worker2", d_random_tensor);
  Tensor loss = (remote1.to_here() * mine + remote2.to_here()).sum();
  backward(ctx.id(), {loss});
  Tensor v1 = remote1.to_here(), v2 = remote2.to_here(), before = mine.detach().clone();
  dist::DistributedOptimizer opt(optim::SGDOptions{.lr = 0.1, .momentum = 0.9},
                                 {local, remote1, remote2});
  opt.step(ctx.id());
  CHECK(allclose(mine.detach(), before - v1 * 0.1));       // d/dmine = v1
  CHECK(allclose(remote1.to_here(), v1 - before * 0.1));   // d/dv1 = mine
  CHECK(allclose(remote2.to_here(), v2 - ones({3, 3}) * 0.1));
  CHECK_FALSE(mine.grad().defined());
  CHECK_THROWS_WITH(opt.step(987654321), Catch::Contains("has no context 987654321"));
  CHECK_THROWS_WITH(dist::DistributedOptimizer(optim::SGD::options(0.1), {}),
                    Catch::Contains("no parameters"));
}

TEST_CASE("DistributedOptimizer's state_dict holds every owner's state and loads back",
          "[dist_optimizer]") {
  Group g(2);
  rpc::Agent::Use use(g[0]);
  rpc::RRef<Tensor> local(rand({3, 3}).requires_grad_());
  auto remote = rpc::remote("worker1", d_random_tensor);
  Context ctx;
  backward(ctx.id(), {(remote.to_here() * local.local_value()).sum()});
  const auto sgd = optim::SGDOptions{.lr = 0.1, .momentum = 0.9};
  dist::DistributedOptimizer opt(sgd, {local, remote});
  const Tensor remote_grad = grad_on_owner(ctx.id(), remote);
  opt.step(ctx.id());

  const NamedTensors state = opt.state_dict();
  // One step of SGD with momentum: the buffer is the gradient, on each owner.
  REQUIRE(state.count("worker1/state.0.momentum_buffer") == 1);
  CHECK(allclose(state.at("worker1/state.0.momentum_buffer"), remote_grad));
  CHECK(state.count("worker0/state.0.momentum_buffer") == 1);
  CHECK(state.at("worker0/lr").item<double>() == 0.1);

  dist::DistributedOptimizer fresh(sgd, {local, remote});
  CHECK(fresh.state_dict().count("worker1/state.0.momentum_buffer") == 0);
  fresh.load_state_dict(state);
  const NamedTensors loaded = fresh.state_dict();
  REQUIRE(loaded.size() == state.size());
  for (const auto& [key, t] : state) CHECK(allclose(loaded.at(key), t));

  NamedTensors stray = state;
  stray["worker7/lr"] = state.at("worker0/lr");
  CHECK_THROWS_WITH(fresh.load_state_dict(stray), Catch::Contains("\"worker7/lr\" names no owner"));
  NamedTensors partial;
  for (const auto& [key, t] : state)
    if (key.starts_with("worker0/")) partial.emplace(key, t);
  CHECK_THROWS_WITH(fresh.load_state_dict(partial),
                    Catch::Contains("no state for owner 'worker1'"));
  NamedTensors bad = state;
  bad["worker1/state.0.momentum_buffer"] = zeros({5});
  CHECK_THROWS_WITH(fresh.load_state_dict(bad), Catch::Contains("state.0.momentum_buffer"));
}

TEST_CASE("RemoteModule: forward runs remotely; training it matches local training",
          "[remote_module]") {
  Group g(2);
  rpc::Agent::Use use(g[0]);
  dist::RemoteModule remote_linear("worker1/cpu", "d_linear", int64_t{4}, int64_t{3}, int64_t{5});
  Generator gen(5);
  nn::Linear local_linear(4, 3, gen);  // the same parameters
  Tensor x = randn({8, 4});
  Tensor y = from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1});
  CHECK(allclose(remote_linear.forward(x), local_linear.forward(x)));
  CHECK(allclose(remote_linear.forward_async(x).wait(), local_linear.forward(x)));
  auto params = remote_linear.remote_parameters();
  REQUIRE(params.size() == 2);
  CHECK(params[0].owner_name() == "worker1");
  CHECK_FALSE(remote_linear.get_module_rref().is_owner());

  dist::DistributedOptimizer opt(optim::SGD::options(0.5), params);
  optim::SGD local_opt(local_linear.parameters(), optim::SGD::options(0.5));
  for (int step = 0; step < 3; ++step) {
    Context ctx;
    Tensor loss = nn::functional::cross_entropy(remote_linear.forward(x), y);
    backward(ctx.id(), {loss});
    opt.step(ctx.id());
    local_opt.zero_grad();
    nn::functional::cross_entropy(local_linear.forward(x), y).backward();
    local_opt.step();
  }
  CHECK(allclose(params[0].to_here(), local_linear.weight, 1e-5, 1e-6));
  CHECK(allclose(params[1].to_here(), local_linear.bias, 1e-5, 1e-6));
  remote_linear.eval();
  remote_linear.train();
  for (const char* bad : {"worker1/tpu", "worker1/cuda:x", "worker1/cuda:-1", "/cpu"})
    CHECK_THROWS_WITH(dist::RemoteModule(bad, "d_linear", int64_t{1}, int64_t{1}, int64_t{1}),
                      Catch::Contains(bad));
}

namespace {
// A module of two inputs: linear(a) * b.
struct Gate : nn::Module {
  std::shared_ptr<nn::Linear> linear;
  explicit Gate(int64_t seed) : Module("Gate") {
    Generator gen(static_cast<uint64_t>(seed));
    linear = register_module("linear", std::make_shared<nn::Linear>(4, 3, true, gen));
  }
  Tensor forward(const Tensor& a, const Tensor& b) { return linear->forward(a) * b; }
};
// Two outputs: (a + b, a * b).
struct SumProduct : nn::Module {
  SumProduct() : Module("SumProduct") {}
  std::vector<Tensor> forward(const Tensor& a, const Tensor& b) { return {a + b, a * b}; }
};
const bool kGateRegistered = [] {
  dist::add_module_constructor<Gate, int64_t>("test_gate");
  dist::add_module_constructor<SumProduct>("test_sum_product");
  return true;
}();
}  // namespace

TEST_CASE("RemoteModule with several inputs: forward and training match the local module",
          "[remote_module]") {
  REQUIRE(kGateRegistered);
  Group g(2);
  rpc::Agent::Use use(g[0]);
  dist::RemoteModule gate("worker1", "test_gate", int64_t{9});
  Gate local(9);
  Generator gen(2);
  Tensor a = randn({5, 4}, gen), b = randn({5, 3}, gen);
  Tensor y = from_vector<int64_t>({0, 1, 2, 0, 1});
  std::vector<Tensor> out = gate.forward({a, b});
  REQUIRE(out.size() == 1);
  CHECK(allclose(out[0], local.forward(a, b)));
  CHECK(allclose(gate.forward_async({a, b}).wait().at(0), local.forward(a, b)));

  dist::DistributedOptimizer opt(optim::SGD::options(0.3), gate.remote_parameters());
  optim::SGD local_opt(local.parameters(), optim::SGD::options(0.3));
  Tensor b_leaf = b.clone().requires_grad_();
  for (int step = 0; step < 3; ++step) {
    Context ctx;
    backward(ctx.id(), {nn::functional::cross_entropy(gate.forward({a, b_leaf})[0], y)});
    opt.step(ctx.id());
    CHECK(get_gradients(ctx.id()).contains(b_leaf));  // the second input's gradient came back
    local_opt.zero_grad();
    nn::functional::cross_entropy(local.forward(a, b), y).backward();
    local_opt.step();
  }
  auto params = gate.remote_parameters();
  CHECK(allclose(params[0].to_here(), local.linear->weight, 1e-5, 1e-6));

  // A module of two outputs; arity errors name the module and the counts.
  dist::RemoteModule sum_product("worker1", "test_sum_product");
  auto both = sum_product.forward({a, a});
  REQUIRE(both.size() == 2);
  CHECK(allclose(both[0], a * 2));
  CHECK(allclose(both[1], a * a));
  CHECK_THROWS_WITH(gate.forward(std::vector<Tensor>{a}),
                    Catch::Contains("the forward of Gate takes 2 inputs, got 1"));
  CHECK_THROWS_WITH(gate.forward(a), Catch::Contains("[Gate] forward(Tensor) is not implemented"));
  dist::RemoteModule linear("worker1", "d_linear", int64_t{4}, int64_t{3}, int64_t{1});
  CHECK_THROWS_WITH(linear.forward({a, b}), Catch::Contains("takes one input, got 2"));
  CHECK(allclose(linear.forward(std::vector<Tensor>{a}).at(0), linear.forward(a)));
}

TEST_CASE("RemoteModule on \"worker/cuda:N\": placed on the owner's GPU", "[remote_module]") {
  Group g(2);
  rpc::Agent::Use use(g[0]);
#ifdef GW_HAVE_CUDA
  if (gw::cuda::is_available()) {
    dist::RemoteModule gpu("worker1/cuda:0", "d_linear", int64_t{4}, int64_t{3}, int64_t{5});
    dist::RemoteModule cpu("worker1/cpu", "d_linear", int64_t{4}, int64_t{3}, int64_t{5});
    CHECK(gpu.device() == cuda_device(0));
    Tensor x = randn({6, 4});
    Tensor out = gpu.forward(x);  // a CPU input moved there, the output brought back
    CHECK(out.device() == kCPU);
    CHECK(allclose(out, cpu.forward(x), 1e-5, 1e-6));
    // Its parameters are CUDA tensors: without a device map toward this worker the owner
    // refuses to send them (as PyTorch's TensorPipe agent does), naming the device.
    CHECK_THROWS_WITH(gpu.remote_parameters()[0].to_here(),
                      Catch::Contains("cuda:0") && Catch::Contains("device map"));
    // With a map they arrive on the mapped device, and forward's outputs stay on the GPU.
    const Tensor expected = cpu.forward(x);
    rpc::RpcBackendOptions mapped = Group::small_options();
    mapped.set_device_map("worker1", {{0, 0}});
    Group h(2, mapped);
    rpc::Agent::Use use_mapped(h[0]);
    dist::RemoteModule on_gpu("worker1/cuda:0", "d_linear", int64_t{4}, int64_t{3}, int64_t{5});
    Tensor weight = on_gpu.remote_parameters()[0].to_here();
    CHECK(weight.device() == cuda_device(0));
    Tensor y = on_gpu.forward(x);
    CHECK(y.device() == cuda_device(0));
    CHECK(allclose(y.to(kCPU), expected, 1e-5, 1e-6));
    return;
  }
#endif
  // No GPU here: the owner refuses to place it, naming the device.
  CHECK_THROWS_WITH(
      dist::RemoteModule("worker1/cuda:0", "d_linear", int64_t{1}, int64_t{1}, int64_t{1}),
      Catch::Contains("cannot place the module on cuda:0"));
  GW_SKIP("no CUDA device: RemoteModule on a GPU not run");
}

TEST_CASE("RRef::backward runs backward on the owner", "[rref_backward]") {
  Group g(2);
  rpc::Agent::Use use(g[0]);
  {
    Context ctx;
    auto x = rpc::remote("worker1", d_leaf, int64_t{3});
    auto s = rpc::remote("worker1", d_square_sum, x);
    s.backward(ctx.id());
    CHECK(allclose(grad_on_owner(ctx.id(), x), x.to_here() * 2.0));
    CHECK_FALSE(rpc::rpc_sync("worker1", d_grad_field, x).has_value());  // the context, not .grad
  }
  // Without a context: local autograd on the owner, into .grad.
  auto x = rpc::remote("worker1", d_leaf, int64_t{4});
  auto s = rpc::remote("worker1", d_square_sum, x);
  s.backward();
  CHECK(allclose(rpc::rpc_sync("worker1", d_grad_field, x).value(), x.to_here() * 2.0));
  // On the owner itself.
  Tensor v = rand({2}).requires_grad_();
  rpc::RRef<Tensor> mine((v * v).sum());
  mine.backward();
  CHECK(allclose(v.grad(), v.detach() * 2.0));
}

#ifdef GW_HAVE_CUDA
TEST_CASE("CUDA tensors through distributed autograd and the distributed optimizer",
          "[dist_autograd][cuda]") {
  GW_REQUIRE_CUDA_DEVICE();
  const Device gpu = cuda_device(0);
  rpc::RpcBackendOptions o = Group::small_options();
  o.set_device_map("worker1", {{0, 0}});
  Group g(2, o);
  rpc::Agent::Use use(g[0]);
  Generator gen(4);
  Tensor a = rand({3, 3}, gen).to(gpu).requires_grad_();
  Tensor w = rand({3, 3}, gen).to(gpu).requires_grad_();
  const Tensor w_before = w.detach().to(kCPU);
  dist::DistributedOptimizer opt(optim::SGD::options(0.5), {rpc::RRef<Tensor>(w)});
  dist::autograd::Context ctx;
  Tensor product = rpc::rpc_sync("worker1", dist::autograd::testing::d_mul, a, w);
  CHECK(product.device() == gpu);  // back on the inverse of the device map
  dist::autograd::backward(ctx.id(), {product.sum()});
  auto grads = dist::autograd::get_gradients(ctx.id());
  REQUIRE(grads.contains(w));
  CHECK(grads.at(w).device() == gpu);
  CHECK(allclose(grads.at(w).to(kCPU), a.detach().to(kCPU)));  // d(sum(a * w))/dw = a
  opt.step(ctx.id());
  CHECK(allclose(w.detach().to(kCPU), w_before - a.detach().to(kCPU) * 0.5));
}
#endif
