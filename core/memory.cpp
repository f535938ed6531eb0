#include "core/memory.h"

#include "core/cpu/cpu_allocator.h"
#include "core/error.h"
#include "core/tensor.h"
#ifdef GW_HAVE_CUDA
#include "core/cuda/allocator.h"
#include "core/cuda/device.h"
#endif

namespace gw {

namespace {
void check_device(Device device) {
#ifndef GW_HAVE_CUDA
  GW_CHECK(device.is_cpu(), InvalidArgumentError, "[memory_stats] ", device.str(),
           ": this build has no CUDA backend");
#else
  GW_CHECK(device.is_cpu() || device.is_cuda(), InvalidArgumentError,
           "[memory_stats] unknown device ", device.str());
#endif
}
}  // namespace

MemoryStats memory_stats(Device device) {
  check_device(device);
  if (device.is_cpu()) {
    const CpuMemoryStats s = cpu_memory_stats();
    return {s.allocated_bytes, s.peak_allocated_bytes, s.allocated_bytes + s.cached_bytes};
  }
#ifdef GW_HAVE_CUDA
  const cuda::MemoryStats s = cuda::memory_stats(device.index);
  return {s.allocated_bytes, s.peak_allocated_bytes, s.reserved_bytes};
#else
  return {};
#endif
}

void reset_peak_memory_stats(Device device) {
  check_device(device);
  if (device.is_cpu()) return reset_peak_cpu_memory_stats();
#ifdef GW_HAVE_CUDA
  cuda::reset_peak_memory_stats(device.index);
#endif
}

Tensor pin_memory(const Tensor& t) {
  GW_CHECK(t.device().is_cpu(), InvalidArgumentError, "[pin_memory] ", t.device().str(),
           " memory cannot be pinned: only a CPU tensor's");
#ifdef GW_HAVE_CUDA
  if (cuda::is_available()) {
    Tensor pinned = cuda::empty_pinned(t.sizes(), t.dtype());
    pinned.copy_(t);
    return pinned;
  }
#endif
  return t;
}

}  // namespace gw
