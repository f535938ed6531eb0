// Fused attention on CUDA for bfloat16 and float16 (autocast's dtypes): FlashAttention-2's
// tiling on the tensor cores, so that no (L x S) score matrix exists in memory, and a backward
// without atomics. float32 and float64, head dims beyond kMaxHeadDim, and dropout take the
// composition (cuBLAS products, the softmax and dropout kernels): has_fused_attention says
// which.
//
// A block owns 64 rows of one head (query rows in the forward and for dQ, keys for dK and dV):
// four warps of 16 rows, one wmma tile high each. It walks through the other side 64 rows at a
// time, staged in shared memory with zeros past the sequence and past the head dim, which is
// padded to D = 32, 64 or 128. Products run in wmma 16x16x16 tiles, 16-bit operands and float32
// accumulators; everything per element (scale, mask, causality, exponentials) is float32 on a
// warp's score tile in shared memory, two lanes per row.
//
// Forward, per key tile: S = Q Kᵀ; each row keeps its running maximum m and sum l of
// exp(s - m) (in log2 units: exp2 is one instruction); P = exp(s - m) rounded to 16 bits;
// the float32 accumulator O, in shared memory, is rescaled by exp(m_old - m_new) and gets P V.
// At the end out = O / l, and the row keeps m and log2 l apart for the backward, as on the CPU
// (core/cpu/attention_kernels.cpp says why); a row whose every key is masked gets zeros and
// m = +inf, so that its P recomputes to 0.
//
// Backward, with D_i = rowsum(dO ∘ O) from a small kernel: one kernel per key tile walks the
// query tiles and keeps dK, dV in wmma accumulators (dV += Pᵀ dO, dK += dSᵀ Q); another per
// query tile walks the key tiles for dQ += dS K. P = exp2(s - m - log2 l) and dP = dO Vᵀ are
// computed by both (FlashAttention-2 shares them through an atomically added dQ instead): each
// gradient has one writer, and the result does not depend on scheduling.
//
// Causal attention (key j <= query i, PyTorch's top-left alignment) skips the tiles wholly
// above the diagonal; the forward's blocks go longest first.
#include <mma.h>

#include <atomic>
#include <cfloat>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/loops.cuh"

namespace gw::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int64_t kMaxHeadDim = 128;
constexpr int kWarps = 4;
constexpr int kBlockThreads = kWarps * kWarpSize;
constexpr int kRows = 16;               // a warp's rows: one wmma tile
constexpr int kTile = kWarps * kRows;   // a block's rows, and the rows of a tile it walks
constexpr int kSkew = 8;                // 16-bit elements padding each staged row (banks)
constexpr int kScoreLd = kTile + 4;     // row stride of a warp's float32 score tile
constexpr int kProbLd = kTile + kSkew;  // ... and of its 16-bit probability tile
constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;  // a transpose
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// A (B, H, len, dim) tensor with a unit last stride, as the rows of its B * H heads.
template <typename T>
struct HeadRows {
  T* data;
  int64_t heads, batch_stride, head_stride, row_stride;

  __device__ T* head(int64_t bh) const {
    return data + (bh / heads) * batch_stride + (bh % heads) * head_stride;
  }
  __device__ T* row(int64_t bh, int64_t r) const { return head(bh) + r * row_stride; }
};

template <typename T>
HeadRows<T> head_rows(const Tensor& t) {
  return {static_cast<T*>(t.raw_data()), t.size(1), t.stride(0), t.stride(1), t.stride(2)};
}

// The additive (B, H, L, S) mask through its strides (0 on broadcast dims); data null: none.
template <typename T>
struct MaskView {
  const T* data;
  int64_t heads, batch_stride, head_stride, row_stride, col_stride;

  // Head bh's (L, S) mask starts at head(bh).
  __device__ const T* head(int64_t bh) const {
    return data ? data + (bh / heads) * batch_stride + (bh % heads) * head_stride : nullptr;
  }
  __device__ float at(const T* head, int64_t i, int64_t j) const {
    return cast<float>(head[i * row_stride + j * col_stride]);
  }
};

