// The fused row ops on the CPU: layer_norm and cross-entropy, forward and backward, each row
// handled by one thread in a few passes over the row while it is in cache. Accumulation is in
// double (acc_type_t), as for the other reductions; these are the reference the CUDA kernels
// are tested against. layer_norm works element by element in the tensor's dtype, as PyTorch's
// CPU kernel does: each row's mean is summed in double and the row centred on it to about
// double's precision, and the centred terms are summed in the dtype's lanes, 256 at a time, each
// block's sum added in double (row_sum). In double element by element it took 1.4x as long on a
// GPT's rows of 128. Cross-entropy's float32 rows take each exp in float, sixteen lanes at a time
// (float_math.h), and add the lanes' sums into double 256 elements at a time.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/float_math.h"
#include "core/cpu/half_as_float.h"
#include "core/cpu/loops.h"
#include "core/ops/creation.h"
#include "core/parallel.h"

namespace gw::cpu {

namespace {

template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

int64_t row_grain(int64_t n) {
  return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1));
}

// The sum of f(i) (a T) for i in [0, n) in a fixed order: sixteen running sums of T (a vector
// of float32), element i on sum i % 16, each 256 elements' sums added pairwise into A; a row of
// any length is summed in T only 16 elements deep.
template <typename A, typename T, typename F>
A row_sum(int64_t n, F f) {
  constexpr int64_t kLanes = 16, kBlock = 256;
  A total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    T part[kLanes] = {};
    const int64_t e = std::min(n, b + kBlock);
    int64_t i = b;
    for (; i + kLanes <= e; i += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) part[j] += f(i + j);
    for (int64_t j = 0; i < e; ++i, ++j) part[j] += f(i);
    for (int64_t w = kLanes / 2; w > 0; w /= 2)
      for (int64_t j = 0; j < w; ++j) part[j] += part[j + w];
    total += A(part[0]);
  }
  return total;
}

}  // namespace

void CpuBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                            const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  if (in_float32({&x, &weight, &bias}, {&y, &mean, &rstd},
                 [&](const auto& t) { layer_norm(t[0], t[1], t[2], eps, t[3], t[4], t[5]); }))
    return;
  dispatch<FloatTypes>(x.dtype(), "layer_norm", [&]<typename T>() {
    using A = acc_type_t<T>;
    const int64_t rows = mean.numel(), n = rows == 0 ? 0 : x.numel() / rows;
    const T *px = x.data_ptr<T>(), *pw = data_or_null<T>(weight), *pb = data_or_null<T>(bias);
    T *py = y.data_ptr<T>(), *pm = mean.data_ptr<T>(), *pr = rstd.data_ptr<T>();
    parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = px + r * n;
        T* yr = py + r * n;
        // The mean, summed in A (its terms are as large as the elements), in T, and what rounding
        // it to T lost: x - mean to about A's precision where the mean is large against the
        // spread; the centred terms that follow are summed in T.
        const A mean = row_sum<A, A>(n, [&](int64_t i) { return A(xr[i]); }) / static_cast<A>(n);
        const auto mu = static_cast<T>(mean), mu_lo = static_cast<T>(mean - mu);
        auto centered = [&](int64_t i) { return (xr[i] - mu) - mu_lo; };
        // Two passes: exact where sum-of-squares formulas cancel.
        const A squares = row_sum<A, T>(n, [&](int64_t i) { return centered(i) * centered(i); });
        const auto inv = static_cast<T>(1 / std::sqrt(squares / static_cast<A>(n) + eps));
        // With or without the weight and the bias, chosen outside the loop so that it vectorizes.
        auto write = [&]<bool kWeight, bool kBias>() {
          for (int64_t i = 0; i < n; ++i) {
            T v = centered(i) * inv;
            if constexpr (kWeight) v *= pw[i];
            if constexpr (kBias) v += pb[i];
            yr[i] = v;
          }
        };
        if (pw && pb)
          write.template operator()<true, true>();
        else if (pw)
          write.template operator()<true, false>();
        else if (pb)
          write.template operator()<false, true>();
        else
          write.template operator()<false, false>();
        pm[r] = mu;
        pr[r] = inv;
      }
    });
  });
}

