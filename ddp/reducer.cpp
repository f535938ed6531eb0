#include "ddp/reducer.h"

#include <algorithm>
#include <cstring>

#include "autograd/autograd.h"
#include "core/ops.h"

namespace gw::ddp {

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<dist::ProcessGroup> group, size_t bucket_cap_bytes,
                 size_t first_bucket_cap_bytes)
    : params_(std::move(params)), names_(std::move(names)), group_(std::move(group)) {
  bucket_of_.resize(params_.size());
  ready_.assign(params_.size(), false);
  // Reverse order: the last layers' gradients are ready first.
  Bucket current;
  size_t bytes = 0;
  auto close = [&] {
    if (current.params.empty()) return;
    int64_t numel = 0;
    for (size_t i : current.params) {
      current.offsets.push_back(numel);
      numel += params_[i].numel();
    }
    current.flat = zeros({numel}, TensorOptions().with_dtype(params_[current.params[0]].dtype()));
    buckets_.push_back(std::move(current));
    current = Bucket{};
    bytes = 0;
  };
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    const size_t cap = buckets_.empty() ? first_bucket_cap_bytes : bucket_cap_bytes;
    const bool other_dtype =
        !current.params.empty() && params_[current.params[0]].dtype() != p.dtype();
    if (!current.params.empty() && (bytes + p.nbytes() > cap || other_dtype)) close();
    bucket_of_[k] = buckets_.size();
    current.params.push_back(k);
    bytes += p.nbytes();
  }
  close();
  for (auto& b : buckets_) b.pending = b.params.size();
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> weak = weak_from_this();
  for (size_t i = 0; i < params_.size(); ++i)
    autograd::register_post_accumulate_grad_hook(params_[i], [weak, i](const Tensor&) {
      if (auto r = weak.lock()) r->mark_ready(i);
    });
}

void Reducer::prepare_for_forward() {
  if (ready_count_ == 0) return;
  std::string missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) missing += (missing.empty() ? "" : ", ") + names_[i];
  throw StateError(
      "[DistributedDataParallel] Expected to have finished reduction in the prior iteration "
      "before starting a new one: parameters that did not receive a gradient: " + missing +
      ". Every parameter must be used in producing the loss (find_unused_parameters is not "
      "supported yet)");
}

void Reducer::mark_ready(size_t index) {
  if (!sync_) return;  // no_sync(): gradients accumulate locally
  GW_CHECK(!ready_[index], StateError, "[DistributedDataParallel] parameter ", names_[index],
           " was marked ready twice in one iteration (a second backward before the reduction "
           "of the first finished)");
  ready_[index] = true;
  ++ready_count_;
  Bucket& b = buckets_[bucket_of_[index]];
  const Tensor grad = params_[index].grad();
  const size_t slot =
      static_cast<size_t>(std::find(b.params.begin(), b.params.end(), index) - b.params.begin());
  std::memcpy(static_cast<uint8_t*>(b.flat.raw_data()) + b.offsets[slot] * grad.element_size(),
              grad.contiguous().raw_data(), grad.nbytes());
  --b.pending;
  launch_ready_buckets();
  if (ready_count_ == params_.size()) finish_iteration();
}

void Reducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    Bucket& b = buckets_[next_to_launch_++];
    b.work = group_->allreduce(b.flat, {.op = dist::ReduceOp::AVG});
    ++launched_;
    if (ready_count_ < params_.size()) ++launched_early_;
  }
}

void Reducer::finish_iteration() {
  for (auto& b : buckets_) {
    b.work->wait();
    for (size_t s = 0; s < b.params.size(); ++s) {
      const Tensor& p = params_[b.params[s]];
      Tensor averaged = b.flat.narrow(0, b.offsets[s], p.numel()).view(p.sizes());
      p.grad().copy_(averaged);
    }
    b.work.reset();
    b.pending = b.params.size();
  }
  ready_.assign(params_.size(), false);
  ready_count_ = 0;
  next_to_launch_ = 0;
}

}  // namespace gw::ddp
