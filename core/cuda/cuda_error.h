// Turning CUDA runtime and cuBLAS status codes into gw::CudaError.
//
// Every runtime/cuBLAS call in cuda/ goes through GW_CUDA_CHECK, so a failure surfaces as an
// exception that names the call, the code and its name instead of a silent wrong result:
//
//   GW_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream));
//   // throws gw::CudaError("[cuda] cudaMemcpyAsync(...) failed: cudaErrorInvalidValue (1): ...")
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "core/error.h"

namespace gw::cuda {

// The message of a failed call: "[cuda] <call> failed: <name> (<code>): <description>".
std::string error_message(cudaError_t status, const char* call);
std::string error_message(cublasStatus_t status, const char* call);

[[noreturn]] void throw_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_error(cublasStatus_t status, const char* call, const char* file, int line);

inline bool succeeded(cudaError_t status) { return status == cudaSuccess; }
inline bool succeeded(cublasStatus_t status) { return status == CUBLAS_STATUS_SUCCESS; }

// Clears the runtime's sticky "last error" left by a failed call we already handled, so a
// later cudaGetLastError() after a kernel launch does not report it again.
inline void clear_last_error() { (void)cudaGetLastError(); }

}  // namespace gw::cuda

// Evaluates `call` once; throws gw::CudaError naming the call when it did not succeed.
#define GW_CUDA_CHECK(call)                                                \
  do {                                                                     \
    auto gw_cuda_status_ = (call);                                         \
    if (!::gw::cuda::succeeded(gw_cuda_status_)) [[unlikely]]              \
      ::gw::cuda::throw_error(gw_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch configuration errors are reported here, not by the launch.
#define GW_CUDA_CHECK_LAUNCH() GW_CUDA_CHECK(cudaGetLastError())
