// The bubble of each pipeline schedule, measured: 4 ranks (processes under mpirun, over Gloo
// on 127.0.0.1; threads where there is no MPI) whose compute is replaced by calibrated sleeps,
// each rank's timer slack cut to 1 ns, so that 4 ranks on 2 cores measure the
// schedule, not the CPU: a forward sleeps 20 ms, a backward 40 ms, its halves under zero bubble
// (I and W) 20 ms each; with two stages per rank (interleaved) each stage is half as long. Each
// rank's idle fraction (1 - time in forwards and backwards / the step's wall time,
// Schedule::last_step) is set beside the theory for uniform stages, (p - 1) / (m + p - 1) for
// GPipe and 1F1B and (p - 1) / (v m + p - 1) interleaved; zero bubble is set beside 1F1B's
// measured idle at the same micro-batches. The largest over the ranks is reported, the median
// of 5 steps. Also the
// micro-batches rank 0 holds at once: m under GPipe, p under 1F1B.
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>

#include "autograd/autograd.h"
#include "bench/harness.h"
#include "core/memory.h"
#include "core/ops.h"
#include "dist/process_group/process_group_gloo.h"
#include "nn/container.h"
#include "nn/module.h"
#include "nn/transformer.h"
#include "pipeline/schedule.h"
#include "store/hash_store.h"
#include "store/launch_env.h"

#ifdef GW_HAVE_MPI
#include <mpi.h>

#include "bench/mpi_peers.h"
#include "dist/process_group/process_group_mpi.h"
#endif

namespace {

using std::chrono::milliseconds;
constexpr int kStages = 4;
constexpr milliseconds kForward{20}, kBackward{40};

// A stage whose forward and backward sleep instead of computing (`scale`: its share of a
// rank's work); it holds one parameter so that it has a gradient to make. Counts the
// micro-batches whose activations a rank holds at once, from F to B or I (`held` is shared by
// the rank's stages).
struct Sleeper : gw::nn::Module {
  gw::Tensor w;
  double scale;
  std::shared_ptr<int> held, most_held;
  Sleeper(double scale, std::shared_ptr<int> held, std::shared_ptr<int> most)
      : Module("Sleeper"), scale(scale), held(std::move(held)), most_held(std::move(most)) {
    w = register_parameter("w", gw::ones({1}));
  }
  void sleep(milliseconds t) const {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(t.count() * scale));
  }
  // y = x * w, whose backward sleeps a whole backward in B and half of one in I (x's gradient)
  // and in W (w's); the first stage, with no input gradient to make, sleeps a whole backward in
  // its W, so that every stage's backward is as long.
  class Backward final : public gw::autograd::Node {
   public:
    Backward(const Sleeper& owner, const gw::Tensor& x, const gw::Tensor& w)
        : owner_(owner), x_(x.detach()), w_(w.detach()) {}
    gw::autograd::TensorList apply(gw::autograd::TensorList&& grads) override {
      const bool dx = gw::autograd::wants(*this, 0), dw = gw::autograd::wants(*this, 1);
      const gw::pipeline::Action* a = gw::pipeline::current_action();
      const bool whole = !a || a->type == gw::pipeline::ActionType::Backward ||
                         (a->type == gw::pipeline::ActionType::BackwardWeight && a->stage == 0);
      owner_.sleep(whole ? kBackward : kBackward / 2);
      // The activations go with B or I; the first stage's I does nothing, so with its W.
      if (!a || a->type != gw::pipeline::ActionType::BackwardWeight || a->stage == 0)
        --*owner_.held;
      return {dx ? grads[0] * w_ : gw::Tensor(),
              dw ? (grads[0] * x_).sum().reshape({1}) : gw::Tensor()};
    }
    std::string name() const override { return "SleeperBackward"; }

   private:
    const Sleeper& owner_;
    gw::Tensor x_, w_;
  };
  gw::Tensor forward(const gw::Tensor& x) override {
    gw::Tensor y;
    {
      gw::autograd::NoGradGuard no_grad;
      y = x * w;
    }
    if (!gw::autograd::is_grad_enabled()) return y;  // the shape check before the first step
    sleep(kForward);
    *most_held = std::max(*most_held, ++*held);
    auto node = std::make_shared<Backward>(*this, x, w);
    node->next_edges = gw::autograd::collect_edges({&x, &w});
    gw::autograd::set_history(y, node);
    return y;
  }
};

