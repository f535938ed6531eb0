// Warp-level tensor-core products on 16-bit tiles staged in shared memory, the pieces
// FlashAttention-style kernels are built from (core/cuda/attention.cu): the mma.sync m16n8k16
// instruction with its operands loaded by ldmatrix, accumulators turned into the next product's
// left operand without leaving registers, asynchronous copies into shared memory (cp.async), and
// a one-instruction exp2. sm_80 and above.
//
//   float s[8][4] = {};                              // a warp's 16 x 64 float32 accumulators
//   mma_rows_by_rows<T, 64, 8>(s, q_rows, k_rows);   // S = Q Kᵀ, 16 rows of Q, 64 of K (D = 64)
//   uint32_t p[4][4];
//   as_operand<T, 4>(p, s);                          // S (say, exponentiated) as 16-bit operands
//   mma_operand_by_rows<T, 64, 4>(o, p, v_rows);     // O += P V
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/cuda/loops.cuh"

namespace gw::cuda {

constexpr int kSkew = 8;  // 16-bit elements padding each staged row (banks)

// --- the tensor-core instructions -----------------------------------------------------------
// m16n8k16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4 and
// t = lane % 4: the left operand's 4 registers hold rows g and g + 8, columns 2t, 2t + 1 and
// 2t + 8, 2t + 9 (two 16-bit values each); the right operand's 2 hold rows (k) 2t, 2t + 1 and
// 2t + 8, 2t + 9 of column (n) g; the float32 accumulator's 4 hold rows g and g + 8, columns
// 2t and 2t + 1.

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit values from shared memory: lanes 8i to 8i + 7 give the rows of
// matrix i; register i gets row lane / 4, columns 2 (lane % 4) and the next of matrix i, or
// (trans) its rows 2 (lane % 4) and the next, column lane / 4.
// row: a shared-memory address (shared_address).
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t row) {
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row));
  }
}

// c += a b for one 16 x 8 tile, 16-bit T operands, float32 c.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as the 16-bit pair of one operand register (lo in the low half: the lower column).
template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&h);
  }
  return r;
}

// 2^x in one instruction (MUFU.EX2: about 2 ulp, results below float's normal range flushed to
// 0; the probabilities it makes are rounded to 16 bits). -inf gives 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 16 bytes from global to shared memory without passing through registers; bytes = 0 writes
// zeros (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// --- tiles of a warp ----------------------------------------------------------------------
// Staged tiles are row-major with row stride D + kSkew (16-byte rows in 8 distinct bank groups:
// ldmatrix reads them without conflicts).

// c (16 x 8N) += a (16 staged rows of D) times bᵀ, b 8N staged rows of D.
template <typename T, int D, int N>
__device__ __forceinline__ void mma_rows_by_rows(float (&c)[N][4], const T* a, const T* b) {
  static_assert(N % 2 == 0, "n tiles go in pairs");
  constexpr int ld = D + kSkew;
  const int lane = threadIdx.x % kWarpSize;
  // The lane's row addresses; what the loops add is a constant (an immediate offset).
  const uint32_t a_row = shared_address(a + (lane % 16) * ld + (lane / 16) * 8);
  const uint32_t b_row =
      shared_address(b + (lane % 8 + (lane / 16) * 8) * ld + ((lane / 8) % 2) * 8);
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    uint32_t fa[4];
    ldmatrix_x4<false>(fa, a_row + k * 16 * sizeof(T));
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      uint32_t fb[4];  // b0, b1 of n tile n, then of n tile n + 1
      ldmatrix_x4<false>(fb, b_row + (n * 8 * ld + k * 16) * sizeof(T));
      mma<T>(c[n], fa, fb[0], fb[1]);
      mma<T>(c[n + 1], fa, fb[2], fb[3]);
    }
  }
}

// The accumulator tiles c (16 x 16K) as K left-operand fragments, rounded to T.
template <typename T, int K>
__device__ __forceinline__ void as_operand(uint32_t (&a)[K][4], const float (&c)[2 * K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    a[k][0] = pack<T>(c[2 * k][0], c[2 * k][1]);
    a[k][1] = pack<T>(c[2 * k][2], c[2 * k][3]);
    a[k][2] = pack<T>(c[2 * k + 1][0], c[2 * k + 1][1]);
    a[k][3] = pack<T>(c[2 * k + 1][2], c[2 * k + 1][3]);
  }
}

// acc (16 x D) += a (16 x 16K, operand fragments) times b, 16K staged rows of D.
template <typename T, int D, int K>
__device__ __forceinline__ void mma_operand_by_rows(float (&acc)[D / 8][4],
                                                    const uint32_t (&a)[K][4], const T* b) {
  constexpr int ld = D + kSkew;
  const int lane = threadIdx.x % kWarpSize;
  const uint32_t b_row =
      shared_address(b + (lane % 8 + ((lane / 8) % 2) * 8) * ld + (lane / 16) * 8);
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int d = 0; d < D / 8; d += 2) {
      uint32_t fb[4];  // b0, b1 of column tile d, then of d + 1: b's rows are k, transposed
      ldmatrix_x4<true>(fb, b_row + (k * 16 * ld + d * 8) * sizeof(T));
      mma<T>(acc[d], a[k], fb[0], fb[1]);
      mma<T>(acc[d + 1], a[k], fb[2], fb[3]);
    }
  }
}

}  // namespace gw::cuda
