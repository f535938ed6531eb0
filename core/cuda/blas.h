// cuBLAS handles and the matmul precision setting.
//
// One cuBLAS handle per (thread, device), created on first use: a handle must not be used
// by two threads at once, and binding it to the current stream before each call is cheap.
// TF32 (10-bit mantissa inputs, float32 accumulation) makes float32 matmuls several times
// faster on Ampere and later, at a precision cost, so it is opt-in, as in PyTorch:
//
//   gw::cuda::set_allow_tf32(true);      // float32 matmuls may use TF32 tensor cores
//   gw::Tensor y = gw::matmul(a, b);
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace gw::cuda {

void set_allow_tf32(bool allow);
bool allow_tf32();

// The calling thread's handle for the current device, bound to `stream`.
cublasHandle_t blas_handle(cudaStream_t stream);

}  // namespace gw::cuda
