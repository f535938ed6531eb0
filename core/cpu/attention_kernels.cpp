// Fused attention on the CPU: FlashAttention's tiling with an online softmax, so that no
// (L x S) score matrix exists, only a (query block x key block) tile per thread.
//
// Forward, for a block of query rows against successive blocks of keys: the tile's scores
// s = scale * Q Kᵀ + mask; each row keeps its running maximum m and sum l of exp(s - m), and an
// accumulator of exp(s - m) V, rescaled by exp(m_old - m_new) whenever the maximum grows. At the
// end out = acc / l and lse = m + log(l); a row whose every key is masked gets zeros (as
// PyTorch 2.5+ gives) and lse = +inf, so that its probabilities recompute to 0 in the
// backward. Threads take query blocks of every head.
//
// Backward (FlashAttention-2): P = exp(s - lse) is recomputed tile by tile, and with
// D = rowsum(dO ∘ O): dV += Pᵀ dO, dS = P ∘ (dO Vᵀ - D), dQ += scale dS K, dK += scale dSᵀ Q.
// Threads take whole heads, so that dK and dV of a head have one writer.
//
// The tiles' products run on gradwire's float32 GEMM (cpu/sgemm.h) where it takes them, on
// Eigen's otherwise; accumulation is in the tensors' dtype, as PyTorch's CPU flash attention
// does for float32.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/sgemm.h"
#include "core/parallel.h"

namespace gw::cpu {

namespace {

constexpr int64_t kQueryBlock = 32, kKeyBlock = 64;

template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using In = Eigen::Map<const Mat<T>>;
template <typename T>
using Out = Eigen::Map<Mat<T>>;

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

// The problem's sizes, and the additive mask (batch..., L, S) read through its strides.
template <typename T>
struct Problem {
  int64_t bh, l, s, e, ev;
  T scale;
  bool causal;
  const T* mask = nullptr;
  std::vector<int64_t> mask_sizes, mask_strides;  // of the batch dims, then L and S

  Problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& m, bool causal,
          double scale)
      : bh(q.size(0)),
        l(q.size(1)),
        s(k.size(1)),
        e(q.size(2)),
        ev(v.size(2)),
        scale(static_cast<T>(scale)),
        causal(causal) {
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
};

template <typename T>
void forward(const Problem<T>& p, const T* q, const T* k, const T* v, T* out, T* lse) {
  const int64_t blocks = (p.l + kQueryBlock - 1) / kQueryBlock;
  const T inf = std::numeric_limits<T>::infinity();
  parallel_for(0, p.bh * blocks, 1, [&](int64_t begin, int64_t end) {
    Mat<T> tile(kQueryBlock, kKeyBlock), acc(kQueryBlock, p.ev);
    std::vector<T> m(kQueryBlock), sum(kQueryBlock);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t h = w / blocks, i0 = (w % blocks) * kQueryBlock;
      const int64_t br = std::min(kQueryBlock, p.l - i0);
      In<T> qb(q + (h * p.l + i0) * p.e, br, p.e);
      auto a = acc.topRows(br);
      a.setZero();
      std::fill(m.begin(), m.end(), -inf);
      std::fill(sum.begin(), sum.end(), T(0));
      const int64_t keys = p.keys_for(i0 + br);
      for (int64_t j0 = 0; j0 < keys; j0 += kKeyBlock) {
        const int64_t bc = std::min(kKeyBlock, keys - j0);
        In<T> kb(k + (h * p.s + j0) * p.e, bc, p.e), vb(v + (h * p.s + j0) * p.ev, bc, p.ev);
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
        }
        product<T>(a, t, vb, true);
      }
      Out<T> ob(out + (h * p.l + i0) * p.ev, br, p.ev);
      for (int64_t r = 0; r < br; ++r) {
        if (sum[r] == 0) {  // every key masked: a zero row (PyTorch 2.5+), P = exp(s - inf) = 0
          ob.row(r).setZero();
          lse[h * p.l + i0 + r] = inf;
          continue;
        }
        ob.row(r) = a.row(r) / sum[r];
        lse[h * p.l + i0 + r] = m[r] + std::log(sum[r]);
      }
    }
  });
}

