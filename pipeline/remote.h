// gw::pipeline::RemotePipeline — the seeds' way: a pipeline of RemoteModules driven from one
// process over RPC and distributed autograd, as PyTorch's first pipeline (Pipe over RPC, PiPPy's
// RPC driver) was.
//
// Mental model: each stage is a RemoteModule on its worker. forward() cuts the batch into
// micro-batches and sends each down the stages without waiting: stage 0 runs it on its worker
// and keeps the output there (an RRef), stage 1's worker fetches it from stage 0's, and so on;
// only the last stage's outputs come back. All micro-batches are under way at once, so stage
// s + 1 works on micro-batch i while stage s works on later ones (GPipe's forward; a stage's
// worker runs as many of its micro-batches at once as its RPC pool has threads). Inside a
// distributed autograd context every fetch is recorded, so one dist::autograd::backward from a
// loss on the outputs runs back through every stage and micro-batch, and each stage's worker
// holds its parameters' gradients in the context, for a DistributedOptimizer (outside a
// context nothing is recorded across workers):
//
//   // Every worker: the stages' constructors, and the stage functions.
//   gw::dist::add_module_constructor<Part, int64_t>("Part");
//   gw::pipeline::register_remote_stages();
//   // The driver:
//   gw::pipeline::RemotePipeline pipe({gw::dist::RemoteModule("worker1", "Part", int64_t{0}),
//                                      gw::dist::RemoteModule("worker2", "Part", int64_t{1})},
//                                     /*microbatches=*/4);
//   gw::dist::DistributedOptimizer opt(gw::optim::SGD::options(0.1), pipe.remote_parameters());
//   gw::dist::autograd::Context ctx;
//   Tensor loss = loss_fn(pipe.forward(x), y);
//   gw::dist::autograd::backward(ctx.id(), {loss});
//   opt.step(ctx.id());
//
// The gradients are those of the model in one piece on the whole batch: the outputs are the
// same function of the parameters, cut differently. The backward is distributed autograd's,
// which runs each worker's part as its gradients arrive: there is no schedule to choose
// (pipeline::Schedule has them, over the process group's point-to-point operations). The
// stages run on their workers' RPC threads, so the driver's autocast does not reach them:
// a stage that should run in 16 bits holds its own AutocastGuard in its forward.
#pragma once

#include <vector>

#include "dist/nn/remote_module.h"

namespace gw::pipeline {

// The functions the stages' workers run ("nn.Module.pipeline_first" and "_next"): once per
// process, on every worker that holds a stage (RemotePipeline's constructor calls it too).
void register_remote_stages();

class RemotePipeline {
 public:
  // The stages in order (at least one), and the micro-batches forward() cuts a batch into.
  // `timeout` bounds each fetch of an activation, which waits for the stage before to make it
  // (the agent's default: RpcBackendOptions::rpc_timeout).
  RemotePipeline(std::vector<dist::RemoteModule> stages, int microbatches,
                 rpc::Milliseconds timeout = rpc::kUseDefaultTimeout);

  // `input` cut along dim 0 into the micro-batches (its size must divide), through every stage;
  // the last stage's outputs, concatenated along dim 0, on this worker.
  Tensor forward(const Tensor& input) const;
  // Every stage's parameters, owned by the stages' workers, in stage order.
  std::vector<rpc::RRef<Tensor>> remote_parameters() const;
  const std::vector<dist::RemoteModule>& stages() const { return stages_; }
  int microbatches() const { return microbatches_; }

 private:
  std::vector<dist::RemoteModule> stages_;
  int microbatches_;
  rpc::Milliseconds timeout_;
};

}  // namespace gw::pipeline