template <typename T>
struct Problem {
  HeadRows<T> q, k, v, out;
  MaskView<T> mask;
  float *row_max, *log_sum;  // (B * H, L) each, log2 units: m and log2 l of each query row
  int64_t bh, l, s;
  int e, ev;
  float scale;
  bool causal;
  bool vec;  // q, k, v (and gout) can be staged 16 bytes at a time
};

template <typename T>
struct Gradients {
  HeadRows<T> gout, gq, gk, gv;
  const float* dots;  // (B * H, L): rowsum(dO ∘ O)
};

// Rows [row0, row0 + kTile) of head bh, columns [0, D), into shared memory with row stride
// D + kSkew: zeros past `rows` and past `cols`. vec: cols, the strides and the base are
// multiples of 8 elements (16 bytes).
template <typename T, int D>
__device__ void stage(T* tile, const HeadRows<T>& src, int64_t bh, int64_t row0, int64_t rows,
                      int cols, bool vec) {
  constexpr int ld = D + kSkew;
  const T* first = src.row(bh, row0);
  const int64_t valid = rows - row0;  // rows of the tile that exist
  if (vec) {
    constexpr int chunks = D / 8;
    for (int i = threadIdx.x; i < kTile * chunks; i += kBlockThreads) {
      const int r = i / chunks, c = (i % chunks) * 8;
      uint4 x = make_uint4(0, 0, 0, 0);
      if (r < valid && c < cols)
        x = *reinterpret_cast<const uint4*>(first + r * src.row_stride + c);
      *reinterpret_cast<uint4*>(tile + r * ld + c) = x;
    }
    return;
  }
  for (int i = threadIdx.x; i < kTile * D; i += kBlockThreads) {
    const int r = i / D, c = i % D;
    tile[r * ld + c] = r < valid && c < cols ? first[r * src.row_stride + c] : cast<T>(0.0f);
  }
}

// out (16 x 64 float32, row stride kScoreLd) = a (16 x D, rows of a staged tile) times bᵀ,
// b the 64 staged rows of another tile (16 x D each).
template <typename T, int D>
__device__ void rows_times_transposed(float* out, const T* a, const T* b) {
  constexpr int ld = D + kSkew;
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragC c;
    wmma::fill_fragment(c, 0.0f);
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      FragA<T> fa;
      FragBt<T> fb;
      wmma::load_matrix_sync(fa, a + k * 16, ld);
      wmma::load_matrix_sync(fb, b + n * 16 * ld + k * 16, ld);
      wmma::mma_sync(c, fa, fb, c);
    }
    wmma::store_matrix_sync(out + n * 16, c, kScoreLd, wmma::mem_row_major);
  }
}

// acc[d] += p (16 x 64, row stride kProbLd) times the 64 staged rows b, for each 16 columns d.
template <typename T, int D>
__device__ void accumulate_product(FragC (&acc)[D / 16], const T* p, const T* b) {
  constexpr int ld = D + kSkew;
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    FragA<T> fa;
    wmma::load_matrix_sync(fa, p + k * 16, kProbLd);
#pragma unroll
    for (int d = 0; d < D / 16; ++d) {
      FragB<T> fb;
      wmma::load_matrix_sync(fb, b + k * 16 * ld + d * 16, ld);
      wmma::mma_sync(acc[d], fa, fb, acc[d]);
    }
  }
}

// Writes a warp's 16 x D accumulators to rows [row0, row0 + 16) of head bh (those below
// `rows`), columns below `cols`, through `scratch`, a 16 x 64 float32 tile.
template <typename T, int D>
__device__ void write_rows(const HeadRows<T>& dst, int64_t bh, int64_t row0, int64_t rows, int cols,
                           FragC (&acc)[D / 16], float* scratch) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int d0 = 0; d0 < D; d0 += kTile) {
    __syncwarp();
#pragma unroll
    for (int d = d0 / 16; d < D / 16 && d < (d0 + kTile) / 16; ++d)
      wmma::store_matrix_sync(scratch + (d * 16 - d0), acc[d], kScoreLd, wmma::mem_row_major);
    __syncwarp();
    for (int r = 0; r < kRows && row0 + r < rows; ++r) {
      T* out = dst.row(bh, row0 + r);
      for (int c = lane; c < kTile && d0 + c < cols; c += kWarpSize)
        out[d0 + c] = cast<T>(scratch[r * kScoreLd + c]);
    }
  }
}

