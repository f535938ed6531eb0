// The bubble of each pipeline schedule, measured: 4 stages (ranks as threads over Gloo on
// 127.0.0.1) whose compute is replaced by calibrated sleeps (a forward sleeps 20 ms, its
// backward 40 ms), so that 4 ranks on 2 cores measure the schedule, not the CPU. Each stage's
// idle fraction (1 - time in forwards and backwards / the step's wall time, Schedule::
// last_step) is set beside the theory for uniform stages, (p - 1) / (m + p - 1) for GPipe and
// 1F1B; the largest over the stages is reported (stage 0, which waits longest). Also the
// activations stage 0 holds at once: m micro-batches under GPipe, p under 1F1B.
#include <chrono>
#include <future>
#include <thread>

#include "autograd/autograd.h"
#include "bench/harness.h"
#include "core/ops.h"
#include "dist/process_group/process_group_gloo.h"
#include "nn/module.h"
#include "pipeline/schedule.h"
#include "store/hash_store.h"

namespace {

using std::chrono::milliseconds;
constexpr int kStages = 4;
constexpr milliseconds kForward{20}, kBackward{40};

// A stage whose forward sleeps kForward and whose backward sleeps kBackward; it holds one
// parameter so that it has a gradient to make. Counts the micro-batches it holds at once.
struct Sleeper : gw::nn::Module {
  gw::Tensor w;
  int held = 0, most_held = 0;
  Sleeper() : Module("Sleeper") { w = register_parameter("w", gw::ones({1})); }
  gw::Tensor forward(const gw::Tensor& x) override {
    std::this_thread::sleep_for(kForward);
    gw::Tensor y = x * w;
    if (!y.requires_grad()) return y;  // the shape check before the first step
    most_held = std::max(most_held, ++held);
    gw::autograd::Edge edge = gw::autograd::gradient_edge(y);
    edge.fn->pre_hooks.emplace_back(edge.input_nr, [this](const gw::Tensor&) {
      std::this_thread::sleep_for(kBackward);
      --held;
      return gw::Tensor();
    });
    return y;
  }
};

struct Measured {
  double idle = 0;  // the largest stage's idle fraction, best step
  int stage0_held = 0;
};

Measured measure(const std::string& schedule, int microbatches) {
  auto store = std::make_shared<gw::store::HashStore>();
  std::vector<std::future<std::pair<double, int>>> ranks;
  for (int r = 0; r < kStages; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto pg = std::make_shared<gw::dist::ProcessGroupGloo>(store, r, kStages);
      auto module = std::make_shared<Sleeper>();
      auto stage = std::make_shared<gw::pipeline::PipelineStage>(module, r, kStages, pg);
      gw::pipeline::Schedule s(stage, gw::pipeline::make_plan(schedule, kStages, microbatches),
                               [](const gw::Tensor& y, const gw::Tensor&) { return y.sum(); });
      const gw::Tensor x = gw::ones({microbatches, 4}).requires_grad_(false);
      double best = 1;
      for (int step = 0; step < 3; ++step) {
        pg->barrier()->wait();
        s.step(x, x);
        // The largest idle fraction over the stages, this step.
        gw::Tensor idle = gw::full({1}, s.last_step().idle_fraction(), gw::kFloat64);
        pg->allreduce(idle, {.op = gw::dist::ReduceOp::MAX})->wait();
        best = std::min(best, idle.item<double>());
      }
      return std::pair{best, module->most_held};
    }));
  Measured m;
  for (int r = 0; r < kStages; ++r) {
    auto [idle, held] = ranks[r].get();
    if (r == 0) m = {idle, held};
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
  for (const char* schedule : {"gpipe", "1f1b"})
    for (int m : {4, 8, 16}) {
      const std::string name =
          gw::detail::str(schedule, ", ", kStages, " stages, ", m, " micro-batches: idle");
      if (!report.wants("pipeline", name)) continue;
      const Measured got = measure(schedule, m);
      const double theory = static_cast<double>(kStages - 1) / (m + kStages - 1);
      report.add({"pipeline", name, got.idle * 100, "% idle", "theory (p-1)/(m+p-1)", theory * 100,
                  gw::detail::str("stage 0 held ", got.stage0_held, " micro-batches at once")});
    }
  return 0;
}
