// Memory per rank of a 50M-parameter GPT trained on 4 ranks three ways, from the CPU allocator's
// counters (gw::memory_stats): DDP (a whole replica, gradients and AdamW state on every rank),
// ZeRO-1 (DDP with AdamW's state sharded by ZeroRedundancyOptimizer) and fully_shard (everything
// sharded). Each is set beside what it must hold at its peak (P parameters, 4 B each):
//   DDP    16 B x P: weights, gradients and AdamW's two moments (the optimizer step, after the
//          activations are gone); 20 B x P where DDP's buckets hold a second copy of the
//          gradients (a group that does not reduce them in place: ProcessGroup::coalesces_in_place)
//   ZeRO-1 8 B x P + 8 B x P / ranks, likewise (12 B x P + ... with the buckets)
//   FSDP   16 B x P / ranks + two gathered blocks + the root gathered + A (backward's start)
// with A the activations one rank's forward keeps for backward, measured separately on the
// unsharded model.
// The step time of each is reported against DDP's in the same run (FSDP's extra all-gather is
// expected to cost time on 2 cores). Then FSDP with the blocks' activations recomputed in
// backward (GPTOptions::checkpoint_activations), its peak and step against FSDP's; then HSDP
// (2 replicas of 2 shards: 16 B x P / 2 per rank), its peak against its model and its step
// against FSDP over the 4 ranks; and HSDP's gradient accumulation over 4 micro-batches with the
// sum over the replicas at the last only (set_requires_all_reduce) against one at each.
//
// Started as a plain program it runs itself under `mpirun -np 4`; the ranks train over a Gloo
// group (the MPI group only starts them); rank 0 reports.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "bench/mpi_peers.h"
#include "core/memory.h"
#include "core/ops.h"
#include "ddp/distributed_data_parallel.h"
#include "dist/optim/zero_redundancy_optimizer.h"
#include "dist/process_group/process_group_mpi.h"
#include "fsdp/fully_shard.h"
#include "nn/functional.h"
#include "nn/transformer.h"
#include "optim/adamw.h"
#include "store/launch_env.h"
#include "store/prefix_store.h"

namespace {

constexpr int kRanks = 4;
constexpr int kSteps = 3;
constexpr double kMiB = 1024.0 * 1024.0;
// 16 blocks of width 512: 50.4M parameters.
const gw::nn::GPTOptions kModel{
    .vocab_size = 65, .context = 64, .layers = 16, .heads = 8, .width = 512};
constexpr int64_t kBatch = 2;  // sequences per rank
constexpr int kMicro = 4;      // micro-batches a step, in the gradient accumulation rows

std::shared_ptr<gw::nn::GPT> make_model(bool checkpoint_activations = false) {
  gw::Generator gen(0);
  gw::nn::GPTOptions options = kModel;
  options.checkpoint_activations = checkpoint_activations;
  return std::make_shared<gw::nn::GPT>(options, gen);
}

std::pair<gw::Tensor, gw::Tensor> batch(int rank, int step) {
  gw::Generator gen(100 + static_cast<uint64_t>(step * kRanks + rank));
  gw::Tensor t = gw::randint(0, kModel.vocab_size, {kBatch, kModel.context + 1}, gen);
  return {t.narrow(1, 0, kModel.context).contiguous(), t.narrow(1, 1, kModel.context).contiguous()};
}

struct Measured {
  double peak_mib = 0;
  double step_s = 1e30;  // the best step after the first
};

// kSteps AdamW steps of `forward_loss` + `step`, each over `micro` micro-batches (gradient
// accumulation) with before_micro(last micro-batch?) before each; the peak from just before the
// first.
template <typename Loss, typename Step>
Measured train(int rank, Loss forward_loss, Step step, int micro = 1,
               const std::function<void(bool)>& before_micro = nullptr) {
  gw::reset_peak_memory_stats(gw::kCPU);
  Measured m;
  for (int s = 0; s < kSteps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < micro; ++i) {
      auto [x, y] = batch(rank, s * micro + i);
      if (before_micro) before_micro(i + 1 == micro);
      forward_loss(x, y).backward();
    }
    step();
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 0) m.step_s = std::min(m.step_s, took);
  }
  m.peak_mib = static_cast<double>(gw::memory_stats(gw::kCPU).peak_allocated_bytes) / kMiB;
  return m;
}

