// Fused attention on CUDA for bfloat16 and float16 (autocast's dtypes): FlashAttention-2's
// algorithm on the tensor cores, so that no (L x S) score matrix exists in memory, and a backward
// without atomics. float32 and float64, head dims beyond kMaxHeadDim, and dropout take the
// composition (cuBLAS products, the softmax and dropout kernels): has_fused_attention says
// which.
//
// A block owns 64 rows of one head (query rows in the forward and for dQ, keys for dK and dV):
// four warps of 16 rows. It walks through the other side 64 rows at a time, staged in shared
// memory (by cp.async where rows are 16-byte aligned, the next tile loading while this one is
// used; element by element otherwise) with zeros past the sequence
// and past the head dim, which is padded to D = 32, 64 or 128. Products are mma.sync
// m16n8k16 instructions: 16-bit operands read from shared memory by ldmatrix, float32
// accumulators in registers. A product's accumulator tile is in registers in the layout of the
// next product's left operand (a thread holds the same rows and columns of both), so a warp
// turns its scores into probabilities and multiplies them by V without leaving registers;
// everything per element (scale, mask, causality, exponentials) is float32.
//
// Forward, per key tile: S = Q Kᵀ; each row keeps its running maximum m and sum l of
// exp(s - m) (in log2 units: exp2 is one instruction); P = exp(s - m) rounded to 16 bits;
// the float32 accumulator O is rescaled by exp(m_old - m_new) and gets P V. At the end
// out = O / l, and the row keeps m and log2 l apart for the backward, as on the CPU
// (core/cpu/attention_kernels.cpp says why); a row whose every key is masked gets zeros and
// m = +inf, so that its P recomputes to 0.
//
// Backward, with D_i = rowsum(dO ∘ O) from a small kernel: one kernel per key tile walks the
// query tiles and keeps dK, dV in registers (dV += Pᵀ dO, dK += dSᵀ Q, from Sᵀ = K Qᵀ and
// dPᵀ = V dOᵀ); another per query tile walks the key tiles for dQ += dS K. P =
// exp2(s - m - log2 l) and dP = dO Vᵀ are computed by both (FlashAttention-2 shares them
// through an atomically added dQ instead): each gradient has one writer, and the result does
// not depend on scheduling.
//
// Causal attention (key j <= query i, PyTorch's top-left alignment) skips the tiles wholly
// above the diagonal; the blocks with the most tiles go first.
#include <atomic>
#include <cfloat>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/loops.cuh"
#include "core/cuda/mma.cuh"

namespace gw::cuda {

namespace {

constexpr int64_t kMaxHeadDim = 128;
constexpr int kWarps = 4;
constexpr int kBlockThreads = kWarps * kWarpSize;
constexpr int kRows = 16;              // a warp's rows: one mma tile high
constexpr int kTile = kWarps * kRows;  // a block's rows, and the rows of a tile it walks
constexpr float kLog2e = 1.4426950408889634f;

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
// multiples of 8 elements (16 bytes), and the copy is asynchronous (cp.async: landed after the
// next cp_async_wait_all); otherwise it is done element by element before this returns.
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
      const bool in = r < valid && c < cols;
      cp_async16(tile + r * ld + c, in ? first + r * src.row_stride + c : first, in ? 16 : 0);
    }
    return;
  }
  for (int i = threadIdx.x; i < kTile * D; i += kBlockThreads) {
    const int r = i / D, c = i % D;
    tile[r * ld + c] = r < valid && c < cols ? first[r * src.row_stride + c] : cast<T>(0.0f);
  }
}

// Writes a warp's 16 x D accumulator tiles (rows row0 + g and row0 + g + 8) times the rows'
// factors to the rows below `rows`, columns below `cols`, of head bh.
template <typename T, int D>
__device__ void write_rows(const HeadRows<T>& dst, int64_t bh, int64_t row0, int64_t rows, int cols,
                           const float (&acc)[D / 8][4], const float (&factor)[2]) {
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + g + 8 * half;
    if (row >= rows) continue;
    T* out = dst.row(bh, row);
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      const int col = d * 8 + 2 * t;
      if (col < cols) out[col] = cast<T>(acc[d][2 * half] * factor[half]);
      if (col + 1 < cols) out[col + 1] = cast<T>(acc[d][2 * half + 1] * factor[half]);
    }
  }
}

