// float32 math the CPU kernels share: exp, erf and GELU without branches or library calls,
// element by element and sixteen lanes at a time with the same bits, and the row loops of the
// softmaxes (softmax, log_softmax, cross-entropy) built on them.
//
//   float e = gw::cpu::exp_vectorizable(x);           // a loop over it vectorizes
//   #if defined(GW_FLOAT_LANES)                        // AVX-512 with FMA
//   const float m = gw::cpu::lanes::row_max(x, n);
//   double sum = gw::cpu::lanes::sum_exp(x, n, m, e);  // e[i] = exp(x[i] - m), summed
//   #endif
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>

namespace gw::cpu {

// float32 exp and erf without branches or calls, so that a loop over them vectorizes (libm's
// expf and erff are scalar calls: erff alone was half of a GPT step's GELU). exp: x = n ln2 + r
// with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial, 2^n put in the exponent bits;
// relative error below 2.5e-7 on [-87, 88] (2.31e-7 at worst over every float there; below,
// 0; above, infinity). erf: Abramowitz and Stegun 7.1.26, absolute error below 1.5e-7
// (PyTorch's vectorized erf is the same formula). a * b + c, fused where the target has FMA
// (std::fma is a library call without it).
inline float madd(float a, float b, float c) {
#if defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}
inline float exp_vectorizable(float x) {
  const float xc = std::min(std::max(x, -87.0f), 88.0f);  // NaN passes through as NaN
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float shifted = madd(xc, 1.44269504088896341f, kRound);
  const float n = shifted - kRound;
  // n's integer from the bits of `shifted` (a cast of NaN would be undefined).
  const int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  float r = madd(n, -0.693145751953125f, xc);  // ln 2 in two parts, so r is exact
  r = madd(n, -1.428606765330187e-6f, r);
  float p = madd(1.0f / 720, r, 1.0f / 120);  // Horner, written out: a loop over the
  p = madd(p, r, 1.0f / 24);                  // coefficients would not vectorize
  p = madd(p, r, 1.0f / 6);
  p = madd(p, r, 0.5f);
  p = madd(p, r, 1.0f);
  p = madd(p, r, 1.0f);
  const float e = p * std::bit_cast<float>((ni + 127) << 23);
  return x < -87.0f ? 0.0f : x > 88.0f ? std::numeric_limits<float>::infinity() : e;  // selects
}
// erf(z) given e = exp(-z²), which GELU's derivative needs again (for z = x/√2, e = √(2π) φ(x)).
inline float erf_given_exp(float z, float e) {
  const float t = 1.0f / madd(0.3275911f, std::fabs(z), 1.0f);
  float r = madd(1.061405429f, t, -1.453152027f);
  r = madd(r, t, 1.421413741f);
  r = madd(r, t, -0.284496736f);
  r = madd(r, t, 0.254829592f);
  return std::copysign(madd(-(t * r), e, 1.0f), z);  // fused, as in the lanes below
}
inline float exp_minus_square(float z) { return exp_vectorizable(-std::fabs(z) * std::fabs(z)); }
inline constexpr float kSqrtHalf = float(std::numbers::sqrt2 / 2),
                       kInvSqrt2Pi = 0.3989422804014327f;

#if defined(__AVX512F__)
namespace lanes {
// The first min(n, 16) lanes of a vector (n >= 1).
inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << n) - 1);
}
}  // namespace lanes
#endif