struct Measured {
  double idle = 0;  // the largest rank's idle fraction, median step
  int stage0_held = 0;
};

// One rank's part: its stages of `plan` over `pg` (kStages ranks), 5 steps. Every rank returns
// the largest idle fraction over the ranks (median step) and its own most held micro-batches.
Measured measure_rank(const gw::pipeline::Plan& plan,
                      const std::shared_ptr<gw::dist::ProcessGroup>& pg) {
  prctl(PR_SET_TIMERSLACK, 1UL);  // the sleeps stand for compute: no 50 us of slack each
  const int r = pg->rank();
  const int stages = gw::pipeline::stages_of(plan), per_rank = stages / kStages;
  int microbatches = 0;
  for (const auto& a : plan[0]) microbatches = std::max(microbatches, a.microbatch + 1);
  auto held = std::make_shared<int>(0), most = std::make_shared<int>(0);
  std::vector<std::shared_ptr<gw::pipeline::PipelineStage>> mine;
  for (int st = r; st < stages; st += kStages)
    mine.push_back(std::make_shared<gw::pipeline::PipelineStage>(
        std::make_shared<Sleeper>(1.0 / per_rank, held, most), st, stages, pg));
  gw::pipeline::Schedule s(mine, plan,
                           [](const gw::Tensor& y, const gw::Tensor&) { return y.sum(); });
  const gw::Tensor x = gw::ones({microbatches, 4});
  std::vector<double> idles;
  for (int step = 0; step < 5; ++step) {
    pg->barrier()->wait();
    s.step(x, x);
    // The largest idle fraction over the ranks, this step.
    gw::Tensor idle = gw::full({1}, s.last_step().idle_fraction(), gw::kFloat64);
    pg->allreduce(idle, {.op = gw::dist::ReduceOp::MAX})->wait();
    idles.push_back(idle.item<double>());
  }
  std::sort(idles.begin(), idles.end());
  return {idles[idles.size() / 2], *most};  // the median step
}

// The ranks: kStages processes under mpirun (`world`, a Gloo group between them), or, without
// MPI, kStages threads of this process.
Measured measure(const gw::pipeline::Plan& plan,
                 const std::shared_ptr<gw::dist::ProcessGroup>& world) {
  if (world) return measure_rank(plan, world);
  auto store = std::make_shared<gw::store::HashStore>();
  std::vector<std::future<Measured>> ranks;
  for (int r = 0; r < kStages; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      return measure_rank(plan, std::make_shared<gw::dist::ProcessGroupGloo>(store, r, kStages));
    }));
  Measured rank0;
  for (int r = 0; r < kStages; ++r) {
    Measured got = ranks[r].get();
    if (r == 0) rank0 = got;
  }
  return rank0;
}

// Zero bubble's split backward on real compute, one thread: 4 GPT blocks (width 256, 4 heads,
// 8 x 128 tokens), float32. I + W must cost what one backward does (nothing computed twice),
// and between them only what W needs stays: the blocks' matrix inputs and output gradients.
void split_backward(gw::bench::Reporter& report) {
  const std::string time_row = "4 GPT blocks, I + W: time",
                    memory_row = "4 GPT blocks, kept from I to W";
  if (!report.wants("pipeline", time_row) && !report.wants("pipeline", memory_row)) return;
  gw::Generator gen(1);
  gw::nn::Sequential blocks;
  for (int i = 0; i < 4; ++i)
    blocks.push_back(std::make_shared<gw::nn::GPTBlock>(256, 4, gw::nn::GPTBlockOptions{}, gen));
  const gw::Tensor x0 = gw::randn({8, 128, 256}, gen);
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::vector<double> whole, split;
  size_t activations = 0, kept = 0;
  for (int rep = 0; rep < 7; ++rep) {
    for (int how = 0; how < 2; ++how) {  // alternating, so that both see the same machine
      gw::Tensor x = x0.clone().requires_grad_();
      const size_t before = gw::memory_stats().allocated_bytes;
      gw::Tensor y = blocks(x).sum();
      const size_t after_forward = gw::memory_stats().allocated_bytes;
      const auto t0 = Clock::now();
      if (how == 0) {
        y.backward();
        whole.push_back(seconds(t0));
      } else {
        gw::autograd::WeightGradients rest;
        gw::Tensor dx = gw::autograd::backward_input({y}, {x}, {}, rest)[0];
        y = gw::Tensor();
        activations = after_forward - before;
        kept = gw::memory_stats().allocated_bytes - before - dx.nbytes();
        rest.run();
        split.push_back(seconds(t0));
      }
      blocks.zero_grad();
    }
  }
  std::sort(whole.begin(), whole.end());
  std::sort(split.begin(), split.end());
  report.add({"pipeline", time_row, split[split.size() / 2] * 1e3, "ms", "B (one backward)",
              whole[whole.size() / 2] * 1e3, "median of 7, 1 thread, float32"});
  report.add({"pipeline", memory_row, static_cast<double>(kept) / (1 << 20), "MiB",
              "activations after F", static_cast<double>(activations) / (1 << 20),
              "CPU allocator's bytes in use"});
}

