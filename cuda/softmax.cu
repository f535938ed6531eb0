// softmax and log_softmax along one dim. The contiguous input is viewed as (outer, n, inner):
// the n elements of one softmax are `inner` apart. One warp computes one softmax (max, sum of
// exponentials, then the outputs) with the same formulas as the CPU kernel.
#include <cmath>

#include "cuda/cuda_backend.h"
#include "cuda/loops.cuh"

namespace gw::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;

template <typename T>
__global__ void softmax_rows(const T* x, T* out, int64_t rows, int64_t n, int64_t inner,
                             bool log_softmax) {
  using C = compute_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  // r depends on the warp only, so every lane of a warp runs the same iterations and the
  // shuffles below always have all 32 lanes.
  for (int64_t r = warp; r < rows; r += warps) {
    const int64_t base = (r / inner) * n * inner + (r % inner);
    const T* xr = x + base;
    T* orow = out + base;
    const C neg_inf = static_cast<C>(-INFINITY);
    C m = neg_inf;
    for (int64_t i = lane; i < n; i += kWarp) {
      const C v = cast<C>(xr[i * inner]);
      m = m < v ? v : m;  // as std::max: a NaN never replaces m (it makes the sum NaN)
    }
    for (int off = kWarp / 2; off > 0; off >>= 1) {
      const C other = __shfl_xor_sync(kFullMask, m, off);
      m = m < other ? other : m;
    }
    if (m == neg_inf) m = C(0);  // an all -inf row: avoid inf - inf
    double sum = 0;
    for (int64_t i = lane; i < n; i += kWarp) {
      sum += static_cast<double>(exp(cast<C>(xr[i * inner]) - m));
    }
    for (int off = kWarp / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(kFullMask, sum, off);
    if (log_softmax) {
      // (x - m) - log(sum), not x - (m + log(sum)): m may be large next to the result.
      const C log_sum = static_cast<C>(log(sum));
      for (int64_t i = lane; i < n; i += kWarp) {
        orow[i * inner] = cast<T>((cast<C>(xr[i * inner]) - m) - log_sum);
      }
    } else {
      const C inv = static_cast<C>(1 / sum);
      for (int64_t i = lane; i < n; i += kWarp) {
        orow[i * inner] = cast<T>(exp(cast<C>(xr[i * inner]) - m) * inv);
      }
    }
  }
}

}  // namespace

void CudaBackend::softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out) {
  const char* name = log ? "log_softmax" : "softmax";
  dispatch<CudaFloatTypes>(in.dtype(), name, [&]<typename T>() {
    using D = cuda_type_t<T>;
    if (in.numel() == 0) return;
    OnDevice on(out);
    Tensor x = in.contiguous();
    Tensor o = contiguous_target(out);
    const int64_t n = x.size(dim);
    int64_t inner = 1, outer = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const int64_t rows = outer * inner;
    softmax_rows<<<grid_for(rows * kWarp), kThreads, 0, on.stream>>>(  // a warp per row
        static_cast<const D*>(x.raw_data()), static_cast<D*>(o.raw_data()), rows, n, inner, log);
    GW_CUDA_CHECK_LAUNCH();
    write_back(o, out);
  });
}

}  // namespace gw::cuda
