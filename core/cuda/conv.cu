// im2col (unfold2d) and its adjoint col2im (fold2d). fold2d gathers instead of scattering:
// each input element sums the column entries that came from it, in the CPU kernel's order
// (kernel row, then kernel column), so there are no atomics and results are deterministic.
#include "core/cuda/cuda_backend.h"
#include "core/cuda/loops.cuh"

namespace gw::cuda {

namespace {

// cols (N*C*kh*kw rows, L = oh*ow columns); row (nc, ki, kj) = nc*kh*kw + ki*kw + kj.
template <typename T>
__global__ void unfold_kernel(const T* x, T* cols, Conv2dGeometry g, int64_t total) {
  const int64_t L = g.oh * g.ow;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t col = i % L;
    int64_t t = i / L;
    const int64_t kj = t % g.kw;
    t /= g.kw;
    const int64_t ki = t % g.kh;
    const int64_t nc = t / g.kh;
    const int64_t oy = col / g.ow, ox = col % g.ow;
    const int64_t y = oy * g.sh - g.ph + ki * g.dh;
    const int64_t xx = ox * g.sw - g.pw + kj * g.dw;
    const bool inside = y >= 0 && y < g.h && xx >= 0 && xx < g.w;
    cols[i] = inside ? x[nc * g.h * g.w + y * g.w + xx] : cast<T>(0.0f);
  }
}

template <typename T>
__global__ void fold_kernel(const T* cols, T* x, Conv2dGeometry g, int64_t total) {
  using C = compute_t<T>;
  const int64_t L = g.oh * g.ow;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t plane = g.h * g.w;
    const int64_t nc = i / plane, pos = i % plane;
    const int64_t y = pos / g.w, xx = pos % g.w;
    C sum = C(0);
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      // y = oy*sh - ph + ki*dh, so oy = (y + ph - ki*dh) / sh when that divides exactly.
      const int64_t ty = y + g.ph - ki * g.dh;
      if (ty < 0 || ty % g.sh != 0) continue;
      const int64_t oy = ty / g.sh;
      if (oy >= g.oh) continue;
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const int64_t tx = xx + g.pw - kj * g.dw;
        if (tx < 0 || tx % g.sw != 0) continue;
        const int64_t ox = tx / g.sw;
        if (ox >= g.ow) continue;
        sum += cast<C>(cols[((nc * g.kh + ki) * g.kw + kj) * L + oy * g.ow + ox]);
      }
    }
    x[i] = cast<T>(sum);
  }
}

}  // namespace

void CudaBackend::unfold2d(const Tensor& x_in, const std::array<int64_t, 8>& params,
                           const Tensor& cols) {
  dispatch<CudaFloatTypes>(x_in.dtype(), "unfold", [&]<typename T>() {
    using D = cuda_type_t<T>;
    const int64_t total = cols.numel();
    if (total == 0) return;
    OnDevice on(cols);
    Tensor x = x_in.contiguous();
    Tensor c = contiguous_target(cols);
    unfold_kernel<<<grid_for(total), kThreads, 0, on.stream>>>(static_cast<const D*>(x.raw_data()),
                                                               static_cast<D*>(c.raw_data()),
                                                               conv2d_geometry(x, params), total);
    GW_CUDA_CHECK_LAUNCH();
    write_back(c, cols);
  });
}

void CudaBackend::fold2d(const Tensor& cols_in, const std::array<int64_t, 8>& params,
                         const Tensor& x) {
  dispatch<CudaFloatTypes>(x.dtype(), "fold", [&]<typename T>() {
    using D = cuda_type_t<T>;
    const int64_t total = x.numel();
    if (total == 0) return;
    OnDevice on(x);
    Tensor cols = cols_in.contiguous();
    Tensor o = contiguous_target(x);
    fold_kernel<<<grid_for(total), kThreads, 0, on.stream>>>(static_cast<const D*>(cols.raw_data()),
                                                             static_cast<D*>(o.raw_data()),
                                                             conv2d_geometry(o, params), total);
    GW_CUDA_CHECK_LAUNCH();
    write_back(o, x);
  });
}

}  // namespace gw::cuda
