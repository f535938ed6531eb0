// The receiver's side of core/ipc.h: other processes' memory, mapped once and reused, since a
// sender's caching allocator hands out the same blocks again. Internal to core/ipc.cpp, apart
// so that its bookkeeping is tested without a GPU (tests/core/test_ipc_cache.cpp).
//
// Mapped memory cannot be freed by its owner, so the cache keeps a bounded number of bytes and
// entries, evicting the least recently used. The driver's functions run under the cache's lock
// and must not call back into it. A mapping is open while it is cached or held by a
// copy (Held), and is closed by whichever lets go last. Opening and closing both happen under
// the cache's lock, so a handle is never opened while it is open (the driver refuses that).
//
//   IpcMappingCache cache({.open = ..., .close = ...});
//   {
//     IpcMappingCache::Held m = cache.hold(handle, 0, sender_pid);   // opened, or reused
//     copy_from(m->base + offset, bytes);
//   }                                                                 // still cached
//   cache.forget(sender_pid);                                         // closed
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <utility>

namespace gw::detail {

struct IpcMappingLimits {
  size_t max_entries = 1024;
  size_t max_bytes = size_t{16} << 30;
};

class IpcMappingCache {
 public:
  using Handle = std::array<uint8_t, 64>;
  struct Opened {
    char* base = nullptr;
    size_t size = 0;
  };
  struct Driver {
    std::function<Opened(const Handle&, int device)> open;  // throws when it cannot
    std::function<void(char* base, int device)> close;      // must not throw
  };
  struct Mapping {
    Opened memory;
    int device = 0;
    int64_t sender = 0;
    int holders = 0;
    bool cached = false;
    uint64_t last_use = 0;
  };

  // A mapping held for one copy; lets go when destroyed.
  class Held {
   public:
    Held(IpcMappingCache& cache, Mapping& m) : cache_(&cache), m_(&m) {}
    ~Held() {
      if (m_) cache_->let_go(*m_);
    }
    Held(Held&& o) noexcept : cache_(o.cache_), m_(std::exchange(o.m_, nullptr)) {}
    Held& operator=(Held&&) = delete;
    const Opened* operator->() const { return &m_->memory; }

   private:
    IpcMappingCache* cache_;
    Mapping* m_;  // a std::map node: stays put while held
  };

  explicit IpcMappingCache(Driver driver, IpcMappingLimits limits = {})
      : driver_(std::move(driver)), limits_(limits) {}
  ~IpcMappingCache() {
    for (auto& [key, m] : mappings_) driver_.close(m.memory.base, m.device);
  }
  IpcMappingCache(const IpcMappingCache&) = delete;
  IpcMappingCache& operator=(const IpcMappingCache&) = delete;

  Held hold(const Handle& h, int device, int64_t sender) {
    std::lock_guard lock(mu_);
    const Key key{h, device};
    auto it = mappings_.find(key);
    if (it == mappings_.end()) {
      Mapping m;
      m.memory = driver_.open(h, device);
      m.device = device;
      m.sender = sender;
      try {
        it = mappings_.emplace(key, m).first;
      } catch (...) {
        driver_.close(m.memory.base, device);
        throw;
      }
    }
    Mapping& m = it->second;
    ++m.holders;
    m.last_use = ++clock_;
    if (!m.cached) {
      m.cached = true;
      ++cached_;
      bytes_ += m.memory.size;
    }
    // Never the one just held: a single mapping past the limits is still kept while in use.
    while ((cached_ > limits_.max_entries || bytes_ > limits_.max_bytes) && cached_ > 1) evict(&m);
    return Held(*this, m);
  }

  // Takes `sender`'s mappings out of the cache: closed now, or when their copies let go.
  void forget(int64_t sender) {
    std::lock_guard lock(mu_);
    for (auto it = mappings_.begin(); it != mappings_.end();) {
      auto next = std::next(it);
      if (it->second.sender == sender && it->second.cached) uncache(it);
      it = next;
    }
  }

  size_t open_count() const {
    std::lock_guard lock(mu_);
    return mappings_.size();
  }

 private:
  using Key = std::pair<Handle, int>;
  using Iterator = std::map<Key, Mapping>::iterator;

  // The least recently used cached mapping other than `keep` leaves the cache. Caller holds mu_.
  void evict(const Mapping* keep) {
    auto oldest = mappings_.end();
    for (auto it = mappings_.begin(); it != mappings_.end(); ++it)
      if (it->second.cached && &it->second != keep &&
          (oldest == mappings_.end() || it->second.last_use < oldest->second.last_use))
        oldest = it;
    if (oldest != mappings_.end()) uncache(oldest);
  }

  // Caller holds mu_.
  void uncache(Iterator it) {
    it->second.cached = false;
    --cached_;
    bytes_ -= it->second.memory.size;
    if (it->second.holders == 0) close(it);
  }

  void let_go(Mapping& m) {
    std::lock_guard lock(mu_);
    if (--m.holders > 0 || m.cached) return;
    for (auto it = mappings_.begin(); it != mappings_.end(); ++it)
      if (&it->second == &m) return close(it);
  }

  // Caller holds mu_.
  void close(Iterator it) {
    driver_.close(it->second.memory.base, it->second.device);
    mappings_.erase(it);
  }

  const Driver driver_;
  const IpcMappingLimits limits_;
  mutable std::mutex mu_;
  std::map<Key, Mapping> mappings_;  // every mapping open now
  size_t cached_ = 0, bytes_ = 0;    // of the cached ones
  uint64_t clock_ = 0;
};

}  // namespace gw::detail