// The scaled, masked score of query i and key j, in log2 units; -inf where the key is
// past the sequence or causality hides it. mask: the head's, from MaskView::head.
template <typename T>
__device__ __forceinline__ float score2(const Problem<T>& p, float dot, const T* mask, int64_t i,
                                        int64_t j) {
  if (j >= p.s || (p.causal && j > i)) return -INFINITY;
  float x = dot * p.scale;
  if (mask && i < p.l) x += p.mask.at(mask, i, j);
  // A finite score stays finite in log2 units: a mask of bfloat16's lowest value (-3.39e38,
  // torch.finfo's min, the usual "hide this key") would overflow to -inf and make a row whose
  // every key it hides a row of no keys (zeros), where the CPU averages V. Clamped to half of
  // float's range, as those keys all are, they still weigh alike. -inf and NaN pass through.
  constexpr float kLowest = -FLT_MAX / 2 / kLog2e;
  if (x < kLowest && x != -INFINITY) x = kLowest;
  // Rounded here, never fused with what is subtracted from it: such a row's scores must equal
  // its maximum exactly, in the forward and in the backward, for x - m to be 0.
  return __fmul_rn(x, kLog2e);
}

// Which (head, tile) a block of a 1-D grid takes: heads outermost, so that the blocks of one
// head run together and share its other side in L2. `reversed`: the last tile first.
struct BlockTile {
  int64_t bh, row0;
  __device__ BlockTile(int64_t tiles, bool reversed) {
    bh = blockIdx.x / tiles;
    const int64_t t = blockIdx.x % tiles;
    row0 = (reversed ? tiles - 1 - t : t) * kTile;
  }
};

template <typename T, int D>
struct ForwardShared {
  static constexpr int ld = D + kSkew;
  static constexpr size_t tile = size_t{kTile} * ld * sizeof(T);  // Q, K and V
  static constexpr size_t scores = size_t{kTile} * kScoreLd * sizeof(float);
  static constexpr size_t probs = size_t{kTile} * kProbLd * sizeof(T);
  static constexpr size_t acc = size_t{kTile} * (D + 4) * sizeof(float);
  static constexpr size_t bytes = 3 * tile + scores + probs + acc + kTile * sizeof(float);
};

