#include "core/cpu/sgemm.h"

#include "core/cpu/float_math.h"
#include "core/error.h"
#include "core/parallel.h"

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
           const float*, double*) {
  return false;
}

#else

namespace {

constexpr int64_t kRows = 6;  // a tile's rows: 6 x 4 accumulators + 4 of B + 1 broadcast
constexpr int kVecs = 4;      // a tile's vectors of 16 floats across
constexpr int64_t kCols = 16 * kVecs;
// k per packed slice: C's tiles are read back once per slice, so deep slices matter for large
// k (a Linear's products with k = 512: 7% from 384 to 512); a panel of B is 128 KiB, from L2.
constexpr int64_t kDepth = 512;
constexpr int64_t kWidth = 512;      // columns per packed slice: at most 1 MiB of B, in L2
constexpr int64_t kHeight = 384;     // rows of A packed at a time (when packed): ~770 KiB
// Floats of an operand (1 MiB) past which it is taken not to be in L2: C's lines are then asked
// for before a tile's products, and A's and B's ahead of their reads (where their rows or
// columns are contiguous).
constexpr int64_t kCold = 1 << 18;
constexpr int64_t kThreadFlops = int64_t{1} << 21;  // at least a thread's share (~20 us)

// This thread's buffers, 64-byte aligned, grown as needed and kept outside the CPU allocator's
// counters: kPacking, the packed blocks (at most ~1.75 MiB); kTransposed, a block of a product
// computed turned around (sgemm's small batches against a transposed weight: at most 1 MiB).
enum Scratch { kPacking, kTransposed };
float* scratch(size_t floats, Scratch which = kPacking) {
  struct Buffer {
    std::unique_ptr<float, decltype(&std::free)> data{nullptr, &std::free};
    size_t size = 0;
  };
  static thread_local Buffer buffers[2];
  Buffer& buffer = buffers[which];
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

using lanes::tail_mask;

constexpr int64_t kPrefetchB = 4;  // rows of a cold B asked for ahead of its packing

// B's rows k0 .. k0 + depth, columns j0 .. j0 + width, as panels of kCols columns:
// out[p * depth * kCols + k * kCols + c] = B(k0 + k, j0 + p * kCols + c), zero past n up to
// the vector of 16 it falls in (a tile reads no further). Panels cut short by n, as the heads'
// products of attention (n = 32) are, are packed as fast as whole ones.
void pack_b(const StridedMatrix& b, int64_t k0, int64_t depth, int64_t j0, int64_t width, bool cold,
            float* out) {
  if (b.col_stride == 1) {  // rows of B are rows of the panels: read each row once, in order
    const int64_t whole = width / kCols;  // panels without padding
    for (int64_t k = 0; k < depth; ++k) {
      const float* row = b.data + (k0 + k) * b.row_stride + j0;
      // A cold B's row kPrefetchB ahead is asked for: a row of a wide B (a weight gradient's X)
      // is 0.5-2 KiB long, and the hardware's prefetchers stop at each 4 KiB page.
      if (cold && k + kPrefetchB < depth)
        for (int64_t j = 0; j < width; j += 16)
          __builtin_prefetch(row + kPrefetchB * b.row_stride + j);
      for (int64_t p = 0; p < whole; ++p) {
        float* dst = out + p * depth * kCols + k * kCols;
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v)
          _mm512_store_ps(dst + 16 * v, _mm512_loadu_ps(row + p * kCols + 16 * v));
      }
      for (int64_t j = whole * kCols; j < width; j += 16)  // the last panel, cut short
        _mm512_store_ps(out + whole * depth * kCols + k * kCols + (j - whole * kCols),
                        _mm512_maskz_loadu_ps(tail_mask(width - j), row + j));
    }
    return;
  }
  for (int64_t p = 0; p * kCols < width; ++p) {
    const int64_t j = j0 + p * kCols, cols = std::min(kCols, j0 + width - j);
    const int64_t vectors = (cols + 15) / 16 * 16;  // the columns a tile reads
    float* panel = out + p * depth * kCols;
    const float* src = b.data + k0 * b.row_stride + j * b.col_stride;
    int64_t k = 0;
    if (b.row_stride == 1) {  // a transposed view: 16 x 16 at a time, the rest one by one
      const int64_t whole = cols / 16 * 16;
      for (; k + 16 <= depth; k += 16) {
        for (int64_t h = 0; h < whole; h += 16)
          transpose16(src + h * b.col_stride + k, b.col_stride, panel + k * kCols + h, kCols);
        for (int64_t r = k; r < k + 16; ++r)
          for (int64_t c = whole; c < vectors; ++c)
            panel[r * kCols + c] = c < cols ? src[r + c * b.col_stride] : 0.0f;
      }
    }
    for (; k < depth; ++k)  // what is left: the last rows, or B with no unit stride
      for (int64_t c = 0; c < vectors; ++c)
        panel[k * kCols + c] = c < cols ? src[k * b.row_stride + c * b.col_stride] : 0.0f;
  }
}

// Floats between two packed tiles of A: a tile, and a cache line more, so that the tiles' k-th
// rows (written together) do not all fall in one set of L1, as they would 4 KiB apart; and
// pack_a's copies of 8 floats run into that line, not into the next tile.
int64_t tile_stride(int64_t depth) { return depth * kRows + 16; }
// k per block of a transposed A's packing (pack_a).
constexpr int64_t kBlockA = 16;

// A's rows i0 .. i0 + rows, k0 .. k0 + depth, as tiles of kRows rows, each interleaved:
// out[t * tile_stride(depth) + k * kRows + r] = A(i0 + t * kRows + r, k0 + k). `available`: A's
// rows from i0 on, which may be read.
//
// When A is a transposed view (a Linear's weight gradient), its rows at one k lie side by side:
// A's transpose is read kBlockA rows (k) at a time, each block once from memory, and each tile
// takes its 6 columns of the block while the block's rows (at most 24 KiB) sit in L1: every
// tile's stores then run in order. (Row by row across all the tiles, each k's 64 stores went
// to 64 tiles 12 KiB apart: a dW of 384 x 128 over k = 4096 spent 22% of its time packing, at
// 101 GFLOP/s; now 18%, at 108-111 GFLOP/s, on a Sapphire Rapids core. Tile by tile over a
// whole slice, each k's 6 floats came from a line long evicted: 20% of a weight gradient's time
// on an AMD Zen 4.) A tile's rows at one k go in one unmasked copy of 8 floats, which runs 2
// into the next k's place (written next) or into the padding after the tile; masked copies of
// 6 floats, which cost more, are left to A's last rows. With `row_sums`, the transposed A's
// rows are added to row_sums[0 .. rows) as they pass (sgemm's a_row_sums).
void pack_a(const StridedMatrix& a, int64_t i0, int64_t rows, int64_t available, int64_t k0,
            int64_t depth, bool cold, float* out, double* row_sums) {
  static_assert(kRows == 6, "pack_a copies a transposed tile's rows as 8 floats");
  const int64_t stride = tile_stride(depth);
  if (a.row_stride == 1) {
    for (int64_t kb = 0; kb < depth; kb += kBlockA) {
      const int64_t kend = std::min(depth, kb + kBlockA);
      for (int64_t t = 0; t * kRows < rows; ++t) {
        const float* src = a.data + i0 + t * kRows + k0 * a.col_stride;
        float* dst = out + t * stride;
        const int64_t valid = std::min(kRows, rows - t * kRows);
        const bool whole = t * kRows + 8 <= available;
        const __mmask16 mask = tail_mask(valid);
        auto row = [&](int64_t k) {  // the tile's rows at k, copied; returns them (8 floats)
          const float* from = src + k * a.col_stride;
          // A cold A's same columns of the next block, asked for now: each k is another row of
          // A's transpose, 0.5-2 KiB from the last and often on another page, where the
          // hardware's prefetchers stop (without it, every block waited on memory).
          if (cold && k + kBlockA < depth) __builtin_prefetch(from + kBlockA * a.col_stride);
          if (whole) {
            const __m256 x = _mm256_loadu_ps(from);
            _mm256_storeu_ps(dst + k * kRows, x);
            return x;
          }
          const __m512 x = _mm512_maskz_loadu_ps(mask, from);
          _mm512_mask_storeu_ps(dst + k * kRows, mask, x);
          return _mm512_castps512_ps256(x);
        };
        if (!row_sums) {
          for (int64_t k = kb; k < kend; ++k) row(k);
          continue;
        }
        // The rows' sums in double, k in order: the bits of sum() over the same values.
        const __mmask8 lanes = static_cast<__mmask8>(mask);
        double* sums = row_sums + t * kRows;
        __m512d acc = _mm512_maskz_loadu_pd(lanes, sums);
        for (int64_t k = kb; k < kend; ++k) acc = _mm512_add_pd(acc, _mm512_cvtps_pd(row(k)));
        _mm512_mask_storeu_pd(sums, lanes, acc);
      }
    }
    return;
  }
  for (int64_t t = 0; t * kRows < rows; ++t) {
    const int64_t n = std::min(kRows, rows - t * kRows);
    float* dst = out + t * stride;
    const float* src = a.data + (i0 + t * kRows) * a.row_stride + k0 * a.col_stride;
    for (int64_t k = 0; k < depth; ++k)
      for (int64_t r = 0; r < n; ++r) dst[k * kRows + r] = src[k * a.col_stride + r * a.row_stride];
  }
}

enum class Start { Zero, C, Bias, RowBias };

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
  const float* bias;  // with Start::Bias: one per column; with Start::RowBias: one per row
  bool cold_c;        // C is larger than L2 (kCold): its lines are asked for before the products
};

