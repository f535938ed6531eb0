// DistributedDataParallel: the cost DDP adds to a training step, and DDP training throughput,
// with two ranks as threads of this process over Gloo on 127.0.0.1, beside PyTorch 1.13's DDP
// over gloo on the same models in the same run (two processes, torch_anchor_ddp.py):
//   - DDP overhead per step of the 784-4096-2560-10 MLP (13.7M parameters), batch 32: the DDP
//     step minus the same step without DDP, both ranks stepping at once in both cases, in
//     alternating rounds (the best round of each);
//   - samples per second (both ranks) of DDP training of the Fashion-MNIST MLP 784-256-128-10
//     with batch 32 per rank (random data of the same shape: speed does not depend on values);
//   - that DDP step with a timeline being recorded (core/trace.h) beside the same step without,
//     in alternating rounds, the median of each (goal: at most 5% slower);
//   - the 13.7M-parameter MLP's DDP step with each compression hook — bf16, PowerSGD at rank 1
//     and 4, batched PowerSGD at rank 4 — beside the allreduce hook, in alternating rounds (the
//     best round of each), and the bytes each hands the network per step and rank (the
//     elements it allreduces times their size; PowerSGD's from its compression statistics);
//   - the 13.7M-parameter MLP's DDP step with Adam sharded by ZeroRedundancyOptimizer beside
//     plain Adam, in alternating rounds (the best of each), and the optimizer state each
//     rank holds;
//   - the Fashion-MNIST MLP with a head it does not use: the DDP step with static_graph beside
//     find_unused_parameters (a graph traversal and a used-map allreduce per step), in
//     alternating rounds, the median of each;
//   - a checkpoint of the 13.7M-parameter MLP and its Adam state (sharded by ZeRO): saved and
//     loaded by both ranks as a distributed checkpoint (each rank writes its file; each reads
//     its ranges) beside one file (the state consolidated on rank 0, which writes it with
//     gw::save_checkpoint; every rank reads it whole), in alternating rounds (the best of each),
//     on the local disk through the page cache;
//   - in a build with MPI, the first two again with the ranks as two processes under
//     `mpirun -np 2` (this program runs itself so): DDP over the MPI group (shared memory)
//     against PyTorch's overhead, and its throughput beside the Gloo group's between the same
//     two processes.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "bench/mpi_peers.h"
#include "core/checkpoint.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/trace.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/powersgd.h"
#include "dist/checkpoint/dist_checkpoint.h"
#include "dist/optim/zero_redundancy_optimizer.h"
#include "dist/process_group/process_group_gloo.h"
#include "dist/process_group/process_group_mpi.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "store/hash_store.h"

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

// The compression hooks' cases, the allreduce hook first (their anchor).
struct HookCase {
  const char* name;
  std::function<gw::ddp::CommHook(std::shared_ptr<gw::ddp::PowerSGDState>)> make;
  int64_t powersgd_rank = 0;  // 0: not PowerSGD
  size_t wire_bytes = 4;      // per element allreduced (PowerSGD: float32 P and Q)
};
const std::vector<HookCase>& hook_cases() {
  static const std::vector<HookCase> cases = {
      {"allreduce hook", [](auto) { return gw::ddp::hooks::allreduce(); }},
      {"bf16 hook", [](auto) { return gw::ddp::hooks::bf16_compress(); }, 0, 2},
      {"PowerSGD hook, rank 1", [](auto s) { return gw::ddp::hooks::powersgd(s); }, 1},
      {"PowerSGD hook, rank 4", [](auto s) { return gw::ddp::hooks::powersgd(s); }, 4},
      {"batched PowerSGD hook, rank 4", [](auto s) { return gw::ddp::hooks::batched_powersgd(s); },
       4},
  };
  return cases;
}

