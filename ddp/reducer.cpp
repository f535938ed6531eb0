#include "ddp/reducer.h"

#include <algorithm>
#include <optional>
#include <unordered_set>

#include "autograd/accumulate_grad.h"
#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/trace.h"

namespace gw::ddp {

namespace {
bool same_memory(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.storage_offset() == b.storage_offset() &&
         a.strides() == b.strides();
}

// dst = src / n in one pass over both (CPU tensors of one float32 or float64 dtype,
// contiguous), else in two.
void copy_divided(Tensor& dst, const Tensor& src, int n) {
  if (dst.device() != kCPU || src.device() != kCPU || dst.dtype() != src.dtype() ||
      dst.element_size() == 2 || !dst.is_contiguous() || !src.is_contiguous()) {
    dst.copy_(src);
    dst.div_(static_cast<double>(n));
    return;
  }
  dispatch<FloatTypes>(dst.dtype(), "DistributedDataParallel", [&]<typename T>() {
    T* d = dst.data_ptr<T>();
    const T* s = src.data_ptr<T>();
    const int64_t count = dst.numel();
    if ((n & (n - 1)) == 0) {  // a power of two: its reciprocal is exact, and a product faster
      const T scale = T(1) / static_cast<T>(n);
      for (int64_t i = 0; i < count; ++i) d[i] = s[i] * scale;  // vectorized
    } else {
      const T divisor = static_cast<T>(n);
      for (int64_t i = 0; i < count; ++i) d[i] = s[i] / divisor;  // vectorized
    }
  });
}

// Waits for a reduction still running; its error, if any, ended the iteration already (or
// would be a second one).
template <typename T>
void wait_quietly(const std::optional<Future<T>>& f) {
  if (!f) return;
  try {
    f->wait();
  } catch (...) {
  }
}

// The same, and drops it.
template <typename T>
void finish_quietly(std::optional<Future<T>>& f) {
  wait_quietly(f);
  f.reset();
}

// The identity, whose backward queues `callback` to run when the pass ends (PyTorch's _DDPSink).
class QueueAtEnd final : public autograd::Node {
 public:
  explicit QueueAtEnd(std::function<void()> callback) : callback_(std::move(callback)) {}
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    autograd::queue_callback(callback_);
    return std::move(grads);
  }
  std::string name() const override { return "DistributedDataParallelEndOfBackward"; }

 private:
  std::function<void()> callback_;
};

// A future of no tensor once `tensors` are averaged where they are across `group`.
Future<Tensor> averaged_in_place(dist::ProcessGroup& group, std::vector<Tensor> tensors) {
  return group.allreduce_coalesced(tensors, {.op = dist::ReduceOp::AVG})
      ->future()
      .then([](Future<void>& done) {
        done.wait();
        return Tensor();
      });
}

// A future of `buffer` once `op` reduced it in place across `group`.
Future<Tensor> reduced_in_place(dist::ProcessGroup& group, Tensor buffer, dist::ReduceOp op) {
  return group.allreduce(buffer, {.op = op})->future().then([buffer](Future<void>& done) {
    done.wait();
    return buffer;
  });
}
}  // namespace

