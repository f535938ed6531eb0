#include "ddp/distributed_data_parallel.h"

#include <map>

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
  broadcast_from(0, module_->parameters());
  broadcast_from(0, module_->buffers());
  reducer_ = std::make_shared<Reducer>(
      std::move(params), std::move(names), group_,
      ReducerOptions{.bucket_cap_bytes = static_cast<size_t>(options.bucket_cap_mb * kMiB),
                     .first_bucket_cap_bytes =
                         static_cast<size_t>(options.first_bucket_cap_mb * kMiB),
                     .gradient_as_bucket_view = options.gradient_as_bucket_view,
                     .static_graph = options.static_graph});
  reducer_->install_hooks();
}

void DistributedDataParallel::broadcast_from(int root, const std::vector<Tensor>& tensors) {
  if (tensors.empty() || group_->size() == 1) return;
  autograd::NoGradGuard no_grad;
  // Coalesced (PyTorch's _broadcast_coalesced): the contiguous CPU tensors of each dtype travel
  // as buffers of up to kCoalesceBytes, so that a model's many small tensors cost one round trip
  // rather than one each; the rest, and a tensor that large, travel alone, in place. Written
  // back as raw bytes, like a broadcast in place: no version bump, so a buffer saved for a
  // backward that spans two forwards stays valid.
  constexpr size_t kCoalesceBytes = size_t{64} << 20;
  struct Buffer {
    std::vector<Tensor> parts;  // the tensors' data: their storage, written back in place
    size_t bytes = 0;
    Tensor flat;
    dist::WorkPtr work;
  };
  std::map<DType, std::vector<Buffer>> buffers;
  std::vector<dist::WorkPtr> in_place;
  for (const Tensor& t : tensors) {
    Tensor data = t.detach();  // the same storage
    if (data.device() != kCPU || !data.is_contiguous() || data.nbytes() >= kCoalesceBytes) {
      in_place.push_back(group_->broadcast(data, {.root = root}));
      continue;
    }
    auto& runs = buffers[data.dtype()];
    if (runs.empty() || runs.back().bytes + data.nbytes() > kCoalesceBytes) runs.emplace_back();
    runs.back().bytes += data.nbytes();
    runs.back().parts.push_back(std::move(data));
  }
  for (auto& [dtype, runs] : buffers)
    for (Buffer& b : runs) {
      b.flat = dist::ProcessGroup::concat(b.parts);
      b.work = group_->broadcast(b.flat, {.root = root});
    }
  for (auto& w : in_place) w->wait();
  for (auto& [dtype, runs] : buffers)
    for (Buffer& b : runs) {
      b.work->wait();
      if (group_->rank() != root) dist::ProcessGroup::split(b.flat, b.parts);
    }
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  trace::Scope span("ddp", "DDP forward");
  const bool grad = autograd::is_grad_enabled();  // else no backward: the reducer is left alone
  if (grad) reducer_->prepare_for_forward();
  int authority = 0;  // whose buffers every rank takes, and whose bucket order
  int divide_by = group_->size();
  GW_CHECK(join_id() == 0 || due_in_join_ != join_id() ||
               reducer_->backwards_ended() > backwards_at_forward_,
           StateError,
           "[DistributedDataParallel] inside a Join, a forward with grad enabled (outside "
           "no_sync) must be followed by its backward before the next forward, which the "
           "joined ranks shadow; run evaluation under NoGradGuard");
  const bool reduces = reducer_->sync() && grad;
  if (auto iteration = notify_join_context()) {
    any_rank_reduces(reduces);
    authority = iteration->training.front();
    divide_by = divisor_in(*iteration);
  }
  reducer_->set_iteration(authority, divide_by);
  if (options_.broadcast_buffers) broadcast_from(authority, module_->buffers());
  Tensor output = (*module_)(input);
  if (grad) output = reducer_->prepare_for_backward(output, options_.find_unused_parameters);
  if (reduces) {  // a forward that threw announced nothing the joined ranks wait for
    due_in_join_ = join_id();
    backwards_at_forward_ = reducer_->backwards_ended();
  }
  return output;
}

int DistributedDataParallel::divisor_in(const dist::JoinIteration& iteration) const {
  return join_options()->divide_by_initial_world_size ? group_->size()
                                                      : static_cast<int>(iteration.training.size());
}

bool DistributedDataParallel::any_rank_reduces(bool mine) {
  Tensor flag = full({1}, mine ? 1.0 : 0.0, TensorOptions(kInt32).with_device(group_->device()));
  group_->allreduce(flag, {.op = dist::ReduceOp::MAX})->wait();
  return flag.to(kCPU).to_vector<int32_t>()[0] > 0;
}

// What a joined rank does for DDP: each iteration of the others, the collectives of their forward
// and backward, in their order, with nothing of its own; at the end, the final model.
class DistributedDataParallel::JoinHook : public dist::JoinHook {
 public:
  explicit JoinHook(DistributedDataParallel& ddp) : ddp_(ddp) {}

  void main_hook(const dist::JoinIteration& iteration) override {
    const bool reduces = ddp_.any_rank_reduces(false);
    const int authority = iteration.training.front();
    if (ddp_.options_.broadcast_buffers) ddp_.broadcast_from(authority, ddp_.module_->buffers());
    if (!reduces) return;
    // The others' divisor: it decides which collectives their backward makes.
    ddp_.reducer_->set_iteration(authority, ddp_.divisor_in(iteration));
    ddp_.reducer_->shadow_backward(ddp_.options_.find_unused_parameters);
  }

  void post_hook(bool is_last_joiner) override {
    // The lowest of the ranks that joined last trained longest: every rank takes its model (the
    // others stopped stepping their optimizers when they joined).
    auto& group = *ddp_.group_;
    Tensor root = full({1}, is_last_joiner ? group.rank() : group.size(),
                       TensorOptions(kInt32).with_device(group.device()));
    group.allreduce(root, {.op = dist::ReduceOp::MIN})->wait();
    const int from = root.to(kCPU).to_vector<int32_t>()[0];
    ddp_.broadcast_from(from, ddp_.module_->parameters());
    ddp_.broadcast_from(from, ddp_.module_->buffers());
  }

 private:
  DistributedDataParallel& ddp_;
};

std::unique_ptr<dist::JoinHook> DistributedDataParallel::join_hook(const dist::JoinOptions&) {
  GW_CHECK(!options_.static_graph, InvalidArgumentError,
           "[DistributedDataParallel] static_graph is not supported inside a Join yet");
  return std::make_unique<JoinHook>(*this);
}

}  // namespace gw::ddp