void CpuBackend::layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& gx,
                                     const Tensor& gweight, const Tensor& gbias) {
  if (in_float32({&gy, &x, &weight, &mean, &rstd}, {&gx, &gweight, &gbias}, [&](const auto& t) {
        layer_norm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
      }))
    return;
  dispatch<FloatTypes>(x.dtype(), "layer_norm_backward", [&]<typename T>() {
    using A = acc_type_t<T>;
    const int64_t rows = mean.numel(), n = rows == 0 ? 0 : x.numel() / rows;
    const T *pg = gy.data_ptr<T>(), *px = x.data_ptr<T>(), *pw = data_or_null<T>(weight);
    const T *pm = mean.data_ptr<T>(), *pr = rstd.data_ptr<T>();
    // What each row's mean lost when the forward stored it in T (its mu_lo, by which it centred
    // the row), found again while the row is read for gx: x - mean is (x - mu) - lo here too.
    std::vector<T> lo(static_cast<size_t>(rows));
    auto find_lo = [&](int64_t r) {
      if constexpr (std::is_same_v<T, A>) return;  // the stored mean is the mean
      const T *xr = px + r * n, mu = pm[r];
      lo[r] = static_cast<T>(row_sum<A, T>(n, [&](int64_t i) { return xr[i] - mu; }) / n);
    };
    if (!gx.defined()) {
      parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) find_lo(r);
      });
    } else {
      // gx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = gy * weight
      T* pgx = gx.data_ptr<T>();
      parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          find_lo(r);
          const T *g = pg + r * n, *xr = px + r * n;
          const T mu = pm[r], mu_lo = lo[r], inv = pr[r];
          auto xhat = [&](int64_t i) { return ((xr[i] - mu) - mu_lo) * inv; };
          // The row with g_i given: without a weight, or with one (a branch outside the loops,
          // so that they vectorize).
          auto row = [&](auto gi) {
            const auto mean_g = static_cast<T>(row_sum<A, T>(n, gi) / n);
            const auto mean_gx =
                static_cast<T>(row_sum<A, T>(n, [&](int64_t i) { return gi(i) * xhat(i); }) / n);
            for (int64_t i = 0; i < n; ++i)
              pgx[r * n + i] = inv * (gi(i) - mean_g - xhat(i) * mean_gx);
          };
          if (pw)
            row([&](int64_t i) { return g[i] * pw[i]; });
          else
            row([&](int64_t i) { return g[i]; });
        }
      });
    }
    if (gweight.defined() || gbias.defined()) {
      // Column sums over the rows, each column's chunk by one thread, rows in memory order.
      T* pgw = gweight.defined() ? gweight.data_ptr<T>() : nullptr;
      T* pgb = gbias.defined() ? gbias.data_ptr<T>() : nullptr;
      auto columns = [&](int64_t begin, int64_t end) {
        std::vector<A> sw(static_cast<size_t>(end - begin)), sb(sw.size());
        for (int64_t r = 0; r < rows; ++r) {
          const T *g = pg + r * n, *xr = px + r * n;
          const A mu = pm[r], mu_lo = lo[r], inv = pr[r];
          for (int64_t i = begin; i < end; ++i) {
            sw[i - begin] += A(g[i]) * ((xr[i] - mu) - mu_lo) * inv;
            sb[i - begin] += g[i];
          }
        }
        for (int64_t i = begin; i < end; ++i) {
          if (pgw) pgw[i] = static_cast<T>(sw[i - begin]);
          if (pgb) pgb[i] = static_cast<T>(sb[i - begin]);
        }
      };
      parallel_for(0, n, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(rows, 1)),
                   columns);
    }
  });
}

void CpuBackend::cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& loss,
                               const Tensor& lse) {
  if (in_float32({&logits, &target}, {&loss, &lse},
                 [&](const auto& t) { cross_entropy(t[0], t[1], t[2], t[3]); }))
    return;
  dispatch<FloatTypes>(logits.dtype(), "cross_entropy", [&]<typename T>() {
    using A = acc_type_t<T>;
    const int64_t rows = loss.numel(), n = rows == 0 ? 0 : logits.numel() / rows;
    const T* px = logits.data_ptr<T>();
    const int64_t* pt = target.data_ptr<int64_t>();
    T *pl = loss.data_ptr<T>(), *ps = lse.data_ptr<T>();
    parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = px + r * n;
        T m = -std::numeric_limits<T>::infinity();
        A sum = 0;
#if defined(GW_FLOAT_LANES)
        if constexpr (std::is_same_v<T, float>) {  // float lanes, each term's exp in float
          m = lanes::softmax_shift(xr, n);
          sum = lanes::sum_exp(xr, n, m, nullptr);
        } else
#endif
        {
          for (int64_t i = 0; i < n; ++i) m = std::max(m, xr[i]);
          if (std::isinf(m) && m < 0) m = 0;  // an all -inf row: avoid inf - inf
          for (int64_t i = 0; i < n; ++i) sum += std::exp(A(xr[i]) - m);
        }
        const A log_sum_exp = m + std::log(sum);
        ps[r] = static_cast<T>(log_sum_exp);
        pl[r] = static_cast<T>(log_sum_exp - xr[pt[r]]);
      }
    });
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& target,
                                        const Tensor& lse, const Tensor& grad_loss,
                                        const Tensor& grad_logits) {
  if (in_float32({&logits, &target, &lse, &grad_loss}, {&grad_logits},
                 [&](const auto& t) { cross_entropy_backward(t[0], t[1], t[2], t[3], t[4]); }))
    return;
  dispatch<FloatTypes>(logits.dtype(), "cross_entropy_backward", [&]<typename T>() {
    const int64_t rows = lse.numel(), n = rows == 0 ? 0 : logits.numel() / rows;
    const T *px = logits.data_ptr<T>(), *ps = lse.data_ptr<T>(), *pg = grad_loss.data_ptr<T>();
    const int64_t* pt = target.data_ptr<int64_t>();
    T* po = grad_logits.data_ptr<T>();
    parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T *xr = px + r * n, s = ps[r], g = pg[r];
        T* orow = po + r * n;
#if defined(GW_FLOAT_LANES)
        if constexpr (std::is_same_v<T, float>)
          lanes::scaled_exp(xr, n, s, g, orow);
        else
#endif
          for (int64_t i = 0; i < n; ++i) orow[i] = g * std::exp(xr[i] - s);
        orow[pt[r]] -= g;
      }
    });
  });
}

}  // namespace gw::cpu
