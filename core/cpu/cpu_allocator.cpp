#include "core/cpu/cpu_allocator.h"

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "core/error.h"

namespace gw {

namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kCachedMin = 16 << 10;
constexpr size_t kPage = 4096;

size_t rounded(size_t nbytes) {
  if (nbytes < kCachedMin) return (std::max<size_t>(nbytes, 1) + kAlignment - 1) & ~(kAlignment - 1);
  return (nbytes + kPage - 1) & ~(kPage - 1);
}

class BlockCache {
 public:
  void* take(size_t size) {
    std::lock_guard lock(mu_);
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= size;
    return p;
  }
  // Keeps the block, making room under the limit by freeing the largest cached blocks first
  // (a cache full of a finished phase's big blocks must not turn away the sizes in use now:
  // each of those would then be a fresh allocation, its pages faulted in again). A block
  // larger than the limit is not kept: the caller frees it.
  bool give(void* p, size_t size) {
    std::vector<void*> evicted;  // freed after the lock: munmap is slow
    {
      std::lock_guard lock(mu_);
      if (size > limit_) return false;
      while (cached_ + size > limit_) evicted.push_back(evict_largest_locked());
      free_[size].push_back(p);
      cached_ += size;
    }
    for (void* e : evicted) std::free(e);
    return true;
  }
  void set_limit(size_t bytes) {
    std::lock_guard lock(mu_);
    limit_ = bytes;
    trim_locked();
  }
  void clear() {
    std::lock_guard lock(mu_);
    size_t keep = limit_;
    limit_ = 0;
    trim_locked();
    free_.clear();  // the sizes' entries, all empty now
    limit_ = keep;
  }
  size_t cached() {
    std::lock_guard lock(mu_);
    return cached_;
  }

 private:
  // Takes a block of the largest cached size out of the cache (cached_ > 0: there is one).
  void* evict_largest_locked() {
    auto largest = std::prev(free_.end());
    while (largest->second.empty()) largest = std::prev(free_.erase(largest));
    void* p = largest->second.back();
    largest->second.pop_back();
    cached_ -= largest->first;
    return p;
  }
  void trim_locked() {
    while (cached_ > limit_) std::free(evict_largest_locked());
  }

  std::mutex mu_;
  // By size. A size's entry stays when its last block is taken: a tensor freed and made again
  // at the same size, the common case, then costs no allocation of the cache's own. (Evictions
  // drop the empty entries they pass, clear() all of them.)
  std::map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  size_t limit_ = size_t{256} << 20;
};

// Leaked on purpose: tensors freed during static destruction must still find it.
BlockCache& cache() {
  static auto* c = new BlockCache;
  return *c;
}

// Bytes in blocks handed out, and their peak.
std::atomic<size_t> g_allocated{0}, g_peak{0};

void raise_peak(size_t now) {
  size_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void count_alloc(size_t size) {
  raise_peak(g_allocated.fetch_add(size, std::memory_order_relaxed) + size);
}

}  // namespace

void set_cpu_cache_limit(size_t bytes) { cache().set_limit(bytes); }
void empty_cpu_cache() { cache().clear(); }
size_t cpu_cached_bytes() { return cache().cached(); }

CpuMemoryStats cpu_memory_stats() {
  return {.allocated_bytes = g_allocated.load(std::memory_order_relaxed),
          .peak_allocated_bytes = g_peak.load(std::memory_order_relaxed),
          .cached_bytes = cache().cached()};
}

void reset_peak_cpu_memory_stats() {
  g_peak.store(g_allocated.load(std::memory_order_relaxed), std::memory_order_relaxed);
  raise_peak(g_allocated.load(std::memory_order_relaxed));  // an allocation in between
}

namespace cpu {

void* alloc_block(size_t nbytes) {
  size_t size = rounded(nbytes);
  if (size >= kCachedMin) {
    if (void* p = cache().take(size)) {
      count_alloc(size);
      return p;
    }
  }
  void* p = std::aligned_alloc(kAlignment, size);
  GW_CHECK(p != nullptr, InvalidArgumentError, "[allocate] out of memory allocating ", nbytes,
           " bytes");
  count_alloc(size);
  return p;
}

void free_block(void* ptr, size_t nbytes) {
  size_t size = rounded(nbytes);
  g_allocated.fetch_sub(size, std::memory_order_relaxed);
  if (size >= kCachedMin && cache().give(ptr, size)) return;
  std::free(ptr);
}

}  // namespace cpu
}  // namespace gw
