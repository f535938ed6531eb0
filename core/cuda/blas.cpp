#include "core/cuda/blas.h"

#include <array>
#include <atomic>

#include "core/cuda/cuda_error.h"
#include "core/cuda/device.h"

namespace gw::cuda {

namespace {
std::atomic<bool> g_allow_tf32{false};

// Handles are deliberately never destroyed: a thread_local destructor running after the CUDA
// runtime has shut down (at process exit) would fail, and there are only threads x devices.
thread_local std::array<cublasHandle_t, kMaxDevices> tls_handles{};
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

cublasHandle_t blas_handle(cudaStream_t stream) {
  const int device = current_device();
  check_device_index(device, "cuda matmul");
  cublasHandle_t& handle = tls_handles[static_cast<size_t>(device)];
  if (!handle) GW_CUDA_CHECK(cublasCreate(&handle));
  GW_CUDA_CHECK(cublasSetStream(handle, stream));
  return handle;
}

}  // namespace gw::cuda
