// Fashion-MNIST from the IDX files that Debian's dataset-fashion-mnist package installs, and a
// seeded shuffling batch loader that shards the data across ranks through the library's
// DistributedSampler (PyTorch's DataLoader with a DistributedSampler).
//
//   auto train = gw::data::load_fashion_mnist(gw::data::Split::Train);
//   gw::data::Loader loader(train, {.batch_size = 64, .seed = 0});
//   for (int64_t i = 0; i < loader.num_batches(); ++i) {
//     auto [images, labels] = loader.batch(epoch, i);   // (64, 784) float32, (64) int64
//   }
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "core/tensor.h"
#include "dist/data/distributed_sampler.h"

namespace gw::data {

enum class Split { Train, Test };

struct Dataset {
  Tensor images;  // (N, 784) float32, normalized with the training set's mean and std
  Tensor labels;  // (N) int64 class indices 0..9
  int64_t size() const { return labels.numel(); }
};

// Where the Debian package puts the files; override with GW_FASHION_MNIST_DIR.
std::string fashion_mnist_dir();
// Reads and normalizes one split; throws IoError naming the file when it is missing or
// malformed. `limit` > 0 keeps only the first `limit` samples.
Dataset load_fashion_mnist(Split split, int64_t limit = 0);

// The class names, index-aligned with the labels.
const char* fashion_mnist_class(int64_t label);

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  // Sharding (gw::dist::DistributedSampler with drop_last, so that every rank runs as many
  // steps): this rank sees every world_size-th sample of the (shuffled) order.
  int rank = 0;
  int world_size = 1;
};

class Loader {
 public:
  Loader(Dataset dataset, LoaderOptions options);
  int64_t num_batches() const;
  int64_t num_samples() const { return sampler_.num_samples(); }
  // Batch `index` of `epoch`: the shuffle order depends only on (seed, epoch).
  std::pair<Tensor, Tensor> batch(int64_t epoch, int64_t index);

 private:
  void reshuffle(int64_t epoch);

  Dataset dataset_;
  LoaderOptions options_;
  dist::DistributedSampler sampler_;
  int64_t epoch_ = -1;
  Tensor order_;  // this rank's sample indices for the current epoch (int64)
};

}  // namespace gw::data
