// The CUDA backend against the raw CUDA it is built on, in the same run:
//   - GEMM (float32, TF32 off) against cublasSgemm on the same buffers;
//   - the memory-bound kernels (add, gelu, whole-tensor sum, softmax, layer_norm forward and
//     backward, cross-entropy forward and backward, an Adam step of GPT-2 small's parameters)
//     in GB/s of the bytes they must move,
//     against a plain copy kernel's GB/s (what the memory can do) in alternating rounds;
//     bench/torch_anchor_cuda.py measures the same cases in PyTorch on the same GPU;
//   - host <-> device copies of a tensor against cudaMemcpy of the same bytes (pinned host
//     memory both ways);
//   - the cost of one tiny op (checks, allocation, dispatch, launch) against launching a
//     one-thread kernel;
//   - a Fashion-MNIST MLP training step on the GPU against the same step on the CPU;
//   - DDP at world size 1 over NCCL against the same training without DDP;
//   - causal self-attention forward and backward in bfloat16, the fused kernel against the
//     composition (time and peak memory), L = 256, 1024, 4096; torch_anchor_cuda.py times
//     PyTorch's scaled_dot_product_attention;
//   - gpt_train's GPT (4 blocks, width 128, context 128, batch 32) training on the GPU, in
//     tokens/s over the fastest 50 steps after 10: in float32 against the same step on the CPU,
//     and with bfloat16 autocast (gpt_train --amp bf16) against the float32 step;
//     bench/torch_anchor_gpt_cuda.py times PyTorch eager on the same GPU, in both precisions;
//   - CUDA tensors through RPC between two processes on one GPU (this one as worker0, a copy of
//     it as worker1, device map cuda:0 -> cuda:0): an echo rpc_sync of 1 and 64 MiB, by IPC
//     handle (shared memory on, as between any two processes of one host), against two raw
//     device-to-device copies of the same bytes and against the same echo staged through host
//     memory (shared memory off); bench/torch_anchor_rpc_cuda.py times PyTorch's TensorPipe.
//     With GW_BENCH_DIAG=1 it also prints where a round trip's time goes (a 4-byte CPU and CUDA
//     echo, and the sender's share_cuda_tensor alone).
// Without a device every case prints "skipped: no device (...)".
#include <cuda_runtime_api.h>

#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench/cuda_anchor_kernels.h"
#include "bench/harness.h"
#include "core/cuda/allocator.h"
#include "core/cuda/blas.h"
#include "core/cuda/cuda_error.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/ipc.h"
#include "core/ops.h"
#include "core/random.h"
#include "examples/common/gpt_recipe.h"
#include "nn/functional.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "rpc/rpc.h"
#include "store/tcp_store.h"
#include "tests/process_util.h"
#ifdef GW_HAVE_NCCL
#include "ddp/distributed_data_parallel.h"
#include "dist/process_group/process_group_nccl.h"
#include "store/hash_store.h"
#endif

// The RPC echo's function: the tensor goes there and back with no work in between.
gw::Tensor echo(gw::Tensor t) { return t; }
GW_RPC_FUNCTION(echo);

namespace {

using gw::Tensor;
const gw::Device kGpu = gw::cuda_device(0);

void sync() { gw::cuda::synchronize(0); }

std::string device_name() {
  cudaDeviceProp prop{};
  GW_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.name;
}

void gemm(gw::bench::Reporter& report) {
  for (int64_t n : {1024, 4096}) {
    const std::string name = "gemm f32 " + std::to_string(n);
    if (!report.wants("cuda", name)) continue;
    gw::Generator gen(1);
    Tensor a = gw::randn({n, n}, gen).to(kGpu), b = gw::randn({n, n}, gen).to(kGpu);
    Tensor c = gw::empty({n, n}, kGpu);
    cublasHandle_t handle = gw::cuda::blas_handle(gw::cuda::current_stream(0));
    const float one = 1, zero = 0;
    const int m = static_cast<int>(n);
    auto [ours, raw] = gw::bench::seconds_per_call_pair(
        [&] {
          gw::bench::do_not_optimize(gw::matmul(a, b));
          sync();
        },
        [&] {  // row-major C = A B is column-major C^T = B^T A^T
          GW_CUDA_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one,
                                    b.data_ptr<float>(), m, a.data_ptr<float>(), m, &zero,
                                    c.data_ptr<float>(), m));
          sync();
        });
    const double flop = 2.0 * static_cast<double>(n * n * n);
    report.add({"cuda", name, flop / ours / 1e9, "GFLOP/s", "raw cuBLAS", flop / raw / 1e9});
  }
}

