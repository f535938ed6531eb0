// Fused attention on the CPU: FlashAttention's tiling with an online softmax, so that no
// (L x S) score matrix exists, only a (query block x key block) tile per thread.
//
// q, k, v, out and their gradients are (B, H, len, dim) with unit columns and any other strides:
// MultiheadAttention's heads, transposed views of its projections, are read and written where
// they lie.
//
// Forward, for a block of query rows against successive blocks of keys: the tile's scores
// s = scale * Q Kᵀ + mask; each row keeps its running maximum m and sum l of exp(s - m), and an
// accumulator of exp(s - m) V, rescaled by exp(m_old - m_new) whenever the maximum grows. At the
// end out = acc / l, and the row keeps m and log(l) for the backward: apart, not as the one
// log-sum-exp m + log(l) FlashAttention keeps, which loses log(l) where |m| is huge (a row
// whose every key a finite mask such as finfo.min hides: its probabilities, 1/S each, would
// recompute to 1). A row whose every key is masked gets zeros (as PyTorch 2.5+ gives) and
// m = +inf, so that its probabilities recompute to 0. Threads take query blocks of every head.
//
// Backward (FlashAttention-2): P = exp(s - m - log(l)) is recomputed tile by tile, and with
// D = rowsum(dO ∘ O): dV += Pᵀ dO, dS = P ∘ (dO Vᵀ - D), dQ += scale dS K, dK += scale dSᵀ Q.
// Threads take whole heads, so that dK and dV of a head have one writer.
//
// Dropout (FlashAttention's): the forward sums l over the probabilities before dropout and
// accumulates the dropped ones, P ∘ Z with Z = 0 or 1 / (1 - p); the backward draws Z again
// (a hash of the seed and the element's place: the same whatever thread takes it) and, with
// D = rowsum(dO ∘ O) as before, dV += (P ∘ Z)ᵀ dO and dS = P ∘ (Z ∘ dO Vᵀ - D).
//
// The tiles' products run on gradwire's float32 GEMM (cpu/sgemm.h) where it takes them, on
// Eigen's otherwise; accumulation is in the tensors' dtype, as PyTorch's CPU flash attention
// does for float32.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/half_as_float.h"
#include "core/cpu/sgemm.h"
#include "core/parallel.h"

namespace gw::cpu {

namespace {

constexpr int64_t kQueryBlock = 32, kKeyBlock = 64;

template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using In = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;
template <typename T>
using Out = Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>>;

// A (B, H, len, dim) tensor as the matrices of its B * H heads: head h = b * H + j.
template <typename T>
struct Heads {
  T* data;
  int64_t heads, batch_stride, head_stride, row_stride, cols;

  explicit Heads(const Tensor& t)
      : data(static_cast<T*>(t.raw_data())),
        heads(t.size(1)),
        batch_stride(t.stride(0)),
        head_stride(t.stride(1)),
        row_stride(t.stride(2)),
        cols(t.size(3)) {}

  T* at(int64_t h, int64_t row) const {
    return data + (h / heads) * batch_stride + (h % heads) * head_stride + row * row_stride;
  }
  In<T> rows(int64_t h, int64_t row, int64_t n) const {
    return In<T>(at(h, row), n, cols, Eigen::OuterStride<>(row_stride));
  }
  Out<T> rows_out(int64_t h, int64_t row, int64_t n) const {
    return Out<T>(at(h, row), n, cols, Eigen::OuterStride<>(row_stride));
  }
};

// c = a b, or c += a b with `accumulate`: matrices and their transposed views, in place.
template <typename T, typename C, typename A, typename B>
void product(C&& c, const A& a, const B& b, bool accumulate) {
  static_assert(std::decay_t<C>::IsRowMajor && std::decay_t<C>::InnerStrideAtCompileTime == 1);
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm(c.rows(), c.cols(), a.cols(), {a.data(), a.rowStride(), a.colStride()},
              {b.data(), b.rowStride(), b.colStride()}, c.data(), c.rowStride(), accumulate,
              nullptr))
      return;
  }
  if (accumulate)
    c.noalias() += a * b;
  else
    c.noalias() = a * b;
}

// Dropout's draw for element `index` (its place among the B * H * L * S probabilities) of a
// call seeded `seed`: splitmix64's finalizer over the counter; the element is dropped where the
// high 32 bits fall below threshold = p * 2^32.
inline bool kept(uint64_t seed, uint64_t index, uint64_t threshold) {
  uint64_t x = seed + index * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return ((x ^ (x >> 31)) >> 32) >= threshold;
}

// The problem's sizes, and the additive mask (batch..., L, S) read through its strides.
template <typename T>
struct Problem {
  int64_t bh, l, s, e, ev;
  T scale;
  bool causal;
  const T* mask = nullptr;
  std::vector<int64_t> mask_sizes, mask_strides;  // of the batch dims, then L and S
  bool dropout;
  uint64_t seed, threshold;  // dropout's
  T keep_scale;              // 1 / (1 - p)

  Problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& m,
          const AttentionOptions& options)
      : bh(q.size(0) * q.size(1)),
        l(q.size(2)),
        s(k.size(2)),
        e(q.size(3)),
        ev(v.size(3)),
        scale(static_cast<T>(options.scale)),
        causal(options.causal),
        dropout(options.dropout_p > 0),
        seed(options.dropout_seed),
        threshold(static_cast<uint64_t>(std::ldexp(options.dropout_p, 32))),
        keep_scale(static_cast<T>(1 / (1 - options.dropout_p))) {
    if (!m.defined()) return;
    mask = m.data_ptr<T>();
    mask_sizes.assign(m.sizes().begin(), m.sizes().end());
    mask_strides.assign(m.strides().begin(), m.strides().end());
  }

  // Where head `h`'s (L, S) mask starts.
  const T* mask_of(int64_t h) const {
    int64_t offset = 0;
    for (auto d = static_cast<int64_t>(mask_sizes.size()) - 3; d >= 0; --d) {
      offset += (h % mask_sizes[d]) * mask_strides[d];
      h /= mask_sizes[d];
    }
    return mask + offset;
  }

  // The scores of query rows [i0, i0 + tile.rows()) against keys [j0, j0 + tile.cols()) of head
  // h, made from tile = Q Kᵀ: scaled, masked, and -inf where causality forbids.
  template <typename Tile>
  void finish_scores(Tile& tile, int64_t h, int64_t i0, int64_t j0) const {
    tile *= scale;
    const T* hm = mask ? mask_of(h) : nullptr;
    const int64_t ms = mask ? mask_strides[mask_strides.size() - 2] : 0;
    const int64_t mt = mask ? mask_strides.back() : 0;
    for (int64_t r = 0; r < tile.rows(); ++r) {
      if (hm)
        for (int64_t c = 0; c < tile.cols(); ++c) tile(r, c) += hm[(i0 + r) * ms + (j0 + c) * mt];
      if (causal)
        for (int64_t c = std::max<int64_t>(0, i0 + r + 1 - j0); c < tile.cols(); ++c)
          tile(r, c) = -std::numeric_limits<T>::infinity();
    }
  }

  // Keys a block of query rows ending before `i1` looks at.
  int64_t keys_for(int64_t i1) const { return causal ? std::min(s, i1) : s; }

  // Dropout's factor Z (0 or 1 / (1 - p)) of head h's probability (i, j).
  T keep_factor(int64_t h, int64_t i, int64_t j) const {
    return kept(seed, static_cast<uint64_t>((h * l + i) * s + j), threshold) ? keep_scale : T(0);
  }
};

// Each query row's maximum score m and log(l), l its sum of exp(s - m): a (2, B * H, L) tensor.
template <typename T>
struct RowStats {
  T *max, *log_sum;
  explicit RowStats(const Tensor& stats)
      : max(static_cast<T*>(stats.raw_data())), log_sum(max + stats.size(1) * stats.size(2)) {}
};

template <typename T>
void forward(const Problem<T>& p, const Heads<T>& q, const Heads<T>& k, const Heads<T>& v,
             const Heads<T>& out, const RowStats<T>& stats) {
  const int64_t blocks = (p.l + kQueryBlock - 1) / kQueryBlock;
  const T inf = std::numeric_limits<T>::infinity();
  parallel_for(0, p.bh * blocks, 1, [&](int64_t begin, int64_t end) {
    Mat<T> tile(kQueryBlock, kKeyBlock), acc(kQueryBlock, p.ev);
    std::vector<T> m(kQueryBlock), sum(kQueryBlock);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t h = w / blocks, i0 = (w % blocks) * kQueryBlock;
      const int64_t br = std::min(kQueryBlock, p.l - i0);
      const In<T> qb = q.rows(h, i0, br);
      auto a = acc.topRows(br);
      a.setZero();
      std::fill(m.begin(), m.end(), -inf);
      std::fill(sum.begin(), sum.end(), T(0));
      const int64_t keys = p.keys_for(i0 + br);
      for (int64_t j0 = 0; j0 < keys; j0 += kKeyBlock) {
        const int64_t bc = std::min(kKeyBlock, keys - j0);
        const In<T> kb = k.rows(h, j0, bc), vb = v.rows(h, j0, bc);
        auto t = tile.topLeftCorner(br, bc);
        product<T>(t, qb, kb.transpose(), false);
        p.finish_scores(t, h, i0, j0);
        for (int64_t r = 0; r < br; ++r) {
          const T top = std::max(m[r], t.row(r).maxCoeff());
          if (top == -inf) {  // every key so far is masked out: nothing to add
            t.row(r).setZero();
            continue;
          }
          const T shrink = std::exp(m[r] - top);  // 0 for the first keys (m = -inf)
          a.row(r) *= shrink;
          sum[r] *= shrink;
          m[r] = top;
          t.row(r) = (t.row(r).array() - top).exp();
          sum[r] += t.row(r).sum();
          if (p.dropout)
            for (int64_t c = 0; c < bc; ++c) t(r, c) *= p.keep_factor(h, i0 + r, j0 + c);
        }
        product<T>(a, t, vb, true);
      }
      Out<T> ob = out.rows_out(h, i0, br);
      for (int64_t r = 0; r < br; ++r) {
        const int64_t row = h * p.l + i0 + r;
        if (sum[r] == 0) {  // every key masked: a zero row (PyTorch 2.5+), P = exp(s - inf) = 0
          ob.row(r).setZero();
          stats.max[row] = inf;
          stats.log_sum[row] = 0;
          continue;
        }
        ob.row(r) = a.row(r) / sum[r];
        stats.max[row] = m[r];
        stats.log_sum[row] = std::log(sum[r]);
      }
    }
  });
}

