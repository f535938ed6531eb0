// softmax and log_softmax along one dim. The contiguous input is viewed as (outer, n, inner):
// the n elements of one softmax are `inner` apart.
//
// The usual case, the last dim (inner == 1), reads each row once from memory. Rows up to 8192
// float32 are held in registers by a block (max, then sum of exponentials, then the writes).
// Other rows take a running (max, sum of exponentials) pair updated per element ("online
// softmax") while the row is kept in shared memory, then are written from there: a warp per
// row up to 1024 elements, a block per row beyond. Rows whose bytes are a multiple of 16 move
// as 16-byte packs.
// Other dims (inner > 1) take a warp per softmax with strided reads.
//
// Cross-entropy is the same pass without the writes: each row's (max, sum) gives its
// log-sum-exp, and loss = lse - logits[target]. Its backward writes softmax minus the one-hot
// target in one read and one write of the logits, never materialising the probabilities.
#include <cmath>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/loops.cuh"

namespace gw::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = kWarpSize;
constexpr int kRowBlock = 512;           // threads for one long row
constexpr int64_t kWarpRowLimit = 1024;  // rows up to this long take a warp

// A softmax's running state: the max so far and the sum of exp(x - max) so far.
template <typename C>
struct Online {
  C max;
  C sum;
};

// Adds V values to a running state: one rescale for the pack's max, then an exp per value.
// A NaN never becomes the max and makes the sum NaN; -inf adds nothing (-inf - -inf would be
// NaN); +inf becomes the max and a second +inf makes the sum NaN, as on the CPU.
template <typename C, int V>
__device__ __forceinline__ void update_pack(Online<C>& s, const C (&x)[V]) {
  C m = s.max;
#pragma unroll
  for (int j = 0; j < V; ++j) m = x[j] > m ? x[j] : m;
  if (m > s.max) {
    s.sum *= exp(s.max - m);  // 0 * exp(-inf) = 0 on the first pack
    s.max = m;
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    if (x[j] != static_cast<C>(-INFINITY)) s.sum += exp(x[j] - s.max);
  }
}

template <typename C>
__device__ __forceinline__ Online<C> merge(Online<C> a, Online<C> b) {
  const C neg_inf = static_cast<C>(-INFINITY);
  const C m = a.max > b.max ? a.max : b.max;
  const C sa = a.max == neg_inf ? C(0) : a.sum * exp(a.max - m);
  const C sb = b.max == neg_inf ? C(0) : b.sum * exp(b.max - m);
  return {m, sa + sb};
}

template <typename C>
__device__ __forceinline__ Online<C> warp_merge(Online<C> s) {
  for (int off = kWarp / 2; off > 0; off >>= 1) {
    s = merge(s, Online<C>{__shfl_xor_sync(kFullMask, s.max, off),
                           __shfl_xor_sync(kFullMask, s.sum, off)});
  }
  return s;
}

// Writes one output from x, given the row's merged state (max of -inf: an all -inf row,
// whose outputs are NaN as on the CPU).
template <typename T, typename C>
__device__ __forceinline__ T finish(C x, C m, C log_sum, C inv, bool log_softmax) {
  return log_softmax ? cast<T>((x - m) - log_sum) : cast<T>(exp(x - m) * inv);
}

// One contiguous row of n elements by `group` threads (a warp or the block; this thread is
// `lane` among them), V elements per load; merge_group merges the threads' states. With a
// cache (shared memory of n elements), the second pass reads the row from there.
template <typename T, int V, typename Merge>
__device__ __forceinline__ void softmax_row(const T* xr, T* orow, int64_t n, bool log_softmax,
                                            T* cache, int lane, int group, Merge merge_group) {
  using C = compute_t<T>;
  using P = Pack<T, V>;
  const int64_t packs = n / V;
  Online<C> st{static_cast<C>(-INFINITY), C(0)};
  for (int64_t i = lane; i < packs; i += group) {
    const P p = reinterpret_cast<const P*>(xr)[i];
    if (cache) reinterpret_cast<P*>(cache)[i] = p;
    C values[V];
#pragma unroll
    for (int j = 0; j < V; ++j) values[j] = cast<C>(p.v[j]);
    update_pack(st, values);
  }
  st = merge_group(st);
  const C m = st.max == static_cast<C>(-INFINITY) ? C(0) : st.max;
  const C log_sum = log(st.sum), inv = C(1) / st.sum;
  const T* src = cache ? cache : xr;
  for (int64_t i = lane; i < packs; i += group) {
    const P p = reinterpret_cast<const P*>(src)[i];
    P o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = finish<T>(cast<C>(p.v[j]), m, log_sum, inv, log_softmax);
    reinterpret_cast<P*>(orow)[i] = o;
  }
}

