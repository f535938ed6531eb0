#include "core/cpu/sgemm.h"

#include "core/error.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>
#endif

namespace gw::cpu {

#if !defined(__AVX512F__)

bool sgemm(int64_t, int64_t, int64_t, StridedMatrix, StridedMatrix, float*, int64_t, bool,
           const float*) {
  return false;
}

#else

namespace {

constexpr int64_t kRows = 12;     // a tile's rows: 12 x 2 accumulators + 2 of B + 1 broadcast
constexpr int64_t kCols = 32;     // a tile's columns: two vectors of 16 floats
// k per packed slice: C's tiles are read back once per slice, so deep slices matter for large
// k (2048 x 2048: 1.03x -> 1.09x raw Eigen from 256 to 512); a panel of B is 64 KiB, from L2.
constexpr int64_t kDepth = 512;
constexpr int64_t kWidth = 512;   // columns per packed slice: at most 1 MiB of B, in L2
constexpr int64_t kHeight = 384;  // rows of A packed at a time (when packed): 768 KiB

// This thread's packing buffer, 64-byte aligned, grown as needed and kept (at most 1.75 MiB
// a thread, outside the CPU allocator's counters).
float* scratch(size_t floats) {
  struct Buffer {
    std::unique_ptr<float, decltype(&std::free)> data{nullptr, &std::free};
    size_t size = 0;
  };
  static thread_local Buffer buffer;
  if (buffer.size < floats) {
    const size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    auto* grown = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!grown) throw std::bad_alloc();  // the old buffer stays as it was
    buffer.data.reset(grown);
    buffer.size = floats;
  }
  return buffer.data.get();
}

// GCC 12's _mm512_undefined_ps initialises a variable from itself (its way of saying "any
// value"); inlined into the shuffles below, that reads as a use of an uninitialized variable.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
// out[i * ldo + j] = in[j * ldi + i] for i, j < 16: a 16 x 16 transpose in registers.
void transpose16(const float* in, int64_t ldi, float* out, int64_t ldo) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + i * ldi);
  for (int i = 0; i < 16; i += 2) {  // interleave pairs of rows
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // then pairs of pairs: 4 x 4 blocks per 128-bit lane
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {  // then the 128-bit lanes across rows 4 and 8 apart
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + i * ldo, r[i]);
}
#pragma GCC diagnostic pop

// B's rows k0 .. k0 + depth, columns j0 .. j0 + width, as panels of kCols columns:
// out[p * depth * kCols + k * kCols + c] = B(k0 + k, j0 + p * kCols + c), zero past n.
void pack_b(const StridedMatrix& b, int64_t k0, int64_t depth, int64_t j0, int64_t width,
            float* out) {
  const int64_t whole = width / kCols;  // panels without padding
  if (b.col_stride == 1) {  // rows of B are rows of the panels: read each row once, in order
    for (int64_t k = 0; k < depth; ++k) {
      const float* row = b.data + (k0 + k) * b.row_stride + j0;
      for (int64_t p = 0; p < whole; ++p) {
        float* dst = out + p * depth * kCols + k * kCols;
        _mm512_store_ps(dst, _mm512_loadu_ps(row + p * kCols));
        _mm512_store_ps(dst + 16, _mm512_loadu_ps(row + p * kCols + 16));
      }
    }
  }
  for (int64_t p = b.col_stride == 1 ? whole : 0; p * kCols < width; ++p) {
    const int64_t j = j0 + p * kCols, cols = std::min(kCols, j0 + width - j);
    float* panel = out + p * depth * kCols;
    const float* src = b.data + k0 * b.row_stride + j * b.col_stride;
    int64_t k = 0;
    if (b.row_stride == 1 && cols == kCols) {  // a transposed view: 16 x 16 at a time
      for (; k + 16 <= depth; k += 16)
        for (int64_t h = 0; h < kCols; h += 16)
          transpose16(src + h * b.col_stride + k, b.col_stride, panel + k * kCols + h, kCols);
    }
    for (; k < depth; ++k)  // what is left: the last rows, or a panel cut short by n
      for (int64_t c = 0; c < kCols; ++c)
        panel[k * kCols + c] = c < cols ? src[k * b.row_stride + c * b.col_stride] : 0.0f;
  }
}

// A's rows i0 .. i0 + rows, k0 .. k0 + depth, as tiles of kRows rows, each interleaved:
// out[t * depth * kRows + k * kRows + r] = A(i0 + t * kRows + r, k0 + k).
void pack_a(const StridedMatrix& a, int64_t i0, int64_t rows, int64_t k0, int64_t depth,
            float* out) {
  for (int64_t k = 0; k < depth; ++k) {  // along A's columns: contiguous when A is transposed
    const float* src = a.data + i0 * a.row_stride + (k0 + k) * a.col_stride;
    for (int64_t t = 0; t * kRows < rows; ++t) {
      const int64_t n = std::min(kRows, rows - t * kRows);
      float* dst = out + t * depth * kRows + k * kRows;
      const float* col = src + t * kRows * a.row_stride;
      if (a.row_stride == 1) {
        const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
        _mm512_mask_storeu_ps(dst, mask, _mm512_maskz_loadu_ps(mask, col));
      } else {
        for (int64_t r = 0; r < n; ++r) dst[r] = col[r * a.row_stride];
      }
    }
  }
}

enum class Start { Zero, C, Bias };

