// The CUDA backend against the raw CUDA it is built on, in the same run:
//   - GEMM (float32, TF32 off) against cublasSgemm on the same buffers;
//   - elementwise add's bandwidth (three streams) against a plain copy kernel's (two streams),
//     which is what the memory can do;
//   - host <-> device copies of a tensor against cudaMemcpy of the same bytes (pinned host
//     memory both ways);
//   - the cost of one tiny op (checks, allocation, dispatch, launch) against launching a
//     one-thread kernel;
//   - a Fashion-MNIST MLP training step on the GPU against the same step on the CPU;
//   - DDP at world size 1 over NCCL against the same training without DDP.
// Without a device every case prints "skipped: no device (...)".
#include <cuda_runtime_api.h>

#include <cublas_v2.h>

#include <string>

#include "bench/cuda_anchor_kernels.h"
#include "bench/harness.h"
#include "core/ops.h"
#include "core/random.h"
#include "cuda/allocator.h"
#include "cuda/blas.h"
#include "cuda/cuda_error.h"
#include "cuda/device.h"
#include "cuda/stream.h"
#include "nn/nn.h"
#include "optim/sgd.h"
#ifdef GW_HAVE_NCCL
#include "ddp/distributed_data_parallel.h"
#include "dist/process_group/process_group_nccl.h"
#include "dist/store/hash_store.h"
#endif

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

void elementwise(gw::bench::Reporter& report) {
  const std::string name = "add f32 64M";
  if (!report.wants("cuda", name)) return;
  const int64_t n = int64_t{64} << 20;
  Tensor a = gw::ones({n}, kGpu), b = gw::ones({n}, kGpu), out = gw::empty({n}, kGpu);
  auto [ours, copy] = gw::bench::seconds_per_call_pair(
      [&] {
        gw::bench::do_not_optimize(gw::add(a, b));
        sync();
      },
      [&] {
        gw::bench::launch_copy(out.data_ptr<float>(), a.data_ptr<float>(),
                               static_cast<size_t>(n), gw::cuda::current_stream(0));
        sync();
      });
  const double bytes = 4.0 * static_cast<double>(n);
  report.add({"cuda", name, 3 * bytes / ours / 1e9, "GB/s", "copy kernel", 2 * bytes / copy / 1e9});
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
        std::make_shared<gw::dist::HashStore>(), 0, 1, gw::dist::NcclOptions{.device = 0});
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

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
  if (!gw::cuda::is_available()) {
    const std::string why = "no device (" + gw::cuda::no_device_reason() + ")";
    for (const char* name :
         {"gemm f32 1024", "gemm f32 4096", "add f32 64M", "H2D 256 MiB pinned",
          "D2H 256 MiB pinned", "one-element add, per op", "MLP SGD step, batch 64",
          "DDP step, world size 1 (NCCL)"})
      report.skip("cuda", name, why);
    return 0;
  }
  if (!report.json()) std::printf("cuda: %s\n", device_name().c_str());
  gemm(report);
  elementwise(report);
  transfers(report);
  dispatch(report);
  training(report);
  return 0;
}