#if defined(__AVX512F__) && defined(__FMA__)  // FMA: the scalar madd must fuse as these do
#define GW_FLOAT_LANES 1
// The float32 formulas above, sixteen lanes at a time and operation for operation the same, so
// an element gets the same bits whichever loop it meets (each multiply-add fused by hand on both
// sides, so the compiler's contraction of the rest cannot tell them apart). GCC keeps the
// scalar loops at 256 bits.
namespace lanes {
inline __m512 splat(float c) { return _mm512_set1_ps(c); }
inline __m512 madd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
inline __m512i sign_bits() { return _mm512_set1_epi32(std::numeric_limits<int32_t>::min()); }
inline __m512 exp(__m512 x) {
  const __m512 xc = _mm512_min_ps(splat(88.0f), _mm512_max_ps(splat(-87.0f), x));  // NaN stays
  const __m512 round = splat(12582912.0f);
  const __m512 shifted = madd(xc, splat(1.44269504088896341f), round);
  const __m512 n = _mm512_sub_ps(shifted, round);
  const __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_castps_si512(round));
  __m512 r = madd(n, splat(-0.693145751953125f), xc);
  r = madd(n, splat(-1.428606765330187e-6f), r);
  __m512 p = madd(splat(1.0f / 720), r, splat(1.0f / 120));
  p = madd(p, r, splat(1.0f / 24));
  p = madd(p, r, splat(1.0f / 6));
  p = madd(p, r, splat(0.5f));
  p = madd(p, r, splat(1.0f));
  p = madd(p, r, splat(1.0f));
  const __m512i two_n = _mm512_slli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23);
  __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(two_n));
  e = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, splat(-87.0f), _CMP_LT_OQ), e,
                           _mm512_setzero_ps());
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, splat(88.0f), _CMP_GT_OQ), e,
                              splat(std::numeric_limits<float>::infinity()));
}
inline __m512 erf_given_exp(__m512 z, __m512 e) {
  const __m512 t =
      _mm512_div_ps(splat(1.0f), madd(splat(0.3275911f), _mm512_abs_ps(z), splat(1.0f)));
  __m512 r = madd(splat(1.061405429f), t, splat(-1.453152027f));
  r = madd(r, t, splat(1.421413741f));
  r = madd(r, t, splat(-0.284496736f));
  r = madd(r, t, splat(0.254829592f));
  const __m512 y = _mm512_fnmadd_ps(_mm512_mul_ps(t, r), e, splat(1.0f));
  return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(  // copysign(y, z): sign ? z : y, bitwise
      sign_bits(), _mm512_castps_si512(z), _mm512_castps_si512(y), 0xCA));
}
inline __m512 exp_minus_square(__m512 z) {
  const __m512 a = _mm512_abs_ps(z);
  // -a by flipping its sign bit, as the scalar's negation does.
  const __m512 minus_a = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), sign_bits()));
  return exp(_mm512_mul_ps(minus_a, a));
}
inline __m512 gelu(__m512 x) {
  const __m512 z = _mm512_mul_ps(x, splat(kSqrtHalf));
  const __m512 erf = erf_given_exp(z, exp_minus_square(z));
  return _mm512_mul_ps(_mm512_mul_ps(splat(0.5f), x), _mm512_add_ps(splat(1.0f), erf));
}
inline __m512 gelu_derivative(__m512 x) {
  const __m512 z = _mm512_mul_ps(x, splat(kSqrtHalf));
  const __m512 e = exp_minus_square(z);
  const __m512 cdf = _mm512_mul_ps(splat(0.5f), _mm512_add_ps(splat(1.0f), erf_given_exp(z, e)));
  return madd(_mm512_mul_ps(x, e), splat(kInvSqrt2Pi), cdf);
}

// The largest of x[0 .. n) (n >= 1; -inf for n == 0). A NaN may or may not win: the softmaxes
// that use it give NaN for a row with a NaN either way, through its exp.
inline float row_max(const float* x, int64_t n) {
  const __m512 low = splat(-std::numeric_limits<float>::infinity());
  __m512 m = low;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  if (i < n) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(low, tail_mask(n - i), x + i));
  return _mm512_reduce_max_ps(m);
}

// The shift of a softmax's row: its maximum, or 0 when every element is -inf (x - max would be
// NaN there; x - 0 stays -inf).
inline float softmax_shift(const float* x, int64_t n) {
  const float m = row_max(x, n);
  return std::isinf(m) && m < 0 ? 0.0f : m;
}

// The sum of exp(x[i] - shift) over [0, n), each term stored to e[i] as well when e is given:
// the terms are summed in float lanes 256 at a time (16 deep), each block's sum added in double,
// as row_kernels.cpp's row_sum does.
inline double sum_exp(const float* x, int64_t n, float shift, float* e) {
  const __m512 s = splat(shift);
  double total = 0;
  for (int64_t b = 0; b < n; b += 256) {
    const int64_t end = std::min(n, b + 256);
    __m512 part = _mm512_setzero_ps();
    for (int64_t i = b; i < end; i += 16) {
      const __mmask16 k = tail_mask(end - i);
      const __m512 v = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s));
      if (e) _mm512_mask_storeu_ps(e + i, k, v);
      part = _mm512_mask_add_ps(part, k, part, v);
    }
    total += static_cast<double>(_mm512_reduce_add_ps(part));
  }
  return total;
}

// out[i] = scale * exp(x[i] - shift) for i in [0, n) (out may be x).
inline void scaled_exp(const float* x, int64_t n, float shift, float scale, float* out) {
  const __m512 s = splat(shift), c = splat(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 v = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s));
    _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(c, v));
  }
}

}  // namespace lanes
#endif

}  // namespace gw::cpu
