// Per-token row primitives shared by the memory-bound kernels (RMSNorm, depth reads): a fixed
// summation order, and explicit 8-lane code for the float reductions, because GCC leaves some
// `omp simd` reductions inside `omp parallel` regions scalar (the depth-read backward's dot
// products ran at one lane). double keeps plain loops: the float64 reference checks use it.
#pragma once

#include <cmath>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace attnres::kernels {

// sum_k a[k] * b[k]
template <class Real>
inline Real dot(const Real* a, const Real* b, int d) {
  Real s = 0;
  for (int k = 0; k < d; ++k) s += a[k] * b[k];
  return s;
}

// sum_k a[k] * b[k] * c[k]
template <class Real>
inline Real dot3(const Real* a, const Real* b, const Real* c, int d) {
  Real s = 0;
  for (int k = 0; k < d; ++k) s += a[k] * b[k] * c[k];
  return s;
}

#if defined(__AVX2__) && defined(__FMA__)
inline float hsum8(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

template <>
inline float dot<float>(const float* a, const float* b, int d) {
  // Two accumulators hide the FMA latency; lanes and accumulators are combined in a fixed order.
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int k = 0;
  for (; k + 16 <= d; k += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), s1);
  }
  for (; k + 8 <= d; k += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
  float s = hsum8(_mm256_add_ps(s0, s1));
  for (; k < d; ++k) s += a[k] * b[k];
  return s;
}

template <>
inline float dot3<float>(const float* a, const float* b, const float* c, int d) {
  __m256 s0 = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 <= d; k += 8)
    s0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k)), _mm256_loadu_ps(c + k), s0);
  float s = hsum8(s0);
  for (; k < d; ++k) s += a[k] * b[k] * c[k];
  return s;
}
#endif

// 1 / sqrt(mean(x^2) + eps): RMSNorm's scale of one row, from its sum of squares or the row.
template <class Real>
inline Real rms_scale(Real sum_squares, int d, Real eps) {
  return Real(1) / std::sqrt(sum_squares / Real(d) + eps);
}

template <class Real>
inline Real inverse_rms(const Real* x, int d, Real eps) {
  return rms_scale(dot(x, x, d), d, eps);
}

// y = x * r * w (y may alias x)
template <class Real>
inline void scale_row(Real* y, const Real* x, Real r, const Real* w, int d) {
#pragma omp simd
  for (int k = 0; k < d; ++k) y[k] = x[k] * r * w[k];
}

// RMSNorm's backward for one row y = x * r * w given dy: dx = r*w*dy - x * r^3 * (sum x*w*dy)/d
// (overwritten), dw_acc += dy * x * r.
template <class Real>
inline void rmsnorm_row_backward(Real* dx, Real* dw_acc, const Real* dy, const Real* x, const Real* w, Real r,
                                 int d) {
  const Real coef = r * r * r * dot3(x, w, dy, d) / Real(d);
#pragma omp simd
  for (int k = 0; k < d; ++k) {
    dx[k] = r * w[k] * dy[k] - x[k] * coef;
    dw_acc[k] += dy[k] * x[k] * r;
  }
}

}  // namespace attnres::kernels
