#include "dist/data/distributed_sampler.h"

#include <numeric>

#include "core/error.h"
#include "core/random.h"
#include "dist/process_group/init_process_group.h"

namespace gw::dist {

namespace {
int from_default_group(int value, bool want_rank) {
  if (value != -1) return value;
  GW_CHECK(dist::is_initialized(), StateError, "[DistributedSampler] no ",
           want_rank ? "rank" : "num_replicas",
           " given and no default process group to take it from (init_process_group)");
  const auto pg = dist::default_process_group();
  return want_rank ? pg->rank() : pg->size();
}
}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options)
    : size_(dataset_size),
      num_replicas_(from_default_group(options.num_replicas, false)),
      rank_(from_default_group(options.rank, true)),
      shuffle_(options.shuffle),
      seed_(options.seed) {
  GW_CHECK(size_ >= 0, InvalidArgumentError, "[DistributedSampler] dataset size ", size_,
           " is negative");
  GW_CHECK(num_replicas_ >= 1, InvalidArgumentError, "[DistributedSampler] num_replicas ",
           num_replicas_, " must be at least 1");
  GW_CHECK(rank_ >= 0 && rank_ < num_replicas_, InvalidArgumentError, "[DistributedSampler] rank ",
           rank_, " is not in [0, ", num_replicas_, ")");
  const int64_t r = num_replicas_;
  // drop_last: the largest share every rank can have; otherwise the smallest that covers all.
  num_samples_ = options.drop_last ? size_ / r : (size_ + r - 1) / r;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle_) {  // Fisher-Yates with the generator of (seed + epoch)
    Generator gen(seed_ + static_cast<uint64_t>(epoch_));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[gen.next_below(i)]);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  // Position p of the padded (or cut) order is order[p % size]: padding repeats the start.
  for (int64_t p = rank_; p < total_size(); p += num_replicas_)
    mine.push_back(order[static_cast<size_t>(p % size_)]);
  return mine;
}

}  // namespace gw::dist