struct Results {
  double big_local = 1e30, big_ddp = 1e30, mnist_step = 0;
  double traced = 0, untraced = 0;  // the Fashion-MNIST step, tracing on and off
  std::vector<double> hook_step, hook_bytes;                                  // by hook_cases()
  double zero_step = 1e30, adam_step = 1e30, zero_state = 0, adam_state = 0;  // s, bytes
  double static_step = 0, find_unused_step = 0;                               // s, medians
  double dcp_save = 1e30, one_file_save = 1e30, dcp_load = 1e30, one_file_load = 1e30;  // s
  double checkpoint_bytes = 0;
};

// What a case runs on each rank.
struct Cases {
  bool hooks = false, zero = false, static_graph = false, checkpoint = false;
  std::string dir;  // for the checkpoints, shared by the ranks
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The overhead case: the 13.7M-parameter MLP's step without and with DDP over `pg`.
void time_big(const std::shared_ptr<gw::dist::ProcessGroup>& pg, Results& r) {
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
}

// The 13.7M-parameter MLP's DDP step through each compression hook, in alternating rounds.
void time_hooks(const std::shared_ptr<gw::dist::ProcessGroup>& pg, Results& r) {
  struct Run {
    std::shared_ptr<gw::nn::Sequential> model = mlp({784, 4096, 2560, 10});
    std::shared_ptr<gw::ddp::PowerSGDState> powersgd;
    std::shared_ptr<size_t> elements = std::make_shared<size_t>(0);  // allreduced, so far
    std::unique_ptr<gw::ddp::DistributedDataParallel> ddp;
    std::optional<Trainer<std::function<gw::Tensor(const gw::Tensor&)>>> trainer;
  };
  const auto& cases = hook_cases();
  std::vector<Run> runs(cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    Run& run = runs[k];
    run.ddp = std::make_unique<gw::ddp::DistributedDataParallel>(run.model, pg);
    if (cases[k].powersgd_rank > 0)
      run.powersgd = std::make_shared<gw::ddp::PowerSGDState>(gw::ddp::PowerSGDOptions{
          .matrix_approximation_rank = cases[k].powersgd_rank, .start_powerSGD_iter = 2});
    run.ddp->register_comm_hook([hook = cases[k].make(run.powersgd), elements = run.elements](
                                    gw::dist::ProcessGroup& group, gw::ddp::GradBucket& bucket) {
      *elements += static_cast<size_t>(bucket.buffer.numel());
      return hook(group, bucket);
    });
    run.trainer.emplace([ddp = run.ddp.get()](const gw::Tensor& x) { return ddp->forward(x); },
                        run.model->parameters());
    for (int warm = 0; warm < 3; ++warm) run.trainer->step();  // PowerSGD compresses from the 3rd
  }
  r.hook_step.assign(cases.size(), 1e30);
  r.hook_bytes.assign(cases.size(), 0);
  for (int round = 0; round < kBigRounds; ++round)
    for (size_t k = 0; k < cases.size(); ++k) {
      Run& run = runs[k];
      const size_t elements = *run.elements;
      const int64_t after = run.powersgd ? run.powersgd->compression_stats().numel_after : 0;
      r.hook_step[k] = std::min(r.hook_step[k], run.trainer->time(kBigSteps, *pg));
      r.hook_bytes[k] =
          run.powersgd
              ? static_cast<double>(run.powersgd->compression_stats().numel_after - after) * 4 /
                    kBigSteps
              : static_cast<double>((*run.elements - elements) * cases[k].wire_bytes) / kBigSteps;
    }
}

// The 13.7M-parameter MLP's DDP step with Adam, plain and sharded, in alternating rounds.
void time_zero(const std::shared_ptr<gw::dist::ProcessGroup>& pg, Results& r) {
  const gw::optim::AdamOptions adam{.lr = 1e-4};
  auto plain_model = mlp({784, 4096, 2560, 10}), zero_model = mlp({784, 4096, 2560, 10});
  gw::ddp::DistributedDataParallel plain_ddp(plain_model, pg), zero_ddp(zero_model, pg);
  gw::optim::Adam plain(plain_model->parameters(), adam);
  gw::dist::ZeroRedundancyOptimizer zero(zero_model->parameters(), adam, pg);
  gw::Generator gen(1);
  const gw::Tensor x = gw::randn({kBatch, 784}, gen), y = gw::randint(0, 10, {kBatch}, gen);
  auto step = [&](gw::ddp::DistributedDataParallel& ddp, auto& opt) {
    opt.zero_grad();
    gw::nn::functional::cross_entropy(ddp.forward(x), y).backward();
    opt.step();
  };
  auto time = [&](gw::ddp::DistributedDataParallel& ddp, auto& opt) {
    pg->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kBigSteps; ++i) step(ddp, opt);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
           kBigSteps;
  };
  for (int warm = 0; warm < 2; ++warm) {
    step(plain_ddp, plain);
    step(zero_ddp, zero);
  }
  for (int round = 0; round < kBigRounds; ++round) {
    r.adam_step = std::min(r.adam_step, time(plain_ddp, plain));
    r.zero_step = std::min(r.zero_step, time(zero_ddp, zero));
  }
  r.zero_state = static_cast<double>(zero.state_bytes());
  for (const auto& [key, t] : plain.state_dict())
    if (key != "lr") r.adam_state += static_cast<double>(t.nbytes());
}

