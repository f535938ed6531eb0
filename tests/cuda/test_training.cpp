// autograd, nn and optim on CUDA tensors, unchanged: gradients checked by finite differences in
// float64 on the GPU, and Adam steps of an MLP on the GPU matching the same steps on the CPU.
#include <catch2/catch.hpp>

#include "autograd/autograd.h"
#include "autograd/gradcheck.h"
#include "core/ops.h"
#include "core/random.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/cuda/cuda_test_util.h"

using namespace gw;
using cuda_test::kGpu;

namespace {
Tensor gpu_leaf(Shape shape, uint64_t seed) {
  Generator gen(seed);
  return randn(std::move(shape), gen).to(kFloat64).to(kGpu).requires_grad_();
}
}  // namespace

TEST_CASE("gradcheck in float64 on CUDA", "[cuda][autograd]") {
  GW_REQUIRE_CUDA_DEVICE();
  Tensor a = gpu_leaf({3, 4}, 1), b = gpu_leaf({4, 2}, 2), c = gpu_leaf({2}, 3);
  using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
  auto check = [](const char* what, const Fn& fn, const std::vector<Tensor>& inputs) {
    INFO(what);
    auto result = autograd::gradcheck(fn, inputs);
    INFO(result.message);
    CHECK(result.ok);
  };
  check("matmul, broadcast add, tanh",
        [](const std::vector<Tensor>& t) { return (matmul(t[0], t[1]) + t[2]).tanh(); },
        {a, b, c});
  check("log_softmax, exp, division", [](const std::vector<Tensor>& t) {
    return log_softmax(t[0], 1).exp() / (square(t[0]) + 1.0);
  }, {a});
  check("sum over a dim, relu, sigmoid", [](const std::vector<Tensor>& t) {
    return sum(t[0].relu() * t[0].sigmoid(), {0});
  }, {a});
  Tensor idx = from_vector<int64_t>({2, 0, 1}).to(kGpu);
  check("index_select and gather", [idx](const std::vector<Tensor>& t) {
    return index_select(t[0], 1, idx) + gather(t[0], 1, idx.view({3, 1}));
  }, {a});
}

TEST_CASE("an MLP trains the same on the GPU as on the CPU", "[cuda][nn][optim]") {
  GW_REQUIRE_CUDA_DEVICE();
  auto make = [](Device device) {
    Generator gen(7);
    auto m = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(8, 16, true, gen),
                                              std::make_shared<nn::ReLU>(),
                                              std::make_shared<nn::Linear>(16, 4, true, gen));
    m->to(device);
    return m;
  };
  auto gpu = make(kGpu), cpu = make(kCPU);
  for (const auto& p : gpu->parameters()) CHECK(p.device() == kGpu);
  optim::Adam gpu_opt(gpu->parameters(), optim::Adam::options(1e-2));
  optim::Adam cpu_opt(cpu->parameters(), optim::Adam::options(1e-2));
  Generator gen(9);
  for (int step = 0; step < 5; ++step) {
    Tensor x = randn({16, 8}, gen), y = randint(0, 4, {16}, gen);
    gpu_opt.zero_grad();
    cpu_opt.zero_grad();
    Tensor gpu_loss = nn::functional::cross_entropy(gpu->forward(x.to(kGpu)), y.to(kGpu));
    Tensor cpu_loss = nn::functional::cross_entropy(cpu->forward(x), y);
    gpu_loss.backward();
    cpu_loss.backward();
    CHECK(gpu_loss.item<double>() == Approx(cpu_loss.item<double>()).epsilon(1e-4));
    gpu_opt.step();
    cpu_opt.step();
  }
  auto p = gpu->parameters(), q = cpu->parameters();
  for (size_t i = 0; i < p.size(); ++i) CHECK(allclose(p[i].to(kCPU), q[i], 1e-4, 1e-5));
}
