// autograd, nn and optim on CUDA tensors, unchanged: gradients checked by finite differences in
// float64 on the GPU, and Adam steps of an MLP on the GPU matching the same steps on the CPU.
#include <catch2/catch.hpp>

#include "autograd/autograd.h"
#include "autograd/gradcheck.h"
#include "core/ops.h"
#include "core/random.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/adamw.h"
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

TEST_CASE("fused Adam and AdamW steps on the GPU match the op-by-op steps on the CPU",
          "[cuda][optim]") {
  GW_REQUIRE_CUDA_DEVICE();
  // 40 parameters (two launches of 32) of 1 to 4999 elements; some skip a step, so their step
  // counts differ within a launch.
  auto run = [](auto make_optimizer, DType dtype) {
    Generator gen(11);
    std::vector<Tensor> cpu, gpu;
    for (int64_t i = 0; i < 40; ++i) {
      Tensor p = randn({1 + (i * 131) % 4999}, gen).to(dtype);
      cpu.push_back(p.clone().requires_grad_());
      gpu.push_back(p.to(kGpu).requires_grad_());
    }
    auto cpu_opt = make_optimizer(cpu);
    auto gpu_opt = make_optimizer(gpu);
    for (int step = 0; step < 4; ++step) {
      for (size_t i = 0; i < cpu.size(); ++i) {
        const bool skip = i % 7 == 3 && step % 2 == 1;
        Tensor g = randn(cpu[i].sizes(), gen).to(dtype);
        cpu[i].set_grad(skip ? Tensor() : g);
        gpu[i].set_grad(skip ? Tensor() : g.to(kGpu));
      }
      cpu_opt.step();
      gpu_opt.step();
    }
    for (size_t i = 0; i < cpu.size(); ++i) {
      INFO("parameter " << i);
      CHECK(allclose(gpu[i].to(kCPU), cpu[i], 1e-5, 1e-6));
    }
    auto cpu_state = cpu_opt.state_dict(), gpu_state = gpu_opt.state_dict();
    REQUIRE(cpu_state.size() == gpu_state.size());
    for (const auto& [key, value] : cpu_state) {
      INFO(key);
      CHECK(allclose(gpu_state.at(key).to(kCPU), value, 1e-5, 1e-6));
    }
  };
  run(
      [](std::vector<Tensor> ps) {
        return optim::Adam(ps, {.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true});
      },
      kFloat32);
  run(
      [](std::vector<Tensor> ps) {
        return optim::AdamW(ps, {.lr = 1e-2, .weight_decay = 0.1, .maximize = true});
      },
      kFloat32);
  run([](std::vector<Tensor> ps) { return optim::Adam(ps, {.lr = 1e-3}); }, kFloat64);
}

TEST_CASE("a GPT trains under bfloat16 autocast on the GPU as on the CPU", "[cuda][nn][autocast]") {
  GW_REQUIRE_CUDA_DEVICE();
  auto make = [](Device device) {
    Generator gen(5);
    auto m = std::make_shared<nn::GPT>(
        nn::GPTOptions{.vocab_size = 16, .context = 8, .layers = 2, .heads = 2, .width = 32}, gen);
    m->to(device);
    return m;
  };
  auto gpu = make(kGpu), cpu = make(kCPU);
  optim::AdamW gpu_opt(gpu->parameters(), {.lr = 1e-3});
  optim::AdamW cpu_opt(cpu->parameters(), {.lr = 1e-3});
  Generator gen(11);
  for (int step = 0; step < 3; ++step) {
    const Tensor x = randint(0, 16, {4, 8}, gen), y = randint(0, 16, {4, 8}, gen);
    gpu_opt.zero_grad();
    cpu_opt.zero_grad();
    Tensor gpu_loss, cpu_loss;
    {
      AutocastGuard amp(DeviceType::CUDA);
      CHECK(matmul(x.to(kFloat32), x.to(kFloat32).t()).dtype() == kFloat32);  // CPU: untouched
      CHECK((*gpu)(x.to(kGpu)).dtype() == kBFloat16);                         // the head's product
      gpu_loss = gpu->loss(x.to(kGpu), y.to(kGpu));
    }
    {
      AutocastGuard amp(DeviceType::CPU);
      cpu_loss = cpu->loss(x, y);
    }
    CHECK(gpu_loss.dtype() == kFloat32);
    gpu_loss.backward();
    cpu_loss.backward();
    // Both round each op to bfloat16, but not the same way (the GPU composes attention, the CPU
    // fuses it): a few bfloat16 steps apart.
    CHECK(gpu_loss.item<double>() == Approx(cpu_loss.item<double>()).epsilon(3e-2));
    for (const Tensor& p : gpu->parameters()) CHECK(p.grad().dtype() == kFloat32);
    gpu_opt.step();
    cpu_opt.step();
  }
  auto p = gpu->parameters(), q = cpu->parameters();
  for (size_t i = 0; i < p.size(); ++i) CHECK(allclose(p[i].to(kCPU), q[i], 1e-2, 1e-2));
}