template <typename T>
void backward(const Problem<T>& p, const T* gout, const T* q, const T* k, const T* v, const T* out,
              const T* lse, T* gq, T* gk, T* gv) {
  parallel_for(0, p.bh, 1, [&](int64_t begin, int64_t end) {
    Mat<T> prob(kQueryBlock, kKeyBlock), dprob(kQueryBlock, kKeyBlock);
    std::vector<T> d(kQueryBlock);
    for (int64_t h = begin; h < end; ++h) {
      Out<T>(gk + h * p.s * p.e, p.s, p.e).setZero();
      Out<T>(gv + h * p.s * p.ev, p.s, p.ev).setZero();
      for (int64_t i0 = 0; i0 < p.l; i0 += kQueryBlock) {
        const int64_t br = std::min(kQueryBlock, p.l - i0), row = h * p.l + i0;
        In<T> qb(q + row * p.e, br, p.e), gob(gout + row * p.ev, br, p.ev);
        In<T> ob(out + row * p.ev, br, p.ev);
        Out<T> gqb(gq + row * p.e, br, p.e);
        gqb.setZero();
        for (int64_t r = 0; r < br; ++r) d[r] = gob.row(r).dot(ob.row(r));
        const int64_t keys = p.keys_for(i0 + br);
        for (int64_t j0 = 0; j0 < keys; j0 += kKeyBlock) {
          const int64_t bc = std::min(kKeyBlock, keys - j0), key = h * p.s + j0;
          In<T> kb(k + key * p.e, bc, p.e), vb(v + key * p.ev, bc, p.ev);
          Out<T> gkb(gk + key * p.e, bc, p.e), gvb(gv + key * p.ev, bc, p.ev);
          auto pt = prob.topLeftCorner(br, bc);
          auto dt = dprob.topLeftCorner(br, bc);
          product<T>(pt, qb, kb.transpose(), false);
          p.finish_scores(pt, h, i0, j0);
          for (int64_t r = 0; r < br; ++r) pt.row(r) = (pt.row(r).array() - lse[row + r]).exp();
          product<T>(gvb, pt.transpose(), gob, true);
          product<T>(dt, gob, vb.transpose(), false);
          for (int64_t r = 0; r < br; ++r)
            dt.row(r) = pt.row(r).array() * (dt.row(r).array() - d[r]) * p.scale;
          product<T>(gqb, dt, kb, true);
          product<T>(gkb, dt.transpose(), qb, true);
        }
      }
    }
  });
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                           bool causal, double scale, const Tensor& out, const Tensor& lse) {
  dispatch<FloatTypes>(q.dtype(), "scaled_dot_product_attention", [&]<typename T>() {
    forward(Problem<T>(q, k, v, mask, causal, scale), q.data_ptr<T>(), k.data_ptr<T>(),
            v.data_ptr<T>(), out.data_ptr<T>(), lse.data_ptr<T>());
  });
}

void CpuBackend::attention_backward(const Tensor& gout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& mask, bool causal, double scale,
                                    const Tensor& out, const Tensor& lse, const Tensor& gq,
                                    const Tensor& gk, const Tensor& gv) {
  dispatch<FloatTypes>(q.dtype(), "scaled_dot_product_attention", [&]<typename T>() {
    backward(Problem<T>(q, k, v, mask, causal, scale), gout.data_ptr<T>(), q.data_ptr<T>(),
             k.data_ptr<T>(), v.data_ptr<T>(), out.data_ptr<T>(), lse.data_ptr<T>(),
             gq.data_ptr<T>(), gk.data_ptr<T>(), gv.data_ptr<T>());
  });
}

}  // namespace gw::cpu