std::vector<Tensor> GradBucket::gradients() const {
  std::vector<Tensor> out;
  int64_t offset = 0;
  for (const Tensor& p : parameters) {
    out.push_back(buffer.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return out;
}

namespace hooks {

CommHook allreduce() {
  return [](dist::ProcessGroup& group, GradBucket& bucket) {
    return reduced_in_place(group, bucket.buffer, dist::ReduceOp::AVG);
  };
}

namespace {
// Averages the buffer with `wire` as the type on the wire; divides and widens in place.
CommHook compress_to(DType wire) {
  return [wire](dist::ProcessGroup& group, GradBucket& bucket) {
    Tensor buffer = bucket.buffer;
    Tensor compressed = buffer.div_(static_cast<double>(group.size())).to(wire);
    return group.allreduce(compressed, {.op = dist::ReduceOp::SUM})
        ->future()
        .then([compressed, buffer](Future<void>& done) mutable {
          done.wait();
          return buffer.copy_(compressed);
        });
  };
}
}  // namespace

CommHook fp16_compress() { return compress_to(kFloat16); }
CommHook bf16_compress() { return compress_to(kBFloat16); }

}  // namespace hooks

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<dist::ProcessGroup> group, ReducerOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      group_in_place_(group_->coalesces_in_place()),
      options_(options) {
  ready_.assign(params_.size(), false);
  used_since_sync_.assign(params_.size(), false);
  divide_by_ = group_->size();
  // Reverse order: the last layers' gradients are usually ready first.
  std::vector<size_t> order(params_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
  build_buckets(order);
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  Bucket current;
  size_t bytes = 0;
  auto close = [&] {
    if (current.params.empty()) return;
    for (size_t i : current.params) {
      current.offsets.push_back(current.numel);
      current.numel += params_[i].numel();
    }
    buckets_.push_back(std::move(current));
    current = Bucket{};
    bytes = 0;
  };
  for (size_t k : order) {
    const Tensor& p = params_[k];
    const size_t cap =
        buckets_.empty() ? options_.first_bucket_cap_bytes : options_.bucket_cap_bytes;
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

Reducer::~Reducer() {
  for (auto& h : hook_handles_) h.remove();
  // A reduction in place may still be writing .grad (a backward that threw midway).
  for (const Bucket& b : buckets_) wait_quietly(b.reduced);
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> weak = weak_from_this();
  for (size_t i = 0; i < params_.size(); ++i)
    hook_handles_.push_back(
        autograd::register_post_accumulate_grad_hook(params_[i], [weak, i](const Tensor&) {
          if (auto r = weak.lock()) r->on_gradient(i);
        }));
}

void Reducer::set_comm_hook(CommHook hook) {
  GW_CHECK(hook, InvalidArgumentError, "[register_comm_hook] the hook is empty");
  GW_CHECK(launched_ == 0, StateError,  // the hook is fixed once a bucket was reduced
           "[register_comm_hook] register the hook before the first backward pass");
  hook_ = std::move(hook);
}

Tensor Reducer::prepare_for_backward(const Tensor& output, bool find_unused) {
  iteration_sync_ = sync_;
  unused_.clear();
  used_map_ = Tensor();
  const bool reduces = iteration_sync_ && autograd::is_grad_enabled();
  if (options_.static_graph) {
    if (!reduces || !output.defined() || !output.requires_grad()) return output;
    if (counted_) {
      for (size_t i = 0; i < params_.size(); ++i)
        if (hook_counts_[i] == 0) unused_.push_back(i);
      hooks_left_ = hook_counts_;
      return output;
    }
    counting_ = true;
    hook_counts_.assign(params_.size(), 0);
    auto node = std::make_shared<QueueAtEnd>([weak = weak_from_this()] {
      if (auto r = weak.lock()) r->finish_counted_backward();
    });
    node->next_edges.push_back(autograd::gradient_edge(output));
    Tensor out = output.detach();
    autograd::set_history(out, node);
    return out;
  }
  if (!find_unused || !reduces) return output;
  // The leaves `output` reaches, through its graph's AccumulateGrad nodes.
  std::unordered_set<const TensorImpl*> used;
  if (output.defined() && output.requires_grad()) {
    std::vector<autograd::Node*> stack;
    std::unordered_set<autograd::Node*> seen;
    if (auto root = autograd::gradient_edge(output); root.valid()) stack.push_back(root.fn.get());
    while (!stack.empty()) {
      autograd::Node* n = stack.back();
      stack.pop_back();
      if (!seen.insert(n).second) continue;
      if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(n)) used.insert(acc->variable.impl());
      for (const auto& e : n->next_edges)
        if (e.valid()) stack.push_back(e.fn.get());
    }
  }
  std::vector<int32_t> used_map(params_.size(), 1);
  for (size_t i = 0; i < params_.size(); ++i)
    if (!used.contains(params_[i].impl())) {
      unused_.push_back(i);
      // Its gradient from no_sync steps still has to be averaged.
      used_map[i] = used_since_sync_[i] ? 1 : 0;
    }
  used_map_ = from_vector<int32_t>(used_map).to(group_->device());
  return output;
}

void Reducer::prepare_for_forward() {
  if (ready_count_ == 0) return;
  // Not raised while the reductions launched may still write .grad (in place).
  for (const Bucket& b : buckets_) wait_quietly(b.reduced);
  std::string missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) missing += (missing.empty() ? "" : ", ") + names_[i];
  throw StateError(
      "[DistributedDataParallel] Expected to have finished reduction in the prior iteration "
      "before starting a new one: parameters that did not receive a gradient: " +
      missing +
      ". Every parameter must be used in producing the loss, or pass "
      "find_unused_parameters = true");
}

void Reducer::set_iteration(int authority, int divide_by) {
  GW_CHECK(authority >= 0 && authority < group_->size() && divide_by >= 1, InvalidArgumentError,
           "[DistributedDataParallel] set_iteration: authority ", authority, " is not in [0, ",
           group_->size(), ") or divisor ", divide_by, " < 1");
  authority_ = authority;
  divide_by_ = divide_by;
}

void Reducer::shadow_backward(bool find_unused) {
  std::optional<Future<void>> used;
  if (find_unused) {
    Tensor none = zeros({static_cast<int64_t>(params_.size())},
                        TensorOptions(kInt32).with_device(group_->device()));
    used = group_->allreduce(none, {.op = dist::ReduceOp::SUM})->future();
  }
  std::vector<Future<Tensor>> reduced;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    if (reduces_in_place(buckets_[k])) {  // the same collective as the others', of zeros
      std::vector<Tensor> none;
      for (size_t i : buckets_[k].params) none.push_back(zeros_like(params_[i]));
      reduced.push_back(averaged_in_place(*group_, std::move(none)));
      continue;
    }
    const Tensor& first = params_[buckets_[k].params[0]];
    GradBucket view{k, zeros({buckets_[k].numel}, first.options()), {}, k + 1 == buckets_.size()};
    for (size_t i : buckets_[k].params) view.parameters.push_back(params_[i]);
    reduced.push_back(hook_ ? hook_(*group_, view)
                            : reduced_in_place(*group_, view.buffer, dist::ReduceOp::SUM));
  }
  if (used) used->wait();
  for (auto& r : reduced) r.wait();
  if (!rebuilt_) rebuild_buckets(authority_);
}

void Reducer::on_gradient(size_t index) {
  if (!iteration_sync_) {  // no_sync(): gradients accumulate locally
    used_since_sync_[index] = true;
    return;
  }
  if (counting_) {  // static_graph's first synced backward: reduced at its end
    ++hook_counts_[index];
    return;
  }
  try {
    if (counted_) {  // static_graph: ready at the last of its hooks
      GW_CHECK(hooks_left_[index] > 0, StateError, "[DistributedDataParallel] static_graph: the ",
               "gradient hook of parameter ", names_[index], " fired more than the ",
               hook_counts_[index], " time(s) it fired in the first iteration; every iteration ",
               "must use the same parameters the same number of times");
      if (--hooks_left_[index] > 0) return;
    }
    if (used_map_.defined() && !used_reduced_)
      used_reduced_ = group_->allreduce(used_map_, {.op = dist::ReduceOp::SUM})->future();
    std::vector<size_t> unused;
    unused.swap(unused_);
    for (size_t i : unused) mark_ready(i, false);
    mark_ready(index, true);
  } catch (...) {
    reset_iteration();
    throw;
  }
}

void Reducer::finish_counted_backward() {
  if (!counting_) return;
  try {
    // Whether any rank used each parameter: kept for every later iteration.
    std::vector<int32_t> fired(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) fired[i] = hook_counts_[i] > 0 ? 1 : 0;
    Tensor used = from_vector<int32_t>(fired).to(group_->device());
    group_->allreduce(used, {.op = dist::ReduceOp::SUM})->wait();
    const std::vector<int32_t> ranks = used.to(kCPU).to_vector<int32_t>();
    static_used_.assign(params_.size(), false);
    for (size_t i = 0; i < params_.size(); ++i) static_used_[i] = ranks[i] > 0;
    // Every rank has the counts from here, even if this iteration fails below; no hook is due
    // until the next reducing forward.
    counted_ = true;
    hooks_left_.assign(params_.size(), 0);
    // Every parameter is ready now: in bucket order, so each bucket launches as it fills. (The
    // last one ends the iteration, which keeps the buckets: their rebuild follows the next
    // iteration's order, the first in which gradients are ready when they really are.)
    std::vector<size_t> order;
    for (const Bucket& b : buckets_) order.insert(order.end(), b.params.begin(), b.params.end());
    for (size_t i : order) mark_ready(i, hook_counts_[i] > 0);
  } catch (...) {
    counting_ = false;
    reset_iteration();
    throw;
  }
  counting_ = false;
}

void Reducer::reset_iteration() {
  ++backwards_ended_;
  // After a failure, reductions still running must not write into the next iteration.
  for (auto& b : buckets_) {
    finish_quietly(b.reduced);
    b.pending = b.params.size();
    b.in_place.clear();
  }
  ready_order_.clear();
  ready_.assign(params_.size(), false);
  ready_count_ = 0;
  next_to_launch_ = 0;
  unused_.clear();
  finish_quietly(used_reduced_);
  used_map_ = Tensor();
  used_since_sync_.assign(params_.size(), false);
}

bool Reducer::reduces_in_place(const Bucket& b) const {
  const DType dtype = params_[b.params[0]].dtype();  // AVG takes float32 and float64
  return group_in_place_ && !hook_ && !options_.gradient_as_bucket_view &&
         divide_by_ == group_->size() && (dtype == kFloat32 || dtype == kFloat64);
}

void Reducer::mark_ready(size_t index, bool fired) {
  GW_CHECK(!ready_[index], StateError, "[DistributedDataParallel] Expected to mark a variable ",
           "ready only once: parameter ", names_[index], " was marked ready twice in one ",
           "iteration. Either a second backward ran before the reduction of the first finished, ",
           "or the parameter's gradient hook fires more than once per backward (a parameter used ",
           "by a reentrant autograd::checkpoint and outside it, or by two of them): if the graph ",
           "is the same every iteration, pass static_graph = true");
  ready_[index] = true;
  ++ready_count_;
  if (!rebuilt_ && !counting_) ready_order_.push_back(index);
  Bucket& b = buckets_[bucket_of_[index]];
  const Tensor& p = params_[index];
  const Tensor grad = p.grad();  // undefined for a parameter unused in this iteration
  const size_t slot =
      static_cast<size_t>(std::find(b.params.begin(), b.params.end(), index) - b.params.begin());
  if (reduces_in_place(b)) {
    b.in_place.resize(b.params.size());
    const bool as_is = fired && grad.defined() && grad.is_contiguous() &&
                       grad.dtype() == p.dtype() && grad.device() == p.device();
    b.in_place[slot] = as_is ? grad : grad.defined() ? empty_like(p).copy_(grad) : zeros_like(p);
  } else {
    Tensor dst = grad_slot(b, slot);
    const int divide_by = hook_ ? 1 : divide_by_;  // the built-in reduction sums divided parts
    if (!grad.defined()) {
      dst.zero_();
    } else if (same_memory(grad, dst)) {  // a bucket view already holds it
      if (divide_by > 1) dst.div_(static_cast<double>(divide_by));
    } else {
      if (divide_by > 1)
        copy_divided(dst, grad, divide_by);
      else
        dst.copy_(grad);
      if (options_.gradient_as_bucket_view) p.set_grad(dst);
    }
  }
  --b.pending;
  launch_ready_buckets();
  if (ready_count_ == params_.size()) finish_iteration();
}

void Reducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    const size_t index = next_to_launch_++;
    Bucket& b = buckets_[index];
    GradBucket view{
        index, b.in_place.empty() ? flat_of(b) : Tensor(), {}, index + 1 == buckets_.size()};
    for (size_t i : b.params) view.parameters.push_back(params_[i]);
    std::optional<trace::Scope> span;  // made only when tracing: its name costs allocations
    if (trace::enabled())
      span.emplace("ddp", "DDP bucket " + std::to_string(index) + " ready",
                   gw::detail::str(
                       "{\"params\":", b.params.size(), ",\"bytes\":",
                       b.numel * static_cast<int64_t>(params_[b.params[0]].element_size()), "}"));
    // In place, AVG averages; through the bucket without a hook, the gradients were divided on
    // their way in and summing them averages.
    b.reduced = !b.in_place.empty() ? averaged_in_place(*group_, b.in_place)
                : hook_             ? hook_(*group_, view)
                                    : reduced_in_place(*group_, view.buffer, dist::ReduceOp::SUM);
    ++launched_;
    if (ready_count_ < params_.size()) ++launched_early_;
  }
}

