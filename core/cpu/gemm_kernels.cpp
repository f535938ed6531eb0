// Batched matrix products: float32 on gradwire's own AVX-512 GEMM (cpu/sgemm.h) where the
// build has it, everything else on Eigen's. Each operand matrix is read in place as row-major
// (unit column stride) or column-major (unit row stride), so transposed views cost nothing;
// only matrices with neither layout are copied.
#include <Eigen/Core>
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/half_as_float.h"
#include "core/cpu/sgemm.h"

namespace gw::cpu {

namespace {

template <typename T, int Order>
using MatMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, 0,
                          Eigen::OuterStride<>>;
template <typename T, int Alignment>
using OutMap =
    Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Alignment>;

// c = a @ b, or c += a @ b when accumulating (Eigen's `=` zeroes c first, then accumulates).
template <typename T, int OA, int OB>
void gemm(const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t n, int64_t k, int64_t m,
          bool accumulate) {
  MatMap<T, OA> A(a, n, k, Eigen::OuterStride<>(lda));
  MatMap<T, OB> B(b, k, m, Eigen::OuterStride<>(ldb));
  auto run = [&](auto&& C) {
    if (accumulate)
      C.noalias() += A * B;
    else
      C.noalias() = A * B;
  };
  // Eigen stores faster into an output it knows is aligned; fresh outputs are 64-aligned.
  if (reinterpret_cast<uintptr_t>(c) % 64 == 0)
    run(OutMap<T, Eigen::Aligned64>(c, n, m));
  else
    run(OutMap<T, Eigen::Unaligned>(c, n, m));
}

template <typename T>
void gemm_dispatch(const T* a, MatrixView va, const T* b, MatrixView vb, T* c, int64_t n, int64_t k,
                   int64_t m, bool accumulate) {
  constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
  bool ar = va.layout == MatrixLayout::RowMajor, br = vb.layout == MatrixLayout::RowMajor;
  if (ar && br) return gemm<T, R, R>(a, va.ld, b, vb.ld, c, n, k, m, accumulate);
  if (ar && !br) return gemm<T, R, C>(a, va.ld, b, vb.ld, c, n, k, m, accumulate);
  if (!ar && br) return gemm<T, C, R>(a, va.ld, b, vb.ld, c, n, k, m, accumulate);
  return gemm<T, C, C>(a, va.ld, b, vb.ld, c, n, k, m, accumulate);
}

StridedMatrix strided(const float* p, MatrixView v) {
  return v.layout == MatrixLayout::RowMajor ? StridedMatrix{p, v.ld, 1} : StridedMatrix{p, 1, v.ld};
}

// bmm; with `accumulate` out += a @ b; with `bias` (float32, one per column of out) out =
// bias + a @ b.
void bmm_into(const Tensor& a_in, const Tensor& b_in, const Tensor& out, bool accumulate,
              const float* bias = nullptr) {
  dispatch<NumericTypes>(a_in.dtype(), "matmul", [&]<typename T>() {
    // 2-D operands are a batch of one (saves mm three views).
    const int64_t r = a_in.dim() - 2;
    const int64_t batch = r ? a_in.size(0) : 1, n = a_in.size(r), k = a_in.size(r + 1),
                  m = b_in.size(r + 1);
    Tensor a = a_in, b = b_in;
    MatrixView va = classify_matrix(n, k, a.stride(r), a.stride(r + 1));
    MatrixView vb = classify_matrix(k, m, b.stride(r), b.stride(r + 1));
    if (va.layout == MatrixLayout::Copy) {
      a = a.contiguous();
      va = {MatrixLayout::RowMajor, k};
    }
    if (vb.layout == MatrixLayout::Copy) {
      b = b.contiguous();
      vb = {MatrixLayout::RowMajor, m};
    }
    T* pc = out.data_ptr<T>();
    // The rows of a product that does not start from its bias in the GEMM: the bias first.
    auto fill_bias = [&](T* c) {
      if constexpr (std::is_same_v<T, float>) {
        for (int64_t row = 0; row < n; ++row) std::copy_n(bias, m, c + row * m);
      }
    };
    if (k == 0) {
      if (!accumulate) std::fill_n(pc, out.numel(), T(0));
      return;
    }
    const T* pa = a.data_ptr<T>();
    const T* pb = b.data_ptr<T>();
    const int64_t sa = r ? a.stride(0) : 0, sb = r ? b.stride(0) : 0;
    for (int64_t i = 0; i < batch; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        if (sgemm(n, m, k, strided(pa + i * sa, va), strided(pb + i * sb, vb), pc + i * n * m, m,
                  accumulate, bias))
          continue;
      }
      if (bias) fill_bias(pc + i * n * m);
      gemm_dispatch<T>(pa + i * sa, va, pb + i * sb, vb, pc + i * n * m, n, k, m,
                       accumulate || bias);
    }
  });
}

// A bias `input` broadcast over out's rows: one float32 per column, contiguous. Null otherwise.
const float* bias_row(const Tensor& input, const Tensor& out) {
  if (input.dtype() != kFloat32) return nullptr;  // addmm's operands share the input's dtype
  const Tensor row = input.expand(out.sizes());
  return (row.stride(0) == 0 || out.size(0) <= 1) && (row.stride(1) == 1 || out.size(1) <= 1)
             ? row.data_ptr<float>()
             : nullptr;
}

}  // namespace

void CpuBackend::bmm(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (in_float32({&a, &b}, {&out}, [&](const auto& t) { bmm(t[0], t[1], t[2]); })) return;
  bmm_into(a, b, out, false);
}

void CpuBackend::addmm(const Tensor& input, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (in_float32({&input, &a, &b}, {&out}, [&](const auto& t) { addmm(t[0], t[1], t[2], t[3]); }))
    return;
  const float* bias = a.size(1) > 0 ? bias_row(input, out) : nullptr;  // k = 0: input alone
  if (bias) {
    bmm_into(a, b, out, false, bias);  // each tile of the product starts from the bias
  } else {
    copy(input.expand(out.sizes()), out);
    bmm_into(a, b, out, true);
  }
}

bool CpuBackend::mm_row_sums(const Tensor& a, const Tensor& b, const Tensor& out,
                             const Tensor& row_sums) {
  if (a.dtype() != kFloat32) return false;
  const int64_t n = a.size(0), k = a.size(1), m = b.size(1);
  const MatrixView va = classify_matrix(n, k, a.stride(0), a.stride(1));
  const MatrixView vb = classify_matrix(k, m, b.stride(0), b.stride(1));
  if (va.layout != MatrixLayout::ColMajor || vb.layout == MatrixLayout::Copy) return false;
  // Summed in double, k in order, as sum() sums float32.
  std::vector<double> sums(static_cast<size_t>(n), 0.0);
  if (!sgemm(n, m, k, strided(a.data_ptr<float>(), va), strided(b.data_ptr<float>(), vb),
             out.data_ptr<float>(), m, false, nullptr, sums.data()))
    return false;
  float* to = row_sums.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) to[i] = static_cast<float>(sums[static_cast<size_t>(i)]);
  return true;
}

}  // namespace gw::cpu
