// exp for the hot loops: a Cephes-style polynomial written in plain arithmetic, so the
// compiler vectorises it inside `omp simd` loops (libm's expf is a scalar call there).
// float: ~2 ulp over the range that matters (arguments <= 0 after max-subtraction, and
// SwiGLU's sigmoid); double keeps std::exp, so float64 checks stay exact.
#pragma once

// First: it includes <immintrin.h> with GCC 12's false-positive warnings silenced (see there).
#include "kernels/avx512_tiles.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/gemm_f32.hpp"

// The 16-lane copies of the 8-lane loops below and in kernels/swiglu.cpp exist where the 8-lane
// loops do (an AVX2 build: -march=native on an AVX2 CPU) and the compiler can target AVX-512.
#if defined(__AVX2__) && ATTNRES_AVX512_CODE
#define ATTNRES_WIDE_LANES 1
#else
#define ATTNRES_WIDE_LANES 0
#endif

namespace attnres::kernels {

inline constexpr bool kWideLanesBuilt = ATTNRES_WIDE_LANES != 0;

// Whether the float kernels with vector code of their own (SwiGLU, the fp32 softmax rows'
// exponentials) run on 16 AVX-512 lanes rather than 8 AVX2 lanes: with the avx512 fp32 backend
// (kernels/gemm_f32.hpp), in builds that have both. Each gives the other's bits (their tests
// compare them), so the avx2 backend's training hashes hold for both.
inline bool fp32_wide_lanes() { return kWideLanesBuilt && fp32_gemm_backend() == Fp32Gemm::avx512; }

#pragma omp declare simd
inline float exp_fast(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (pure adds: vectorises without -ffast-math).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // Cody-Waite: r = x - n ln 2
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  // NaN in, NaN out (y is NaN already): the exponent of a NaN n must not reach the int
  // conversion, which is undefined for it (UBSan, `make hardening`).
  const std::int32_t e = static_cast<std::int32_t>(n == n ? n : 0.0f) + 127;
  return y * std::bit_cast<float>(e << 23);
}

inline double exp_fast(double x) { return std::exp(x); }

#if defined(__AVX2__)
// exp_fast's clamp, Cody-Waite reduction and polynomial on 8 lanes (GCC may contract a mul and
// an add into an FMA here as in the scalar code, so a result can differ from exp_fast's in the
// last bit). GCC does not vectorise exp_fast itself: its clamp is not if-converted under the
// default -ftrapping-math, so the loops would run scalar.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));  // NaN stays NaN
  const __m256 shifter = _mm256_set1_ps(12582912.0f);
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), shifter), shifter);
  const __m256 r = _mm256_add_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f))),
                                 _mm256_mul_ps(n, _mm256_set1_ps(2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

#if ATTNRES_AVX512_CODE
// exp_shifted's 8-lane loop below on 16 AVX-512 lanes, the same bits (kernels/fast_math.cpp).
// Only for CPUs with AVX-512 F/BW/VL/DQ: callers pass wide = fp32_wide_lanes().
float exp_shifted_avx512(float* x, int n, float shift);
#endif

// x[j] = exp(x[j] - shift) for j < n; returns their sum in a fixed order (8 lane sums, combined
// pairwise, then the tail). The softmax rows of attention and of the LM head's cross-entropy:
// each exponential is taken once and kept. wide: on 16 lanes (fp32_wide_lanes()), the same bits.
inline float exp_shifted(float* x, int n, float shift, bool wide) {
  (void)wide;
  float sum = 0;
  int j = 0;
#if ATTNRES_WIDE_LANES
  if (wide) return exp_shifted_avx512(x, n, shift);
#endif
#if defined(__AVX2__)
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), sh));
    _mm256_storeu_ps(x + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lane[8];
  _mm256_store_ps(lane, acc);
  sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
#endif
  for (; j < n; ++j) sum += (x[j] = exp_fast(x[j] - shift));
  return sum;
}

inline double exp_shifted(double* x, int n, double shift, bool /*wide: float only*/) {
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - shift));
  return sum;
}

// max_j row[j], NaNs ignored as by std::max(m, row[j]) from -inf (a NaN never compares greater).
template <class Real>
inline Real row_max(const Real* row, int n) {
  Real mx = -std::numeric_limits<Real>::infinity();
  for (int j = 0; j < n; ++j) mx = std::max(mx, row[j]);
  return mx;
}

#if defined(__AVX2__)
// On 8 lanes (GCC leaves the loop above scalar: one dependent vmaxss per element, half the
// cross-entropy softmax's time at a vocabulary of 8,192). The maximum of a set does not depend on
// the order it is taken in: the same value, NaNs ignored alike (VMAXPS returns its second operand
// unless the first is greater); only the sign of a zero maximum could differ, which changes
// neither x - max nor max + log(sum) of a softmax.
template <>
inline float row_max<float>(const float* row, int n) {
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int j = 0;
  for (; j + 8 <= n; j += 8) mx = _mm256_max_ps(_mm256_loadu_ps(row + j), mx);
  alignas(32) float lane[8];
  _mm256_store_ps(lane, mx);
  float m = -std::numeric_limits<float>::infinity();
  for (float x : lane) m = std::max(m, x);
  for (; j < n; ++j) m = std::max(m, row[j]);
  return m;
}
#endif

}  // namespace attnres::kernels
