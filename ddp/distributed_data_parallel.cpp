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
  // Coalesced (PyTorch's _broadcast_coalesced): runs of tensors of one dtype travel as one
  // buffer of up to kCoalesceBytes, so that a model's many small tensors cost one round trip
  // rather than one each. A tensor that large travels alone, in place.
  constexpr size_t kCoalesceBytes = size_t{64} << 20;
  struct Chunk {
    std::vector<Tensor> parts;  // the tensors' data: the same storage, written in place
    size_t bytes = 0;
  };
  std::vector<Chunk> chunks;
  for (const Tensor& t : tensors) {
    const bool fits = !chunks.empty() && chunks.back().parts[0].dtype() == t.dtype() &&
                      chunks.back().bytes + t.nbytes() <= kCoalesceBytes;
    if (!fits) chunks.emplace_back();
    chunks.back().parts.push_back(t.detach());
    chunks.back().bytes += t.nbytes();
  }
  std::vector<std::pair<dist::WorkPtr, Tensor>> works;  // with the buffer each fills, if any
  for (Chunk& c : chunks) {
    const bool alone = c.parts.size() == 1 && c.parts[0].is_contiguous();
    Tensor buffer = alone ? c.parts[0] : dist::ProcessGroup::concat(c.parts);
    works.emplace_back(group_->broadcast(buffer, {.root = 0}), alone ? Tensor() : buffer);
  }
  for (size_t k = 0; k < chunks.size(); ++k) {
    works[k].first->wait();
    const Tensor& buffer = works[k].second;
    if (!buffer.defined()) continue;  // broadcast in place
    int64_t offset = 0;
    for (Tensor& part : chunks[k].parts) {
      part.copy_(buffer.narrow(0, offset, part.numel()).view(part.sizes()));
      offset += part.numel();
    }
  }
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