// The Fashion-MNIST MLP's DDP training over `pg`: seconds per step, and with `traced`, the
// medians of the step with tracing on and off.
void time_mnist(const std::shared_ptr<gw::dist::ProcessGroup>& pg, int rank, bool traced,
                Results& r) {
  auto small = mlp({784, 256, 128, 10});
  gw::ddp::DistributedDataParallel small_ddp(small, pg);
  Trainer mnist([&](const gw::Tensor& x) { return small_ddp.forward(x); }, small->parameters());
  mnist.step();
  mnist.step();
  r.mnist_step = mnist.time(kMnistSteps, *pg);
  if (!traced) return;
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
  r.traced = median(on);
  r.untraced = median(off);
}

// The Fashion-MNIST MLP beside a head it never uses.
struct WithSpareHead : gw::nn::Module {
  std::shared_ptr<gw::nn::Sequential> body = mlp({784, 256, 128, 10});
  std::shared_ptr<gw::nn::Linear> spare = std::make_shared<gw::nn::Linear>(128, 10);
  WithSpareHead() {
    register_module("body", body);
    register_module("spare", spare);
  }
  gw::Tensor forward(const gw::Tensor& x) override { return body->forward(x); }
};

// Its DDP step with static_graph and with find_unused_parameters, in alternating rounds.
void time_static_graph(const std::shared_ptr<gw::dist::ProcessGroup>& pg, Results& r) {
  auto a = std::make_shared<WithSpareHead>(), b = std::make_shared<WithSpareHead>();
  gw::ddp::DistributedDataParallel unused(a, pg, {.find_unused_parameters = true}),
      fixed(b, pg, {.static_graph = true});
  Trainer find([&](const gw::Tensor& x) { return unused.forward(x); }, a->parameters());
  Trainer stat([&](const gw::Tensor& x) { return fixed.forward(x); }, b->parameters());
  for (int warm = 0; warm < 3; ++warm) {  // static_graph counts in its first
    find.step();
    stat.step();
  }
  std::vector<double> with_find, with_static;
  for (int round = 0; round < kTraceRounds; ++round) {
    with_find.push_back(find.time(kTraceSteps, *pg));
    with_static.push_back(stat.time(kTraceSteps, *pg));
  }
  r.find_unused_step = median(with_find);
  r.static_step = median(with_static);
}

