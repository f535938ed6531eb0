// Batched matrix products. Floating types go to cuBLAS (cublasGemmStridedBatchedEx): cuBLAS
// is column-major, so the row-major C = A B is computed as C^T = B^T A^T, and each operand is
// passed as is with a transpose flag when it is row- or column-major (transposed views cost
// nothing); other layouts are copied first. Integer types use a simple kernel (cuBLAS has no
// integer GEMM of these types).
#include <climits>

#include "core/cuda/blas.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/loops.cuh"

namespace gw::cuda {

namespace {

// cuBLAS's name for the element type T.
template <typename T>
constexpr cudaDataType_t blas_data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  if constexpr (std::is_same_v<T, __half>) return CUDA_R_16F;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> ||
                std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>);
  return CUDA_R_16BF;
}

template <typename T>
cublasComputeType_t compute_type() {
  if constexpr (std::is_same_v<T, double>) return CUBLAS_COMPUTE_64F;
  if constexpr (std::is_same_v<T, float>) {
    return allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  }
  return CUBLAS_COMPUTE_32F;  // 16-bit inputs accumulate in float
}

int checked_int(int64_t v, const char* what) {
  GW_CHECK(v >= 0 && v <= INT_MAX, InvalidArgumentError, "[cuda matmul] ", what, " ", v,
           " exceeds cuBLAS's 32-bit limit");
  return static_cast<int>(v);
}

struct Operand {
  Tensor t;
  MatrixView view;
  int64_t batch_stride;
};

// A matrix operand (..., rows, cols) as cuBLAS can read it: copied when neither layout fits.
Operand prepare(const Tensor& t, int64_t r, int64_t rows, int64_t cols) {
  Operand o{t, classify_matrix(rows, cols, t.stride(r), t.stride(r + 1)), 0};
  if (o.view.layout == MatrixLayout::Copy) {
    o.t = t.contiguous();
    o.view = {MatrixLayout::RowMajor, cols};
  }
  o.batch_stride = r ? o.t.stride(0) : 0;
  return o;
}

// out (batch, n, m) contiguous = a (batch, n, k) b (batch, k, m), any strides; int types.
template <typename T>
__global__ void int_bmm_kernel(const T* a, const T* b, T* out, int64_t batch, int64_t n, int64_t k,
                               int64_t m, int64_t sab, int64_t sar, int64_t sac, int64_t sbb,
                               int64_t sbr, int64_t sbc) {
  const int64_t total = batch * n * m;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t j = i % m, row = (i / m) % n, bi = i / (m * n);
    const T* pa = a + bi * sab + row * sar;
    const T* pb = b + bi * sbb + j * sbc;
    T acc = 0;
    for (int64_t kk = 0; kk < k; ++kk) acc += pa[kk * sac] * pb[kk * sbr];
    out[i] = acc;
  }
}

}  // namespace

void CudaBackend::bmm(const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch<CudaNumericTypes>(a.dtype(), "matmul", [&]<typename T>() {
    using D = cuda_type_t<T>;
    // 2-D operands are a batch of one.
    const int64_t r = a.dim() - 2;
    const int64_t batch = r ? a.size(0) : 1, n = a.size(r), k = a.size(r + 1), m = b.size(r + 1);
    if (out.numel() == 0) return;
    OnDevice on(out);
    Tensor c = contiguous_target(out);
    if (k == 0) {
      fill(c, 0);
    } else if constexpr (std::is_integral_v<T>) {
      const int64_t sab = r ? a.stride(0) : 0, sbb = r ? b.stride(0) : 0;
      int_bmm_kernel<<<grid_for(batch * n * m), kThreads, 0, on.stream>>>(
          static_cast<const D*>(a.raw_data()), static_cast<const D*>(b.raw_data()),
          static_cast<D*>(c.raw_data()), batch, n, k, m, sab, a.stride(r), a.stride(r + 1), sbb,
          b.stride(r), b.stride(r + 1));
      GW_CUDA_CHECK_LAUNCH();
    } else {
      Operand A = prepare(a, r, n, k), B = prepare(b, r, k, m);
      // Column-major C^T (m x n, ld m) = op(B) (m x k) * op(A) (k x n).
      const auto op_of = [](const Operand& o) {
        return o.view.layout == MatrixLayout::RowMajor ? CUBLAS_OP_N : CUBLAS_OP_T;
      };
      const cublasOperation_t op_b = op_of(B), op_a = op_of(A);
      const compute_t<D> alpha = 1, beta = 0;  // cuBLAS scales 16-bit products in float
      constexpr cudaDataType_t type = blas_data_type<D>();
      cublasHandle_t handle = blas_handle(on.stream);
      GW_CUDA_CHECK(cublasGemmStridedBatchedEx(
          handle, op_b, op_a, checked_int(m, "size"), checked_int(n, "size"),
          checked_int(k, "size"), &alpha, B.t.raw_data(), type,
          checked_int(B.view.ld, "leading dimension"), B.batch_stride, A.t.raw_data(), type,
          checked_int(A.view.ld, "leading dimension"), A.batch_stride, &beta, c.raw_data(), type,
          checked_int(m, "size"), n * m, checked_int(batch, "batch"), compute_type<D>(),
          CUBLAS_GEMM_DEFAULT));
    }
    write_back(c, out);
  });
}

}  // namespace gw::cuda