// The scaled score of a dot product in log2 units, where no mask takes part. Rounded at each
// step, never fused with what is subtracted from it: the forward and the backward, and tiles with
// and without bounds or causality to check (score2), must get the same value.
template <typename T>
__device__ __forceinline__ float plain_score2(const Problem<T>& p, float dot) {
  return __fmul_rn(__fmul_rn(dot, p.scale), kLog2e);
}

// Where a tile of query rows [i0, i0 + kTile) against keys [j0, j0 + kTile) needs no check but
// causality's (no mask, every row and key exists), how far the keys are shifted against the rows:
// key column c of query row r (both counted within their tiles) is hidden where c > r + shift
// (kTile: none is). -1 where the tile needs score2's checks element by element.
template <typename T>
__device__ __forceinline__ int causal_shift(const Problem<T>& p, bool masked, int64_t i0,
                                            int64_t j0) {
  if (masked || i0 + kTile > p.l || j0 + kTile > p.s) return -1;
  return p.causal && j0 + kTile > i0 ? static_cast<int>(i0 - j0) : kTile;  // 0 <= i0 - j0 here
}

// The scaled, masked score of query i and key j, in log2 units; -inf where the key is
// past the sequence or causality hides it. mask: the head's, from MaskView::head.
template <typename T>
__device__ __forceinline__ float score2(const Problem<T>& p, float dot, const T* mask, int64_t i,
                                        int64_t j) {
  if (j >= p.s || (p.causal && j > i)) return -INFINITY;
  if (!mask || i >= p.l) return plain_score2(p, dot);
  float x = __fmul_rn(dot, p.scale) + p.mask.at(mask, i, j);
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
  static constexpr size_t tile = size_t{kTile} * ld * sizeof(T);
  static constexpr size_t bytes = 5 * tile;  // Q; K and V twice (this tile, the next)
};

template <typename T, int D>
__global__ void __launch_bounds__(kBlockThreads) attention_forward(Problem<T> p) {
  constexpr int ld = D + kSkew;
  extern __shared__ __align__(128) unsigned char shared[];
  T* qs = reinterpret_cast<T*>(shared);
  // K and V of buffer b (0 or 1): this tile's and the next's, in turn.
  auto ks = [&](int b) { return qs + (1 + 2 * b) * kTile * ld; };
  auto vs = [&](int b) { return qs + (2 + 2 * b) * kTile * ld; };
  const int warp = threadIdx.x / kWarpSize, t = threadIdx.x % 4;
  const BlockTile bt((p.l + kTile - 1) / kTile, p.causal);
  const int64_t bh = bt.bh, i0 = bt.row0, warp_row0 = i0 + warp * kRows;
  const int64_t rows[2] = {warp_row0 + (threadIdx.x % kWarpSize) / 4,
                           warp_row0 + (threadIdx.x % kWarpSize) / 4 + 8};
  const T* mask = p.mask.head(bh);
  const int64_t keys = p.causal && i0 + kTile < p.s ? i0 + kTile : p.s;
  stage<T, D>(qs, p.q, bh, i0, p.l, p.e, p.vec);
  stage<T, D>(ks(0), p.k, bh, 0, p.s, p.e, p.vec);
  stage<T, D>(vs(0), p.v, bh, 0, p.s, p.ev, p.vec);
  cp_async_commit();
  float o[D / 8][4] = {};
  // Per row (g, g + 8): the running maximum (log2 units) and this thread's part of the sum of
  // exp2(x - m) (its quad's four parts are added at the end).
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0, 0};
  int buf = 0;
  for (int64_t j0 = 0; j0 < keys; j0 += kTile, buf ^= 1) {
    cp_async_wait_all();
    __syncthreads();  // tile j0 has landed, and every warp is done with the other buffer
    if (j0 + kTile < keys) {
      stage<T, D>(ks(buf ^ 1), p.k, bh, j0 + kTile, p.s, p.e, p.vec);
      stage<T, D>(vs(buf ^ 1), p.v, bh, j0 + kTile, p.s, p.ev, p.vec);
    }
    cp_async_commit();
    float s[kTile / 8][4] = {};
    mma_rows_by_rows<T, D, kTile / 8>(s, qs + warp * kRows * ld, ks(buf));
    float top[2] = {-INFINITY, -INFINITY};
    if (const int shift = causal_shift(p, mask != nullptr, i0, j0); shift >= 0) {
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool hidden = n * 8 + 2 * t + e % 2 > static_cast<int>(rows[e / 2] - i0) + shift;
          s[n][e] = hidden ? -INFINITY : plain_score2(p, s[n][e]);
          top[e / 2] = fmaxf(top[e / 2], s[n][e]);
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] = score2(p, s[n][e], mask, rows[e / 2], j0 + n * 8 + 2 * t + e % 2);
          top[e / 2] = fmaxf(top[e / 2], s[n][e]);
        }
      }
    }
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // a row's four threads are lanes 4g to 4g + 3
      top[h] = fmaxf(top[h], __shfl_xor_sync(0xffffffffu, top[h], 1));
      top[h] = fmaxf(top[h], __shfl_xor_sync(0xffffffffu, top[h], 2));
      const float m_new = fmaxf(m[h], top[h]);
      base[h] = m_new == -INFINITY ? 0.0f : m_new;  // every key so far masked: p = 0
      const float shrink = exp2_approx(m[h] - base[h]);  // 0 while m is -inf
      sum[h] *= shrink;
      m[h] = m_new;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        o[d][2 * h] *= shrink;
        o[d][2 * h + 1] *= shrink;
      }
    }
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2_approx(s[n][e] - base[e / 2]);
        sum[e / 2] += s[n][e];
      }
    }
    uint32_t probs[kTile / 16][4];
    as_operand<T, kTile / 16>(probs, s);
    mma_operand_by_rows<T, D, kTile / 16>(o, probs, vs(buf));  // O += P V
  }
  float factor[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
    factor[h] = sum[h] > 0 ? 1 / sum[h] : 0.0f;  // every key masked: a zero row
    if (t == 0 && rows[h] < p.l) {
      p.row_max[bh * p.l + rows[h]] = sum[h] > 0 ? m[h] : INFINITY;
      p.log_sum[bh * p.l + rows[h]] = sum[h] > 0 ? log2f(sum[h]) : 0.0f;
    }
  }
  write_rows<T, D>(p.out, bh, warp_row0, p.l, p.ev, o, factor);
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

