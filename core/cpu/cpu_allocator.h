// Host memory for CPU tensors. Blocks of 16 KiB and more are cached after use and handed out
// again for the next request of the same rounded size: a training loop allocates the same
// activation shapes every step, and fresh large blocks would otherwise come from mmap and
// pay a page fault per 4 KiB on first touch. The cache is bounded (set_cpu_cache_limit,
// default 256 MiB) and empty_cpu_cache() returns it to the system. cpu_memory_stats() counts
// the bytes in use and their peak, as the CUDA allocator does:
//
//   gw::reset_peak_cpu_memory_stats();
//   loss.backward();
//   size_t peak = gw::cpu_memory_stats().peak_allocated_bytes;
#pragma once

#include <cstddef>

namespace gw {

void set_cpu_cache_limit(size_t bytes);
void empty_cpu_cache();
size_t cpu_cached_bytes();

struct CpuMemoryStats {
  size_t allocated_bytes = 0;       // in blocks handed out (rounded sizes)
  size_t peak_allocated_bytes = 0;  // since start or reset_peak_cpu_memory_stats
  size_t cached_bytes = 0;          // freed blocks kept for reuse
};
CpuMemoryStats cpu_memory_stats();
// The peak starts again from the bytes in use now.
void reset_peak_cpu_memory_stats();

namespace cpu {
// 64-byte aligned, uninitialized; release with free_block(ptr, nbytes).
void* alloc_block(size_t nbytes);
void free_block(void* ptr, size_t nbytes);
}  // namespace cpu

}  // namespace gw
