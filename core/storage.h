// A reference-counted block of memory on one device. Tensors are views into a Storage: several
// tensors (a tensor and its transposes, slices, reshapes) share one. The version counter counts
// in-place writes so that autograd can tell a saved tensor was modified after it was saved.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/device.h"

namespace gw {

// Frees a block; `ctx` lets an allocator find its bookkeeping without a std::function.
struct Deleter {
  void (*fn)(void* ctx, void* ptr) = nullptr;
  void* ctx = nullptr;
  void operator()(void* ptr) const {
    if (fn) fn(ctx, ptr);
  }
};

class Storage {
 public:
  // Memory from the device's backend allocator (64-byte aligned on CPU, uninitialized).
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device);
  // Wraps memory owned elsewhere; `deleter` runs when the last tensor lets go (may be empty).
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, Device device, Deleter deleter);

  Storage(void* data, size_t nbytes, Device device, Deleter deleter)
      : data_(data), nbytes_(nbytes), device_(device), deleter_(deleter) {}
  ~Storage() { deleter_(data_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }

  // Makes this block other memory, for every tensor that views it, and releases the old memory
  // now (PyTorch's storage resize_). Sharded data parallelism frees a gathered parameter after
  // its module's forward with reset(nullptr, 0, {}) and points it at freshly gathered memory
  // before its backward, while the tensors autograd saved still view this block. A tensor of a
  // released block refuses to be read (Tensor::raw_data). Not safe while another thread reads.
  void reset(void* data, size_t nbytes, Deleter deleter) {
    Deleter old = deleter_;
    void* old_data = data_;
    data_ = data;
    nbytes_ = nbytes;
    deleter_ = deleter;
    old(old_data);
  }
  Device device() const { return device_; }

  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void* data_;
  size_t nbytes_;
  Device device_;
  Deleter deleter_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace gw