// P and dS of a query row and a key from the score x (log2 units) and dP:
// p = exp2(x - m_i - log2 l_i), ds = p (dP - D_i) scale.
template <typename T>
__device__ __forceinline__ void prob_and_grad_of(const Problem<T>& p, float x, float dprob,
                                                 float row_max, float log_sum, float row_dot,
                                                 float& prob, float& grad) {
  // m = +inf (every key masked): 0. A probability is at most 1: a score recomputed here (as
  // K Qᵀ for dK and dV) may round above the forward's maximum. (Not fminf: NaN stays NaN.)
  const float e = (x - row_max) - log_sum;
  prob = exp2_approx(e > 0.0f ? 0.0f : e);
  grad = prob * (dprob - row_dot) * p.scale;
}

// The same of query i and key j from their dot product: both 0 where the key does not take
// part.
template <typename T>
__device__ __forceinline__ void prob_and_grad(const Problem<T>& p, float dot, float dprob,
                                              float row_max, float log_sum, float row_dot,
                                              const T* mask, int64_t i, int64_t j, float& prob,
                                              float& grad) {
  prob = grad = 0;
  if (i >= p.l) return;
  const float x = score2(p, dot, mask, i, j);
  if (x == -INFINITY) return;
  prob_and_grad_of(p, x, dprob, row_max, log_sum, row_dot, prob, grad);
}

// P and dS, in place, over a warp's 16 x 8N accumulator tiles of a backward kernel: `sc` holds
// the dot products, `dp` dP. The element at the tile's row r (the warp's rows within the block's
// 64) and column c0 + c pairs query q and key k of the staged tiles, (q, k) = (r, c) where the
// rows are queries (the dQ kernel), (c, r) where they are keys (the dK and dV kernel). st: the
// query tile's m, log2 l and D_i; shift: causal_shift(p, mask, i0, j0).
template <bool QueryRows, typename T, int N>
__device__ __forceinline__ void probs_and_grads(const Problem<T>& p, float (&sc)[N][4],
                                                float (&dp)[N][4], const float* st, int shift,
                                                const T* mask, int64_t i0, int64_t j0, int c0) {
  const int lane = threadIdx.x % kWarpSize, r0 = (threadIdx.x / kWarpSize) * kRows + lane / 4;
  // f(element, its query, its key) over every element of the tiles.
  auto each = [&](auto f) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + 8 * (e / 2), c = c0 + n * 8 + 2 * (lane % 4) + e % 2;
        f(sc[n][e], dp[n][e], QueryRows ? r : c, QueryRows ? c : r);
      }
    }
  };
  if (shift >= 0) {
    each([&](float& s, float& d, int q, int k) {
      prob_and_grad_of(p, plain_score2(p, s), d, st[q], st[kTile + q], st[2 * kTile + q], s, d);
      if (k > q + shift) s = d = 0;  // as prob_and_grad: a NaN in dO stays out
    });
  } else {
    each([&](float& s, float& d, int q, int k) {
      prob_and_grad(p, s, d, st[q], st[kTile + q], st[2 * kTile + q], mask, i0 + q, j0 + k, s, d);
    });
  }
}

