// gw::dist::ProcessGroup — collectives over a fixed group of ranks (c10d's ProcessGroup).
//
// Mental model (torch.distributed): every rank of the group calls the same collectives in the
// same order; each returns a Work at once and runs in the background, in order. Tensors are
// dense CPU tensors (CUDA tensors go to the NCCL group) and are updated in place, as in PyTorch:
//
//   auto pg = gw::dist::init_process_group("gloo", "env://", rank, world_size);
//   gw::Tensor t = gw::ones({4}) * (rank + 1);
//   pg->allreduce(t)->wait();                         // every rank: 1 + 2 + ... + world_size
//   pg->broadcast(t, {.root = 0})->wait();
//   std::vector<gw::Tensor> all = ...;                 // world_size tensors shaped like t
//   pg->allgather(all, t)->wait();
//
// A rank that dies, or a collective that passes its timeout, fails the Work on every other
// rank (gw::IoError / gw::TimeoutError), and the group is unusable afterwards, as in PyTorch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/process_group/types.h"
#include "dist/process_group/work.h"
#include "store/store.h"

namespace gw::dist {

class ProcessGroup {
 public:
  // `store`: the group's own namespace of the job's store (monitored_barrier's keys go under
  // it); may be null for a group that offers no monitored_barrier.
  ProcessGroup(int rank, int size, std::shared_ptr<store::Store> store = nullptr);
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend() const = 0;
  // Where this group's tensors must be: the CPU for Gloo, this rank's GPU for NCCL.
  virtual Device device() const { return kCPU; }

