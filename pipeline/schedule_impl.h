// The inside of a pipeline Schedule (schedule.h), shared by schedule.cpp (the steps) and
// shape_exchange.cpp (what the stages learn of each other before the first step).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "pipeline/schedule.h"

namespace gw::pipeline {

// Tags: 0 and 1 for the shapes and the skips before the first step (between two ranks they go
// in stage order), then one per receiving stage, micro-batch and direction, then one per skip,
// micro-batch and direction: small, as MPI guarantees only 32767.
constexpr int kShapeTag = 0, kSkipTableTag = 1;

// What stash and pop work on: the running stage's forward (the schedule's), or outside a
// schedule this thread's own table, so that the same modules also run unpipelined.
struct SkipScope {
  int stage = -1;
  std::map<std::string, Tensor>* incoming = nullptr;  // what pop takes, by name
  std::map<std::string, Tensor>* outgoing = nullptr;  // what stash gives, by name
};
// Set by InSkipScope around a stage's forward; null outside one (defined in schedule.cpp).
extern thread_local const SkipScope* t_skips;

class InSkipScope {
 public:
  explicit InSkipScope(const SkipScope* scope) : prev_(t_skips) { t_skips = scope; }
  ~InSkipScope() { t_skips = prev_; }
  InSkipScope(const InSkipScope&) = delete;
  InSkipScope& operator=(const InSkipScope&) = delete;

 private:
  const SkipScope* prev_;
};

// One of this rank's stages, and what it keeps from step to step and within one.
struct LocalStage {
  std::shared_ptr<PipelineStage> stage;
  Shape in_shape, out_shape;
  DType in_dtype = kFloat32, out_dtype = kFloat32;
  std::vector<Tensor> activations, output_grads;   // per micro-batch, kept between steps
  bool allocated = false;                          // those two, at the first step
  std::vector<Tensor> inputs, outputs;             // per micro-batch, within a step
  std::vector<autograd::WeightGradients> weights;  // what each I leaves for its W
  // Skip connections: indices into Impl::skips of those this stage stashes and pops; per
  // micro-batch, the tensors it stashed (within a step), and the buffers it receives popped
  // skips and their gradients into (kept between steps).
  std::vector<int> skips_out, skips_in;
  std::vector<std::vector<Tensor>> stashed, popped, stash_grads;
};

// A skip connection: `name`, stashed by stage `from` and popped by stage `to`.
struct Skip {
  std::string name;
  int from = 0, to = 0;
  Shape shape;
  DType dtype = kFloat32;
};

// Each of a rank's stages by the index in `actions` (the rank's) of its last backward, B or W:
// where, with replicas, the stage averages its gradients.
std::map<int, size_t> last_backwards(const std::vector<Action>& actions);

struct Schedule::Impl {
  std::vector<LocalStage> stages;  // by stage index / ranks
  Plan plan;
  LossFn loss;
  int microbatches = 0, num_stages = 0, ranks = 0;
  bool checked = false;  // the shapes were exchanged and every stage ran them
  bool broken = false;   // a step failed midway: messages of it may still be on their way
  Shape input_shape, target_shape;  // of the first step's micro-batches, kept from then on
  // A stage's messages to a stage on the same rank (one rank only: every stage here).
  std::map<int, Tensor> local_mail;

  dist::ProcessGroup& group() { return stages.front().stage->group(); }
  int rank() { return group().rank(); }
  LocalStage& local(int s) { return stages[static_cast<size_t>(s / ranks)]; }
  int rank_of(int s) const { return s % ranks; }
  std::shared_ptr<dist::ProcessGroup> data_parallel;  // ScheduleOptions::data_parallel
  std::function<void(int, bool)> before_backward;     // ScheduleOptions::before_backward
  std::vector<Skip> skips;                            // every stage's, in one order on every rank
  const Skip& skip(int k) const { return skips[static_cast<size_t>(k)]; }
  // A message's tag: the receiving stage, the micro-batch and the direction.
  int tag(int to_stage, int microbatch, bool gradient) const {
    return 2 + (to_stage * microbatches + microbatch) * 2 + (gradient ? 1 : 0);
  }
  int skip_tag(int skip, int microbatch, bool gradient) const {
    return tag(num_stages, 0, false) + (skip * microbatches + microbatch) * 2 + (gradient ? 1 : 0);
  }
  dist::WorkPtr send(const Tensor& t, int to_stage, int tag_value);
  void recv(Tensor& t, int from_stage, int tag_value);
  void exchange_shapes(const Tensor& input, const Tensor& target);
};

}  // namespace gw::pipeline
