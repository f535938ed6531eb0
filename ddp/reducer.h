// The Reducer: DDP's gradient synchronisation (the Reducer of PyTorch's DDP design note,
// pytorch.org/docs/stable/notes/ddp.html).
//
// Parameters are assigned to buckets in reverse parameters() order (roughly the order their
// gradients become ready in backward), the first bucket capped at 1 MiB so that communication
// starts early, the others at bucket_cap_mb; after the first iteration the buckets are rebuilt
// in the order the gradients actually became ready (one rank's, so that all ranks agree: rank
// 0's, or inside a Join the lowest training rank's). A post-accumulate hook on each parameter
// marks it ready; a bucket whose parameters are all ready is averaged across ranks with an
// asynchronous collective, always in bucket-index order, so that every rank issues the same
// collectives in the same order while the rest of backward runs. When the last parameter is
// ready, the hook waits for every bucket before backward returns. (So .grad is final when
// backward returns, not before: a later post-accumulate hook must not read or write it.)
//
// How a bucket is averaged depends on the group. One that reduces a list of tensors where they
// are (ProcessGroup::coalesces_in_place: the Gloo group through shared memory) averages the
// bucket's .grad tensors themselves with one allreduce_coalesced: no copies. Otherwise the hook
// copies each gradient into the bucket's flat buffer: divided, to be summed with one allreduce,
// and copied back to .grad at the end (unless .grad is a view of the bucket:
// gradient_as_bucket_view); or as it is, for a comm hook to reduce.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "core/future.h"
#include "core/tensor.h"
#include "dist/process_group/process_group.h"

namespace gw::ddp {

// A bucket as a communication hook sees it (PyTorch's GradBucket).
struct GradBucket {
  size_t index = 0;
  Tensor buffer;                   // the bucket's gradients, flattened
  std::vector<Tensor> parameters;  // whose gradients they are, in buffer order
  bool is_last = false;            // the last bucket of the iteration
  // Each parameter's gradient: a view of `buffer`, shaped like the parameter.
  std::vector<Tensor> gradients() const;
};

// Reduces a bucket across the group: returns a future of the averaged gradients (a tensor shaped
// like bucket.buffer, which the hook may also write in place and return). PyTorch's
// register_comm_hook(state, hook); state is whatever the function captures.
using CommHook = std::function<Future<Tensor>(dist::ProcessGroup& group, GradBucket& bucket)>;

namespace hooks {
// An averaging allreduce of the buffer (what DDP does without a hook, which it does faster:
// with no copy where the group reduces in place, else dividing the gradients as it copies them
// into the bucket).
CommHook allreduce();
// Halves the bytes on the wire: the buffer is divided by the world size (in place: with
// gradient_as_bucket_view, a failed iteration leaves .grad at that share), sent as float16,
// summed, and widened again into the buffer (PyTorch's fp16_compress_hook).
CommHook fp16_compress();
// The same through bfloat16 (PyTorch's bf16_compress_hook): float32's range, 8 bits of
// mantissa. PowerSGD (ddp/powersgd.h) compresses much further.
CommHook bf16_compress();
}  // namespace hooks

struct ReducerOptions {
  size_t bucket_cap_bytes = size_t{25} << 20;
  size_t first_bucket_cap_bytes = size_t{1} << 20;
  // Each parameter's .grad becomes a view into its bucket once it is ready: no copy back after
  // the reduction, and no second copy of the gradients in memory. (Without a comm hook the
  // view is divided (by the world size) when it becomes ready: after an iteration that failed,
  // .grad holds that share, not the local gradient.)
  bool gradient_as_bucket_view = false;
  // The graph is the same every iteration (DDPOptions::static_graph): the first synced backward
  // counts each parameter's hook and reduces at its end; later ones reduce a parameter at its
  // counted firing and mark the never-fired ones ready without a graph traversal.
  bool static_graph = false;
};

struct Bucket {
  std::vector<size_t> params;             // indices into the reducer's parameters
  std::vector<int64_t> offsets;           // of each parameter's gradient in `flat`
  int64_t numel = 0;                      // of all its parameters
  // The bucket's gradients, back to back: made the first time the bucket goes through it (a
  // bucket reduced in place never does, and costs no memory).
  Tensor flat;
  size_t pending = 0;                     // parameters not ready yet in this iteration
  std::optional<Future<Tensor>> reduced;  // its reduction, once launched
  // When this iteration reduces in place (Reducer::reduces_in_place): by slot, what is reduced
  // instead of the slot of `flat`: the parameter's own .grad, or a copy of it (or zeros) for a
  // parameter no gradient reached, whose .grad only changes if another rank used it.
  std::vector<Tensor> in_place;
};

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  Reducer(std::vector<Tensor> params, std::vector<std::string> names,
          std::shared_ptr<dist::ProcessGroup> group, ReducerOptions options);

  ~Reducer();  // unregisters the hooks: the parameters may outlive DDP

