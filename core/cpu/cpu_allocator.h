// Host memory for CPU tensors. Blocks of 16 KiB and more are cached after use and handed out
// again for the next request of the same rounded size: a training loop allocates the same
// activation shapes every step, and fresh large blocks would otherwise come from mmap and
// pay a page fault per 4 KiB on first touch. The cache is bounded (set_cpu_cache_limit,
// default 256 MiB) and empty_cpu_cache() returns it to the system.
#pragma once

#include <cstddef>

namespace gw {

void set_cpu_cache_limit(size_t bytes);
void empty_cpu_cache();
size_t cpu_cached_bytes();

namespace cpu {
// 64-byte aligned, uninitialized; release with free_block(ptr, nbytes).
void* alloc_block(size_t nbytes);
void free_block(void* ptr, size_t nbytes);
}  // namespace cpu

}  // namespace gw