// The 13.7M-parameter MLP's checkpoint with Adam sharded by ZeRO: saved and loaded as a
// distributed checkpoint and as one file, in alternating rounds.
void time_checkpoint(const std::shared_ptr<gw::dist::ProcessGroup>& pg, const std::string& dir,
                     Results& r) {
  namespace dcp = gw::dist::checkpoint;
  auto model = mlp({784, 4096, 2560, 10});
  gw::ddp::DistributedDataParallel ddp(model, pg);
  gw::dist::ZeroRedundancyOptimizer zero(model->parameters(), gw::optim::AdamOptions{.lr = 1e-4},
                                         pg);
  gw::Generator gen(1);
  const gw::Tensor x = gw::randn({kBatch, 784}, gen), y = gw::randint(0, 10, {kBatch}, gen);
  gw::nn::functional::cross_entropy(ddp.forward(x), y).backward();
  zero.step();  // Adam's state exists from here
  const std::string spread = dir + "/distributed", single = dir + "/one_file";
  const bool root = pg->rank() == 0;
  auto timed = [&](const std::function<void()>& f) {
    pg->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    f();
    pg->barrier()->wait();  // done when the last rank is
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto save_spread = [&] {
    dcp::ShardedState state = dcp::whole(model->state_dict(), "model.");
    state.merge(zero.sharded_state_dict("optim."));
    dcp::save(spread, state, *pg);
  };
  auto save_single = [&] {
    zero.consolidate_state_dict(0);
    if (root)
      gw::save_checkpoint(single, {.model = model->state_dict(),
                                   .optimizer = zero.state_dict(),
                                   .epoch = 0,
                                   .step = 0,
                                   .seed = 0,
                                   .extra = {}});
  };
  auto load_spread = [&] {
    const dcp::Reader ckpt(spread);
    dcp::load(ckpt, dcp::whole(model->state_dict(), "model."), *pg);
    zero.load_state_dict(ckpt, "optim.");
  };
  auto load_single = [&] {
    auto c = gw::load_checkpoint(single);
    model->load_state_dict(c->model);
    zero.load_state_dict(c->optimizer);
  };
  for (int round = 0; round < kBigRounds; ++round) {
    r.dcp_save = std::min(r.dcp_save, timed(save_spread));
    r.one_file_save = std::min(r.one_file_save, timed(save_single));
    r.dcp_load = std::min(r.dcp_load, timed(load_spread));
    r.one_file_load = std::min(r.one_file_load, timed(load_single));
  }
  if (root)
    r.checkpoint_bytes =
        static_cast<double>(std::filesystem::file_size(single + "/checkpoint.safetensors"));
}

Results run_rank(std::shared_ptr<gw::store::Store> store, int rank, const Cases& cases) {
  auto pg = std::make_shared<gw::dist::ProcessGroupGloo>(store, rank, kRanks);
  Results r;
  time_big(pg, r);
  time_mnist(pg, rank, /*traced=*/true, r);
  if (cases.hooks) time_hooks(pg, r);
  if (cases.zero) time_zero(pg, r);
  if (cases.static_graph) time_static_graph(pg, r);
  if (cases.checkpoint) time_checkpoint(pg, cases.dir, r);
  return r;
}

#ifdef GW_HAVE_MPI
// One of the two processes under mpirun: the cases over the MPI group, and the Fashion-MNIST
// one over the Gloo group between the same processes. Rank 0 prints one JSON line.
int run_under_mpi() {
  auto mpi = std::make_shared<gw::dist::ProcessGroupMPI>();
  const int rank = mpi->rank();
  Results r;
  time_big(mpi, r);
  time_mnist(mpi, rank, /*traced=*/false, r);
  Results over_gloo;
  time_mnist(gw::bench::gloo_beside(*mpi), rank, /*traced=*/false, over_gloo);
  if (rank == 0)
    std::printf(
        "{\"big_local_ms\": %.6g, \"big_ddp_ms\": %.6g, \"mnist_step_s\": %.6g, "
        "\"gloo_mnist_step_s\": %.6g}\n",
        r.big_local * 1e3, r.big_ddp * 1e3, r.mnist_step, over_gloo.mnist_step);
  return 0;
}
#endif

// The MPI cases: this program again under `mpirun -np 2`; its JSON line, or why it did not run.
std::optional<std::string> run_mpi_cases(std::string* why) {
#ifdef GW_HAVE_MPI
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    *why = "no mpirun (Debian: openmpi-bin)";
    return std::nullopt;
  }
  std::string command = "timeout -k 5 600";
  for (const auto& arg : gw::bench::mpirun_args(kRanks)) command += " " + arg;
  auto out = gw::bench::run_capture(command + " " + gw::bench::executable_dir() +
                                    "/bench_ddp --under-mpi 2>/dev/null");
  if (!out || out->find("big_ddp_ms") == std::string::npos) {
    *why = "mpirun -np 2 bench_ddp --under-mpi failed";
    return std::nullopt;
  }
  return out;
#else
  gw::dist::mpi_available(why);
  return std::nullopt;
#endif
}