// C's tile (Rows x 16 Vecs columns) = its start + A B over the tile's depth; the panel's
// columns past the tile's (Vecs < kVecs: the last panel, cut short by n) are not computed.
// Rows and Vecs are template parameters so that the Rows x Vecs accumulators live in registers.
template <int Rows, int Vecs, bool kPacked>
void tile(const Tile& t) {
  __mmask16 mask[Vecs];  // the columns of each vector that exist (each has at least one)
  for (int v = 0; v < Vecs; ++v) mask[v] = tail_mask(t.cols - 16 * v);
  __m512 acc[Rows][Vecs];
  for (int r = 0; r < Rows; ++r)
    for (int v = 0; v < Vecs; ++v) {
      if (t.start == Start::C)
        acc[r][v] = _mm512_maskz_loadu_ps(mask[v], t.c + r * t.ldc + 16 * v);
      else if (t.start == Start::Bias)
        acc[r][v] = _mm512_maskz_loadu_ps(mask[v], t.bias + 16 * v);
      else if (t.start == Start::RowBias)
        acc[r][v] = _mm512_set1_ps(t.bias[r]);
      else
        acc[r][v] = _mm512_setzero_ps();
    }
  // A tile that does not read C writes it only at the end: when C is larger than the caches,
  // its lines are asked for (for writing) now, so that their misses overlap the products
  // instead of stalling the stores (a Linear's forward, k = 128 and 512 columns: 95 -> 101
  // GFLOP/s on a Zen 4). A C in cache gains nothing and pays the instructions.
  if (t.cold_c && t.start != Start::C)
    for (int r = 0; r < Rows; ++r)
      for (int v = 0; v < Vecs; ++v) __builtin_prefetch(t.c + r * t.ldc + 16 * v, 1, 3);
  const float* a[Rows];
  for (int r = 0; r < Rows; ++r) a[r] = kPacked ? t.a + r : t.a + r * t.a_row;
  for (int64_t k = 0; k < t.depth; ++k) {
    __m512 b[Vecs];
    for (int v = 0; v < Vecs; ++v) b[v] = _mm512_load_ps(t.b + k * kCols + 16 * v);
#pragma GCC unroll 6
    for (int r = 0; r < Rows; ++r) {
      const __m512 x = _mm512_set1_ps(a[r][kPacked ? k * kRows : k]);
#pragma GCC unroll 4
      for (int v = 0; v < Vecs; ++v) acc[r][v] = _mm512_fmadd_ps(x, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < Rows; ++r)
    for (int v = 0; v < Vecs; ++v)
      _mm512_mask_storeu_ps(t.c + r * t.ldc + 16 * v, mask[v], acc[r][v]);
}

using TileFn = void (*)(const Tile&);
// kTiles<kPacked>[vecs - 1][rows - 1]: the tile function for 1 .. kVecs vectors of columns and
// 1 .. kRows rows of A, where it lies or packed. (Products of at most 32 columns ran 5-7% slower
// on tiles of 12 rows x 2 vectors than on these: nothing is gained from a second shape.)
template <bool kPacked, int Vecs, int... R>
constexpr std::array<TileFn, kRows> rows_of(std::integer_sequence<int, R...>) {
  return {tile<R + 1, Vecs, kPacked>...};
}
template <bool kPacked, int... V>
constexpr std::array<std::array<TileFn, kRows>, kVecs> tiles_of(std::integer_sequence<int, V...>) {
  return {rows_of<kPacked, V + 1>(std::make_integer_sequence<int, kRows>{})...};
}
template <bool kPacked>
constexpr auto kTiles = tiles_of<kPacked>(std::make_integer_sequence<int, kVecs>{});

// The product on this thread: sgemm's, for rows [0, m) of A and C; with `row_bias`, bias has
// one value per row of C (sgemm's product computed transposed), not per column.
void multiply(int64_t m, int64_t n, int64_t k, const StridedMatrix& a, const StridedMatrix& b,
              float* c, int64_t ldc, bool accumulate, const float* bias, bool row_bias,
              double* a_row_sums) {
  // A's rows are read where they lie when each is contiguous in k; otherwise packed.
  const bool direct = a.col_stride == 1;
  // The operands' footprints, which decide what is asked for ahead (C's rows may lie far apart:
  // an attention head's columns in a row of heads).
  const bool cold_a = m * k > kCold, cold_b = k * n > kCold, cold_c = m * n > kCold;
  const int64_t width_max = std::min((n + kCols - 1) / kCols * kCols, kWidth);
  const int64_t depth_max = std::min(k, kDepth);
  const int64_t height_max =
      direct ? 0 : (std::min(m, kHeight) + kRows - 1) / kRows * tile_stride(depth_max);
  float* panels = scratch(static_cast<size_t>(depth_max * width_max + height_max));
  float* packed_a = panels + depth_max * width_max;
  for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
    const int64_t depth = std::min(kDepth, k - k0);
    // The first slice starts from C, the bias or zero; the later ones add to what it left.
    const Start start = accumulate || k0 > 0 ? Start::C
                        : !bias              ? Start::Zero
                        : row_bias           ? Start::RowBias
                                             : Start::Bias;
    for (int64_t j0 = 0; j0 < n; j0 += kWidth) {
      const int64_t width = std::min(kWidth, n - j0);
      pack_b(b, k0, depth, j0, width, cold_b, panels);
      for (int64_t h0 = 0; h0 < m; h0 += kHeight) {
        const int64_t height = std::min(kHeight, m - h0);
        // A's rows are packed once per block of columns; summed at the first only.
        if (!direct)
          pack_a(a, h0, height, m - h0, k0, depth, cold_a, packed_a,
                 a_row_sums && j0 == 0 ? a_row_sums + h0 : nullptr);
        for (int64_t i = 0; i < height; i += kRows) {
          const int64_t rows = std::min(kRows, height - i);
          Tile t{.a = direct ? a.data + (h0 + i) * a.row_stride + k0
                             : packed_a + i / kRows * tile_stride(depth),
                 .a_row = a.row_stride,
                 .b = nullptr,
                 .c = nullptr,
                 .ldc = ldc,
                 .depth = depth,
                 .cols = 0,
                 .start = start,
                 .bias = nullptr,
                 .cold_c = cold_c};
          const auto& tiles = direct ? kTiles<false> : kTiles<true>;
          // A cold A's next row tile, where it lies, is asked for while this one runs its panels:
          // its rows, a few hundred floats each, are too short for the hardware's prefetchers to
          // learn (an activation read once from memory, as a Linear's forward reads it).
          if (direct && cold_a && i + kRows < height) {
            const float* next = a.data + (h0 + i + kRows) * a.row_stride + k0;
            for (int64_t r = 0; r < std::min(kRows, height - i - kRows); ++r)
              for (int64_t kk = 0; kk < depth; kk += 16)
                __builtin_prefetch(next + r * a.row_stride + kk);
          }
          for (int64_t j = 0; j < width; j += kCols) {
            t.b = panels + j * depth;
            t.c = c + (h0 + i) * ldc + j0 + j;
            t.cols = std::min(kCols, width - j);
            t.bias = !bias ? nullptr : row_bias ? bias + h0 + i : bias + j0 + j;
            tiles[static_cast<size_t>((t.cols + 15) / 16 - 1)][static_cast<size_t>(rows - 1)](t);
          }
        }
      }
    }
  }
}

// sgemm's product over the CPU threads: each takes a run of C's row tiles (packing its own B). A
// row is summed in the same order whatever thread takes it, so the bits do not depend on the
// threads. parallel_for runs it here alone inside another parallel region (attention's heads).
void run(int64_t m, int64_t n, int64_t k, const StridedMatrix& a, const StridedMatrix& b, float* c,
         int64_t ldc, bool accumulate, const float* bias, bool row_bias, double* a_row_sums) {
  const int64_t tiles = (m + kRows - 1) / kRows;
  if (get_num_threads() == 1 || tiles == 1) {
    multiply(m, n, k, a, b, c, ldc, accumulate, bias, row_bias, a_row_sums);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kThreadFlops / (2 * kRows * n * k));
  parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    const int64_t i0 = t0 * kRows;
    const StridedMatrix rows{a.data + i0 * a.row_stride, a.row_stride, a.col_stride};
    multiply(std::min(m, t1 * kRows) - i0, n, k, rows, b, c + i0 * ldc, ldc, accumulate,
             bias && row_bias ? bias + i0 : bias, row_bias, a_row_sums ? a_row_sums + i0 : nullptr);
  });
}