template <typename T, int D>
struct BackwardShared {
  static constexpr int ld = D + kSkew;
  static constexpr size_t tile = size_t{kTile} * ld * sizeof(T);
  static constexpr size_t stats = 3 * kTile * sizeof(float);  // m, log2 l, D_i of query rows
  // The two tiles a block keeps (K and V, or Q and dO), the two it walks, twice (this tile and
  // the next), and the query rows' statistics, twice for the walk over query tiles.
  static constexpr size_t bytes = 6 * tile + 2 * stats;
};

// The statistics of query rows [i0, i0 + kTile) into `at`: m, then log2 l, then D_i (m = +inf
// past L: P = 0).
template <typename T>
__device__ void stage_stats(float* at, const Problem<T>& p, const Gradients<T>& g, int64_t bh,
                            int64_t i0) {
  for (int t = threadIdx.x; t < kTile; t += kBlockThreads) {
    const bool in = i0 + t < p.l;
    at[t] = in ? p.row_max[bh * p.l + i0 + t] : INFINITY;
    at[kTile + t] = in ? p.log_sum[bh * p.l + i0 + t] : 0.0f;
    at[2 * kTile + t] = in ? g.dots[bh * p.l + i0 + t] : 0.0f;
  }
}

// Three blocks a multiprocessor for head dims up to 64, as Hopper's shared memory holds (an
// A100's holds two).
template <typename T, int D>
__global__ void __launch_bounds__(kBlockThreads, D > 64 ? 1 : 3)
    attention_backward_kv(Problem<T> p, Gradients<T> g) {
  using Shared = BackwardShared<T, D>;
  constexpr int ld = Shared::ld;
  // Query columns per step: Sᵀ and dPᵀ of 16 x 32 beside dK and dV in registers (16 x 64 would
  // spill at head dim 128, and leave room for one block less a multiprocessor at 64).
  constexpr int kStep = 32;
  extern __shared__ __align__(128) unsigned char shared[];
  T* ks = reinterpret_cast<T*>(shared);
  T* vs = ks + kTile * ld;
  // Q, dO and the statistics of buffer b (0 or 1): this query tile's and the next's, in turn.
  auto qs = [&](int b) { return ks + (2 + 2 * b) * kTile * ld; };
  auto gos = [&](int b) { return ks + (3 + 2 * b) * kTile * ld; };
  auto stats = [&](int b) {
    return reinterpret_cast<float*>(shared + 6 * Shared::tile) + b * 3 * kTile;
  };
  const int warp = threadIdx.x / kWarpSize;
  const BlockTile bt((p.s + kTile - 1) / kTile, false);
  const int64_t bh = bt.bh, j0 = bt.row0, warp_key0 = j0 + warp * kRows;
  const T* mask = p.mask.head(bh);
  const int64_t first = p.causal ? j0 : 0;  // causal: no query before j0 sees these keys
  stage<T, D>(ks, p.k, bh, j0, p.s, p.e, p.vec);
  stage<T, D>(vs, p.v, bh, j0, p.s, p.ev, p.vec);
  if (first < p.l) {
    stage<T, D>(qs(0), p.q, bh, first, p.l, p.e, p.vec);
    stage<T, D>(gos(0), g.gout, bh, first, p.l, p.ev, p.vec);
    stage_stats(stats(0), p, g, bh, first);
  }
  cp_async_commit();
  float gk[D / 8][4] = {}, gv[D / 8][4] = {};
  int buf = 0;
  for (int64_t i0 = first; i0 < p.l; i0 += kTile, buf ^= 1) {
    cp_async_wait_all();
    __syncthreads();
    if (i0 + kTile < p.l) {
      stage<T, D>(qs(buf ^ 1), p.q, bh, i0 + kTile, p.l, p.e, p.vec);
      stage<T, D>(gos(buf ^ 1), g.gout, bh, i0 + kTile, p.l, p.ev, p.vec);
      stage_stats(stats(buf ^ 1), p, g, bh, i0 + kTile);
    }
    cp_async_commit();
    const float* st = stats(buf);
    const int shift = causal_shift(p, mask != nullptr, i0, j0);
#pragma unroll
    for (int c0 = 0; c0 < kTile; c0 += kStep) {
      float sc[kStep / 8][4] = {}, dp[kStep / 8][4] = {};
      mma_rows_by_rows<T, D, kStep / 8>(sc, ks + warp * kRows * ld, qs(buf) + c0 * ld);   // Sᵀ
      mma_rows_by_rows<T, D, kStep / 8>(dp, vs + warp * kRows * ld, gos(buf) + c0 * ld);  // dPᵀ
      probs_and_grads<false>(p, sc, dp, st, shift, mask, i0, j0, c0);
      uint32_t probs[kStep / 16][4], grads[kStep / 16][4];
      as_operand<T, kStep / 16>(probs, sc);
      as_operand<T, kStep / 16>(grads, dp);
      mma_operand_by_rows<T, D, kStep / 16>(gv, probs, gos(buf) + c0 * ld);  // dV += Pᵀ dO
      mma_operand_by_rows<T, D, kStep / 16>(gk, grads, qs(buf) + c0 * ld);   // dK += dSᵀ Q
    }
  }
  cp_async_wait_all();  // none left in flight where no query tile was walked
  const float one[2] = {1, 1};
  write_rows<T, D>(g.gk, bh, warp_key0, p.s, p.e, gk, one);
  write_rows<T, D>(g.gv, bh, warp_key0, p.s, p.ev, gv, one);
}