template <typename T, int D>
__global__ void __launch_bounds__(kBlockThreads) attention_forward(Problem<T> p) {
  using Shared = ForwardShared<T, D>;
  constexpr int ld = Shared::ld, acc_ld = D + 4;
  extern __shared__ __align__(128) unsigned char shared[];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  T* qs = reinterpret_cast<T*>(shared);
  T* ks = qs + kTile * ld;
  T* vs = ks + kTile * ld;
  unsigned char* rest = shared + 3 * Shared::tile;
  float* scores = reinterpret_cast<float*>(rest) + warp * kRows * kScoreLd;
  T* probs = reinterpret_cast<T*>(rest + Shared::scores) + warp * kRows * kProbLd;
  float* acc =
      reinterpret_cast<float*>(rest + Shared::scores + Shared::probs) + warp * kRows * acc_ld;
  float* row_factor =
      reinterpret_cast<float*>(rest + Shared::scores + Shared::probs + Shared::acc) + warp * kRows;

  const BlockTile bt((p.l + kTile - 1) / kTile, p.causal);
  const int64_t bh = bt.bh, i0 = bt.row0, warp_row0 = i0 + warp * kRows;
  const T* mask = p.mask.head(bh);
  stage<T, D>(qs, p.q, bh, i0, p.l, p.e, p.vec);
  for (int i = lane; i < kRows * acc_ld; i += kWarpSize) acc[i] = 0;
  // This lane's share of the score tile: row r, columns half, half + 2, ... (two lanes a row).
  const int r = lane / 2, half = lane % 2;
  const int64_t i = warp_row0 + r;
  float m = -INFINITY, sum = 0;  // running maximum (log2 units) and sum of exp2(x - m)
  const int64_t keys = p.causal && i0 + kTile < p.s ? i0 + kTile : p.s;
  for (int64_t j0 = 0; j0 < keys; j0 += kTile) {
    __syncthreads();  // every warp is done with the last K and V (and Q is staged)
    stage<T, D>(ks, p.k, bh, j0, p.s, p.e, p.vec);
    stage<T, D>(vs, p.v, bh, j0, p.s, p.ev, p.vec);
    __syncthreads();
    rows_times_transposed<T, D>(scores, qs + warp * kRows * ld, ks);
    __syncwarp();
    float x[kTile / 2];
    float top = -INFINITY;
#pragma unroll
    for (int c = 0; c < kTile / 2; ++c) {
      const int col = 2 * c + half;
      x[c] = score2(p, scores[r * kScoreLd + col], mask, i, j0 + col);
      top = fmaxf(top, x[c]);
    }
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
    const float m_new = fmaxf(m, top);
    const float base = m_new == -INFINITY ? 0.0f : m_new;  // every key so far masked: p = 0
    float part = 0;
#pragma unroll
    for (int c = 0; c < kTile / 2; ++c) {
      const float e = exp2f(x[c] - base);
      part += e;
      probs[r * kProbLd + 2 * c + half] = cast<T>(e);
    }
    part += __shfl_xor_sync(0xffffffffu, part, 1);
    const float shrink = exp2f(m - base);  // 0 while m is -inf
    sum = sum * shrink + part;
    m = m_new;
    if (half == 0) row_factor[r] = shrink;
    __syncwarp();
    for (int t = lane; t < kRows * D; t += kWarpSize)
      acc[(t / D) * acc_ld + t % D] *= row_factor[t / D];
    __syncwarp();
    FragC o[D / 16];
#pragma unroll
    for (int d = 0; d < D / 16; ++d)
      wmma::load_matrix_sync(o[d], acc + d * 16, acc_ld, wmma::mem_row_major);
    accumulate_product<T, D>(o, probs, vs);
#pragma unroll
    for (int d = 0; d < D / 16; ++d)
      wmma::store_matrix_sync(acc + d * 16, o[d], acc_ld, wmma::mem_row_major);
    __syncwarp();
  }
  if (half == 0) {
    row_factor[r] = sum > 0 ? 1 / sum : 0.0f;  // every key masked: a zero row
    if (i < p.l) {
      p.row_max[bh * p.l + i] = sum > 0 ? m : INFINITY;
      p.log_sum[bh * p.l + i] = sum > 0 ? log2f(sum) : 0.0f;
    }
  }
  __syncwarp();
  for (int rr = 0; rr < kRows && warp_row0 + rr < p.l; ++rr) {
    T* out = p.out.row(bh, warp_row0 + rr);
    for (int c = lane; c < p.ev; c += kWarpSize)
      out[c] = cast<T>(acc[rr * acc_ld + c] * row_factor[rr]);
  }
}

// dots[row] = rowsum(dO ∘ O) in float32: a warp per row.
template <typename T>
__global__ void attention_row_dots(HeadRows<T> gout, HeadRows<T> out, int64_t bh, int64_t l, int ev,
                                   float* dots) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
       row < bh * l; row += warps) {  // the whole warp takes the row
    const T* g = gout.row(row / l, row % l);
    const T* o = out.row(row / l, row % l);
    float sum = 0;
    for (int c = lane; c < ev; c += kWarpSize) sum += cast<float>(g[c]) * cast<float>(o[c]);
    for (int offset = kWarpSize / 2; offset > 0; offset >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) dots[row] = sum;
  }
}

template <typename T, int D>
struct BackwardShared {
  static constexpr int ld = D + kSkew;
  static constexpr size_t tile = size_t{kTile} * ld * sizeof(T);              // Q, K, V and dO
  static constexpr size_t scores = size_t{kTile} * kScoreLd * sizeof(float);  // S and dP
  static constexpr size_t probs = size_t{kTile} * kProbLd * sizeof(T);        // P and dS
  static constexpr size_t bytes = 4 * tile + 2 * scores + 2 * probs + 3 * kTile * sizeof(float);
};

