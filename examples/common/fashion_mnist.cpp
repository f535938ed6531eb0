#include "examples/common/fashion_mnist.h"

#include <zlib.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/ops.h"

namespace gw::data {

namespace {

// Per-pixel mean and std of the Fashion-MNIST training images (scaled to [0, 1]).
constexpr float kMean = 0.2860f, kStd = 0.3530f;

std::vector<uint8_t> read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  GW_CHECK(f != nullptr, IoError, "[load_fashion_mnist] cannot open ", path,
           " (install Debian's dataset-fashion-mnist, or set GW_FASHION_MNIST_DIR)");
  std::vector<uint8_t> out;
  std::vector<uint8_t> buf(1 << 20);
  int n;
  while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0) {
    out.insert(out.end(), buf.begin(), buf.begin() + n);
  }
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string error = err != Z_OK && err != Z_STREAM_END ? msg : "";
  gzclose(f);
  GW_CHECK(n == 0 && error.empty(), IoError, "[load_fashion_mnist] error reading ", path, ": ",
           error);
  return out;
}

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) |
         uint32_t{b[at + 3]};
}

// IDX: magic (0, 0, type 0x08 = ubyte, ndim), big-endian dims, then the bytes.
std::vector<uint8_t> read_idx(const std::string& path, uint8_t ndim, std::vector<int64_t>& dims) {
  std::vector<uint8_t> b = read_gz(path);
  GW_CHECK(b.size() >= 4 + 4u * ndim && b[0] == 0 && b[1] == 0 && b[2] == 0x08 && b[3] == ndim,
           IoError, "[load_fashion_mnist] ", path, " is not an IDX file of ", int(ndim),
           "-D unsigned bytes");
  size_t count = 1;
  dims.clear();
  for (uint8_t i = 0; i < ndim; ++i) {
    dims.push_back(be32(b, 4 + 4 * i));
    count *= static_cast<size_t>(dims.back());
  }
  size_t header = 4 + 4u * ndim;
  GW_CHECK(b.size() == header + count, IoError, "[load_fashion_mnist] ", path, " holds ",
           b.size() - header, " data bytes, its header promises ", count);
  return std::vector<uint8_t>(b.begin() + static_cast<long>(header), b.end());
}

}  // namespace

std::string fashion_mnist_dir() {
  const char* env = std::getenv("GW_FASHION_MNIST_DIR");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

Dataset load_fashion_mnist(Split split, int64_t limit) {
  const std::string prefix =
      fashion_mnist_dir() + (split == Split::Train ? "/train" : "/t10k");
  std::vector<int64_t> idims, ldims;
  std::vector<uint8_t> pixels = read_idx(prefix + "-images-idx3-ubyte.gz", 3, idims);
  std::vector<uint8_t> labels = read_idx(prefix + "-labels-idx1-ubyte.gz", 1, ldims);
  GW_CHECK(idims[0] == ldims[0] && idims[1] == 28 && idims[2] == 28, IoError,
           "[load_fashion_mnist] ", idims[0], " images of ", idims[1], "x", idims[2], " and ",
           ldims[0], " labels do not match");
  int64_t n = limit > 0 ? std::min(limit, idims[0]) : idims[0];
  Dataset ds{empty({n, 784}), empty({n}, kInt64)};
  float* img = ds.images.data_ptr<float>();
  for (int64_t i = 0; i < n * 784; ++i) img[i] = (pixels[i] / 255.0f - kMean) / kStd;
  int64_t* lab = ds.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    GW_CHECK(labels[i] < 10, IoError, "[load_fashion_mnist] label ", int(labels[i]), " at ", i,
             " is not a class index 0..9");
    lab[i] = labels[i];
  }
  return ds;
}

const char* fashion_mnist_class(int64_t label) {
  static const char* kNames[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return label >= 0 && label < 10 ? kNames[label] : "?";
}

namespace {
// The sampler reads -1 as "the default group's": the loader takes explicit values only.
LoaderOptions checked(LoaderOptions o) {
  GW_CHECK(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, InvalidArgumentError,
           "[Loader] rank ", o.rank, " is not in world of size ", o.world_size);
  return o;
}
}  // namespace

Loader::Loader(Dataset dataset, LoaderOptions options)
    : dataset_(std::move(dataset)),
      options_(checked(options)),
      sampler_(dataset_.size(), {.num_replicas = options.world_size,
                                 .rank = options.rank,
                                 .shuffle = options.shuffle,
                                 .seed = options.seed,
                                 .drop_last = true}) {
  GW_CHECK(options_.batch_size > 0, InvalidArgumentError,
           "[Loader] batch_size must be positive, got ", options_.batch_size);
}

int64_t Loader::num_batches() const {
  const int64_t samples = sampler_.num_samples();
  return options_.drop_last ? samples / options_.batch_size
                            : (samples + options_.batch_size - 1) / options_.batch_size;
}

void Loader::reshuffle(int64_t epoch) {
  sampler_.set_epoch(epoch);
  order_ = from_vector<int64_t>(sampler_.indices());
  epoch_ = epoch;
}

std::pair<Tensor, Tensor> Loader::batch(int64_t epoch, int64_t index) {
  GW_CHECK(index >= 0 && index < num_batches(), IndexError, "[Loader] batch ", index,
           " is out of range for ", num_batches(), " batches");
  if (epoch != epoch_) reshuffle(epoch);
  int64_t start = index * options_.batch_size;
  int64_t len = std::min(options_.batch_size, sampler_.num_samples() - start);
  Tensor idx = order_.narrow(0, start, len);
  return {index_select(dataset_.images, 0, idx), index_select(dataset_.labels, 0, idx)};
}

}  // namespace gw::data