Tensor Reducer::grad_slot(Bucket& b, size_t slot) {
  const Tensor& p = params_[b.params[slot]];
  return flat_of(b).narrow(0, b.offsets[slot], p.numel()).view(p.sizes());
}

const Tensor& Reducer::flat_of(Bucket& b) {
  if (!b.flat.defined()) b.flat = zeros({b.numel}, params_[b.params[0]].options());
  return b.flat;
}

std::vector<bool> Reducer::used_anywhere() {
  if (counted_) return static_used_;
  std::vector<bool> used(params_.size(), true);
  if (!used_reduced_) return used;
  used_reduced_->wait();
  const std::vector<int32_t> counts = used_map_.to(kCPU).to_vector<int32_t>();
  for (size_t i = 0; i < used.size(); ++i) used[i] = counts[i] > 0;
  return used;
}

void Reducer::finish_iteration() {
  const std::vector<bool> used = used_anywhere();
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    Tensor reduced = b.reduced->wait();
    const bool in_place = !b.in_place.empty();  // averaged in .grad itself, but for the copies
    GW_CHECK(in_place || (reduced.defined() && reduced.numel() == b.numel), InvalidArgumentError,
             "[DistributedDataParallel] the communication hook returned ",
             reduced.defined() ? reduced.numel() : 0, " elements for bucket ", k, " of ", b.numel);
    for (size_t s = 0; s < b.params.size(); ++s) {
      const Tensor& p = params_[b.params[s]];
      if (!used[b.params[s]]) continue;  // no rank used it: its .grad stays as it was
      Tensor averaged =
          in_place ? b.in_place[s] : reduced.narrow(0, b.offsets[s], p.numel()).view(p.sizes());
      Tensor grad = p.grad();
      const bool had_grad = grad.defined();
      if (!had_grad) {  // a parameter unused here but used on another rank
        grad = in_place                           ? averaged
               : options_.gradient_as_bucket_view ? grad_slot(b, s)
                                                  : averaged.clone();
        p.set_grad(grad);
      }
      if (!same_memory(grad, averaged))
        grad.copy_(averaged);
      else if (in_place && had_grad)
        grad.bump_version();  // written by the collective
    }
  }
  if (!rebuilt_ && !counting_) rebuild_buckets(authority_);
  reset_iteration();
}