// The shared memory of a backward block, carved from the dynamic allocation.
template <typename T, int D>
struct BackwardTiles {
  T *qs, *ks, *vs, *gos;
  float *scores, *dprobs;  // this warp's
  T *probs, *dscores;      // this warp's
  float *row_max, *log_sum, *dots;  // of the staged query rows
  __device__ explicit BackwardTiles(unsigned char* shared) {
    using Shared = BackwardShared<T, D>;
    const int warp = threadIdx.x / kWarpSize;
    qs = reinterpret_cast<T*>(shared);
    ks = qs + kTile * Shared::ld;
    vs = ks + kTile * Shared::ld;
    gos = vs + kTile * Shared::ld;
    unsigned char* rest = shared + 4 * Shared::tile;
    scores = reinterpret_cast<float*>(rest) + warp * kRows * kScoreLd;
    dprobs = reinterpret_cast<float*>(rest + Shared::scores) + warp * kRows * kScoreLd;
    probs = reinterpret_cast<T*>(rest + 2 * Shared::scores) + warp * kRows * kProbLd;
    dscores =
        reinterpret_cast<T*>(rest + 2 * Shared::scores + Shared::probs) + warp * kRows * kProbLd;
    row_max = reinterpret_cast<float*>(rest + 2 * Shared::scores + 2 * Shared::probs);
    log_sum = row_max + kTile;
    dots = log_sum + kTile;
  }
  // Query rows [i0, i0 + kTile): their statistics and dots (m = +inf past L: P = 0).
  __device__ void stage_rows(const Problem<T>& p, const Gradients<T>& g, int64_t bh, int64_t i0) {
    for (int t = threadIdx.x; t < kTile; t += kBlockThreads) {
      const bool in = i0 + t < p.l;
      row_max[t] = in ? p.row_max[bh * p.l + i0 + t] : INFINITY;
      log_sum[t] = in ? p.log_sum[bh * p.l + i0 + t] : 0.0f;
      dots[t] = in ? g.dots[bh * p.l + i0 + t] : 0.0f;
    }
  }
};

// P and dS of query i and key j from their score and dP: p = exp2(s - m_i - log2 l_i),
// ds = p (dP - D_i) scale; both 0 where the key does not take part.
template <typename T>
__device__ __forceinline__ void prob_and_grad(const Problem<T>& p, float dot, float dprob,
                                              float row_max, float log_sum, float row_dot,
                                              const T* mask, int64_t i, int64_t j, float& prob,
                                              float& grad) {
  prob = grad = 0;
  if (i >= p.l) return;
  const float x = score2(p, dot, mask, i, j);
  if (x == -INFINITY) return;
  // m = +inf (every key masked): 0. A probability is at most 1: a score recomputed here (as
  // K Qᵀ for dK and dV) may round above the forward's maximum. (Not fminf: NaN stays NaN.)
  const float e = (x - row_max) - log_sum;
  prob = exp2f(e > 0.0f ? 0.0f : e);
  grad = prob * (dprob - row_dot) * p.scale;
}