// Whether C = A B is cheaper as Cᵀ = Bᵀ Aᵀ, transposed back: B a transposed view (a Linear's
// weight, which packing transposes, k x n floats), A's rows contiguous (Aᵀ then packs the same
// way, k x m), C started from zero or the bias, and a batch m of 64 to 512 rows (the product
// turned around has m columns: whole tiles of 64 from 64 on) small beside n, so that
// transposing A and C moves fewer floats than transposing B. An MLP's 64 x 784 input against
// its 256 x 784 weight: 66K floats instead of 200K, and the weight's rows become the 256 rows of
// a tall product (the 64 rows of C ended in a tile of 4). The bits are the same: each element
// starts from its bias and adds the same products, k in order (but a NaN times a NaN, whose
// payload x86 picks by operand position).
constexpr int64_t kTurnRows = 64, kTurnRowsMax = 512;
// Cᵀ is computed kTurnBlock of its rows at a time (B's columns), each block transposed back while
// it is in cache: the scratch holds at most 512 x 512 floats (1 MiB) a thread.
constexpr int64_t kTurnBlock = 512;
bool cheaper_turned(int64_t m, int64_t n, int64_t k, const StridedMatrix& a, const StridedMatrix& b,
                    bool accumulate, const double* a_row_sums) {
  return !accumulate && !a_row_sums && b.row_stride == 1 && b.col_stride != 1 &&
         a.col_stride == 1 && m >= kTurnRows && m <= kTurnRowsMax && k * n > k * m + m * n;
}