struct MergeWarp {
  template <typename C>
  __device__ Online<C> operator()(Online<C> s) const {
    return warp_merge(s);
  }
};

// The block's merged state, in every thread.
struct MergeBlock {
  template <typename C>
  __device__ Online<C> operator()(Online<C> s) const {
    __shared__ C maxes[kRowBlock / kWarp], sums[kRowBlock / kWarp];
    s = warp_merge(s);
    const int lane = static_cast<int>(threadIdx.x) % kWarp,
              warp = static_cast<int>(threadIdx.x) / kWarp;
    if (lane == 0) {
      maxes[warp] = s.max;
      sums[warp] = s.sum;
    }
    __syncthreads();
    s = Online<C>{maxes[0], sums[0]};
    for (int w = 1; w < kRowBlock / kWarp; ++w) s = merge(s, Online<C>{maxes[w], sums[w]});
    __syncthreads();  // the next row may overwrite maxes/sums
    return s;
  }
};

// A warp per row; each warp caches its row in its slice of the block's shared memory.
template <typename T, int V>
__global__ void softmax_warp_rows(const T* x, T* out, int64_t rows, int64_t n, bool log_softmax,
                                  bool cached) {
  extern __shared__ __align__(16) unsigned char shared_raw[];
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp_in_block = static_cast<int>(threadIdx.x) / kWarp;
  T* cache = cached ? reinterpret_cast<T*>(shared_raw) + warp_in_block * n : nullptr;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  // r depends on the warp only, so all 32 lanes run the same iterations and shuffle together.
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + warp_in_block;
       r < rows; r += warps) {
    softmax_row<T, V>(x + r * n, out + r * n, n, log_softmax, cache, lane, kWarp, MergeWarp{});
    __syncwarp();
  }
}

// A block of kRowBlock threads per row.
template <typename T, int V>
__global__ void softmax_block_rows(const T* x, T* out, int64_t rows, int64_t n, bool log_softmax,
                                   bool cached) {
  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* cache = cached ? reinterpret_cast<T*>(shared_raw) : nullptr;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    softmax_row<T, V>(x + r * n, out + r * n, n, log_softmax, cache, static_cast<int>(threadIdx.x),
                      kRowBlock, MergeBlock{});
    __syncthreads();  // the cache is refilled by the next row
  }
}

// A block per row with the whole row in registers: each of the kRegBlock threads holds K
// packs, so the row is read once, exp is taken once per element, and nothing is cached in
// shared memory. Covers rows up to kRegBlock * K * V elements (8192 float32 with K = 8).
constexpr int kRegBlock = 256;
constexpr int kMaxRegPacks = 8;

template <typename T, int V, int K>
__global__ void softmax_register_rows(const T* x, T* out, int64_t rows, int64_t n,
                                      bool log_softmax) {
  using C = compute_t<T>;
  using P = Pack<T, V>;
  const C neg_inf = static_cast<C>(-INFINITY);
  const int64_t packs = n / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(x + r * n);
    C v[K][V];
    C m = neg_inf;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t i = threadIdx.x + k * kRegBlock;
      P p{};
      if (i < packs) p = xr[i];  // p stays zero past the row: those lanes are padding
#pragma unroll
      for (int j = 0; j < V; ++j) {
        v[k][j] = i < packs ? cast<C>(p.v[j]) : neg_inf;
        m = v[k][j] > m ? v[k][j] : m;  // a NaN never becomes the max; it makes the sum NaN
      }
    }
    m = block_all_reduce<kRegBlock>(m, MaxOf{});
    if (m == neg_inf) m = C(0);  // an all -inf row: its outputs are NaN, as on the CPU
    C sum = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const C e = exp(v[k][j] - m);  // 0 for the padding
        sum += e;
        if (!log_softmax) v[k][j] = e;
      }
    }
    sum = block_all_reduce<kRegBlock>(sum, SumOf{});
    const C log_sum = log(sum), inv = C(1) / sum;
    P* orow = reinterpret_cast<P*>(out + r * n);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t i = threadIdx.x + k * kRegBlock;
      if (i >= packs) break;
      P o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        o.v[j] = cast<T>(log_softmax ? (v[k][j] - m) - log_sum : v[k][j] * inv);
      }
      orow[i] = o;
    }
  }
}

template <typename T>
__global__ void softmax_strided(const T* x, T* out, int64_t rows, int64_t n, int64_t inner,
                                bool log_softmax) {
  using C = compute_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t r = warp; r < rows; r += warps) {
    const int64_t base = (r / inner) * n * inner + (r % inner);
    const T* xr = x + base;
    T* orow = out + base;
    Online<C> st{static_cast<C>(-INFINITY), C(0)};
    for (int64_t i = lane; i < n; i += kWarp) {
      const C value[1] = {cast<C>(xr[i * inner])};
      update_pack(st, value);
    }
    st = warp_merge(st);
    const C m = st.max == static_cast<C>(-INFINITY) ? C(0) : st.max;
    const C log_sum = log(st.sum), inv = C(1) / st.sum;
    for (int64_t i = lane; i < n; i += kWarp) {
      orow[i * inner] = finish<T>(cast<C>(xr[i * inner]), m, log_sum, inv, log_softmax);
    }
  }
}

