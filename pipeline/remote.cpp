#include "pipeline/remote.h"

#include <mutex>

#include "core/ops.h"
#include "pipeline/schedule.h"
#include "rpc/rpc.h"

namespace gw::pipeline {

namespace {

// On a stage's worker: the first stage's forward of a micro-batch sent along, and a later
// stage's of the previous stage's output, fetched from its worker (in the caller's distributed
// autograd context, so the fetch is recorded both ways).
Tensor first_stage(std::shared_ptr<nn::Module> module, Tensor input) { return (*module)(input); }
Tensor next_stage(std::shared_ptr<nn::Module> module, rpc::RRef<Tensor> input, int64_t timeout_ms) {
  return (*module)(input.to_here(rpc::Milliseconds(timeout_ms)));
}

}  // namespace

void register_remote_stages() {
  static std::once_flag once;
  std::call_once(once, [] {
    dist::register_module_methods();
    rpc::functions().add("nn.Module.pipeline_first", &first_stage);
    rpc::functions().add("nn.Module.pipeline_next", &next_stage);
  });
}

RemotePipeline::RemotePipeline(std::vector<dist::RemoteModule> stages, int microbatches,
                               rpc::Milliseconds timeout)
    : stages_(std::move(stages)), microbatches_(microbatches), timeout_(timeout) {
  GW_CHECK(!stages_.empty() && microbatches_ >= 1, InvalidArgumentError,
           "[RemotePipeline] needs at least one stage and one micro-batch, got ", stages_.size(),
           " stages and ", microbatches_, " micro-batches");
  register_remote_stages();
}

Tensor RemotePipeline::forward(const Tensor& input) const {
  const std::vector<Tensor> parts =
      split_microbatches(input, microbatches_, "[RemotePipeline] the input");
  // Every micro-batch down every stage, without waiting: each call's result stays on its worker.
  std::vector<rpc::RRef<Tensor>> last;
  for (int i = 0; i < microbatches_; ++i) {
    auto activation = stages_.front().get_module_rref().remote<Tensor>(
        "pipeline_first", parts[static_cast<size_t>(i)].contiguous());
    for (size_t s = 1; s < stages_.size(); ++s)
      activation = stages_[s].get_module_rref().remote<Tensor>(
          "pipeline_next", activation, static_cast<int64_t>(timeout_.count()));
    last.push_back(std::move(activation));
  }
  std::vector<Tensor> outputs;
  for (const auto& r : last) outputs.push_back(r.to_here(timeout_));
  return cat(outputs, 0);
}

std::vector<rpc::RRef<Tensor>> RemotePipeline::remote_parameters() const {
  std::vector<rpc::RRef<Tensor>> params;
  for (const auto& stage : stages_)
    for (auto& p : stage.remote_parameters()) params.push_back(std::move(p));
  return params;
}

}  // namespace gw::pipeline