  // Registers the hooks (after construction: they hold a weak reference to this reducer).
  void install_hooks();
  void set_comm_hook(CommHook hook);
  // The end of a forward pass: fixes whether its backward reduces (no_sync), and with
  // `find_unused` notes the parameters `output` does not depend on, which the first hook of the
  // backward then marks ready with a zero gradient (no hook fires for them). Marking them only
  // once backward runs keeps every collective inside backward, in the same order everywhere.
  // The first hook also sums the ranks' used-parameter maps: a parameter no rank used since the
  // last synced backward (no_sync steps count) keeps its .grad untouched, as in PyTorch (except
  // that a bucket view is reduced in place).
  //
  // With static_graph, `find_unused` is ignored: the first synced backward counts how often each
  // parameter's hook fires (a parameter a reentrant checkpoint uses fires once per pass) and
  // reduces every bucket at its end; later backwards reduce a parameter when its hook has fired
  // that often, mark the parameters that never fired ready at their first hook, and keep the
  // first iteration's used-parameter map. Returns `output`, or during that first iteration a
  // view of it whose backward node queues the end-of-backward reduction (autograd's
  // queue_callback), so that it runs after a reentrant pass's hooks too.
  [[nodiscard]] Tensor prepare_for_backward(const Tensor& output, bool find_unused);
  // A new forward pass with grad enabled (DDP calls neither this nor prepare_for_backward for
  // one without, which must not disturb an iteration whose backward is still to come): throws
  // if the previous iteration's reduction did not finish (parameters that never got a gradient
  // are named).
  void prepare_for_forward();
  // Of the iteration whose forward runs: whose bucket order the first rebuild takes (rank 0
  // without a Join) and what the built-in reduction divides each gradient by (the group's size,
  // or the ranks still training inside a Join that asks for it).
  void set_iteration(int authority, int divide_by);
  // A rank that joined (dist/algorithms/join.h), after set_iteration: the collectives of the
  // others' synced backward, in their order, with zeros: the used-parameter map (with
  // `find_unused`), each bucket as they reduce it (in place, or through the comm hook, so that
  // a hook's own state stays in step), the first rebuild.
  void shadow_backward(bool find_unused);
  // Gradients accumulate locally and are not reduced for forward passes made while this is
  // false (no_sync()).
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // How many synced backward passes ended here (reduced, or failed).
  int64_t backwards_ended() const { return backwards_ended_; }
  // How many allreduces this reducer launched, and how many of them before the last gradient
  // of their iteration was ready (communication overlapping backward).
  int64_t launched() const { return launched_; }
  int64_t launched_before_last_ready() const { return launched_early_; }

 private:
  void on_gradient(size_t index);  // a parameter's post-accumulate hook
  // static_graph: the end of the first synced backward, which counted the hooks; reduces all.
  void finish_counted_backward();
  // `fired`: its gradient hook fired in this backward (else it is unused here).
  void mark_ready(size_t index, bool fired);
  // Whether this iteration's built-in reduction averages bucket `b`'s gradients where they are,
  // with one allreduce_coalesced and no copy into the bucket or back: over a group that
  // coalesces in place, without a comm hook or gradient_as_bucket_view, dividing by the
  // group's size, float32 or float64 gradients. The same on every rank.
  bool reduces_in_place(const Bucket& b) const;
  void launch_ready_buckets();
  void finish_iteration();
  void reset_iteration();  // after a failure: the next iteration starts clean
  void build_buckets(const std::vector<size_t>& order);  // parameters in `order`, capped
  void rebuild_buckets(int root);
  // The part of bucket `b` that holds the gradient of its `slot`-th parameter, shaped like it.
  Tensor grad_slot(Bucket& b, size_t slot);
  const Tensor& flat_of(Bucket& b);   // b.flat, made (zeros) if it is not yet
  std::vector<bool> used_anywhere();  // the summed used maps, or all true without find_unused

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<dist::ProcessGroup> group_;
  bool group_in_place_;  // group_->coalesces_in_place()
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // by parameter
  ReducerOptions options_;
  bool rebuilt_ = false;             // buckets follow the first iteration's ready order
  std::vector<size_t> ready_order_;  // of the first synced iteration
  std::vector<bool> ready_;          // by parameter, this iteration
  size_t ready_count_ = 0;
  size_t next_to_launch_ = 0;
  int authority_ = 0;
  int divide_by_ = 1;                  // the group's size unless set_iteration says otherwise
  bool sync_ = true;                   // the no_sync() state, read at the end of each forward
  bool iteration_sync_ = true;         // whether the current iteration's backward reduces
  std::vector<size_t> unused_;         // found by prepare_for_backward, marked by the first hook
  std::vector<bool> used_since_sync_;  // got a gradient in a no_sync backward since the last sync
  // static_graph: the hooks of each parameter per backward, counted in the first synced one
  // (while `counting_`), and what is left of them in this one; whether any rank used each.
  bool counting_ = false;
  bool counted_ = false;
  std::vector<int> hook_counts_, hooks_left_;
  std::vector<bool> static_used_;
  Tensor used_map_;  // int32 by parameter, summed across ranks by the first hook
  std::optional<Future<void>> used_reduced_;
  // Null: the built-in reduction: in place (reduces_in_place(b)), or each gradient divided by
  // divide_by_ as it is copied into its bucket (one pass over it, as PyTorch's DDP divides
  // before summing) and the bucket summed.
  CommHook hook_;
  std::vector<autograd::RemovableHandle> hook_handles_;  // one per parameter
  int64_t launched_ = 0, launched_early_ = 0;
  int64_t backwards_ended_ = 0;
};

}  // namespace gw::ddp