// After the first iteration the buckets follow the order gradients actually became ready in
// (PyTorch's bucket rebuild), so that each bucket fills as early as it can. Every rank must
// bucket alike: the order of `root` (rank 0, or inside a Join the lowest rank still training,
// whose order is complete) is the one used.
void Reducer::rebuild_buckets(int root) {
  rebuilt_ = true;
  Tensor order;
  if (group_->rank() == root) {
    std::vector<int64_t> mine(ready_order_.begin(), ready_order_.end());
    order = from_vector<int64_t>(mine).to(group_->device());
  } else {
    order = empty({static_cast<int64_t>(params_.size())},
                  TensorOptions(kInt64).with_device(group_->device()));
  }
  group_->broadcast(order, {.root = root})->wait();
  std::vector<size_t> observed;
  for (int64_t k : order.to(kCPU).to_vector<int64_t>()) observed.push_back(static_cast<size_t>(k));
  build_buckets(observed);
  if (!options_.gradient_as_bucket_view) return;
  for (Bucket& b : buckets_)  // the gradients move into the new buckets
    for (size_t s = 0; s < b.params.size(); ++s) {
      const Tensor& p = params_[b.params[s]];
      if (!p.grad().defined()) continue;
      Tensor slot = grad_slot(b, s);
      slot.copy_(p.grad());
      p.set_grad(slot);
    }
}

}  // namespace gw::ddp
