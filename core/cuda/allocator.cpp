#include "core/cuda/allocator.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/cuda/cuda_error.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"

namespace gw::cuda {

namespace {

constexpr size_t kSmallGranularity = 512;
constexpr size_t kLargeThreshold = size_t{1} << 20;    // 1 MiB
constexpr size_t kLargeGranularity = size_t{2} << 20;  // 2 MiB

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// One cache: device blocks (one instance for all devices) or pinned host blocks (device -1).
// A single mutex guards it; cudaMalloc under the lock serializes allocation misses, which are
// rare once the cache is warm.
class BlockCache {
 public:
  using RawAlloc = cudaError_t (*)(void** ptr, size_t nbytes);
  using RawFree = cudaError_t (*)(void* ptr);

  BlockCache(RawAlloc raw_alloc, RawFree raw_free, const char* what)
      : raw_alloc_(raw_alloc), raw_free_(raw_free), what_(what) {}

  void* allocate(size_t nbytes, int device, cudaStream_t stream) {
    const size_t size = round_size(nbytes);
    std::lock_guard lock(mutex_);
    MemoryStats& st = stats(device);
    void* ptr = nullptr;
    auto it = free_.find(Key{device, stream, size});
    if (it != free_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      ++st.num_cache_hits;
    } else {
      ptr = allocate_from_driver(size, device);
      st.reserved_bytes += size;
      ++st.num_driver_allocs;
    }
    live_.emplace(ptr, Block{size, device, stream});
    ++st.num_allocs;
    st.allocated_bytes += size;
    st.peak_allocated_bytes = std::max(st.peak_allocated_bytes, st.allocated_bytes);
    return ptr;
  }

  void release(void* ptr) {
    if (!ptr) return;
    std::lock_guard lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;  // not ours: a deleter must not throw
    const Block b = it->second;
    live_.erase(it);
    stats(b.device).allocated_bytes -= b.size;
    free_[Key{b.device, b.stream, b.size}].push_back(ptr);
  }

  // Frees the cached blocks of `device` (all devices when kAll).
  static constexpr int kAll = -2;
  void empty(int device = kAll) {
    std::lock_guard lock(mutex_);
    empty_locked(device);
  }

  // `stream` is being destroyed, its work done: its handle may come back for a new stream
  // that has no order with the old one's work. Its cached blocks go back to the driver, and
  // blocks still in use go to the legacy default stream's cache when they are freed.
  void forget(cudaStream_t stream) {
    std::lock_guard lock(mutex_);
    free_cached([&](int, cudaStream_t s) { return s == stream; });
    for (auto& [ptr, block] : live_)
      if (block.stream == stream) block.stream = cudaStreamLegacy;
  }

  MemoryStats get_stats(int device) {
    std::lock_guard lock(mutex_);
    return stats(device);
  }

  void reset_peak(int device) {
    std::lock_guard lock(mutex_);
    MemoryStats& st = stats(device);
    st.peak_allocated_bytes = st.allocated_bytes;
  }

 private:
  struct Block {
    size_t size;
    int device;
    cudaStream_t stream;
  };
  using Key = std::tuple<int, cudaStream_t, size_t>;

  MemoryStats& stats(int device) {
    // -1 is the pinned host pool.
    if (device != -1) check_device_index(device, (std::string("cuda ") + what_).c_str());
    return stats_[static_cast<size_t>(device + 1)];
  }

  void* allocate_from_driver(size_t size, int device) {
    std::optional<DeviceGuard> guard;
    if (device >= 0) guard.emplace(device);
    void* ptr = nullptr;
    cudaError_t status = raw_alloc_(&ptr, size);
    if (status == cudaErrorMemoryAllocation) {
      // Cached blocks of other sizes may be what stands in the way: give them back, retry.
      clear_last_error();
      empty_locked(device);
      status = raw_alloc_(&ptr, size);
    }
    if (status != cudaSuccess) {
      clear_last_error();
      const MemoryStats& st = stats(device);
      throw CudaError(detail::str("[cuda ", what_, "] could not allocate ", size, " bytes",
                                  device >= 0 ? detail::str(" on cuda:", device) : std::string(),
                                  " (allocated ", st.allocated_bytes, ", reserved ",
                                  st.reserved_bytes, "): ", cudaGetErrorName(status), ": ",
                                  cudaGetErrorString(status)));
    }
    return ptr;
  }