// The anchor of the memory-bound cases: a copy kernel moving 256 MiB each way.
struct CopyKernel {
  static constexpr int64_t n = int64_t{64} << 20;
  Tensor src = gw::ones({n}, kGpu), dst = gw::empty({n}, kGpu);
  void operator()() {
    gw::bench::launch_copy(dst.data_ptr<float>(), src.data_ptr<float>(), static_cast<size_t>(n),
                           gw::cuda::current_stream(0));
  }
  double bytes() const { return 8.0 * n; }
};

// One memory-bound case: `op` must move `bytes` (reads plus writes) per call; it is timed in
// alternating rounds with the copy kernel.
void memory_case(gw::bench::Reporter& report, CopyKernel& copy, const std::string& name,
                 double bytes, const std::function<void()>& op) {
  if (!report.wants("cuda", name)) return;
  auto [ours, anchor] = gw::bench::seconds_per_call_pair(
      [&] {
        op();
        sync();
      },
      [&] {
        copy();
        sync();
      });
  report.add(
      {"cuda", name, bytes / ours / 1e9, "GB/s", "copy kernel", copy.bytes() / anchor / 1e9});
}

void memory_bound(gw::bench::Reporter& report) {
  namespace F = gw::nn::functional;
  gw::Generator gen(3);
  CopyKernel copy;
  const int64_t n = int64_t{64} << 20;
  const double f = 4;  // bytes per float
  {
    Tensor a = gw::randn({n}, gen).to(kGpu), b = gw::randn({n}, gen).to(kGpu);
    memory_case(report, copy, "add f32 64M", 3 * f * n, [&] { gw::bench::do_not_optimize(a + b); });
    memory_case(report, copy, "gelu f32 64M", 2 * f * n,
                [&] { gw::bench::do_not_optimize(gw::gelu(a)); });
    memory_case(report, copy, "sum f32 64M", f * n,
                [&] { gw::bench::do_not_optimize(gw::sum(a)); });
    memory_case(report, copy, "bias-gradient sum f32 16384x4096, dim 0", f * n, [&] {
      gw::bench::do_not_optimize(gw::sum(a.view({16384, 4096}), {0}));
    });
  }
  {
    Tensor x = gw::randn({8192, 8192}, gen).to(kGpu);
    memory_case(report, copy, "softmax f32 8192x8192", 2 * f * 8192 * 8192,
                [&] { gw::bench::do_not_optimize(gw::softmax(x, -1)); });
  }
  {
    const int64_t rows = 8192, h = 4096;
    Tensor x = gw::randn({rows, h}, gen).to(kGpu), w = gw::randn({h}, gen).to(kGpu),
           b = gw::randn({h}, gen).to(kGpu), gy = gw::randn({rows, h}, gen).to(kGpu);
    memory_case(report, copy, "layer_norm f32 8192x4096", 2 * f * rows * h,
                [&] { gw::bench::do_not_optimize(F::layer_norm(x, {h}, w, b, 1e-5)); });
    Tensor xl = x.detach().requires_grad_(true), wl = w.detach().requires_grad_(true),
           bl = b.detach().requires_grad_(true);
    // Forward (read x, write y) and backward (read gy and x twice, write gx).
    memory_case(report, copy, "layer_norm fwd+bwd f32 8192x4096", 7 * f * rows * h, [&] {
      for (const Tensor& t : {xl, wl, bl}) t.set_grad({});
      F::layer_norm(xl, {h}, wl, bl, 1e-5).backward(gy);
    });
  }
  if (report.wants("cuda", "Adam step, GPT-2 small (148 tensors, 124M)")) {
    // GPT-2 small's 148 parameter tensors (124M parameters): one Adam step reads param, grad
    // and both moments and writes param and both moments.
    std::vector<gw::Shape> shapes = {{50257, 768}, {1024, 768}};
    for (int layer = 0; layer < 12; ++layer) {
      for (gw::Shape s : std::vector<gw::Shape>{{768}, {768}, {2304, 768}, {2304}, {768, 768},
                                                {768}, {768}, {768}, {3072, 768}, {3072},
                                                {768, 3072}, {768}}) {
        shapes.push_back(s);
      }
    }
    shapes.push_back({768});
    shapes.push_back({768});
    std::vector<Tensor> params;
    double elements = 0;
    for (const gw::Shape& s : shapes) {
      params.push_back(gw::randn(s, gen).to(kGpu).requires_grad_(true));
      params.back().set_grad(gw::randn(s, gen).to(kGpu));
      elements += static_cast<double>(params.back().numel());
    }
    gw::optim::Adam adam(params, gw::optim::Adam::options(1e-4));
    memory_case(report, copy, "Adam step, GPT-2 small (148 tensors, 124M)", 7 * f * elements,
                [&] { adam.step(); });
  }
  {
    const int64_t rows = 4096, classes = 32000;
    Tensor logits = gw::randn({rows, classes}, gen).to(kGpu).requires_grad_(true);
    Tensor target = gw::randint(0, classes, {rows}, gen).to(kGpu);
    // Forward reads the logits; backward reads them and writes their gradient.
    memory_case(report, copy, "cross_entropy fwd+bwd 4096x32000", 3 * f * rows * classes, [&] {
      logits.set_grad({});
      F::cross_entropy(logits, target).backward();
    });
  }
}