template <typename T>
void backward(const Problem<T>& p, const Heads<T>& gout, const Heads<T>& q, const Heads<T>& k,
              const Heads<T>& v, const Heads<T>& out, const RowStats<T>& stats, const Heads<T>& gq,
              const Heads<T>& gk, const Heads<T>& gv) {
  parallel_for(0, p.bh, 1, [&](int64_t begin, int64_t end) {
    Mat<T> prob(kQueryBlock, kKeyBlock), dprob(kQueryBlock, kKeyBlock);
    std::vector<T> d(kQueryBlock);
    for (int64_t h = begin; h < end; ++h) {
      gk.rows_out(h, 0, p.s).setZero();
      gv.rows_out(h, 0, p.s).setZero();
      for (int64_t i0 = 0; i0 < p.l; i0 += kQueryBlock) {
        const int64_t br = std::min(kQueryBlock, p.l - i0), row = h * p.l + i0;
        const In<T> qb = q.rows(h, i0, br), gob = gout.rows(h, i0, br), ob = out.rows(h, i0, br);
        Out<T> gqb = gq.rows_out(h, i0, br);
        gqb.setZero();
        for (int64_t r = 0; r < br; ++r) d[r] = gob.row(r).dot(ob.row(r));
        const int64_t keys = p.keys_for(i0 + br);
        for (int64_t j0 = 0; j0 < keys; j0 += kKeyBlock) {
          const int64_t bc = std::min(kKeyBlock, keys - j0);
          const In<T> kb = k.rows(h, j0, bc), vb = v.rows(h, j0, bc);
          Out<T> gkb = gk.rows_out(h, j0, bc), gvb = gv.rows_out(h, j0, bc);
          auto pt = prob.topLeftCorner(br, bc);
          auto dt = dprob.topLeftCorner(br, bc);
          product<T>(pt, qb, kb.transpose(), false);
          p.finish_scores(pt, h, i0, j0);
          for (int64_t r = 0; r < br; ++r) {
            pt.row(r) = ((pt.row(r).array() - stats.max[row + r]) - stats.log_sum[row + r]).exp();
          }
          product<T>(dt, gob, vb.transpose(), false);  // dO Vᵀ
          for (int64_t r = 0; r < br; ++r) {
            if (!p.dropout) {
              dt.row(r) = pt.row(r).array() * (dt.row(r).array() - d[r]) * p.scale;
              continue;
            }
            for (int64_t c = 0; c < bc; ++c) {
              const T z = p.keep_factor(h, i0 + r, j0 + c);
              dt(r, c) = pt(r, c) * (z * dt(r, c) - d[r]) * p.scale;
              pt(r, c) *= z;  // what multiplied V
            }
          }
          product<T>(gvb, pt.transpose(), gob, true);
          product<T>(gqb, dt, kb, true);
          product<T>(gkb, dt.transpose(), qb, true);
        }
      }
    }
  });
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                           const AttentionOptions& options, const Tensor& out,
                           const Tensor& stats) {
  if (in_float32({&q, &k, &v, &mask}, {&out, &stats},
                 [&](const auto& t) { attention(t[0], t[1], t[2], t[3], options, t[4], t[5]); }))
    return;
  dispatch<FloatTypes>(q.dtype(), "scaled_dot_product_attention", [&]<typename T>() {
    forward(Problem<T>(q, k, v, mask, options), Heads<T>(q), Heads<T>(k), Heads<T>(v),
            Heads<T>(out), RowStats<T>(stats));
  });
}

void CpuBackend::attention_backward(const Tensor& gout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& mask,
                                    const AttentionOptions& options, const Tensor& out,
                                    const Tensor& stats, const Tensor& gq, const Tensor& gk,
                                    const Tensor& gv) {
  if (in_float32({&gout, &q, &k, &v, &mask, &out, &stats}, {&gq, &gk, &gv}, [&](const auto& t) {
        attention_backward(t[0], t[1], t[2], t[3], t[4], options, t[5], t[6], t[7], t[8], t[9]);
      }))
    return;
  dispatch<FloatTypes>(q.dtype(), "scaled_dot_product_attention", [&]<typename T>() {
    backward(Problem<T>(q, k, v, mask, options), Heads<T>(gout), Heads<T>(q), Heads<T>(k),
             Heads<T>(v), Heads<T>(out), RowStats<T>(stats), Heads<T>(gq), Heads<T>(gk),
             Heads<T>(gv));
  });
}

}  // namespace gw::cpu
