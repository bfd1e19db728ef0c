#include "util/threads.hpp"
#include "kernels/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/fast_math.hpp"
#include "kernels/gemm.hpp"

namespace attnres::kernels {

namespace {

// sum_j exp(row[j] - shift), in a fixed order.
inline float sum_exp(const float* row, int n, float shift) {
  float sum = 0;
  int j = 0;
#if defined(__AVX2__)
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), sh)));
  alignas(32) float lane[8];
  _mm256_store_ps(lane, acc);
  sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
#endif
  for (; j < n; ++j) sum += exp_fast(row[j] - shift);
  return sum;
}

inline double sum_exp(const double* row, int n, double shift) {
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += exp_fast(row[j] - shift);
  return sum;
}

// row[j] = exp(row[j] - shift) * scale.
inline void exp_scale(float* row, int n, float shift, float scale) {
  int j = 0;
#if defined(__AVX2__)
  const __m256 sh = _mm256_set1_ps(shift), sc = _mm256_set1_ps(scale);
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(row + j, _mm256_mul_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), sh)), sc));
#endif
  for (; j < n; ++j) row[j] = exp_fast(row[j] - shift) * scale;
}

inline void exp_scale(double* row, int n, double shift, double scale) {
  for (int j = 0; j < n; ++j) row[j] = exp_fast(row[j] - shift) * scale;
}
}  // namespace

template <class Real>
double lm_head_cross_entropy(const Real* x, const Real* w, const std::int32_t* targets, std::int64_t n, int d,
                             int vocab, const CrossEntropyScratch<Real>& scratch, Real grad_scale, Real* dx,
                             Real* dw, MatmulPrecision precision) {
  const bool with_grad = dx != nullptr;
  double total = 0;
  for (std::int64_t r0 = 0; r0 < n; r0 += scratch.rows) {
    const std::int64_t rows = std::min(scratch.rows, n - r0);
    Real* logits = scratch.logits;
    linear_forward(logits, x + r0 * d, w, rows, d, vocab, false, precision);
#pragma omp parallel for schedule(static) if (rows * vocab >= kParallelMin)
    for (std::int64_t r = 0; r < rows; ++r) {
      Real* row = logits + r * vocab;
      Real mx = -std::numeric_limits<Real>::infinity();
#pragma omp simd reduction(max : mx)
      for (int j = 0; j < vocab; ++j) mx = std::max(mx, row[j]);
      const Real sum = sum_exp(row, vocab, mx);
      const Real lse = mx + std::log(sum);
      const std::int32_t target = targets[r0 + r];
      scratch.row_loss[r] = static_cast<double>(lse) - static_cast<double>(row[target]);
      if (with_grad) {
        exp_scale(row, vocab, lse, grad_scale);
        row[target] -= grad_scale;
      }
    }
    for (std::int64_t r = 0; r < rows; ++r) total += scratch.row_loss[r];
    if (with_grad) {
      linear_backward_input(dx + r0 * d, logits, w, rows, d, vocab, false, precision);
      linear_backward_weight(dw, logits, x + r0 * d, rows, d, vocab, precision);
    }
  }
  return total;
}

template double lm_head_cross_entropy<float>(const float*, const float*, const std::int32_t*, std::int64_t, int,
                                             int, const CrossEntropyScratch<float>&, float, float*, float*,
                                             MatmulPrecision);
template double lm_head_cross_entropy<double>(const double*, const double*, const std::int32_t*, std::int64_t, int,
                                              int, const CrossEntropyScratch<double>&, double, double*, double*,
                                              MatmulPrecision);

}  // namespace attnres::kernels
