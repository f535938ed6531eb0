// Raw CUDA kernels that bench_cuda measures gradwire against: the copy that bounds what an
// elementwise op can reach (memory bandwidth), and the smallest kernel, whose launch is the
// floor of an op's dispatch cost.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace gw::bench {

// dst[i] = src[i] for i < n, grid-stride, float4-wide where aligned.
void launch_copy(float* dst, const float* src, size_t n, cudaStream_t stream);
// out[0] = a[0] + b[0]: one thread.
void launch_add_one(float* out, const float* a, const float* b, cudaStream_t stream);

}  // namespace gw::bench