  void empty_locked(int device) {
    free_cached([&](int dev, cudaStream_t) { return device == kAll || dev == device; });
  }

  // Returns the cached blocks of the (device, stream) pairs `matches` picks to the driver.
  template <typename Match>
  void free_cached(Match matches) {
    for (auto it = free_.begin(); it != free_.end();) {
      const auto& [dev, stream, size] = it->first;
      if (!matches(dev, stream)) {
        ++it;
        continue;
      }
      std::optional<DeviceGuard> guard;
      if (dev >= 0) guard.emplace(dev);
      for (void* p : it->second) {
        // A failure here leaves nothing we could do about it; it must not linger either.
        if (raw_free_(p) != cudaSuccess) clear_last_error();
        stats(dev).reserved_bytes -= size;
      }
      it = free_.erase(it);
    }
  }

  RawAlloc raw_alloc_;
  RawFree raw_free_;
  const char* what_;
  std::mutex mutex_;
  std::map<Key, std::vector<void*>> free_;
  std::unordered_map<void*, Block> live_;
  std::array<MemoryStats, kMaxDevices + 1> stats_{};  // [0] is the host (device -1)
};

cudaError_t device_alloc(void** ptr, size_t n) { return cudaMalloc(ptr, n); }
// Portable: a pinned block counts as pinned in every device's context (one process may drive
// several GPUs), not only in the one current when it was allocated.
cudaError_t host_alloc(void** ptr, size_t n) {
  return cudaHostAlloc(ptr, n, cudaHostAllocPortable);
}

// Never destroyed: storages freed during static destruction still return their blocks, and
// cudaFree after the runtime has shut down would fail anyway.
BlockCache& device_cache() {
  static auto* cache = new BlockCache(&device_alloc, &cudaFree, "allocate");
  return *cache;
}
BlockCache& host_cache() {
  static auto* cache = new BlockCache(&host_alloc, &cudaFreeHost, "pinned allocate");
  return *cache;
}

void free_device_block(void*, void* ptr) { device_cache().release(ptr); }
void free_host_block(void*, void* ptr) { host_cache().release(ptr); }

}  // namespace

size_t round_size(size_t nbytes) {
  if (nbytes == 0) return kSmallGranularity;
  return nbytes < kLargeThreshold ? round_up(nbytes, kSmallGranularity)
                                  : round_up(nbytes, kLargeGranularity);
}

void* device_malloc(size_t nbytes, int device, cudaStream_t stream) {
  return device_cache().allocate(nbytes, device, stream);
}
void device_free(void* ptr) { device_cache().release(ptr); }

std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device) {
  check_device(device, "cuda allocate");
  void* ptr = device_malloc(nbytes, device.index, current_stream(device.index));
  return std::make_shared<Storage>(ptr, nbytes, device, Deleter{&free_device_block, nullptr});
}

void empty_cache() { device_cache().empty(); }
void forget_stream(cudaStream_t stream) { device_cache().forget(stream); }
MemoryStats memory_stats(int device) { return device_cache().get_stats(device); }
void reset_peak_memory_stats(int device) { device_cache().reset_peak(device); }

void* pinned_malloc(size_t nbytes) { return host_cache().allocate(nbytes, -1, nullptr); }
void pinned_free(void* ptr) { host_cache().release(ptr); }

std::shared_ptr<Storage> allocate_pinned_storage(size_t nbytes) {
  GW_CHECK(is_available(), CudaError,
           "[cuda pinned allocate] pinned memory needs a CUDA device: ", no_device_reason());
  return std::make_shared<Storage>(pinned_malloc(nbytes), nbytes, kCPU,
                                   Deleter{&free_host_block, nullptr});
}

Tensor empty_pinned(Shape shape, DType dtype) {
  for (int64_t s : shape) {
    GW_CHECK(s >= 0, ShapeError, "[empty_pinned] negative size in shape ", shape_str(shape));
  }
  auto storage = allocate_pinned_storage(numel(shape) * itemsize(dtype));
  Shape strides = contiguous_strides(shape);
  return Tensor::make(std::move(storage), std::move(shape), std::move(strides), 0, dtype);
}

void empty_pinned_cache() { host_cache().empty(); }
MemoryStats pinned_memory_stats() { return host_cache().get_stats(-1); }

}  // namespace gw::cuda