template <typename T, int D>
__global__ void __launch_bounds__(kBlockThreads)
    attention_backward_kv(Problem<T> p, Gradients<T> g) {
  constexpr int ld = D + kSkew;
  extern __shared__ __align__(128) unsigned char shared[];
  BackwardTiles<T, D> s(shared);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const BlockTile bt((p.s + kTile - 1) / kTile, false);
  const int64_t bh = bt.bh, j0 = bt.row0, warp_key0 = j0 + warp * kRows;
  const T* mask = p.mask.head(bh);
  stage<T, D>(s.ks, p.k, bh, j0, p.s, p.e, p.vec);
  stage<T, D>(s.vs, p.v, bh, j0, p.s, p.ev, p.vec);
  FragC gk[D / 16], gv[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; ++d) {
    wmma::fill_fragment(gk[d], 0.0f);
    wmma::fill_fragment(gv[d], 0.0f);
  }
  // This lane: key r of the warp's 16 against query columns half, half + 2, ...
  const int r = lane / 2, half = lane % 2;
  const int64_t j = warp_key0 + r;
  // Causal: a query tile before j0 holds no row that sees these keys.
  for (int64_t i0 = p.causal ? j0 : 0; i0 < p.l; i0 += kTile) {
    __syncthreads();
    stage<T, D>(s.qs, p.q, bh, i0, p.l, p.e, p.vec);
    stage<T, D>(s.gos, g.gout, bh, i0, p.l, p.ev, p.vec);
    s.stage_rows(p, g, bh, i0);
    __syncthreads();
    rows_times_transposed<T, D>(s.scores, s.ks + warp * kRows * ld, s.qs);   // Sᵀ
    rows_times_transposed<T, D>(s.dprobs, s.vs + warp * kRows * ld, s.gos);  // dPᵀ
    __syncwarp();
#pragma unroll 4
    for (int c = 0; c < kTile / 2; ++c) {
      const int col = 2 * c + half;
      float prob, grad;
      prob_and_grad(p, s.scores[r * kScoreLd + col], s.dprobs[r * kScoreLd + col], s.row_max[col],
                    s.log_sum[col], s.dots[col], mask, i0 + col, j, prob, grad);
      s.probs[r * kProbLd + col] = cast<T>(prob);
      s.dscores[r * kProbLd + col] = cast<T>(grad);
    }
    __syncwarp();
    accumulate_product<T, D>(gv, s.probs, s.gos);   // dV += Pᵀ dO
    accumulate_product<T, D>(gk, s.dscores, s.qs);  // dK += dSᵀ Q
  }
  write_rows<T, D>(g.gk, bh, warp_key0, p.s, p.e, gk, s.scores);
  write_rows<T, D>(g.gv, bh, warp_key0, p.s, p.ev, gv, s.scores);
}

template <typename T, int D>
__global__ void __launch_bounds__(kBlockThreads)
    attention_backward_q(Problem<T> p, Gradients<T> g) {
  constexpr int ld = D + kSkew;
  extern __shared__ __align__(128) unsigned char shared[];
  BackwardTiles<T, D> s(shared);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const BlockTile bt((p.l + kTile - 1) / kTile, p.causal);
  const int64_t bh = bt.bh, i0 = bt.row0, warp_row0 = i0 + warp * kRows;
  const T* mask = p.mask.head(bh);
  stage<T, D>(s.qs, p.q, bh, i0, p.l, p.e, p.vec);
  stage<T, D>(s.gos, g.gout, bh, i0, p.l, p.ev, p.vec);
  s.stage_rows(p, g, bh, i0);
  FragC gq[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; ++d) wmma::fill_fragment(gq[d], 0.0f);
  const int r = lane / 2, half = lane % 2;
  const int64_t i = warp_row0 + r;
  const int64_t keys = p.causal && i0 + kTile < p.s ? i0 + kTile : p.s;
  for (int64_t j0 = 0; j0 < keys; j0 += kTile) {
    __syncthreads();
    stage<T, D>(s.ks, p.k, bh, j0, p.s, p.e, p.vec);
    stage<T, D>(s.vs, p.v, bh, j0, p.s, p.ev, p.vec);
    __syncthreads();
    rows_times_transposed<T, D>(s.scores, s.qs + warp * kRows * ld, s.ks);   // S
    rows_times_transposed<T, D>(s.dprobs, s.gos + warp * kRows * ld, s.vs);  // dP
    __syncwarp();
#pragma unroll 4
    for (int c = 0; c < kTile / 2; ++c) {
      const int col = 2 * c + half;
      float prob, grad;
      const int row = warp * kRows + r;
      prob_and_grad(p, s.scores[r * kScoreLd + col], s.dprobs[r * kScoreLd + col], s.row_max[row],
                    s.log_sum[row], s.dots[row], mask, i, j0 + col, prob, grad);
      s.dscores[r * kProbLd + col] = cast<T>(grad);
    }
    __syncwarp();
    accumulate_product<T, D>(gq, s.dscores, s.ks);  // dQ += dS K
  }
  write_rows<T, D>(g.gq, bh, warp_row0, p.l, p.e, gq, s.scores);
}

// --- host side ----------------------------------------------------------------------------