void transfers(gw::bench::Reporter& report) {
  const int64_t n = int64_t{64} << 20;  // 256 MiB
  const size_t bytes = static_cast<size_t>(n) * 4;
  Tensor host = gw::cuda::empty_pinned({n});
  host.fill_(1.0);
  Tensor device = gw::empty({n}, kGpu);
  if (report.wants("cuda", "H2D 256 MiB pinned")) {
    auto [ours, raw] = gw::bench::seconds_per_call_pair(
        [&] { gw::bench::do_not_optimize(host.to(kGpu)); sync(); },
        [&] {
          GW_CUDA_CHECK(cudaMemcpy(device.raw_data(), host.raw_data(), bytes,
                                   cudaMemcpyHostToDevice));
        });
    report.add({"cuda", "H2D 256 MiB pinned", bytes / ours / 1e9, "GB/s", "cudaMemcpy",
                bytes / raw / 1e9});
  }
  if (report.wants("cuda", "D2H 256 MiB pinned")) {
    auto [ours, raw] = gw::bench::seconds_per_call_pair(
        [&] { host.copy_(device); },
        [&] {
          GW_CUDA_CHECK(cudaMemcpy(host.raw_data(), device.raw_data(), bytes,
                                   cudaMemcpyDeviceToHost));
        });
    report.add({"cuda", "D2H 256 MiB pinned", bytes / ours / 1e9, "GB/s", "cudaMemcpy",
                bytes / raw / 1e9});
  }
}

void dispatch(gw::bench::Reporter& report) {
  const std::string name = "one-element add, per op";
  if (!report.wants("cuda", name)) return;
  Tensor a = gw::ones({1}, kGpu), b = gw::ones({1}, kGpu), out = gw::empty({1}, kGpu);
  // Many ops per timed call so that the launch queue, not one synchronization, dominates.
  constexpr int kOps = 256;
  auto [ours, raw] = gw::bench::seconds_per_call_pair(
      [&] {
        for (int i = 0; i < kOps; ++i) gw::bench::do_not_optimize(gw::add(a, b));
        sync();
      },
      [&] {
        for (int i = 0; i < kOps; ++i)
          gw::bench::launch_add_one(out.data_ptr<float>(), a.data_ptr<float>(),
                                    b.data_ptr<float>(), gw::cuda::current_stream(0));
        sync();
      });
  report.add({"cuda", name, ours / kOps * 1e6, "us", "raw kernel launch", raw / kOps * 1e6});
}

