// gradwire's own float32 GEMM, for CPUs with AVX-512 (Eigen does every other case).
//
// The product is cut into tiles of 6 rows x 64 columns of C, each held in 24 registers while
// the k loop runs: per k, four loads of B (64 columns) and 6 broadcasts of A (one per row)
// feed 24 fused multiply-adds. (Tiles of 12 x 32, with twice the broadcasts per multiply-add,
// ran 3-14% slower, shape by shape, on an AMD Zen 4.) B is packed in blocks of 512 rows x 512
// columns into 64-column panels (transposed on the way when it is a transposed view, as a Linear's
// weight is), so a block sits in L2 while every row tile of A streams past it; A is read where it
// lies when its rows are contiguous, and otherwise packed 384 rows at a time, 6-row tiles
// interleaved. A tile starts from zero, from C (accumulate) or from the bias (addmm's Linear),
// so no pass zeroes C or copies the bias first. A batch of 64 to 512 rows against a transposed
// view of B (x @ w.T, a Linear's forward at 64 rows against 256) is computed turned around,
// (w xᵀ)ᵀ, through a scratch buffer of at most 1 MiB a thread: transposing x and the result
// moves fewer floats than transposing w. Each element of C is summed in one order,
// k = 0, 1, ..., whatever the shape around it: a row's result does not depend on how many rows
// come with it, nor on the CPU threads (set_num_threads), which take runs of C's row tiles
// (each packing its own B) when the product is large enough (2 MFLOP a thread).
//
//   // y (64 x 256) = x (64 x 784) @ w.T + bias, w (256 x 784) row-major
//   gw::cpu::sgemm(64, 256, 784, {x, 784, 1}, {w, 1, 784}, y, 256, false, bias);
#pragma once

#include <cstdint>

namespace gw::cpu {

// Whether this build has the kernel (sgemm declines everything otherwise).
#if defined(__AVX512F__)
inline constexpr bool kHaveSgemm = true;
#else
inline constexpr bool kHaveSgemm = false;
#endif

// A matrix of floats: element (i, j) at data[i * row_stride + j * col_stride].
struct StridedMatrix {
  const float* data;
  int64_t row_stride, col_stride;
};

// c (m x n, rows ldc apart, columns contiguous) = a (m x k) @ b (k x n), plus c's own values
// when `accumulate`, or plus bias[j] on every row's column j when bias is given (not both).
// c must not overlap a, b or bias. Returns false and leaves c alone when this build has no AVX-512,
// or for products it leaves to Eigen (k == 0, n < 16: a matrix-vector product wastes most of a
// tile).
//
// With `a_row_sums` (m doubles), adds A's row i, k = 0, 1, ... in turn, to a_row_sums[i] on the
// way: a Linear's bias gradient (the column sums of dY) from the read of dY its weight gradient
// dYᵀ X makes anyway. Only where A is a transposed view (row_stride 1, the rows packed); returns
// false and does nothing otherwise.
bool sgemm(int64_t m, int64_t n, int64_t k, StridedMatrix a, StridedMatrix b, float* c, int64_t ldc,
           bool accumulate, const float* bias, double* a_row_sums = nullptr);

}  // namespace gw::cpu
