// A pipeline whose stages sleep a random 0-500 us in each forward, so that the ranks drift
// apart: `steps` steps alternating GPipe, 1F1B and zero bubble, on any group (threads over
// Gloo in test_pipeline, processes over Gloo or MPI in pipeline_peer). `die_at`: the step in
// whose forward this rank ends its process (exit code 3), as a crash mid-step would.
#pragma once

#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>

#include "core/ops.h"
#include "nn/module.h"
#include "pipeline/schedule.h"

namespace gw::pipeline::testing {

struct Jittery : nn::Module {
  Tensor w;
  std::mt19937 rng;
  int forwards = 0, die_at_forward = -1;
  explicit Jittery(int seed) : Module("Jittery"), rng(static_cast<uint32_t>(seed)) {
    w = register_parameter("w", ones({3}));
  }
  Tensor forward(const Tensor& x) override {
    if (forwards++ == die_at_forward) std::_Exit(3);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
    return x * w;
  }
};

// Returns the last step's gradient of this rank's stage: 2 for every element of w (6 rows of
// ones, each micro-batch's sum divided by its 3 micro-batches, every w 1).
inline Tensor run_jittery(std::shared_ptr<dist::ProcessGroup> pg, int steps, int die_at = -1) {
  const int s = pg->rank(), n = pg->size();
  auto module = std::make_shared<Jittery>(s);
  // Past the shape check's forward: die_at counts steps of 3 forwards each.
  if (die_at >= 0) module->die_at_forward = 1 + die_at * 3 + 1;
  auto stage = std::make_shared<PipelineStage>(module, s, n, pg);
  auto sum = [](const Tensor& y, const Tensor&) { return y.sum(); };
  Schedule gpipe_schedule(stage, gpipe(n, 3), sum);
  Schedule one_f_one_b_schedule(stage, one_f_one_b(n, 3), sum);
  Schedule zb(stage, zero_bubble(n, 3), sum);
  Schedule* schedules[] = {&gpipe_schedule, &one_f_one_b_schedule, &zb};
  const Tensor x = ones({6, 3});
  for (int step = 0; step < steps; ++step) {
    module->zero_grad();
    schedules[step % 3]->step(x, x);
  }
  return module->w.grad();
}

}  // namespace gw::pipeline::testing