template <typename T, int D>
__global__ void __launch_bounds__(kBlockThreads)
    attention_backward_q(Problem<T> p, Gradients<T> g) {
  using Shared = BackwardShared<T, D>;
  constexpr int ld = Shared::ld;
  extern __shared__ __align__(128) unsigned char shared[];
  T* qs = reinterpret_cast<T*>(shared);
  T* gos = qs + kTile * ld;
  // K and V of buffer b (0 or 1): this tile's and the next's, in turn.
  auto ks = [&](int b) { return qs + (2 + 2 * b) * kTile * ld; };
  auto vs = [&](int b) { return qs + (3 + 2 * b) * kTile * ld; };
  float* const st = reinterpret_cast<float*>(shared + 6 * Shared::tile);
  const int warp = threadIdx.x / kWarpSize;
  const BlockTile bt((p.l + kTile - 1) / kTile, p.causal);
  const int64_t bh = bt.bh, i0 = bt.row0, warp_row0 = i0 + warp * kRows;
  const T* mask = p.mask.head(bh);
  const int64_t keys = p.causal && i0 + kTile < p.s ? i0 + kTile : p.s;
  stage<T, D>(qs, p.q, bh, i0, p.l, p.e, p.vec);
  stage<T, D>(gos, g.gout, bh, i0, p.l, p.ev, p.vec);
  stage_stats(st, p, g, bh, i0);
  stage<T, D>(ks(0), p.k, bh, 0, p.s, p.e, p.vec);
  stage<T, D>(vs(0), p.v, bh, 0, p.s, p.ev, p.vec);
  cp_async_commit();
  float gq[D / 8][4] = {};
  int buf = 0;
  for (int64_t j0 = 0; j0 < keys; j0 += kTile, buf ^= 1) {
    cp_async_wait_all();
    __syncthreads();
    if (j0 + kTile < keys) {
      stage<T, D>(ks(buf ^ 1), p.k, bh, j0 + kTile, p.s, p.e, p.vec);
      stage<T, D>(vs(buf ^ 1), p.v, bh, j0 + kTile, p.s, p.ev, p.vec);
    }
    cp_async_commit();
    float sc[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
    mma_rows_by_rows<T, D, kTile / 8>(sc, qs + warp * kRows * ld, ks(buf));   // S
    mma_rows_by_rows<T, D, kTile / 8>(dp, gos + warp * kRows * ld, vs(buf));  // dP
    probs_and_grads<true>(p, sc, dp, st, causal_shift(p, mask != nullptr, i0, j0), mask, i0, j0, 0);
    uint32_t grads[kTile / 16][4];
    as_operand<T, kTile / 16>(grads, dp);
    mma_operand_by_rows<T, D, kTile / 16>(gq, grads, ks(buf));  // dQ += dS K
  }
  const float one[2] = {1, 1};
  write_rows<T, D>(g.gq, bh, warp_row0, p.l, p.e, gq, one);
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

// D = 128 takes 103.5 KiB of shared memory (the backward's), beyond the 99 KiB of GPUs such as
// the A10, L4 and RTX 30 to 50 series (sm_86, sm_89, sm_120): there, those heads compose.
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
