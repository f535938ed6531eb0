// gw::dist::DistributedSampler — torch.utils.data.distributed.DistributedSampler: which samples
// of a dataset each rank reads in an epoch, so that the ranks of a data-parallel job together
// read the whole dataset once, each a different part, and all the same number of samples (DDP's
// collectives need every rank to run as many steps).
//
//   gw::dist::DistributedSampler sampler(dataset.size(), {.shuffle = true, .seed = 42});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);                       // a new order every epoch, the same on
//     for (int64_t i : sampler.indices()) ...         // every rank for the same (seed, epoch)
//   }
//
// As in PyTorch: the order is a permutation drawn from (seed + epoch) when shuffling, the range
// otherwise; rank r takes positions r, r + R, r + 2R, ... of it (R ranks). When the size does not
// divide by R, drop_last drops the tail so that every rank has floor(size / R) samples;
// otherwise the order is padded with its own first samples up to ceil(size / R) per rank. The
// rank and R default to the default process group's (dist/process_group/init_process_group.h). The
// permutation is gradwire's generator's, not PyTorch's: the same seed gives another order.
#pragma once

#include <cstdint>
#include <vector>

namespace gw::dist {

struct DistributedSamplerOptions {
  int num_replicas = -1;  // -1: the default process group's size
  int rank = -1;          // -1: this process's rank in the default process group
  bool shuffle = true;
  uint64_t seed = 0;  // the same on every rank
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // Throws InvalidArgumentError for a negative size, num_replicas < 1 or a rank outside
  // [0, num_replicas), and StateError when a default is asked for without a default group.
  DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options = {});

  // The epoch the next indices() are for (PyTorch's set_epoch); 0 until set.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // This rank's sample indices for the current epoch: num_samples() of them.
  std::vector<int64_t> indices() const;
  int64_t num_samples() const { return num_samples_; }  // per rank
  int64_t total_size() const { return num_samples_ * num_replicas_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

 private:
  int64_t size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
};

}  // namespace gw::dist