std::shared_ptr<gw::nn::Sequential> mlp(gw::Device device) {
  gw::Generator gen(0);
  auto m = std::make_shared<gw::nn::Sequential>(
      std::make_shared<gw::nn::Linear>(784, 256, true, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(256, 128, true, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(128, 10, true, gen));
  m->to(device);
  return m;
}

// Seconds per SGD step of `forward` on a batch of 64 on `device`.
template <typename Forward>
double step_seconds(Forward forward, const std::vector<Tensor>& params, gw::Device device) {
  gw::Generator gen(2);
  Tensor x = gw::randn({64, 784}, gen).to(device), y = gw::randint(0, 10, {64}, gen).to(device);
  gw::optim::SGD opt(params, gw::optim::SGD::options(0.01));
  return gw::bench::seconds_per_call([&] {
    opt.zero_grad();
    gw::nn::functional::cross_entropy(forward(x), y).backward();
    opt.step();
    if (device.is_cuda()) sync();
  });
}

void training(gw::bench::Reporter& report) {
  if (report.wants("cuda", "MLP SGD step, batch 64")) {
    auto gpu = mlp(kGpu), cpu = mlp(gw::kCPU);
    double g = step_seconds([&](const Tensor& x) { return gpu->forward(x); }, gpu->parameters(),
                            kGpu);
    double c = step_seconds([&](const Tensor& x) { return cpu->forward(x); }, cpu->parameters(),
                            gw::kCPU);
    report.add({"cuda", "MLP SGD step, batch 64", g * 1e6, "us", "the same step on the CPU",
                c * 1e6});
  }
#ifdef GW_HAVE_NCCL
  if (report.wants("cuda", "DDP step, world size 1 (NCCL)")) {
    auto pg = std::make_shared<gw::dist::ProcessGroupNCCL>(
        std::make_shared<gw::store::HashStore>(), 0, 1, gw::dist::NcclOptions{.device = 0});
    auto plain = mlp(kGpu), wrapped = mlp(kGpu);
    gw::ddp::DistributedDataParallel model(wrapped, pg);
    double local = step_seconds([&](const Tensor& x) { return plain->forward(x); },
                                plain->parameters(), kGpu);
    double ddp = step_seconds([&](const Tensor& x) { return model.forward(x); },
                              wrapped->parameters(), kGpu);
    report.add({"cuda", "DDP step, world size 1 (NCCL)", ddp * 1e6, "us", "without DDP",
                local * 1e6});
  }
#else
  report.skip("cuda", "DDP step, world size 1 (NCCL)", "this build has no NCCL");
#endif
}

// gpt_train's model and recipe, one step after another on random tokens (the speed does not
// depend on them), reading the loss every step as gpt_train's progress line does.
double gpt_tokens_per_s(gw::Device device, int64_t steps,
                        std::optional<gw::DType> autocast = std::nullopt) {
  constexpr int64_t kBatch = 32, kContext = 128, kVocab = 80, kUntimed = 10, kWindow = 50;
  gw::Generator gen(0);
  auto model = std::make_shared<gw::nn::GPT>(
      gw::nn::GPTOptions{.vocab_size = kVocab, .context = kContext}, gen);
  model->to(device);
  gw::examples::GPTTrainer trainer(model, {.steps = steps, .warmup = 10, .autocast = autocast});
  Tensor xs = gw::randint(0, kVocab, {steps, kBatch, kContext}, gen).to(device);
  Tensor ys = gw::randint(0, kVocab, {steps, kBatch, kContext}, gen).to(device);
  std::vector<double> seconds;
  for (int64_t s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    trainer.step(xs.select(0, s), ys.select(0, s));
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return static_cast<double>(kWindow * kBatch * kContext) /
         gw::bench::fastest_window(seconds, kUntimed, kWindow);
}

constexpr const char* kGptCase = "gpt step f32, gpt_train's model, 4096 tokens";
constexpr const char* kGptBf16Case = "gpt step bf16 autocast, gpt_train's model, 4096 tokens";

void gpt(gw::bench::Reporter& report) {
  const bool f32 = report.wants("cuda", kGptCase), bf16 = report.wants("cuda", kGptBf16Case);
  if (!f32 && !bf16) return;
  const double gpu = gpt_tokens_per_s(kGpu, 110);
  if (f32)
    report.add({"cuda", kGptCase, gpu, "tokens/s", "the same step on the CPU",
                gpt_tokens_per_s(gw::kCPU, 62)});
  if (bf16) {  // float32 parameters, bfloat16 products and attention (gpt_train --amp bf16)
    report.add({"cuda", kGptBf16Case, gpt_tokens_per_s(kGpu, 110, gw::kBFloat16), "tokens/s",
                "the same step in float32", gpu});
  }
}

// Causal self-attention forward and backward in bfloat16 (16 heads of 64, 16384 tokens a
// step): the fused kernel against the composition written out, softmax((q · scale) kᵀ + causal
// mask) v (cuBLAS products, the softmax kernel), in TFLOP/s of FlashAttention's count
// (the causal half of 4 L² E per head forward, 2.5 times that backward); and the memory each
// holds at its peak beyond its inputs. torch_anchor_cuda.py times PyTorch's
// scaled_dot_product_attention on the same case.
std::string attention_case(int64_t l, bool memory) {
  return "attention fwd+bwd bf16 causal, L " + std::to_string(l) + ", " +
         (memory ? "peak extra memory" : "16 heads of 64, 16384 tokens");
}

void attention(gw::bench::Reporter& report) {
  namespace F = gw::nn::functional;
  for (int64_t l : {256, 1024, 4096}) {
    const bool time = report.wants("cuda", attention_case(l, false));
    const bool memory = report.wants("cuda", attention_case(l, true));
    if (!time && !memory) continue;
    const int64_t b = 16384 / l, h = 16, e = 64;
    gw::Generator gen(5);
    auto leaf = [&] {
      return gw::randn({b, h, l, e}, gen).to(gw::kBFloat16).to(kGpu).requires_grad_(true);
    };
    Tensor q = leaf(), k = leaf(), v = leaf();
    Tensor gout = gw::randn({b, h, l, e}, gen).to(gw::kBFloat16).to(kGpu);
    // The causal mask as an additive bfloat16 (L, L): 0 on and below the diagonal, -inf above.
    const Tensor hidden =
        gw::gt(gw::arange(l, gw::TensorOptions(gw::kInt64).with_device(kGpu)).unsqueeze(0),
               gw::arange(l, gw::TensorOptions(gw::kInt64).with_device(kGpu)).unsqueeze(1));
    const Tensor causal =
        gw::masked_fill(gw::zeros({l, l}, gw::TensorOptions(gw::kBFloat16).with_device(kGpu)),
                        hidden, -std::numeric_limits<double>::infinity());
    const double scale = 1 / std::sqrt(static_cast<double>(e));
    auto step = [&](bool fused) {
      for (Tensor* t : {&q, &k, &v}) t->set_grad({});
      Tensor out =
          fused
              ? F::scaled_dot_product_attention(q, k, v, {}, 0.0, true)
              : gw::matmul(gw::softmax(gw::matmul(q * scale, k.transpose(-2, -1)) + causal, -1), v);
      out.backward(gout);
    };
    if (time) {
      auto [fused, composed] = gw::bench::seconds_per_call_pair(
          [&] {
            step(true);
            sync();
          },
          [&] {
            step(false);
            sync();
          });
      const double flop = 3.5 * 4.0 * static_cast<double>(b * h * l * l * e) / 2;
      report.add({"cuda", attention_case(l, false), flop / fused / 1e12, "TFLOP/s",
                  "gradwire composed", flop / composed / 1e12});
    }
    if (memory) {
      auto peak_mib = [&](bool fused) {
        step(fused);  // the cached blocks are there: the peak counts tensors, not the cache
        for (Tensor* t : {&q, &k, &v}) t->set_grad({});
        sync();
        const size_t base = gw::cuda::memory_stats(0).allocated_bytes;
        gw::cuda::reset_peak_memory_stats(0);
        step(fused);
        sync();
        return static_cast<double>(gw::cuda::memory_stats(0).peak_allocated_bytes - base) /
               (1 << 20);
      };
      report.add({"cuda", attention_case(l, true), peak_mib(true), "MiB", "gradwire composed",
                  peak_mib(false)});
    }
  }
}

// worker1 of rpc_transfers' world: bench_cuda --rpc-peer STORE_PORT SHARED_MEMORY(0|1).
int rpc_peer(const char* port, bool shared_memory) {
  gw::rpc::RpcBackendOptions o;
  o.init_method = std::string("tcp://127.0.0.1:") + port;
  o.shared_memory = shared_memory;
  gw::rpc::init_rpc("worker1", 1, 2, o);
  gw::rpc::shutdown();  // returns once worker0 is done
  return 0;
}

std::string rpc_case(int64_t mib) {
  return "rpc echo " + std::to_string(mib) + " MiB, cuda:0 -> cuda:0, two processes";
}

void rpc_transfers(gw::bench::Reporter& report) {
  const std::vector<int64_t> sizes{1, 64};
  if (std::ranges::none_of(sizes, [&](int64_t mib) { return report.wants("cuda", rpc_case(mib)); }))
    return;
  std::vector<double> shared(sizes.size()), staged(sizes.size()), raw(sizes.size());
  for (const bool shared_memory : {true, false}) {
    auto store = std::make_shared<gw::store::TCPStore>("127.0.0.1", 0, -1, true);
    const pid_t peer = gw::test::spawn(
        {"/proc/self/exe", "--rpc-peer", std::to_string(store->port()), shared_memory ? "1" : "0"});
    {
      gw::rpc::RpcBackendOptions o;
      o.store = store;
      o.shared_memory = shared_memory;
      o.set_device_map("worker1", {{0, 0}});
      gw::rpc::Agent agent("worker0", 0, 2, o);
      gw::rpc::Agent::Use use(agent);
      for (size_t i = 0; i < sizes.size(); ++i) {
        Tensor x = gw::ones({sizes[i] << 18}, kGpu);
        Tensor y = gw::empty_like(x), z = gw::empty_like(x);
        auto [ours, anchor] = gw::bench::seconds_per_call_pair(
            [&] { gw::bench::do_not_optimize(gw::rpc::rpc_sync(1, echo, x)); },
            [&] {
              GW_CUDA_CHECK(
                  cudaMemcpy(y.raw_data(), x.raw_data(), x.nbytes(), cudaMemcpyDeviceToDevice));
              GW_CUDA_CHECK(
                  cudaMemcpy(z.raw_data(), y.raw_data(), x.nbytes(), cudaMemcpyDeviceToDevice));
            });
        (shared_memory ? shared : staged)[i] = ours;
        if (shared_memory) raw[i] = anchor;
      }
      if (std::getenv("GW_BENCH_DIAG")) {  // where a round trip's time goes
        Tensor cpu = gw::ones({1}), gpu = gw::ones({1}, kGpu), big = gw::ones({1 << 18}, kGpu);
        const auto us = [](const std::function<void()>& f) {
          return gw::bench::seconds_per_call(f) * 1e6;
        };
        std::fprintf(stderr, "diag (%s): echo of a 4-byte CPU tensor %.1f us, CUDA %.1f us\n",
                     shared_memory ? "shared memory" : "tcp",
                     us([&] { gw::rpc::rpc_sync(1, echo, cpu); }),
                     us([&] { gw::rpc::rpc_sync(1, echo, gpu); }));
        if (shared_memory)
          std::fprintf(
              stderr, "diag: cuda_ipc_shareable %.2f us, share_cuda_tensor 1 MiB %.2f us\n",
              us([&] { gw::bench::do_not_optimize(gw::cuda_ipc_shareable(big)); }), us([&] {
                gw::CudaIpcLease lease;
                gw::bench::do_not_optimize(gw::share_cuda_tensor(big, lease));
              }));
      }
      agent.shutdown();
    }
    GW_CHECK(gw::test::wait_exit(peer) == 0, gw::InternalError, "[bench_cuda] the RPC peer failed");
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double bytes = static_cast<double>(sizes[i] << 20);
    report.add({"cuda", rpc_case(sizes[i]), bytes / shared[i] / 1e9, "GB/s",
                "two device-to-device copies", bytes / raw[i] / 1e9});
    report.add({"cuda", rpc_case(sizes[i]), bytes / shared[i] / 1e9, "GB/s",
                "staged through host memory", bytes / staged[i] / 1e9});
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string_view(argv[1]) == "--rpc-peer")
    return rpc_peer(argv[2], std::string_view(argv[3]) == "1");
  gw::bench::Reporter report(argc, argv);
  if (!gw::cuda::is_available()) {
    const std::string why = "no device (" + gw::cuda::no_device_reason() + ")";
    for (const char* name :
         {"gemm f32 1024", "gemm f32 4096", "add f32 64M", "gelu f32 64M", "sum f32 64M",
          "bias-gradient sum f32 16384x4096, dim 0", "softmax f32 8192x8192",
          "layer_norm f32 8192x4096", "layer_norm fwd+bwd f32 8192x4096",
          "Adam step, GPT-2 small (148 tensors, 124M)", "cross_entropy fwd+bwd 4096x32000",
          "H2D 256 MiB pinned", "D2H 256 MiB pinned",
          "one-element add, per op", "MLP SGD step, batch 64", "DDP step, world size 1 (NCCL)"})
      report.skip("cuda", name, why);
    for (int64_t mib : {1, 64}) report.skip("cuda", rpc_case(mib), why);
    for (int64_t l : {256, 1024, 4096}) {
      report.skip("cuda", attention_case(l, false), why);
      report.skip("cuda", attention_case(l, true), why);
    }
    report.skip("cuda", kGptCase, why);
    report.skip("cuda", kGptBf16Case, why);
    return 0;
  }
  if (!report.json()) std::printf("cuda: %s\n", device_name().c_str());
  gemm(report);
  memory_bound(report);
  transfers(report);
  dispatch(report);
  training(report);
  attention(report);
  gpt(report);
  rpc_transfers(report);
  return 0;
}
