// The Reducer: DDP's gradient synchronisation (ddp_design.txt, "Reducer").
//
// Parameters are assigned to buckets in reverse parameters() order (roughly the order their
// gradients become ready in backward), the first bucket capped at 1 MiB so that communication
// starts early, the others at bucket_cap_mb. A post-accumulate hook on each parameter copies its
// gradient into its bucket and marks it ready; a bucket whose parameters are all ready is
// averaged across ranks with an asynchronous allreduce, always in bucket-index order, so that
// every rank issues the same collectives in the same order while the rest of backward runs.
// When the last parameter is ready, the hook waits for every bucket and writes the averaged
// gradients back to `.grad` before backward returns.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/process_group/process_group.h"

namespace gw::ddp {

struct Bucket {
  std::vector<size_t> params;  // indices into the reducer's parameters
  std::vector<int64_t> offsets;  // of each parameter's gradient in `flat`
  Tensor flat;                 // the bucket's gradients, back to back
  size_t pending = 0;          // parameters not ready yet in this iteration
  dist::WorkPtr work;          // its allreduce, once launched
};

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  Reducer(std::vector<Tensor> params, std::vector<std::string> names,
          std::shared_ptr<dist::ProcessGroup> group, size_t bucket_cap_bytes,
          size_t first_bucket_cap_bytes);

  // Registers the hooks (after construction: they hold a weak reference to this reducer).
  void install_hooks();
  // A new forward pass: throws if the previous iteration's reduction did not finish (some
  // parameters never got a gradient: they are named).
  void prepare_for_forward();
  // Gradients accumulate locally and are not reduced while this is false (no_sync()).
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // How many allreduces this reducer launched, and how many of them before the last gradient
  // of their iteration was ready (communication overlapping backward).
  int64_t launched() const { return launched_; }
  int64_t launched_before_last_ready() const { return launched_early_; }

 private:
  void mark_ready(size_t index);
  void launch_ready_buckets();
  void finish_iteration();

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<dist::ProcessGroup> group_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // by parameter
  std::vector<bool> ready_;        // by parameter, this iteration
  size_t ready_count_ = 0;
  size_t next_to_launch_ = 0;
  bool sync_ = true;
  int64_t launched_ = 0, launched_early_ = 0;
};

}  // namespace gw::ddp
