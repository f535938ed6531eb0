// gw::pipeline — pipeline parallelism (torch.distributed.pipelining): a model cut into stages,
// one per rank, with micro-batches streamed through them.
//
// Mental model: a stage is a module, the part of the model between two cuts; stage s sits on
// rank s % ranks (one stage per rank, or several: interleaved). A step splits the batch along
// dim 0 into micro-batches; stage 0 runs each through its part and sends the activation to
// stage 1, and so on; the last stage computes each micro-batch's loss and starts its backward,
// whose input gradients travel back the same way. A *schedule* decides the order in which each
// rank runs its forwards (F) and backwards (B):
// - GPipe runs every forward, then every backward;
// - 1F1B starts backwards as soon as the pipeline is full, so stage s holds at most
//   (stages - s) micro-batches' activations instead of all of them;
// - interleaved 1F1B gives each rank several thinner stages, which shrinks the bubble by that
//   factor;
// - zero bubble (ZB-H1) splits each backward into the input gradient (I), which the previous
//   stage waits for, and the weight gradient (W), which fills the bubble.
// A schedule is data, a list of actions per rank, checked for deadlock before it runs and
// printable:
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
// naming both stages and the shapes, before any step. The forwards run on the thread that calls
// step(), under its autocast state (core/autocast.h): the dtypes exchanged are that state's, so
// run every step under the same one.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/process_group/process_group.h"
#include "nn/module.h"