// The activations one rank's forward keeps for backward: its peak over the bytes held before.
double activations_mib(int rank, bool checkpoint_activations = false) {
  auto model = make_model(checkpoint_activations);
  auto [x, y] = batch(rank, 0);
  const size_t before = gw::memory_stats(gw::kCPU).allocated_bytes;
  gw::reset_peak_memory_stats(gw::kCPU);
  gw::Tensor loss = model->loss(x, y);
  const size_t peak = gw::memory_stats(gw::kCPU).peak_allocated_bytes;
  return static_cast<double>(peak - before) / kMiB;
}

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
  const std::string what = "GPT 50M, 4 ranks";
  if (!report.wants("fsdp", what)) return 0;
  if (gw::store::detect_launch_env().launcher != "openmpi") {
    gw::bench::run_under_mpirun("bench_fsdp", kRanks, argc, argv);
    report.skip("fsdp", what, "no mpirun (Debian: openmpi-bin)");
    return 0;
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  {
    gw::dist::ProcessGroupMPI mpi;
    const std::shared_ptr<gw::store::Store> store = gw::bench::store_beside(mpi);
    std::shared_ptr<gw::dist::ProcessGroup> pg =
        std::make_shared<gw::dist::ProcessGroupGloo>(store, rank, kRanks);
    // HSDP's: 2 replicas (ranks 0, 1 and 2, 3) of 2 shards each.
    auto pair = [&](const std::string& name, int index, int place) {
      return std::make_shared<gw::dist::ProcessGroupGloo>(
          std::make_shared<gw::store::PrefixStore>(name + std::to_string(index), store), place, 2,
          gw::dist::GlooOptions{.group_name = name});
    };
    const std::shared_ptr<gw::dist::ProcessGroup> shard = pair("shard", rank / 2, rank % 2),
                                                  replicate = pair("replicate", rank % 2, rank / 2);
    const gw::optim::AdamWOptions adamw{.lr = 1e-4};

    int64_t params = 0, block_params = 0, root_params = 0;
    {
      auto model = make_model();
      for (const auto& p : model->parameters()) params += p.numel();
      for (const auto& p : model->h->children()[0]->parameters()) block_params += p.numel();
      root_params = params - block_params * kModel.layers;
    }
    const double p_mib = static_cast<double>(params) * 4 / kMiB;
    const double act = activations_mib(rank), act_recomputing = activations_mib(rank, true);

    // DDP with `Optimizer` over its parameters: the plain one, or ZeRO's.
    auto with_ddp = [&]<typename Optimizer>(auto&&... optimizer_args) {
      auto model = make_model();
      gw::ddp::DistributedDataParallel ddp(model, pg);
      Optimizer opt(model->parameters(), optimizer_args...);
      return train(
          rank,
          [&](const gw::Tensor& x, const gw::Tensor& y) {
            gw::Tensor logits = ddp.forward(x);
            return gw::nn::functional::cross_entropy(logits.reshape({-1, kModel.vocab_size}),
                                                     y.reshape({-1}));
          },
          [&] {
            opt.step();
            opt.zero_grad();
          });
    };
    const Measured ddp_m = with_ddp.operator()<gw::optim::AdamW>(adamw);
    const Measured zero_m = with_ddp.operator()<gw::dist::ZeroRedundancyOptimizer>(
        gw::optim::OptimizerOptions(adamw), pg);
    // micro > 1 (HSDP): that many micro-batches a step, summed over the replicas at each
    // (every_micro) or at the last only (set_requires_all_reduce).
    auto with_fsdp = [&](bool checkpoint_activations, bool hybrid = false, int micro = 1,
                         bool every_micro = true) {
      auto model = make_model(checkpoint_activations);
      const auto& group = hybrid ? shard : pg;
      const gw::fsdp::FullyShardOptions options{.replicate_group = hybrid ? replicate : nullptr};
      for (const auto& block : model->h->children()) gw::fsdp::fully_shard(block, group, options);
      auto root = gw::fsdp::fully_shard(model, group, options);
      gw::optim::AdamW opt(model->parameters(), adamw);
      return train(
          rank, [&](const gw::Tensor& x, const gw::Tensor& y) { return model->loss(x, y); },
          [&] {
            opt.step();
            opt.zero_grad();
          },
          micro, [&](bool last) { root->set_requires_all_reduce(every_micro || last); });
    };
    const Measured fsdp_m = with_fsdp(false), recomputing_m = with_fsdp(true),
                   hybrid_m = with_fsdp(false, true);
    const Measured accumulating_every_m = with_fsdp(false, true, kMicro, true),
                   accumulating_last_m = with_fsdp(false, true, kMicro, false);
    // Every rank's peak: the largest is what a machine must hold.
    auto largest = [&](double v) {
      gw::Tensor t = gw::full({1}, v, gw::kFloat64);
      pg->allreduce(t, {.op = gw::dist::ReduceOp::MAX})->wait();
      return t.item<double>();
    };
    const double ddp_peak = largest(ddp_m.peak_mib), zero_peak = largest(zero_m.peak_mib),
                 fsdp_peak = largest(fsdp_m.peak_mib),
                 recomputing_peak = largest(recomputing_m.peak_mib),
                 hybrid_peak = largest(hybrid_m.peak_mib);
    if (rank == 0) {
      const double unit = static_cast<double>(block_params) * 4 / kMiB;
      const double root = static_cast<double>(root_params) * 4 / kMiB;
      const int buckets = pg->coalesces_in_place() ? 0 : 1;  // a copy of the gradients, or none
      const double ddp_model = (4 + buckets) * p_mib;
      const double zero_model = (2 + buckets) * p_mib + 2 * p_mib / kRanks;
      const double fsdp_model = 4 * p_mib / kRanks + 2 * unit + root + act;
      const std::string note =
          gw::detail::str(params / 1000000.0, "M parameters (", p_mib,
                          " MiB of weights), activations ", act, " MiB, a block ", unit, " MiB");
      report.add({"fsdp", what + ": peak memory per rank, DDP", ddp_peak, "MiB",
                  buckets ? "model: 20 B x P" : "model: 16 B x P", ddp_model, note});
      report.add(
          {"fsdp", what + ": peak memory per rank, ZeRO-1", zero_peak, "MiB",
           buckets ? "model: 12 B x P + 8 B x P / ranks" : "model: 8 B x P + 8 B x P / ranks",
           zero_model, note});
      report.add({"fsdp", what + ": peak memory per rank, FSDP", fsdp_peak, "MiB",
                  "model: 16 B x P / ranks + 2 blocks + root + activations", fsdp_model, note});
      report.add(
          {"fsdp", what + ": peak memory per rank, FSDP", fsdp_peak, "MiB", "DDP", ddp_peak});
      report.add({"fsdp", what + ": step, ZeRO-1", zero_m.step_s, "s", "DDP", ddp_m.step_s});
      report.add({"fsdp", what + ": step, FSDP", fsdp_m.step_s, "s", "DDP", ddp_m.step_s});
      const std::string recomputing = " + activation checkpointing";
      report.add({"fsdp", what + ": peak memory per rank, FSDP" + recomputing, recomputing_peak,
                  "MiB", "FSDP", fsdp_peak,
                  gw::detail::str("each block's activations recomputed in backward: the forward "
                                  "keeps ",
                                  act_recomputing, " MiB instead of ", act, " MiB")});
      report.add({"fsdp", what + ": step, FSDP" + recomputing, recomputing_m.step_s, "s", "FSDP",
                  fsdp_m.step_s});
      const std::string hybrid = ": HSDP, 2 replicas of 2 shards";
      const double hybrid_model = 4 * p_mib / (kRanks / 2) + 2 * unit + root + act;
      report.add({"fsdp", what + hybrid + ", peak memory per rank", hybrid_peak, "MiB",
                  "model: 16 B x P / 2 + 2 blocks + root + activations", hybrid_model, note});
      report.add({"fsdp", what + hybrid + ", step", hybrid_m.step_s, "s", "FSDP over 4",
                  fsdp_m.step_s,
                  "the gathers between 2 ranks, the gradients summed over the "
                  "replicas at the end of backward"});
      report.add({"fsdp",
                  what + hybrid + ", step of " + std::to_string(kMicro) +
                      " micro-batches, summed over the replicas at the last",
                  accumulating_last_m.step_s, "s", "summed at each micro-batch",
                  accumulating_every_m.step_s,
                  "set_requires_all_reduce(false) but for the last micro-batch: each micro-batch "
                  "reduce-scattered within its replica, one allreduce of the rows a step"});
    }
    pg->barrier()->wait();
  }
  MPI_Finalize();
  return 0;
}
