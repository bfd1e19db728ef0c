// Per-token row primitives shared by the memory-bound kernels (RMSNorm, depth reads): a fixed
// summation order, and explicit 8-lane code for the float reductions, because GCC leaves some
// `omp simd` reductions inside `omp parallel` regions scalar (the depth-read backward's dot
// products ran at one lane). double keeps plain loops: the float64 reference checks use it.
#pragma once

#include <cmath>
#include <cstdint>

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

// Row mixes and multi-row dot products: the per-token passes of the depth read and of the
// residual-mixing ops (DenseFormer, MUDD, hyper-connections), which mix a few L1-resident rows.
// Each output is computed in the same order whatever the number of outputs handled together,
// so a backward that recomputes one output agrees with the forward bit for bit.

// h[o] = sum_s c[o * cs + s] * v[s] for NO outputs over n >= 1 inputs (ACC: h[o] += ...), summed
// in input order.
template <int NO, bool ACC, class Real>
inline void mix_rows_n(Real* const* h, const Real* const* v, const Real* c, int cs, int n, int d) {
  for (int o = 0; o < NO; ++o)
    for (int k = 0; k < d; ++k) {
      Real a = ACC ? std::fma(c[o * cs], v[0][k], h[o][k]) : c[o * cs] * v[0][k];
      for (int s = 1; s < n; ++s) a = std::fma(c[o * cs + s], v[s][k], a);
      h[o][k] = a;
    }
}

// out[i] = x . y[i] for NY rows.
template <int NY, class Real>
inline void dots_n(const Real* x, const Real* const* y, int d, Real* out) {
  for (int i = 0; i < NY; ++i) out[i] = dot(x, y[i], d);
}

#if defined(__AVX2__) && defined(__FMA__)
template <int NO, bool ACC>
inline void mix_rows_n(float* const* h, const float* const* v, const float* c, int cs, int n, int d) {
  int k = 0;
  for (; k + 8 <= d; k += 8) {
    __m256 x = _mm256_loadu_ps(v[0] + k);
    __m256 a[NO];
    for (int o = 0; o < NO; ++o)
      a[o] = ACC ? _mm256_fmadd_ps(_mm256_set1_ps(c[o * cs]), x, _mm256_loadu_ps(h[o] + k))
                 : _mm256_mul_ps(_mm256_set1_ps(c[o * cs]), x);
    for (int s = 1; s < n; ++s) {
      x = _mm256_loadu_ps(v[s] + k);
      for (int o = 0; o < NO; ++o) a[o] = _mm256_fmadd_ps(_mm256_set1_ps(c[o * cs + s]), x, a[o]);
    }
    for (int o = 0; o < NO; ++o) _mm256_storeu_ps(h[o] + k, a[o]);
  }
  for (; k < d; ++k)
    for (int o = 0; o < NO; ++o) {
      float a = ACC ? std::fma(c[o * cs], v[0][k], h[o][k]) : c[o * cs] * v[0][k];
      for (int s = 1; s < n; ++s) a = std::fma(c[o * cs + s], v[s][k], a);
      h[o][k] = a;
    }
}

template <int NY>
inline void dots_n(const float* x, const float* const* y, int d, float* out) {
  __m256 a[NY];
  for (int i = 0; i < NY; ++i) a[i] = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 <= d; k += 8) {
    const __m256 xv = _mm256_loadu_ps(x + k);
    for (int i = 0; i < NY; ++i) a[i] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(y[i] + k), a[i]);
  }
  for (int i = 0; i < NY; ++i) out[i] = hsum8(a[i]);
  for (; k < d; ++k)
    for (int i = 0; i < NY; ++i) out[i] += x[k] * y[i][k];
}
#endif

// Runtime output counts, in groups of up to four (register blocking).
template <bool ACC = false, class Real>
inline void mix_rows(int n_out, Real* const* h, const Real* const* v, const Real* c, int cs, int n, int d) {
  for (int o = 0; o < n_out; o += 4) {
    const Real* co = c + o * cs;
    switch (n_out - o) {
      case 1: mix_rows_n<1, ACC>(h + o, v, co, cs, n, d); break;
      case 2: mix_rows_n<2, ACC>(h + o, v, co, cs, n, d); break;
      case 3: mix_rows_n<3, ACC>(h + o, v, co, cs, n, d); break;
      default: mix_rows_n<4, ACC>(h + o, v, co, cs, n, d); break;
    }
  }
}

template <class Real>
inline void dots(int n_y, const Real* x, const Real* const* y, int d, Real* out) {
  for (int i = 0; i < n_y; i += 4) {
    switch (n_y - i) {
      case 1: dots_n<1>(x, y + i, d, out + i); break;
      case 2: dots_n<2>(x, y + i, d, out + i); break;
      case 3: dots_n<3>(x, y + i, d, out + i); break;
      default: dots_n<4>(x, y + i, d, out + i); break;
    }
  }
}

// 1 / sqrt(mean(x^2) + eps): RMSNorm's scale of one row, from its sum of squares or the row.
template <class Real>
inline Real rms_scale(Real sum_squares, int d, Real eps) {
  return Real(1) / std::sqrt(sum_squares / Real(d) + eps);
}

// rms_scale of each of n sums of squares, in place. The 8-lane version gives rms_scale's bits lane
// for lane (IEEE division and square root are correctly rounded, and nothing is contracted) with
// an eighth of the divisions and roots: the depth read's forward takes one per source and token.
template <class Real>
inline void rms_scales(Real* sum_squares, std::int64_t n, int d, Real eps) {
  for (std::int64_t i = 0; i < n; ++i) sum_squares[i] = rms_scale(sum_squares[i], d, eps);
}

#if defined(__AVX2__) && defined(__FMA__)
template <>
inline void rms_scales<float>(float* sum_squares, std::int64_t n, int d, float eps) {
  const __m256 dd = _mm256_set1_ps(static_cast<float>(d)), e = _mm256_set1_ps(eps), one = _mm256_set1_ps(1.0f);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(sum_squares + i);
    _mm256_storeu_ps(sum_squares + i, _mm256_div_ps(one, _mm256_sqrt_ps(_mm256_add_ps(_mm256_div_ps(x, dd), e))));
  }
  for (; i < n; ++i) sum_squares[i] = rms_scale(sum_squares[i], d, eps);
}
#endif

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

// As rmsnorm_row_backward, but dx += the input gradient; w == nullptr is a norm without weight
// (w = 1, and dw_acc is not touched).
template <class Real>
inline void rmsnorm_row_backward_add(Real* dx, Real* dw_acc, const Real* dy, const Real* x, const Real* w, Real r,
                                     int d) {
  if (w == nullptr) {
    const Real coef = r * r * r * dot(x, dy, d) / Real(d);
#pragma omp simd
    for (int k = 0; k < d; ++k) dx[k] += r * dy[k] - x[k] * coef;
    return;
  }
  const Real coef = r * r * r * dot3(x, w, dy, d) / Real(d);
#pragma omp simd
  for (int k = 0; k < d; ++k) {
    dx[k] += r * w[k] * dy[k] - x[k] * coef;
    dw_acc[k] += dy[k] * x[k] * r;
  }
}

}  // namespace attnres::kernels
