// Reductions and softmax. A reduction walks the input in memory order and accumulates into an
// accumulator laid over the input's shape with stride 0 on the reduced dims, so reducing a
// row (inner stride 0) and reducing across rows (unit inner stride) are both cache friendly.
// Floating sums accumulate in double.
#include <cmath>
#include <limits>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/float_math.h"
#include "core/cpu/half_as_float.h"
#include "core/cpu/loops.h"
#include "core/ops/creation.h"

namespace gw::cpu {

namespace {

template <typename T>
bool better(ReduceOp op, T v, T best) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(v)) return !std::isnan(best);  // NaN wins, first NaN kept
    if (std::isnan(best)) return false;
  }
  return op == ReduceOp::Max ? v > best : v < best;
}

template <typename Acc, typename T>
Acc combine(ReduceOp op, Acc acc, T v) {
  switch (op) {
    case ReduceOp::Sum:
      if constexpr (std::is_same_v<Acc, bool>) return acc || v;
      else return acc + static_cast<Acc>(v);
    case ReduceOp::Prod:
      if constexpr (std::is_same_v<Acc, bool>) return acc && v;
      else return acc * static_cast<Acc>(v);
    case ReduceOp::Max:
    case ReduceOp::Min: return better<Acc>(op, static_cast<Acc>(v), acc) ? static_cast<Acc>(v) : acc;
  }
  return acc;
}

// Sum of a contiguous run with four independent accumulators (breaks the add dependency
// chain, which matters more than vector width for double accumulation of floats).
template <typename Acc, typename T>
Acc sum_contiguous(const T* x, int64_t n) {
  Acc a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a0 += static_cast<Acc>(x[i]);
    a1 += static_cast<Acc>(x[i + 1]);
    a2 += static_cast<Acc>(x[i + 2]);
    a3 += static_cast<Acc>(x[i + 3]);
  }
  for (; i < n; ++i) a0 += static_cast<Acc>(x[i]);
  return (a0 + a1) + (a2 + a3);
}

#if defined(GW_FLOAT_LANES)
// One float32 row of softmax (or log_softmax) as the generic loop below computes it, by vectors:
// the row's maximum m (0 if every element is -inf), sum = Σ exp(x - m) in double over float
// lanes, then exp(x - m) / sum, or (x - m) - log(sum).
void softmax_row(const float* x, int64_t n, bool log, float* out) {
  const float m = lanes::softmax_shift(x, n);
  if (!log) {
    const double sum = lanes::sum_exp(x, n, m, out);
    const auto inv = static_cast<float>(1 / sum);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 k = lanes::tail_mask(n - i);
      _mm512_mask_storeu_ps(out + i, k,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(k, out + i), lanes::splat(inv)));
    }
    return;
  }
  const auto log_sum = static_cast<float>(std::log(lanes::sum_exp(x, n, m, nullptr)));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = lanes::tail_mask(n - i);
    const __m512 centred = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), lanes::splat(m));
    _mm512_mask_storeu_ps(out + i, k, _mm512_sub_ps(centred, lanes::splat(log_sum)));
  }
}
#endif

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& in, const Tensor& out) {
  if (in_float32({&in}, {&out}, [&](const auto& t) { reduce(op, t[0], t[1]); })) return;
  dispatch<AllTypes>(in.dtype(), "reduce", [&]<typename T>() {
    // Sums and products accumulate wide (double for floats, int64 for ints and bools);
    // max/min stay in T.
    auto run = [&]<typename Acc>() {
      const Acc init = reduce_identity<Acc>(op);
      if (in.is_contiguous() && out.numel() == 1) {
        const T* x = static_cast<const T*>(in.raw_data());
        int64_t n = in.numel();
        Acc acc = init;
        if (op == ReduceOp::Sum) {
          acc = sum_contiguous<Acc>(x, n);
        } else {
          for (int64_t i = 0; i < n; ++i) acc = combine(op, acc, x[i]);
        }
        dispatch<AllTypes>(out.dtype(), "reduce", [&]<typename O>() {
          *static_cast<O*>(out.raw_data()) = static_cast<O>(acc);
        });
        return;
      }
      Tensor acc = full(out.sizes(), Scalar(init), TensorOptions(dtype_of_v<Acc>));
      Tensor acc_view = acc.expand(in.sizes());
      std::array<const Tensor*, 2> ts{&acc_view, &in};
      Operands<2> ops = collapse<2>(in.sizes(), ts);
      if (in.numel() > 0) {
        int64_t rows = numel(ops.shape) / ops.shape.back();
        auto row = [op](auto& p, auto& s, int64_t n) {
          if (s[0] == 0) {  // the whole row folds into one accumulator
            Acc* a = reinterpret_cast<Acc*>(p[0]);
            if (op == ReduceOp::Sum && s[1] == sizeof(T)) {
              *a += sum_contiguous<Acc>(reinterpret_cast<const T*>(p[1]), n);
              return;
            }
            Acc v = *a;
            for (int64_t i = 0; i < n; ++i) {
              v = combine(op, v, *reinterpret_cast<const T*>(p[1] + i * s[1]));
            }
            *a = v;
          } else if (op == ReduceOp::Sum && s[0] == sizeof(Acc) && s[1] == sizeof(T)) {
            // Across rows (e.g. a bias gradient): a vectorizable running sum per column.
            Acc* a = reinterpret_cast<Acc*>(p[0]);
            const T* x = reinterpret_cast<const T*>(p[1]);
            for (int64_t i = 0; i < n; ++i) a[i] += static_cast<Acc>(x[i]);
          } else {
            for (int64_t i = 0; i < n; ++i) {
              Acc* a = reinterpret_cast<Acc*>(p[0] + i * s[0]);
              *a = combine(op, *a, *reinterpret_cast<const T*>(p[1] + i * s[1]));
            }
          }
        };
        run_rows(ops, 0, rows, row);  // serial: rows may share accumulators
      }
      Tensor(out).copy_(acc);
    };
    if (op == ReduceOp::Max || op == ReduceOp::Min) {
      run.template operator()<T>();
    } else {
      run.template operator()<acc_type_t<T>>();
    }
  });
}