constexpr const char* kMpiOverhead = "overhead per step, 13.7M-parameter MLP, MPI group";
constexpr const char* kMpiMnist = "Fashion-MNIST MLP training, 2 ranks, MPI group";

constexpr const char* kTraced = "Fashion-MNIST MLP DDP step, traced";
constexpr const char* kZeroStep = "13.7M MLP step, Adam sharded by ZeroRedundancyOptimizer";
constexpr const char* kZeroState = "13.7M MLP, Adam state per rank with ZeroRedundancyOptimizer";
constexpr const char* kStaticGraph =
    "Fashion-MNIST MLP with an unused head, step with static_graph";
constexpr const char* kCheckpointSave = "13.7M MLP + Adam (ZeRO) checkpoint save, distributed";
constexpr const char* kCheckpointLoad = "13.7M MLP + Adam (ZeRO) checkpoint load, distributed";

}  // namespace

int main(int argc, char** argv) {
#ifdef GW_HAVE_MPI
  if (argc == 2 && std::string(argv[1]) == "--under-mpi") return run_under_mpi();
#endif
  gw::bench::Reporter report(argc, argv);
  const bool overhead = report.wants("ddp", "overhead per step, 13.7M-parameter MLP");
  const bool mnist = report.wants("ddp", "Fashion-MNIST MLP training, 2 ranks");
  const bool traced = report.wants("ddp", kTraced);
  const bool mpi_overhead = report.wants("ddp", kMpiOverhead);
  const bool mpi_mnist = report.wants("ddp", kMpiMnist);
  Cases cases;
  for (const HookCase& h : hook_cases())
    cases.hooks = cases.hooks || report.wants("ddp", std::string("13.7M MLP step, ") + h.name);
  cases.zero = report.wants("ddp", kZeroStep) || report.wants("ddp", kZeroState);
  cases.static_graph = report.wants("ddp", kStaticGraph);
  cases.checkpoint = report.wants("ddp", kCheckpointSave) || report.wants("ddp", kCheckpointLoad);
  if (!overhead && !mnist && !traced && !mpi_overhead && !mpi_mnist && !cases.hooks &&
      !cases.zero && !cases.static_graph && !cases.checkpoint)
    return 0;
  if (cases.checkpoint) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "bench_ddp_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("bench_ddp: mkdtemp");
      return 1;
    }
    cases.dir = tmpl;
  }
  // PyTorch anchors the overheads and the Gloo throughput.
  auto torch =
      overhead || mnist || mpi_overhead
          ? gw::bench::run_capture("timeout -k 5 300 /usr/bin/python3 " +
                                   gw::bench::executable_dir() + "/torch_anchor_ddp.py 2>/dev/null")
          : std::nullopt;
  auto get = [&](const std::string& key) {
    return torch ? gw::bench::json_number(*torch, key) : std::nullopt;
  };
  const std::string blas = torch ? gw::bench::blas_note(*torch) : "";

  auto store = std::make_shared<gw::store::HashStore>();
  auto peer = std::async(std::launch::async, run_rank, store, 1, cases);
  Results r = run_rank(store, 0, cases);
  peer.get();
  if (!cases.dir.empty()) std::filesystem::remove_all(cases.dir);

  if (overhead) {
    auto local = get("big_local_ms"), ddp = get("big_ddp_ms");
    const double ours = (r.big_ddp - r.big_local) * 1e3;
    if (!report.json())
      std::printf("ddp: 13.7M MLP step %.1f ms without DDP, %.1f ms with DDP\n",
                  r.big_local * 1e3, r.big_ddp * 1e3);
    if (local && ddp)
      report.add({"ddp", "overhead per step, 13.7M-parameter MLP", ours, "ms",
                  "pytorch ddp overhead", *ddp - *local, blas});
    else
      report.skip("ddp", "overhead per step, 13.7M-parameter MLP", "the PyTorch anchor failed");
  }
  if (mnist) {
    auto theirs = get("mnist_samples_per_s");
    if (theirs)
      report.add({"ddp", "Fashion-MNIST MLP training, 2 ranks", kRanks * kBatch / r.mnist_step,
                  "samples/s", "pytorch ddp", *theirs, blas});
    else
      report.skip("ddp", "Fashion-MNIST MLP training, 2 ranks", "the PyTorch anchor failed");
  }
  if (traced)
    report.add({"ddp", kTraced, r.traced * 1e3, "ms", "tracing off, same run", r.untraced * 1e3});
  if (cases.hooks) {
    const auto& hooks = hook_cases();
    for (size_t k = 1; k < hooks.size(); ++k) {
      const std::string name = std::string("13.7M MLP step, ") + hooks[k].name;
      report.add({"ddp", name, r.hook_step[k] * 1e3, "ms", "allreduce hook, same run",
                  r.hook_step[0] * 1e3});
      report.add({"ddp", name + ": bytes per step and rank", r.hook_bytes[k] / (1 << 20), "MiB",
                  "allreduce hook", r.hook_bytes[0] / (1 << 20)});
    }
  }

  if (cases.static_graph)
    report.add({"ddp", kStaticGraph, r.static_step * 1e3, "ms", "find_unused_parameters, same run",
                r.find_unused_step * 1e3});
  if (cases.checkpoint) {
    if (!report.json())
      std::printf("ddp: checkpoint of %.1f MiB\n", r.checkpoint_bytes / (1 << 20));
    report.add({"ddp", kCheckpointSave, r.dcp_save * 1e3, "ms",
                "consolidated on rank 0, one file (save_checkpoint)", r.one_file_save * 1e3});
    report.add({"ddp", kCheckpointLoad, r.dcp_load * 1e3, "ms",
                "one file, read whole by every rank (load_checkpoint)", r.one_file_load * 1e3});
  }
  if (cases.zero) {
    report.add(
        {"ddp", kZeroStep, r.zero_step * 1e3, "ms", "plain Adam, same run", r.adam_step * 1e3});
    report.add({"ddp", kZeroState, r.zero_state / (1 << 20), "MiB", "plain Adam",
                r.adam_state / (1 << 20)});
  }
  if (mpi_overhead || mpi_mnist) {
    std::string why;
    auto mpi = run_mpi_cases(&why);
    auto value = [&](const char* key) {
      return mpi ? gw::bench::json_number(*mpi, key) : std::nullopt;
    };
    auto local = get("big_local_ms"), ddp = get("big_ddp_ms");
    auto mpi_local = value("big_local_ms"), mpi_ddp = value("big_ddp_ms");
    if (mpi_overhead && !mpi) report.skip("ddp", kMpiOverhead, why);
    if (mpi_overhead && mpi_local && mpi_ddp) {
      if (local && ddp)
        report.add({"ddp", kMpiOverhead, *mpi_ddp - *mpi_local, "ms", "pytorch ddp overhead (gloo)",
                    *ddp - *local, blas});
      else
        report.skip("ddp", kMpiOverhead, "the PyTorch anchor failed");
    }
    auto step = value("mnist_step_s"), gloo_step = value("gloo_mnist_step_s");
    if (mpi_mnist && !mpi) report.skip("ddp", kMpiMnist, why);
    if (mpi_mnist && step && gloo_step)
      report.add({"ddp", kMpiMnist, kRanks * kBatch / *step, "samples/s",
                  "gradwire gloo group, same processes", kRanks * kBatch / *gloo_step});
  }
  return 0;
}