// c[i * ldc + j] = ct[j * m + i] for i < m, j < n: a block of Cᵀ (n x m) back into C.
void transpose_back(const float* ct, int64_t n, int64_t m, float* c, int64_t ldc) {
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) transpose16(ct + j * m + i, m, c + i * ldc + j, ldc);
    for (; j < n; ++j)
      for (int64_t r = i; r < i + 16; ++r) c[r * ldc + j] = ct[j * m + r];
  }
  for (; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = ct[j * m + i];
}

}  // namespace

bool sgemm(int64_t m, int64_t n, int64_t k, StridedMatrix a, StridedMatrix b, float* c, int64_t ldc,
           bool accumulate, const float* bias, double* a_row_sums) {
  if (k == 0 || n < 16) return false;
  if (a_row_sums && (a.row_stride != 1 || a.col_stride == 1)) return false;  // A is not packed
  GW_CHECK(!(accumulate && bias), InternalError,
           "[sgemm] accumulates or starts from a bias, not both");
  if (!cheaper_turned(m, n, k, a, b, accumulate, a_row_sums)) {
    run(m, n, k, a, b, c, ldc, accumulate, bias, false, a_row_sums);
    return true;
  }
  // Cᵀ = Bᵀ Aᵀ a block of its rows at a time, each row starting from its bias, then C = (Cᵀ)ᵀ.
  float* ct = scratch(static_cast<size_t>(std::min(n, kTurnBlock) * m), kTransposed);
  for (int64_t j0 = 0; j0 < n; j0 += kTurnBlock) {
    const int64_t rows = std::min(kTurnBlock, n - j0);
    const float* block_bias = bias ? bias + j0 : nullptr;
    run(rows, m, k, {b.data + j0 * b.col_stride, b.col_stride, 1}, {a.data, 1, a.row_stride}, ct, m,
        false, block_bias, true, nullptr);
    transpose_back(ct, rows, m, c + j0, ldc);
  }
  return true;
}

#endif

}  // namespace gw::cpu