// The mask as the (B, H, L, S) view of q's heads for MaskView: fewer dims get leading ones,
// more are folded into H as the heads were (a copy if they must be: a mask broadcast over some
// of those dims and not others).
Tensor mask_4d(const Tensor& mask, const Tensor& q, int64_t s) {
  Tensor m = mask;
  while (m.dim() < 4) m = m.unsqueeze(0);
  if (m.dim() > 4) m = m.reshape({1, -1, q.size(2), s});
  return m.expand({q.size(0), q.size(1), q.size(2), s});
}

template <typename T>
Problem<T> problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                   const AttentionOptions& options, const Tensor& out, const Tensor& stats,
                   const Tensor& mask4, std::initializer_list<const Tensor*> staged) {
  auto* row_max = static_cast<float*>(stats.raw_data());
  Problem<T> p{head_rows<T>(q),
               head_rows<T>(k),
               head_rows<T>(v),
               head_rows<T>(out),
               MaskView<T>{nullptr, 1, 0, 0, 0, 0},
               row_max,
               row_max + stats.size(1) * stats.size(2),
               q.size(0) * q.size(1),
               q.size(2),
               k.size(2),
               static_cast<int>(q.size(3)),
               static_cast<int>(v.size(3)),
               static_cast<float>(options.scale),
               options.causal,
               false};
  if (mask.defined()) {
    p.mask = {static_cast<const T*>(mask4.raw_data()),
              mask4.size(1),
              mask4.stride(0),
              mask4.stride(1),
              mask4.stride(2),
              mask4.stride(3)};
  }
  p.vec = p.e % 8 == 0 && p.ev % 8 == 0;
  for (const Tensor* t : staged) {
    p.vec = p.vec && aligned16(t->raw_data()) && t->stride(0) % 8 == 0 && t->stride(1) % 8 == 0 &&
            t->stride(2) % 8 == 0;
  }
  return p;
}

// Kernel's dynamic shared memory beyond the default 48 KiB, opted into once per device (the
// flag is per kernel: one per template instance).
template <auto Kernel>
void allow_shared(size_t bytes, int device) {
  static std::atomic<uint64_t> done{0};
  const uint64_t bit = uint64_t{1} << (device % 64);
  if (done.load(std::memory_order_acquire) & bit) return;
  GW_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
  done.fetch_or(bit, std::memory_order_acq_rel);
}

// The shared memory the kernels for padded head dim D take (both 16-bit types alike).
template <int D>
constexpr size_t shared_bytes() {
  return std::max(ForwardShared<__half, D>::bytes, BackwardShared<__half, D>::bytes);
}

// Calls f.template operator()<D>() with the padded head dim of e and ev.
template <typename F>
void dispatch_head_dim(int64_t e, int64_t ev, F&& f) {
  const int64_t dim = std::max(e, ev);
  if (dim <= 32) return f.template operator()<32>();
  if (dim <= 64) return f.template operator()<64>();
  return f.template operator()<128>();
}

unsigned blocks_for(int64_t bh, int64_t rows) {
  const int64_t n = bh * ((rows + kTile - 1) / kTile);
  GW_CHECK(n < (int64_t{1} << 31), InvalidArgumentError, "[scaled_dot_product_attention] ", bh,
           " heads of ", rows, " rows are more blocks than a CUDA grid holds");
  return static_cast<unsigned>(n);
}

}  // namespace

// D = 128 takes 121 KiB of shared memory, beyond the 99 KiB of GPUs such as the A10, L4 and RTX
// 30 to 50 series (sm_86, sm_89, sm_120): there, those heads take the composition.
bool CudaBackend::has_fused_attention(const Tensor& q, const Tensor& v, bool dropout) const {
  const int64_t e = q.size(-1), ev = v.size(-1);
  if (dropout || !is_16_bit_float(q.dtype()) || std::max(e, ev) > kMaxHeadDim) return false;
  int limit = 0;
  GW_CUDA_CHECK(
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, q.device().index));
  size_t bytes = 0;
  dispatch_head_dim(e, ev, [&]<int D>() { bytes = shared_bytes<D>(); });
  return bytes <= static_cast<size_t>(limit);
}

