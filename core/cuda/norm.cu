// layer_norm, forward and backward, as fused row kernels.
//
// Forward: a block per row holds the row in registers (up to 8192 float32; beyond, in shared
// memory when it fits in 48 KiB, else it is read again) and takes the mean, then the variance
// of the held values (two passes, exact where a sum of squares would cancel), then writes y:
// one read and one write of memory.
// Backward: a block per row for the input's gradient (two sums per row, then the write), and
// for the weight and bias a thread per column summing its chunk of rows into per-chunk
// partials, which a second small kernel adds up. Statistics are in compute_t (float for
// 16-bit tensors).
#include "core/cuda/cuda_backend.h"
#include "core/cuda/loops.cuh"

namespace gw::cuda {

namespace {

constexpr int kNormBlock = 256;
constexpr int64_t kBusyThreads = int64_t{1} << 18;

template <typename T>
__device__ __forceinline__ compute_t<T> value_or(const T* p, int64_t i, compute_t<T> fallback) {
  return p ? cast<compute_t<T>>(p[i]) : fallback;
}

template <typename T, int V>
__global__ void layer_norm_rows(const T* x, const T* weight, const T* bias, T* y,
                                compute_t<T>* mean, compute_t<T>* rstd, int64_t rows, int64_t n,
                                compute_t<T> eps, bool cached) {
  using C = compute_t<T>;
  using P = Pack<T, V>;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  P* cache = reinterpret_cast<P*>(shared_raw);
  const int64_t packs = n / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(x + r * n);
    const P* src = cached ? cache : xr;
    C sum = 0;
    for (int64_t i = threadIdx.x; i < packs; i += kNormBlock) {
      const P p = xr[i];
      if (cached) cache[i] = p;
#pragma unroll
      for (int j = 0; j < V; ++j) sum += cast<C>(p.v[j]);
    }
    const C mu = block_all_reduce<kNormBlock>(sum, SumOf{}) / static_cast<C>(n);
    C squares = 0;
    for (int64_t i = threadIdx.x; i < packs; i += kNormBlock) {
      const P p = src[i];  // each thread reads back the packs it wrote
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const C d = cast<C>(p.v[j]) - mu;
        squares += d * d;
      }
    }
    const C inv =
        C(1) / sqrt(block_all_reduce<kNormBlock>(squares, SumOf{}) / static_cast<C>(n) + eps);
    for (int64_t i = threadIdx.x; i < packs; i += kNormBlock) {
      const P p = src[i];
      P o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int64_t k = i * V + j;
        o.v[j] = cast<T>((cast<C>(p.v[j]) - mu) * inv * value_or(weight, k, C(1)) +
                         value_or(bias, k, C(0)));
      }
      reinterpret_cast<P*>(y + r * n)[i] = o;
    }
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = inv;
    }
    __syncthreads();  // the cache is refilled by the next row
  }
}

// The forward with the row in registers (K packs per thread): no shared-memory round trip.
// Rows up to kNormBlock * kMaxRegPacks * V elements (8192 float32).
constexpr int kMaxRegPacks = 8;

template <typename T, int V, int K>
__global__ void layer_norm_register_rows(const T* x, const T* weight, const T* bias, T* y,
                                         compute_t<T>* mean, compute_t<T>* rstd, int64_t rows,
                                         int64_t n, compute_t<T> eps) {
  using C = compute_t<T>;
  using P = Pack<T, V>;
  const int64_t packs = n / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(x + r * n);
    C v[K][V];
    C sum = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t i = threadIdx.x + k * kNormBlock;
      P p{};  // zeros past the row: they add nothing to the sum
      if (i < packs) p = xr[i];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        v[k][j] = cast<C>(p.v[j]);
        sum += v[k][j];
      }
    }
    const C mu = block_all_reduce<kNormBlock>(sum, SumOf{}) / static_cast<C>(n);
    C squares = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (threadIdx.x + k * kNormBlock >= packs) break;
#pragma unroll
      for (int j = 0; j < V; ++j) squares += (v[k][j] - mu) * (v[k][j] - mu);
    }
    const C inv =
        C(1) / sqrt(block_all_reduce<kNormBlock>(squares, SumOf{}) / static_cast<C>(n) + eps);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t i = threadIdx.x + k * kNormBlock;
      if (i >= packs) break;
      P o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int64_t c = i * V + j;
        o.v[j] =
            cast<T>((v[k][j] - mu) * inv * value_or(weight, c, C(1)) + value_or(bias, c, C(0)));
      }
      reinterpret_cast<P*>(y + r * n)[i] = o;
    }
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = inv;
    }
  }
}

