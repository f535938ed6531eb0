#include "ddp/distributed_data_parallel.h"

#include "autograd/grad_mode.h"
#include "core/ops.h"
#include "core/trace.h"

namespace gw::ddp {

namespace {
constexpr double kMiB = 1024.0 * 1024.0;
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<dist::ProcessGroup> group,
                                                 DDPOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  GW_CHECK(module_, InvalidArgumentError, "[DistributedDataParallel] no module given");
  GW_CHECK(group_, InvalidArgumentError, "[DistributedDataParallel] no process group given");
  GW_CHECK(options.bucket_cap_mb > 0 && options.first_bucket_cap_mb > 0, InvalidArgumentError,
           "[DistributedDataParallel] bucket caps must be positive, got ", options.bucket_cap_mb,
           " and ", options.first_bucket_cap_mb, " MB");
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (auto& [name, p] : module_->named_parameters()) {
    if (!p.requires_grad()) continue;
    params.push_back(p);
    names.push_back(name);
  }
  std::vector<std::string> described;  // "parameter fc1.weight" in shape errors
  for (const auto& n : names) described.push_back("parameter " + n);
  group_->check_same_shapes(params, described, "DistributedDataParallel");  // every rank first
  for (size_t i = 0; i < params.size(); ++i) {
    GW_CHECK(params[i].dtype() == kFloat32 || params[i].dtype() == kFloat64,
             InvalidArgumentError, "[DistributedDataParallel] parameter ", names[i], " is ",
             dtype_name(params[i].dtype()), "; gradients are averaged in float32 or float64");
    GW_CHECK(params[i].device() == group_->device(), InvalidArgumentError,
             "[DistributedDataParallel] parameter ", names[i], " is on ",
             params[i].device().str(), " but the ", group_->backend(), " group takes tensors on ",
             group_->device().str());
  }
  GW_CHECK(!params.empty(), InvalidArgumentError,
           "[DistributedDataParallel] the module has no parameter that requires grad");
  broadcast_from_rank0(module_->parameters());
  broadcast_from_rank0(module_->buffers());
  reducer_ = std::make_shared<Reducer>(
      std::move(params), std::move(names), group_,
      ReducerOptions{.bucket_cap_bytes = static_cast<size_t>(options.bucket_cap_mb * kMiB),
                     .first_bucket_cap_bytes =
                         static_cast<size_t>(options.first_bucket_cap_mb * kMiB),
                     .gradient_as_bucket_view = options.gradient_as_bucket_view});
  reducer_->install_hooks();
}

void DistributedDataParallel::broadcast_from_rank0(const std::vector<Tensor>& tensors) {
  if (tensors.empty() || group_->size() == 1) return;
  autograd::NoGradGuard no_grad;
  std::vector<dist::WorkPtr> works;
  for (const Tensor& t : tensors) {
    Tensor data = t.detach();  // the same storage: written in place
    works.push_back(group_->broadcast(data, {.root = 0}));
  }
  for (auto& w : works) w->wait();
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  trace::Scope span("ddp", "DDP forward");
  reducer_->prepare_for_forward();
  if (options_.broadcast_buffers) broadcast_from_rank0(module_->buffers());
  Tensor output = module_->forward(input);
  reducer_->prepare_for_backward(output, options_.find_unused_parameters);
  return output;
}

}  // namespace gw::ddp
