// Device memory for CUDA tensors: a caching allocator, plus cached pinned host memory.
//
// cudaMalloc and cudaFree are slow (cudaFree synchronizes the device), and a training loop
// asks for the same sizes every step. So freed blocks are not returned to the driver but kept
// in a free list per (device, stream, rounded size) and handed out again: sizes round up to
// 512 B below 1 MiB and to 2 MiB above, so near sizes share buckets. A block is reused only
// on the stream it was allocated on, where the next user is ordered after the last one; a
// tensor used on another stream must be synchronized by the caller before it is freed.
// empty_cache() returns the cached blocks to the driver (e.g. before another library
// allocates). Out of memory, the device's cache is emptied and the allocation retried once.
//
//   auto before = gw::cuda::memory_stats(0);
//   { gw::Tensor x = gw::empty({1024}, gw::cuda_device(0)); }    // freed into the cache
//   gw::Tensor y = gw::empty({1024}, gw::cuda_device(0));        // the same block again
//   gw::cuda::empty_cache();
//
// Pinned (page-locked) host memory makes host <-> device copies DMA transfers; it is cached
// the same way (pinned allocation is even slower than cudaMalloc) and used for host staging.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/shape.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace gw::cuda {

struct MemoryStats {
  size_t allocated_bytes = 0;       // in blocks handed out (rounded sizes)
  size_t reserved_bytes = 0;        // obtained from the driver: allocated + cached
  size_t peak_allocated_bytes = 0;  // since start or reset_peak_memory_stats
  uint64_t num_allocs = 0;          // requests served
  uint64_t num_cache_hits = 0;      // requests served from the cache
  uint64_t num_driver_allocs = 0;   // cudaMalloc / cudaHostAlloc calls
};

// The size a request of `nbytes` occupies: a multiple of 512 B below 1 MiB, of 2 MiB above.
size_t round_size(size_t nbytes);

// Raw blocks on `device` for `stream`; free with device_free (any thread).
void* device_malloc(size_t nbytes, int device, cudaStream_t stream);
void device_free(void* ptr);
// A Storage for a CUDA tensor on `device`, allocated for the device's current stream.
std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device);

// Returns every cached (free) block of every device to the driver.
void empty_cache();
// Stream calls this before destroying `stream` (a new stream may get the same handle): its
// cached blocks go back to the driver, and blocks still in use will be cached for the legacy
// default stream instead.
void forget_stream(cudaStream_t stream);
MemoryStats memory_stats(int device);
void reset_peak_memory_stats(int device);

// Page-locked host memory (a CPU Storage); its blocks are cached like device blocks.
void* pinned_malloc(size_t nbytes);
void pinned_free(void* ptr);
std::shared_ptr<Storage> allocate_pinned_storage(size_t nbytes);
// A CPU tensor in pinned memory, uninitialized.
Tensor empty_pinned(Shape shape, DType dtype = kFloat32);
void empty_pinned_cache();
MemoryStats pinned_memory_stats();

}  // namespace gw::cuda