// gx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = gy * weight, a block per row.
template <typename T, int V>
__global__ void layer_norm_input_grad(const T* gy, const T* x, const T* weight,
                                      const compute_t<T>* mean, const compute_t<T>* rstd, T* gx,
                                      int64_t rows, int64_t n) {
  using C = compute_t<T>;
  using P = Pack<T, V>;
  const int64_t packs = n / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const P* gr = reinterpret_cast<const P*>(gy + r * n);
    const P* xr = reinterpret_cast<const P*>(x + r * n);
    const C mu = mean[r], inv = rstd[r];
    C sum_g = 0, sum_gx = 0;
    for (int64_t i = threadIdx.x; i < packs; i += kNormBlock) {
      const P g = gr[i], xv = xr[i];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const C gi = cast<C>(g.v[j]) * value_or(weight, i * V + j, C(1));
        sum_g += gi;
        sum_gx += gi * (cast<C>(xv.v[j]) - mu) * inv;
      }
    }
    const C mean_g = block_all_reduce<kNormBlock>(sum_g, SumOf{}) / static_cast<C>(n);
    const C mean_gx = block_all_reduce<kNormBlock>(sum_gx, SumOf{}) / static_cast<C>(n);
    for (int64_t i = threadIdx.x; i < packs; i += kNormBlock) {
      const P g = gr[i], xv = xr[i];
      P o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const C gi = cast<C>(g.v[j]) * value_or(weight, i * V + j, C(1));
        const C xhat = (cast<C>(xv.v[j]) - mu) * inv;
        o.v[j] = cast<T>(inv * (gi - mean_g - xhat * mean_gx));
      }
      reinterpret_cast<P*>(gx + r * n)[i] = o;
    }
  }
}

// Per chunk c of rows (grid.y) and column k: partial_w[c][k] = sum of gy * xhat and
// partial_b[c][k] = sum of gy over the chunk's rows.
template <typename T>
__global__ void layer_norm_param_partials(const T* gy, const T* x, const compute_t<T>* mean,
                                          const compute_t<T>* rstd, compute_t<T>* partial_w,
                                          compute_t<T>* partial_b, int64_t rows, int64_t n,
                                          int64_t chunk) {
  using C = compute_t<T>;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const int64_t begin = blockIdx.y * chunk, end = begin + chunk < rows ? begin + chunk : rows;
  C sw = 0, sb = 0;
  for (int64_t r = begin; r < end; ++r) {
    const C g = cast<C>(gy[r * n + k]);
    sw += g * (cast<C>(x[r * n + k]) - mean[r]) * rstd[r];
    sb += g;
  }
  partial_w[blockIdx.y * n + k] = sw;
  partial_b[blockIdx.y * n + k] = sb;
}

template <typename T>
__global__ void layer_norm_param_finish(const compute_t<T>* partial_w,
                                        const compute_t<T>* partial_b, T* gw, T* gb, int64_t chunks,
                                        int64_t n) {
  using C = compute_t<T>;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  C sw = 0, sb = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    sw += partial_w[c * n + k];
    sb += partial_b[c * n + k];
  }
  if (gw) gw[k] = cast<T>(sw);
  if (gb) gb[k] = cast<T>(sb);
}

template <typename D>
const D* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const D*>(t.raw_data()) : nullptr;
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, kMaxBlocks));
}

}  // namespace

void CudaBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  dispatch<CudaFloatTypes>(x.dtype(), "layer_norm", [&]<typename T>() {
    using D = cuda_type_t<T>;
    using C = compute_t<D>;
    const int64_t rows = mean.numel(), n = rows == 0 ? 0 : x.numel() / rows;
    if (rows == 0 || n == 0) return;
    OnDevice on(y);
    const auto *px = static_cast<const D*>(x.raw_data()), *pw = data_or_null<D>(weight),
               *pb = data_or_null<D>(bias);
    auto* py = static_cast<D*>(y.raw_data());
    auto *pm = static_cast<C*>(mean.raw_data()), *pr = static_cast<C*>(rstd.raw_data());
    const size_t row_bytes = static_cast<size_t>(n) * sizeof(D);
    const bool cached = row_bytes <= kRowCacheBytes;
    auto launch = [&]<int V>() {
      const int64_t per_thread = (n / V + kNormBlock - 1) / kNormBlock;
      auto in_registers = [&]<int K>() {
        layer_norm_register_rows<D, V, K><<<row_blocks(rows), kNormBlock, 0, on.stream>>>(
            px, pw, pb, py, pm, pr, rows, n, static_cast<C>(eps));
      };
      if (per_thread <= 1) {
        in_registers.template operator()<1>();
      } else if (per_thread <= 2) {
        in_registers.template operator()<2>();
      } else if (per_thread <= 4) {
        in_registers.template operator()<4>();
      } else if (per_thread <= kMaxRegPacks) {
        in_registers.template operator()<kMaxRegPacks>();
      } else {
        layer_norm_rows<D, V><<<row_blocks(rows), kNormBlock, cached ? row_bytes : 0, on.stream>>>(
            px, pw, pb, py, pm, pr, rows, n, static_cast<C>(eps), cached);
      }
    };
    if (n % kVecWidth<D> == 0 && aligned16(px) && aligned16(py)) {
      launch.template operator()<kVecWidth<D>>();
    } else {
      launch.template operator()<1>();
    }
    GW_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight,
                                      const Tensor& mean, const Tensor& rstd, const Tensor& gx,
                                      const Tensor& gweight, const Tensor& gbias) {
  dispatch<CudaFloatTypes>(x.dtype(), "layer_norm_backward", [&]<typename T>() {
    using D = cuda_type_t<T>;
    using C = compute_t<D>;
    const int64_t rows = mean.numel(), n = rows == 0 ? 0 : x.numel() / rows;
    OnDevice on(x);
    const auto *pg = static_cast<const D*>(gy.raw_data()),
               *px = static_cast<const D*>(x.raw_data());
    const auto *pm = static_cast<const C*>(mean.raw_data()),
               *pr = static_cast<const C*>(rstd.raw_data());
    if (gx.defined() && rows > 0 && n > 0) {
      auto* po = static_cast<D*>(gx.raw_data());
      const D* pw = data_or_null<D>(weight);
      if (n % kVecWidth<D> == 0 && aligned16(pg) && aligned16(px) && aligned16(po)) {
        layer_norm_input_grad<D, kVecWidth<D>>
            <<<row_blocks(rows), kNormBlock, 0, on.stream>>>(pg, px, pw, pm, pr, po, rows, n);
      } else {
        layer_norm_input_grad<D, 1>
            <<<row_blocks(rows), kNormBlock, 0, on.stream>>>(pg, px, pw, pm, pr, po, rows, n);
      }
      GW_CUDA_CHECK_LAUNCH();
    }
    if (!gweight.defined() && !gbias.defined()) return;
    if (rows == 0) {  // sums over no rows
      if (gweight.defined()) fill(gweight, 0);
      if (gbias.defined()) fill(gbias, 0);
      return;
    }
    // Row chunks: enough columns x chunks to keep the GPU busy, each chunk 16 rows or more.
    int64_t chunks = std::clamp<int64_t>(kBusyThreads / n, 1, std::max<int64_t>(rows / 16, 1));
    chunks = std::min<int64_t>(chunks, 65535);
    const int64_t chunk = (rows + chunks - 1) / chunks;
    chunks = (rows + chunk - 1) / chunk;
    Tensor partials = empty({2, chunks, n}, x.options().with_dtype(dtype_of_v<C>));
    auto* pw = static_cast<C*>(partials.raw_data());
    C* pb = pw + chunks * n;
    const auto column_blocks = static_cast<unsigned>((n + kNormBlock - 1) / kNormBlock);
    layer_norm_param_partials<D>
        <<<dim3(column_blocks, static_cast<unsigned>(chunks)), kNormBlock, 0, on.stream>>>(
            pg, px, pm, pr, pw, pb, rows, n, chunk);
    GW_CUDA_CHECK_LAUNCH();
    layer_norm_param_finish<D><<<column_blocks, kNormBlock, 0, on.stream>>>(
        pw, pb, gweight.defined() ? static_cast<D*>(gweight.raw_data()) : nullptr,
        gbias.defined() ? static_cast<D*>(gbias.raw_data()) : nullptr, chunks, n);
    GW_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gw::cuda