namespace gw::pipeline {

// --- schedules as data ---------------------------------------------------------------------

// F: forward; B: the whole backward; I and W: its input-gradient and weight-gradient parts.
enum class ActionType { Forward, Backward, BackwardInput, BackwardWeight };

struct Action {
  ActionType type;
  int microbatch;
  int stage;
  bool operator==(const Action&) const = default;
};

// plan[r]: the actions of rank r, in order; plan.size() is the number of ranks, and stage s
// runs on rank s % ranks.
using Plan = std::vector<std::vector<Action>>;

// GPipe (Huang et al. 2019): every forward, then every backward (in reverse order).
Plan gpipe(int stages, int microbatches);
// 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs min(stages - s - 1, microbatches)
// forwards to fill the pipeline, then one forward and one backward in turn, then the rest.
Plan one_f_one_b(int stages, int microbatches);
// Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021): `ranks` x `stages_per_rank` stages,
// rank r holding stages r, r + ranks, ...; micro-batches go through in groups of `ranks`, so
// their number must be a multiple of it. Bubble: (p-1)/(v m + p - 1) for v stages per rank.
Plan interleaved_one_f_one_b(int ranks, int stages_per_rank, int microbatches);
// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): each backward split into I, which
// the previous stage waits for, and W, which only this stage needs and which fills the bubble
// (autograd::backward_input: I computes only the input's gradient and frees the activations W
// does not need; W keeps a layer's input and output gradient). Built by simulating actions of
// one unit each (but on the first stage, whose input needs no gradient, I is empty and W two
// units): I first, then F while stage s holds fewer than stages - s micro-batches between their
// F and I (1F1B's activations; on the first stage, between F and W) and fewer than
// `pending_weights` (0: `stages`) between their I and W, then W. With equal F, I and W the
// bubble is p - 1 units against 1F1B's 3 (p - 1).
Plan zero_bubble(int stages, int microbatches, int pending_weights = 0);
// By name: "gpipe", "1f1b", "interleaved" (2 stages per rank: `stages` counts ranks x 2) or
// "zb" (InvalidArgumentError naming them).
Plan make_plan(const std::string& name, int ranks, int microbatches);

// Throws InvalidArgumentError unless `plan` runs, on each stage's rank, every micro-batch's
// forward once and either its backward once or its I and then its W once, each backward after
// its forward; and cannot deadlock: simulated with sends that never block and receives that
// wait for their sender (F after the previous stage's F, B or I after the next stage's B or I),
// every rank reaches its end. The error names the stuck ranks and the action each waits in.
void check_plan(const Plan& plan, int stages, int microbatches);

// One row per rank: "stage 0: F0 F1 B0 F2 B1 ..." with one stage per rank, else
// "rank 0: F0@0 F0@2 ..." (action, micro-batch, @ stage).
std::string to_string(const Plan& plan);
// One action: "F3", "I0", "W1", or with its stage "F3@2".
std::string to_string(const Action& a, bool with_stage = true);
// The stages a plan runs (one more than the largest stage it names).
int stages_of(const Plan& plan);

// --- running a plan --------------------------------------------------------------------------

// `batch` as `microbatches` views along dim 0, of one size; an undefined or 0-dim batch, or one
// whose first dim does not divide, throws InvalidArgumentError: "<what> must split along dim 0
// into <microbatches> micro-batches of one size, got <shape>".
std::vector<Tensor> split_microbatches(const Tensor& batch, int microbatches,
                                       const std::string& what);

// The action the schedule runs on this thread now (its module's forward or its backward hooks
// can ask), or null: for instrumentation, and for benchmarks that stand in for a stage's work.
const Action* current_action();

// Skip connections across stages (torchgpipe's stash and pop): a stage's forward stashes a
// tensor under a name, and a later stage's forward pops it, as if the stages between passed it
// on; its gradient comes back the same way. The pipeline learns who stashes and who pops from
// the forward it runs before the first step, and sends the skip straight from the one stage's
// rank to the other's. Outside a pipeline the same calls hand the tensor over on this thread,
// so the modules run unpipelined too:
//
//   Tensor Embed::forward(const Tensor& ids) {           // stage 0
//     Tensor e = wte(ids);
//     gw::pipeline::stash("embedding", e);
//     return e;
//   }
//   Tensor Head::forward(const Tensor& h) {              // stage 2
//     return lm_head(h + gw::pipeline::pop("embedding"));
//   }
//
// Each name is stashed by one stage and popped by one later stage, in every micro-batch, with
// the shape it had before the first step; a name stashed twice, popped by no stage or by a
// stage before its stasher fails on every rank before the first step, naming the stages.
// Outside a pipeline a stashed tensor waits on the thread until popped (stashing the name
// again replaces it). Not inside an activation checkpoint's segment: its recomputation in
// backward runs outside the step.
void stash(const std::string& name, const Tensor& t);
Tensor pop(const std::string& name);

// A part of the model: stage s of `num_stages`, which sits on rank s % group->size().
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

struct ScheduleOptions {
  // 2D parallelism: replicas of the pipeline, each fed its own share of the batch. This group
  // holds the ranks that run this rank's stages in the other replicas (a DeviceMesh's "dp"
  // group, dist/process_group/init_process_group.h); as each stage's last backward (B or W) of a
  // step ends, its parameters' gradients are averaged over it while the other stages still run,
  // and step() returns once that is done. DDP's arithmetic: every replica's stages end the step
  // with the gradient of the mean loss over all replicas' micro-batches (a parameter without a
  // gradient gets zeros). A parameter several of the rank's stages share (a tied weight) is
  // averaged once, by the stage whose last backward comes last. The replicas' stages must
  // average in the same order with the same parameters (dtype, shape, trained or frozen), tied
  // alike, or their averages would not pair up: the first step compares them and raises
  // InvalidArgumentError on every rank of every replica, showing the first difference (as it
  // does when any replica's first step cannot run). Every rank of every replica passes its
  // group (a pipeline whose ranks disagree is refused; a rank without one, whose replicas have
  // theirs, leaves them waiting until the group's timeout). Null: one replica.
  std::shared_ptr<dist::ProcessGroup> data_parallel;
  // Runs before each backward action (B, I or W) of a stage with whether it is the stage's last
  // of the step. Stages sharded over the replicas (fsdp::fully_shard) give their
  // set_requires_gradient_sync(last): their gradients add up whole on the rank until the last
  // micro-batch's backward reduce-scatters the sum, one reduce-scatter a step rather than one a
  // micro-batch (torch.distributed.pipelining does the same), for the price of each stage's
  // whole gradients kept on the rank between its first and last backward. Sharded stages leave
  // `data_parallel` null (fully_shard reduces), and do not run zero bubble (its I refuses a
  // unit: fully_shard reduces the weights' gradients I leaves for W). After a step that
  // failed midway such units still hold the partial sums: build nothing new over them.
  std::function<void(int stage, bool last)> before_backward = {};
};

class Schedule {
 public:
  // `plan`: for every rank (checked by check_plan); its micro-batch count is the schedule's.
  // `stages`: this rank's, every stage the plan gives it.
  Schedule(std::vector<std::shared_ptr<PipelineStage>> stages, Plan plan, LossFn loss,
           ScheduleOptions options = {});
  Schedule(std::shared_ptr<PipelineStage> stage, Plan plan, LossFn loss,
           ScheduleOptions options = {})
      : Schedule(std::vector<std::shared_ptr<PipelineStage>>{std::move(stage)}, std::move(plan),
                 std::move(loss), std::move(options)) {}
  ~Schedule();

  // One step, on every rank: `input` on the first stage's rank (ignored elsewhere) and `target`
  // on the last's, each split along dim 0 into the plan's micro-batches (their size must
  // divide, and their shapes stay those of the first step); gradients accumulate into the
  // stages' parameters' .grad. The last stage's rank appends each micro-batch's loss
  // (undivided) to `losses`. A step that throws midway (a rank died, a bad batch) leaves the
  // schedule refusing further steps: messages of it may still be on their way.
  void step(const Tensor& input = {}, const Tensor& target = {},
            std::vector<double>* losses = nullptr);

  int microbatches() const;

  // The last step on this rank: its wall time, from the start of its actions (after the first
  // step's shape exchange) to the end of its last send, and the time spent in its stages'
  // forwards and backwards (the rest is waiting: the bubble).
  struct StepTimes {
    double wall_s = 0, busy_s = 0;
    double idle_fraction() const { return wall_s > 0 ? 1 - busy_s / wall_s : 0; }
  };
  const StepTimes& last_step() const { return last_step_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  StepTimes last_step_;
};

}  // namespace gw::pipeline