template <typename T, int V>
void launch_rows(const T* x, T* out, int64_t rows, int64_t n, bool log, cudaStream_t stream) {
  const size_t row_bytes = static_cast<size_t>(n) * sizeof(T);
  if (n <= kWarpRowLimit) {
    constexpr int kWarpsPerBlock = kThreads / kWarp;
    const bool cached = row_bytes * kWarpsPerBlock <= kRowCacheBytes;
    const int64_t blocks =
        std::clamp<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, kMaxBlocks);
    softmax_warp_rows<T, V>
        <<<static_cast<unsigned>(blocks), kThreads, cached ? row_bytes * kWarpsPerBlock : 0,
           stream>>>(x, out, rows, n, log, cached);
  } else if (n / V <= int64_t{kRegBlock} * kMaxRegPacks) {
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(rows, kMaxBlocks));
    const int64_t per_thread = (n / V + kRegBlock - 1) / kRegBlock;
    auto launch = [&]<int K>() {
      softmax_register_rows<T, V, K><<<blocks, kRegBlock, 0, stream>>>(x, out, rows, n, log);
    };
    if (per_thread <= 2) {
      launch.template operator()<2>();
    } else if (per_thread <= 4) {
      launch.template operator()<4>();
    } else {
      launch.template operator()<kMaxRegPacks>();
    }
  } else {
    const bool cached = row_bytes <= kRowCacheBytes;
    softmax_block_rows<T, V>
        <<<static_cast<unsigned>(std::min<int64_t>(rows, kMaxBlocks)), kRowBlock,
           cached ? row_bytes : 0, stream>>>(x, out, rows, n, log, cached);
  }
  GW_CUDA_CHECK_LAUNCH();
}

// The merged (max, sum) of one contiguous row, in every thread of its group.
template <typename T, int V, typename Merge>
__device__ __forceinline__ Online<compute_t<T>> row_state(const T* xr, int64_t n, int lane,
                                                          int group, Merge merge_group) {
  using C = compute_t<T>;
  using P = Pack<T, V>;
  Online<C> st{static_cast<C>(-INFINITY), C(0)};
  auto add = [&st](const P& p) {
    C values[V];
#pragma unroll
    for (int j = 0; j < V; ++j) values[j] = cast<C>(p.v[j]);
    update_pack(st, values);
  };
  const P* packs = reinterpret_cast<const P*>(xr);
  int64_t i = lane;
  for (; i + group < n / V; i += 2 * group) {  // two loads in flight
    const P a = packs[i], b = packs[i + group];
    add(a);
    add(b);
  }
  if (i < n / V) add(packs[i]);
  return merge_group(st);
}

template <typename T, typename C>
__device__ __forceinline__ void write_loss(const T* xr, int64_t target, Online<C> st, T* loss,
                                           C* lse) {
  const C m = st.max == static_cast<C>(-INFINITY) ? C(0) : st.max;
  const C log_sum_exp = m + log(st.sum);
  *lse = log_sum_exp;
  *loss = cast<T>(log_sum_exp - cast<C>(xr[target]));
}

template <typename T, int V>
__global__ void cross_entropy_warp_rows(const T* x, const int64_t* target, T* loss,
                                        compute_t<T>* lse, int64_t rows, int64_t n) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t per_block = blockDim.x / kWarp;
  for (int64_t r = blockIdx.x * per_block + threadIdx.x / kWarp; r < rows;
       r += gridDim.x * per_block) {
    const auto st = row_state<T, V>(x + r * n, n, lane, kWarp, MergeWarp{});
    if (lane == 0) write_loss(x + r * n, target[r], st, loss + r, lse + r);
  }
}

template <typename T, int V>
__global__ void cross_entropy_block_rows(const T* x, const int64_t* target, T* loss,
                                         compute_t<T>* lse, int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const auto st =
        row_state<T, V>(x + r * n, n, static_cast<int>(threadIdx.x), kRowBlock, MergeBlock{});
    if (threadIdx.x == 0) write_loss(x + r * n, target[r], st, loss + r, lse + r);
  }
}

