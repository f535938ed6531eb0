// What a device's allocator holds: the bytes in tensors now, their peak, and what the allocator
// keeps from the system (torch.cuda.memory_stats' main counters, for the CPU too). Sizes are the
// allocator's rounded block sizes; the CPU's smallest tensors live inside their Storage object
// and are not counted.
//
//   gw::reset_peak_memory_stats(gw::kCPU);
//   train_step();
//   gw::MemoryStats s = gw::memory_stats(gw::kCPU);  // s.peak_allocated_bytes: the step's peak
#pragma once

#include <cstddef>

#include "core/device.h"

namespace gw {

struct MemoryStats {
  size_t allocated_bytes = 0;       // in blocks handed out
  size_t peak_allocated_bytes = 0;  // since start or reset_peak_memory_stats
  size_t reserved_bytes = 0;        // allocated, plus freed blocks cached for reuse
};

MemoryStats memory_stats(Device device = kCPU);
// The peak starts again from the bytes in use now.
void reset_peak_memory_stats(Device device = kCPU);

class Tensor;
// A copy of the CPU tensor `t` in page-locked host memory (torch's Tensor.pin_memory()), which
// copies to and from a GPU read and write directly; `t` itself in a build without CUDA or on a
// machine without a device, where nothing could use it.
Tensor pin_memory(const Tensor& t);

}  // namespace gw
