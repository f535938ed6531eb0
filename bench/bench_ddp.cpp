// DistributedDataParallel: the cost DDP adds to a training step, and DDP training throughput,
// with two ranks as threads of this process over Gloo on 127.0.0.1, beside PyTorch 1.13's DDP
// over gloo on the same models in the same run (two processes, torch_anchor_ddp.py):
//   - DDP overhead per step of the 784-4096-2560-10 MLP (13.7M parameters), batch 32: the DDP
//     step minus the same step without DDP, both ranks stepping at once in both cases, in
//     alternating rounds (the best round of each);
//   - samples per second (both ranks) of DDP training of the Fashion-MNIST MLP 784-256-128-10
//     with batch 32 per rank (random data of the same shape: speed does not depend on values);
//   - that DDP step with a timeline being recorded (core/trace.h) beside the same step without,
//     in alternating rounds, the median of each (goal: at most 5% slower).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <optional>
#include <string>

#include "bench/harness.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/trace.h"
#include "ddp/distributed_data_parallel.h"
#include "dist/process_group/process_group_gloo.h"
#include "dist/store/hash_store.h"
#include "nn/nn.h"
#include "optim/sgd.h"

namespace {

constexpr int kRanks = 2, kBatch = 32, kBigRounds = 5, kBigSteps = 3, kMnistSteps = 200;
constexpr int kTraceRounds = 21, kTraceSteps = 20;

std::shared_ptr<gw::nn::Sequential> mlp(const std::vector<int64_t>& sizes) {
  gw::Generator gen(0);
  auto model = std::make_shared<gw::nn::Sequential>();
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    if (i) model->push_back(std::make_shared<gw::nn::ReLU>());
    model->push_back(std::make_shared<gw::nn::Linear>(sizes[i], sizes[i + 1], true, gen));
  }
  return model;
}

// SGD steps of `forward` over `params` on one fixed batch.
template <typename Forward>
struct Trainer {
  Forward forward;
  gw::optim::SGD opt;
  gw::Tensor x, y;
  Trainer(Forward f, const std::vector<gw::Tensor>& params)
      : forward(std::move(f)), opt(params, gw::optim::SGD::options(0.01)) {
    gw::Generator gen(1);
    x = gw::randn({kBatch, 784}, gen);
    y = gw::randint(0, 10, {kBatch}, gen);
  }
  void step() {
    opt.zero_grad();
    gw::nn::functional::cross_entropy(forward(x), y).backward();
    opt.step();
  }
  // Seconds per step over `steps` steps, both ranks starting together.
  double time(int steps, gw::dist::ProcessGroup& pg) {
    pg.barrier()->wait();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
  }
};

struct Results {
  double big_local = 1e30, big_ddp = 1e30, mnist_step = 0;
  double traced = 1e30, untraced = 1e30;  // the Fashion-MNIST step, tracing on and off
};

Results run_rank(std::shared_ptr<gw::dist::Store> store, int rank) {
  auto pg = std::make_shared<gw::dist::ProcessGroupGloo>(store, rank, kRanks);
  Results r;
  // Two copies of the model, one plain and one in DDP, timed in alternating rounds so that a
  // busy moment of the machine hits both alike; the best round of each counts.
  auto big = mlp({784, 4096, 2560, 10}), big_copy = mlp({784, 4096, 2560, 10});
  gw::ddp::DistributedDataParallel big_ddp(big_copy, pg);
  Trainer local([&](const gw::Tensor& x) { return big->forward(x); }, big->parameters());
  Trainer ddp([&](const gw::Tensor& x) { return big_ddp.forward(x); }, big_copy->parameters());
  for (int warm = 0; warm < 2; ++warm) {
    local.step();
    ddp.step();
  }
  for (int round = 0; round < kBigRounds; ++round) {
    r.big_local = std::min(r.big_local, local.time(kBigSteps, *pg));
    r.big_ddp = std::min(r.big_ddp, ddp.time(kBigSteps, *pg));
  }
  auto small = mlp({784, 256, 128, 10});
  gw::ddp::DistributedDataParallel small_ddp(small, pg);
  Trainer mnist([&](const gw::Tensor& x) { return small_ddp.forward(x); }, small->parameters());
  mnist.step();
  mnist.step();
  r.mnist_step = mnist.time(kMnistSteps, *pg);
  // Tracing is the process's, so rank 0 turns it on and off between barriers: both ranks step
  // with it on, then both with it off. Nothing is written (cancel).
  // The medians of the rounds: on two cores, one slow round in a few is the rule.
  std::vector<double> on, off;
  for (int round = 0; round < kTraceRounds; ++round) {
    pg->barrier()->wait();
    if (rank == 0) gw::trace::start("bench_ddp.trace");
    on.push_back(mnist.time(kTraceSteps, *pg));
    pg->barrier()->wait();
    if (rank == 0) gw::trace::cancel();
    off.push_back(mnist.time(kTraceSteps, *pg));
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  r.traced = median(on);
  r.untraced = median(off);
  return r;
}

constexpr const char* kTraced = "Fashion-MNIST MLP DDP step, traced";

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
  const bool overhead = report.wants("ddp", "overhead per step, 13.7M-parameter MLP");
  const bool mnist = report.wants("ddp", "Fashion-MNIST MLP training, 2 ranks");
  const bool traced = report.wants("ddp", kTraced);
  if (!overhead && !mnist && !traced) return 0;
  // PyTorch anchors only the first two cases.
  auto torch = overhead || mnist ? gw::bench::run_capture("timeout -k 5 300 /usr/bin/python3 " +
                                                          gw::bench::executable_dir() +
                                                          "/torch_anchor_ddp.py 2>/dev/null")
                                 : std::nullopt;
  auto get = [&](const std::string& key) {
    return torch ? gw::bench::json_number(*torch, key) : std::nullopt;
  };

  auto store = std::make_shared<gw::dist::HashStore>();
  auto peer = std::async(std::launch::async, run_rank, store, 1);
  Results r = run_rank(store, 0);
  peer.get();

  if (overhead) {
    auto local = get("big_local_ms"), ddp = get("big_ddp_ms");
    const double ours = (r.big_ddp - r.big_local) * 1e3;
    if (!report.json())
      std::printf("ddp: 13.7M MLP step %.1f ms without DDP, %.1f ms with DDP\n",
                  r.big_local * 1e3, r.big_ddp * 1e3);
    if (local && ddp)
      report.add({"ddp", "overhead per step, 13.7M-parameter MLP", ours, "ms",
                  "pytorch ddp overhead", *ddp - *local});
    else
      report.skip("ddp", "overhead per step, 13.7M-parameter MLP", "the PyTorch anchor failed");
  }
  if (mnist) {
    auto theirs = get("mnist_samples_per_s");
    if (theirs)
      report.add({"ddp", "Fashion-MNIST MLP training, 2 ranks", kRanks * kBatch / r.mnist_step,
                  "samples/s", "pytorch ddp", *theirs});
    else
      report.skip("ddp", "Fashion-MNIST MLP training, 2 ranks", "the PyTorch anchor failed");
  }
  if (traced)
    report.add({"ddp", kTraced, r.traced * 1e3, "ms", "tracing off, same run", r.untraced * 1e3});
  return 0;
}