// The schedules' rows, on every rank of `world` (null: threads); rank 0 reports.
void bubbles(gw::bench::Reporter& report, const std::shared_ptr<gw::dist::ProcessGroup>& world) {
  const bool reports = !world || world->rank() == 0;
  for (int m : {4, 8, 16}) {
    auto name = [&](const std::string& schedule) {
      return gw::detail::str(schedule, ", ", kStages, " ranks, ", m, " micro-batches: idle");
    };
    auto held = [&](const Measured& got) {
      return gw::detail::str(world ? "processes" : "threads", "; rank 0 held ", got.stage0_held,
                             " micro-batches at once");
    };
    // GPipe, 1F1B and interleaved against the theory for uniform stages.
    double one_f_one_b = -1;
    for (const std::string schedule : {"gpipe", "1f1b", "interleaved"}) {
      const bool zb_wanted = report.wants("pipeline", name("zb"));
      if (!report.wants("pipeline", name(schedule)) && !(schedule == "1f1b" && zb_wanted)) continue;
      const Measured got = measure(gw::pipeline::make_plan(schedule, kStages, m), world);
      if (schedule == "1f1b") one_f_one_b = got.idle;
      if (!report.wants("pipeline", name(schedule)) || !reports) continue;
      const int v = schedule == "interleaved" ? 2 : 1;
      const double theory = static_cast<double>(kStages - 1) / (v * m + kStages - 1);
      report.add({"pipeline", name(schedule), got.idle * 100, "% idle",
                  v == 1 ? "theory (p-1)/(m+p-1)" : "theory (p-1)/(vm+p-1)", theory * 100,
                  held(got)});
    }
    // Zero bubble against 1F1B, measured in the same run at the same micro-batches.
    if (report.wants("pipeline", name("zb")) && one_f_one_b >= 0) {
      const Measured got = measure(gw::pipeline::zero_bubble(kStages, m), world);
      if (reports)
        report.add({"pipeline", name("zb"), got.idle * 100, "% idle", "1f1b, measured",
                    one_f_one_b * 100, held(got)});
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
#ifdef GW_HAVE_MPI
  // Four processes, as a pipeline runs: the program runs itself under mpirun -np 4, whose
  // ranks talk over a Gloo group (MPI only starts them: its waits spin, and would take the
  // cores the sleeping stages leave).
  if (gw::store::detect_launch_env().launcher != "openmpi") {
    std::fflush(stdout);
    gw::bench::run_under_mpirun("bench_pipeline", kStages, argc, argv);
    std::fprintf(stderr, "bench_pipeline: no mpirun (Debian: openmpi-bin): ranks as threads\n");
  } else {
    int provided = 0, size = 0, rank = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (size != kStages) {  // started by hand under an mpirun of another size
      if (rank == 0)
        std::fprintf(stderr, "bench_pipeline: needs %d ranks, mpirun started %d\n", kStages, size);
      MPI_Finalize();
      return 1;
    }
    {
      gw::dist::ProcessGroupMPI mpi;
      std::shared_ptr<gw::dist::ProcessGroup> world = gw::bench::gloo_beside(mpi);
      if (world->rank() == 0) split_backward(report);
      world->barrier()->wait();
      bubbles(report, world);
      world->barrier()->wait();
    }
    MPI_Finalize();
    return 0;
  }
#endif
  split_backward(report);
  bubbles(report, nullptr);
  return 0;
}