// grad[r, c] = g[r] * (exp(x[r, c] - lse[r]) - (c == target[r])), a block per row.
template <typename T, int V>
__global__ void cross_entropy_backward_rows(const T* x, const int64_t* target,
                                            const compute_t<T>* lse, const T* grad_loss, T* grad,
                                            int64_t rows, int64_t n) {
  using C = compute_t<T>;
  using P = Pack<T, V>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const C s = lse[r], g = cast<C>(grad_loss[r]);
    const int64_t t = target[r];
    const P* xr = reinterpret_cast<const P*>(x + r * n);
    P* gr = reinterpret_cast<P*>(grad + r * n);
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n / V; i += blockDim.x) {
      const P p = xr[i];
      P o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const C hot = i * V + j == t ? C(1) : C(0);
        o.v[j] = cast<T>(g * (exp(cast<C>(p.v[j]) - s) - hot));
      }
      gr[i] = o;
    }
  }
}

template <typename T, int V>
void launch_cross_entropy(const T* x, const int64_t* target, T* loss, compute_t<T>* lse,
                          int64_t rows, int64_t n, cudaStream_t stream) {
  if (n <= kWarpRowLimit) {
    constexpr int kWarpsPerBlock = kThreads / kWarp;
    const int64_t blocks =
        std::clamp<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, kMaxBlocks);
    cross_entropy_warp_rows<T, V>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, target, loss, lse, rows, n);
  } else {
    cross_entropy_block_rows<T, V>
        <<<static_cast<unsigned>(std::min<int64_t>(rows, kMaxBlocks)), kRowBlock, 0, stream>>>(
            x, target, loss, lse, rows, n);
  }
  GW_CUDA_CHECK_LAUNCH();
}

// V when every row of n elements starts on a 16-byte boundary, else 1.
template <typename T>
bool rows_vectorizable(int64_t n, std::initializer_list<const void*> bases) {
  if (n % kVecWidth<T> != 0) return false;
  for (const void* p : bases) {
    if (!aligned16(p)) return false;
  }
  return true;
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
    const auto* px = static_cast<const D*>(x.raw_data());
    auto* po = static_cast<D*>(o.raw_data());
    if (inner == 1) {
      constexpr int V = kVecWidth<D>;
      if (rows_vectorizable<D>(n, {px, po})) {
        launch_rows<D, V>(px, po, rows, n, log, on.stream);
      } else {
        launch_rows<D, 1>(px, po, rows, n, log, on.stream);
      }
    } else {
      softmax_strided<<<grid_for(rows * kWarp), kThreads, 0, on.stream>>>(px, po, rows, n, inner,
                                                                          log);
      GW_CUDA_CHECK_LAUNCH();
    }
    write_back(o, out);
  });
}

}  // namespace gw::cuda

namespace gw::cuda {

void CudaBackend::cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& loss,
                                const Tensor& lse) {
  dispatch<CudaFloatTypes>(logits.dtype(), "cross_entropy", [&]<typename T>() {
    using D = cuda_type_t<T>;
    const int64_t rows = loss.numel(), n = rows == 0 ? 0 : logits.numel() / rows;
    if (rows == 0) return;
    OnDevice on(loss);
    const auto* px = static_cast<const D*>(logits.raw_data());
    const auto* pt = static_cast<const int64_t*>(target.raw_data());
    auto* pl = static_cast<D*>(loss.raw_data());
    auto* ps = static_cast<compute_t<D>*>(lse.raw_data());
    if (rows_vectorizable<D>(n, {px})) {
      launch_cross_entropy<D, kVecWidth<D>>(px, pt, pl, ps, rows, n, on.stream);
    } else {
      launch_cross_entropy<D, 1>(px, pt, pl, ps, rows, n, on.stream);
    }
  });
}

void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& target,
                                         const Tensor& lse, const Tensor& grad_loss,
                                         const Tensor& grad_logits) {
  dispatch<CudaFloatTypes>(logits.dtype(), "cross_entropy_backward", [&]<typename T>() {
    using D = cuda_type_t<T>;
    const int64_t rows = lse.numel(), n = rows == 0 ? 0 : logits.numel() / rows;
    if (rows == 0 || n == 0) return;
    OnDevice on(grad_logits);
    const auto* px = static_cast<const D*>(logits.raw_data());
    const auto* pt = static_cast<const int64_t*>(target.raw_data());
    const auto* ps = static_cast<const compute_t<D>*>(lse.raw_data());
    const auto* pg = static_cast<const D*>(grad_loss.raw_data());
    auto* po = static_cast<D*>(grad_logits.raw_data());
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(rows, kMaxBlocks));
    if (rows_vectorizable<D>(n, {px, po})) {
      cross_entropy_backward_rows<D, kVecWidth<D>>
          <<<blocks, kThreads, 0, on.stream>>>(px, pt, ps, pg, po, rows, n);
    } else {
      cross_entropy_backward_rows<D, 1>
          <<<blocks, kThreads, 0, on.stream>>>(px, pt, ps, pg, po, rows, n);
    }
    GW_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gw::cuda