  virtual WorkPtr allreduce(Tensor& tensor, AllreduceOptions options = {}) = 0;
  // Several tensors reduced as one buffer (DDP's buckets, small tensors).
  virtual WorkPtr allreduce_coalesced(std::vector<Tensor>& tensors,
                                      AllreduceOptions options = {}) = 0;
  // Whether allreduce_coalesced reduces disjoint tensors where they are, with no flat copy of
  // them (the Gloo group through shared memory): then DDP reduces gradients without its bucket.
  virtual bool coalesces_in_place() const { return false; }
  virtual WorkPtr broadcast(Tensor& tensor, BroadcastOptions options = {}) = 0;
  // The result lands in `tensor` on the root only.
  virtual WorkPtr reduce(Tensor& tensor, ReduceOptions options = {}) = 0;
  // outputs: size() tensors shaped like `input`.
  virtual WorkPtr allgather(std::vector<Tensor>& outputs, const Tensor& input,
                            CollectiveOptions options = {}) = 0;
  // outputs: size() tensors on the root, empty elsewhere.
  virtual WorkPtr gather(std::vector<Tensor>& outputs, const Tensor& input,
                         GatherOptions options = {}) = 0;
  // inputs: size() tensors on the root, empty elsewhere.
  virtual WorkPtr scatter(Tensor& output, const std::vector<Tensor>& inputs,
                          ScatterOptions options = {}) = 0;
  // inputs: size() tensors shaped like `output`; output = op over ranks of inputs[rank()].
  virtual WorkPtr reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                 CollectiveOptions options = {}) = 0;
  // The flat forms (torch.distributed's all_gather_into_tensor and reduce_scatter_tensor), what
  // sharded data parallelism runs on: one buffer holds size() equal chunks back to back, rank
  // r's at r * chunk. `output` gets every rank's `input`:
  virtual WorkPtr all_gather_into_tensor(Tensor& output, const Tensor& input,
                                         CollectiveOptions options = {}) = 0;
  // and `output` = op over ranks of their `input`'s chunk rank().
  virtual WorkPtr reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                        CollectiveOptions options = {}) = 0;
  // inputs[i] goes to rank i; outputs[j] comes from rank j.
  virtual WorkPtr alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                           CollectiveOptions options = {}) = 0;
  virtual WorkPtr barrier(CollectiveOptions options = {}) = 0;
  virtual WorkPtr send(const Tensor& tensor, int dst, int tag = 0,
                       CollectiveOptions options = {}) = 0;
  virtual WorkPtr recv(Tensor& tensor, int src, int tag = 0, CollectiveOptions options = {}) = 0;

  // c10d's monitored_barrier: a barrier through the group's store that, when a rank does not
  // come within `timeout`, throws TimeoutError on every rank that came, naming every rank that
  // did not ("[monitored_barrier] rank 2 did not arrive within 1000 ms"); a rank arriving after
  // the others gave up throws too. For finding the rank that is stuck (c10d's, with
  // wait_all_ranks=True). StateError on a group without a store.
  void monitored_barrier(Milliseconds timeout = kDefaultCollectiveTimeout);

  // Checks that every rank passes tensors of the same count, shapes and dtypes (two small
  // allgathers); throws InvalidArgumentError on every rank otherwise, naming the tensor, both
  // shapes and both ranks. DDP runs it on its parameters; `what` names the caller.
  void check_same_shapes(const std::vector<Tensor>& tensors, const std::vector<std::string>& names,
                         const std::string& what);
  void check_same_shape(const Tensor& tensor, const std::string& what);
  // One contiguous buffer holding `parts` back to back, on their device.
  static Tensor concat(const std::vector<Tensor>& parts);
  // The way back: copies `flat`'s bytes into `parts` in order (CPU tensors).
  static void split(const Tensor& flat, std::vector<Tensor>& parts);
  // t /= n in place (a CPU floating point tensor): AVG after a SUM.
  static void divide(const Tensor& t, int n, const char* op);
  // The same over `count` elements at `p`.
  template <typename T>
  static void divide(T* p, size_t count, int n) {
    const T divisor = static_cast<T>(n);
    for (size_t i = 0; i < count; ++i) p[i] /= divisor;  // vectorized
  }
  // Throws naming `op` unless `reduce` suits `t` (AVG needs a floating point tensor).
  static void check_avg(const char* op, const Tensor& t, ReduceOp reduce);

 protected:
  // Argument checks shared by the backends, made before anything is queued; each throws
  // InvalidArgumentError naming `op` and the values.
  // Defined, on device(), contiguous.
  void check_tensor(const char* op, const Tensor& t, const char* what = "tensor") const;
  // check_tensor, and `like`'s dtype and element count.
  void check_like(const char* op, const Tensor& t, const Tensor& like, const char* what) const;
  void check_count(const char* op, size_t got, const char* what) const;  // one per rank
  void check_rank(const char* op, int r, const char* what) const;        // in [0, size())
  // send/recv: the tensor, a peer other than this rank, a tag >= 0.
  void check_p2p(const char* op, const Tensor& t, int peer, int tag) const;
  // The arguments of these collectives (besides the dtypes and reduce ops a backend supports):
  // several tensors of one dtype; size() outputs like `input`; size() inputs like `output`;
  // size() inputs and outputs all like inputs[0].
  void check_coalesced(const char* op, const std::vector<Tensor>& tensors) const;
  void check_allgather(const std::vector<Tensor>& outputs, const Tensor& input) const;
  void check_reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs) const;
  // A flat collective's buffers: `whole` holds size() chunks like `chunk` (dtype and count).
  void check_flat(const char* op, const Tensor& whole, const char* whole_name, const Tensor& chunk,
                  const char* chunk_name) const;
  void check_alltoall(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) const;
  // gather's outputs / scatter's inputs: one per rank like `like` on the root, none elsewhere.
  void check_root_parts(const char* op, const std::vector<Tensor>& parts, const Tensor& like,
                        int root, const char* what) const;
  // A backend constructor's own arguments.
  static void check_group_args(const char* who, bool has_store, int rank, int size,
                               Milliseconds timeout);

 private:
  int rank_;
  int size_;
  std::shared_ptr<store::Store> barrier_store_;
  int64_t barriers_ = 0;  // monitored_barrier calls so far: each has its own keys
};

}  // namespace gw::dist
