// gw::pipeline — pipeline parallelism (torch.distributed.pipelining): a model cut into stages,
// one per rank, with micro-batches streamed through them.
//
// Mental model: rank s holds stage s (a module: the part of the model between two cuts). A step
// splits the batch along dim 0 into micro-batches; stage 0 runs each through its part and sends
// the activation to stage 1, and so on; the last stage computes each micro-batch's loss and
// starts its backward, whose input gradients travel back the same way. A *schedule* decides the
// order in which each rank runs its forwards (F) and backwards (B): GPipe runs every forward
// and then every backward; 1F1B starts backwards as soon as the pipeline is full, so a stage
// holds at most (stages - s) micro-batches' activations instead of all of them. A schedule is
// data, a list of actions per rank, checked for deadlock before it runs and printable:
//
//   auto stage = std::make_shared<gw::pipeline::PipelineStage>(my_part, rank, 4, pg);
//   gw::pipeline::Schedule schedule(stage, gw::pipeline::one_f_one_b(4, 8), loss_fn);
//   std::vector<double> losses;                      // the last stage's, one per micro-batch
//   schedule.step(rank == 0 ? x : Tensor(), rank == 3 ? y : Tensor(), &losses);
//   opt.step();                                      // on this stage's parameters
//
// Gradients: each micro-batch's loss is divided by the number of micro-batches before its
// backward, so with a loss that is a mean over the micro-batch (and micro-batches of equal size)
// the stages' .grad equal those of the whole model on the whole batch's mean loss.
//
// Time: every forward and backward is a span on the track "pipeline stage S" of the timeline
// (core/trace.h, GW_TRACE=FILE), from after its input arrived to before its output leaves, so
// the gaps between spans are the stage's idle time; last_step() gives the same sums.
//
// Transport: activations and their gradients go point to point on the stage's process group
// (Gloo or MPI), sends posted without waiting and received into buffers kept from step to
// step. Before the first step the stages exchange the shape and dtype of what they pass, and run
// one forward of them: a stage that cannot take what its predecessor gives fails on every rank,
// naming both stages and the shapes, before any step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/process_group/process_group.h"
#include "nn/module.h"

namespace gw::pipeline {

// --- schedules as data ---------------------------------------------------------------------

enum class ActionType { Forward, Backward };

struct Action {
  ActionType type;
  int microbatch;
  bool operator==(const Action&) const = default;
};

// plan[s]: the actions of stage s (on rank s), in order.
using Plan = std::vector<std::vector<Action>>;

// GPipe (Huang et al. 2019): every forward, then every backward (in reverse order).
Plan gpipe(int stages, int microbatches);
// 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs min(stages - s - 1, microbatches)
// forwards to fill the pipeline, then one forward and one backward in turn, then the remaining
// backwards.
Plan one_f_one_b(int stages, int microbatches);
// By name: "gpipe" or "1f1b" (InvalidArgumentError naming the others).
Plan make_plan(const std::string& name, int stages, int microbatches);

// Throws InvalidArgumentError unless `plan` runs every forward and backward of every micro-batch
// once on each stage, each backward after its forward, and cannot deadlock: simulated with
// sends that never block and receives that wait for their sender, every rank reaches its end.
// The error names the stuck ranks and the action each waits in.
void check_plan(const Plan& plan, int stages, int microbatches);

// One row per stage: "stage 0: F0 F1 B0 F2 B1 ...".
std::string to_string(const Plan& plan);

// --- running a plan --------------------------------------------------------------------------

// The part of the model rank `stage_index` of `group` runs; stage s sits on rank s.
class PipelineStage {
 public:
  PipelineStage(std::shared_ptr<nn::Module> module, int stage_index, int num_stages,
                std::shared_ptr<dist::ProcessGroup> group);

  nn::Module& module() { return *module_; }
  int index() const { return index_; }
  int num_stages() const { return num_stages_; }
  bool is_first() const { return index_ == 0; }
  bool is_last() const { return index_ == num_stages_ - 1; }
  dist::ProcessGroup& group() { return *group_; }

 private:
  std::shared_ptr<nn::Module> module_;
  int index_, num_stages_;
  std::shared_ptr<dist::ProcessGroup> group_;
};

// The loss of one micro-batch from the last stage's output and its targets.
using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;

class Schedule {
 public:
  // `plan`: for every stage (checked by check_plan); its micro-batch count is the schedule's.
  Schedule(std::shared_ptr<PipelineStage> stage, Plan plan, LossFn loss);
  ~Schedule();

  // One step, on every rank: `input` on the first stage (ignored elsewhere) and `target` on the
  // last, each split along dim 0 into the plan's micro-batches (their size must divide);
  // gradients accumulate into the stage's parameters' .grad. The last stage appends each
  // micro-batch's loss (undivided) to `losses`.
  void step(const Tensor& input = {}, const Tensor& target = {},
            std::vector<double>* losses = nullptr);

  int microbatches() const { return microbatches_; }

  // The last step on this rank: its wall time, from the start of step() to the end of its last
  // send, and the time spent in forwards and backwards (the rest is waiting: the bubble).
  struct StepTimes {
    double wall_s = 0, busy_s = 0;
    double idle_fraction() const { return wall_s > 0 ? 1 - busy_s / wall_s : 0; }
  };
  const StepTimes& last_step() const { return last_step_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int microbatches_;
  StepTimes last_step_;
};

}  // namespace gw::pipeline