// What one tile needs: A's rows (where they lie, or packed), a panel of B, the tile of C.
struct Tile {
  const float* a;  // A(row, k): a[row * a_row + k] where A lies, a[k * kRows + row] packed
  int64_t a_row;   // where A lies: the distance between its rows
  const float* b;  // the panel: b[k * kCols + column]
  float* c;        // C(row, column) at c[row * ldc + column]
  int64_t ldc;
  int64_t depth;  // k runs over 0 .. depth
  int64_t cols;   // columns of C that exist (the rest of the panel is padding)
  Start start;
  const float* bias;  // with Start::Bias: one per column
};

// C's tile (Rows x kCols) = its start + A B over the tile's depth. Rows is a template
// parameter so that the 2 x Rows accumulators live in registers.
template <int Rows, bool kPacked>
void tile(const Tile& t) {
  const int64_t cols = t.cols;
  const __mmask16 m0 = cols >= 16 ? 0xffff : static_cast<__mmask16>((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32   ? 0xffff
                       : cols <= 16 ? 0
                                    : static_cast<__mmask16>((1u << (cols - 16)) - 1);
  __m512 c0[Rows], c1[Rows];
  for (int r = 0; r < Rows; ++r) {
    if (t.start == Start::C) {
      c0[r] = _mm512_maskz_loadu_ps(m0, t.c + r * t.ldc);
      c1[r] = _mm512_maskz_loadu_ps(m1, t.c + r * t.ldc + 16);
    } else if (t.start == Start::Bias) {
      c0[r] = _mm512_maskz_loadu_ps(m0, t.bias);
      c1[r] = _mm512_maskz_loadu_ps(m1, t.bias + 16);
    } else {
      c0[r] = c1[r] = _mm512_setzero_ps();
    }
  }
  const float* a[Rows];
  for (int r = 0; r < Rows; ++r) a[r] = kPacked ? t.a + r : t.a + r * t.a_row;
  for (int64_t k = 0; k < t.depth; ++k) {
    const __m512 b0 = _mm512_load_ps(t.b + k * kCols), b1 = _mm512_load_ps(t.b + k * kCols + 16);
#pragma GCC unroll 12
    for (int r = 0; r < Rows; ++r) {
      const __m512 x = _mm512_set1_ps(a[r][kPacked ? k * kRows : k]);
      c0[r] = _mm512_fmadd_ps(x, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(x, b1, c1[r]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    _mm512_mask_storeu_ps(t.c + r * t.ldc, m0, c0[r]);
    _mm512_mask_storeu_ps(t.c + r * t.ldc + 16, m1, c1[r]);
  }
}

using TileFn = void (*)(const Tile&);

template <bool kPacked, int... R>
constexpr std::array<TileFn, sizeof...(R)> tiles_of(std::integer_sequence<int, R...>) {
  return {tile<R + 1, kPacked>...};
}
// The tile function for `rows` (1 .. kRows) rows of A, where it lies or packed.
constexpr auto kDirectTiles = tiles_of<false>(std::make_integer_sequence<int, kRows>{});
constexpr auto kPackedTiles = tiles_of<true>(std::make_integer_sequence<int, kRows>{});

}  // namespace

bool sgemm(int64_t m, int64_t n, int64_t k, StridedMatrix a, StridedMatrix b, float* c, int64_t ldc,
           bool accumulate, const float* bias) {
  if (k == 0 || n < 16) return false;
  GW_CHECK(!(accumulate && bias), InternalError,
           "[sgemm] accumulates or starts from a bias, not both");
  // A's rows are read where they lie when each is contiguous in k; otherwise packed.
  const bool direct = a.col_stride == 1;
  const int64_t width_max = std::min((n + kCols - 1) / kCols * kCols, kWidth);
  const int64_t depth_max = std::min(k, kDepth);
  const int64_t height_max = direct ? 0 : std::min((m + kRows - 1) / kRows * kRows, kHeight);
  float* panels = scratch(static_cast<size_t>(depth_max * (width_max + height_max)));
  float* packed_a = panels + depth_max * width_max;
  for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
    const int64_t depth = std::min(kDepth, k - k0);
    // The first slice starts from C, the bias or zero; the later ones add to what it left.
    const Start start = accumulate || k0 > 0 ? Start::C : bias ? Start::Bias : Start::Zero;
    for (int64_t j0 = 0; j0 < n; j0 += kWidth) {
      const int64_t width = std::min(kWidth, n - j0);
      pack_b(b, k0, depth, j0, width, panels);
      for (int64_t h0 = 0; h0 < m; h0 += kHeight) {
        const int64_t height = std::min(kHeight, m - h0);
        if (!direct) pack_a(a, h0, height, k0, depth, packed_a);
        for (int64_t i = 0; i < height; i += kRows) {
          const int64_t rows = std::min(kRows, height - i);
          Tile t{.a = direct ? a.data + (h0 + i) * a.row_stride + k0 : packed_a + i * depth,
                 .a_row = a.row_stride,
                 .b = nullptr,
                 .c = nullptr,
                 .ldc = ldc,
                 .depth = depth,
                 .cols = 0,
                 .start = start,
                 .bias = nullptr};
          const TileFn fn = (direct ? kDirectTiles : kPackedTiles)[static_cast<size_t>(rows - 1)];
          for (int64_t j = 0; j < width; j += kCols) {
            t.b = panels + j * depth;
            t.c = c + (h0 + i) * ldc + j0 + j;
            t.cols = std::min(kCols, width - j);
            t.bias = bias ? bias + j0 + j : nullptr;
            fn(t);
          }
        }
      }
    }
  }
  return true;
}

#endif

}  // namespace gw::cpu