namespace {
// The kernels' entry points run only where has_fused_attention said yes (nn asks it first).
void check_fused(const CudaBackend& backend, const Tensor& q, const Tensor& v, const Tensor& mask,
                 const AttentionOptions& options) {
  GW_CHECK(backend.has_fused_attention(q, v, options.dropout_p > 0), InternalError,
           "[scaled_dot_product_attention] no fused CUDA kernel for ", q.dtype(),
           " with head dims ", q.size(3), " and ", v.size(3), " on ", q.device().str(),
           options.dropout_p > 0 ? " with dropout" : "");
  // The kernels read the mask's elements as q's type (nn converts it).
  GW_CHECK(!mask.defined() || mask.dtype() == q.dtype(), InternalError,
           "[scaled_dot_product_attention] the fused CUDA kernel takes a ", q.dtype(),
           " mask, got ", mask.dtype());
}
}  // namespace

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                            const AttentionOptions& options, const Tensor& out,
                            const Tensor& stats) {
  check_fused(*this, q, v, mask, options);
  if (q.numel() == 0 || k.numel() == 0) return;  // nn composes these; nothing to launch
  const Tensor mask4 = mask.defined() ? mask_4d(mask, q, k.size(2)) : Tensor();
  dispatch<TypeList<Half, BFloat16>>(q.dtype(), "scaled_dot_product_attention", [&]<typename H>() {
    using T = cuda_type_t<H>;
    OnDevice on(out);
    const Problem<T> p = problem<T>(q, k, v, mask, options, out, stats, mask4, {&q, &k, &v});
    dispatch_head_dim(p.e, p.ev, [&]<int D>() {
      const size_t bytes = ForwardShared<T, D>::bytes;
      allow_shared<attention_forward<T, D>>(bytes, out.device().index);
      attention_forward<T, D><<<blocks_for(p.bh, p.l), kBlockThreads, bytes, on.stream>>>(p);
      GW_CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaBackend::attention_backward(const Tensor& gout, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& mask,
                                     const AttentionOptions& options, const Tensor& out,
                                     const Tensor& stats, const Tensor& gq, const Tensor& gk,
                                     const Tensor& gv) {
  check_fused(*this, q, v, mask, options);
  if (q.numel() == 0 || k.numel() == 0) {  // nn composes these; nothing to launch
    for (Tensor g : {gq, gk, gv}) g.zero_();
    return;
  }
  const Tensor mask4 = mask.defined() ? mask_4d(mask, q, k.size(2)) : Tensor();
  dispatch<TypeList<Half, BFloat16>>(q.dtype(), "scaled_dot_product_attention", [&]<typename H>() {
    using T = cuda_type_t<H>;
    OnDevice on(gq);
    const Problem<T> p = problem<T>(q, k, v, mask, options, out, stats, mask4, {&q, &k, &v, &gout});
    const Tensor dots = empty({p.bh, p.l}, TensorOptions(kFloat32).with_device(q.device()));
    const Gradients<T> g{head_rows<T>(gout), head_rows<T>(gq), head_rows<T>(gk), head_rows<T>(gv),
                         static_cast<const float*>(dots.raw_data())};
    const int64_t rows = p.bh * p.l;
    attention_row_dots<T><<<grid_for(rows * kWarpSize), kThreads, 0, on.stream>>>(
        g.gout, p.out, p.bh, p.l, p.ev, static_cast<float*>(dots.raw_data()));
    GW_CUDA_CHECK_LAUNCH();
    dispatch_head_dim(p.e, p.ev, [&]<int D>() {
      const size_t bytes = BackwardShared<T, D>::bytes;
      const int device = q.device().index;
      allow_shared<attention_backward_kv<T, D>>(bytes, device);
      allow_shared<attention_backward_q<T, D>>(bytes, device);
      attention_backward_kv<T, D><<<blocks_for(p.bh, p.s), kBlockThreads, bytes, on.stream>>>(p, g);
      GW_CUDA_CHECK_LAUNCH();
      attention_backward_q<T, D><<<blocks_for(p.bh, p.l), kBlockThreads, bytes, on.stream>>>(p, g);
      GW_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace gw::cuda