void CpuBackend::reduce_with_index(ReduceOp op, const Tensor& in, int64_t dim,
                                   const Tensor& values, const Tensor& indices) {
  if (in_float32({&in}, {&values, &indices},
                 [&](const auto& t) { reduce_with_index(op, t[0], dim, t[1], t[2]); }))
    return;
  dispatch<NumericTypes>(in.dtype(), op == ReduceOp::Max ? "max" : "min", [&]<typename T>() {
    // Move `dim` last (keeping the others in order) so each output element scans one row.
    Shape perm;
    for (int64_t d = 0; d < in.dim(); ++d) {
      if (d != dim) perm.push_back(d);
    }
    perm.push_back(dim);
    Tensor x = in.permute(perm).contiguous();
    const int64_t n = in.size(dim);
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    const T* px = x.data_ptr<T>();
    T* pv = values.data_ptr<T>();
    int64_t* pi = indices.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = px + r * n;
      int64_t best = 0;
      for (int64_t i = 1; i < n; ++i) {
        if (better(op, row[i], row[best])) best = i;
      }
      pv[r] = row[best];
      pi[r] = best;
    }
  });
}

void CpuBackend::softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out) {
  if (in_float32({&in}, {&out}, [&](const auto& t) { softmax(t[0], dim, log, t[1]); })) return;
  dispatch<FloatTypes>(in.dtype(), log ? "log_softmax" : "softmax", [&]<typename T>() {
    Tensor x = in.contiguous();
    // View as (outer, n, inner): elements of one softmax are `inner` apart.
    const int64_t n = x.size(dim);
    int64_t inner = 1, outer = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const T* px = x.data_ptr<T>();
    T* po = out.data_ptr<T>();
    const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1));
#if defined(GW_FLOAT_LANES)
    if constexpr (std::is_same_v<T, float>) {
      if (inner == 1) {  // contiguous rows: the passes below, in float lanes (float_math.h)
        parallel_for(0, outer, grain, [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) softmax_row(px + r * n, n, log, po + r * n);
        });
        return;
      }
    }
#endif
    parallel_for(0, outer * inner, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + (r / inner) * n * inner + (r % inner);
        T* orow = po + (r / inner) * n * inner + (r % inner);
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t i = 0; i < n; ++i) m = std::max(m, xr[i * inner]);
        if (std::isinf(m) && m < 0) m = 0;  // an all -inf row: avoid inf - inf
        acc_type_t<T> sum = 0;
        if (log) {
          for (int64_t i = 0; i < n; ++i) sum += std::exp(xr[i * inner] - m);
          // (x - m) - log(sum), not x - (m + log(sum)): m may be large next to the result.
          T log_sum = static_cast<T>(std::log(sum));
          for (int64_t i = 0; i < n; ++i) orow[i * inner] = (xr[i * inner] - m) - log_sum;
        } else {
          for (int64_t i = 0; i < n; ++i) {
            T e = std::exp(xr[i * inner] - m);
            orow[i * inner] = e;
            sum += e;
          }
          T inv = static_cast<T>(1 / sum);
          for (int64_t i = 0; i < n; ++i) orow[i * inner] *= inv;
        }
      }
    });
  });
}

}  // namespace gw::cpu
