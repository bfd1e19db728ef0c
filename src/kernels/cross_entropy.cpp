#include "util/threads.hpp"
#include "kernels/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/fast_math.hpp"
#include "kernels/gemm.hpp"

namespace attnres::kernels {

template <class Real>
double lm_head_cross_entropy(const Real* x, const Real* w, const std::int32_t* targets, std::int64_t n, int d,
                             int vocab, const CrossEntropyScratch<Real>& scratch, Real grad_scale, Real* dx,
                             Real* dw) {
  const bool with_grad = dx != nullptr;
  double total = 0;
  for (std::int64_t r0 = 0; r0 < n; r0 += scratch.rows) {
    const std::int64_t rows = std::min(scratch.rows, n - r0);
    Real* logits = scratch.logits;
    linear_forward(logits, x + r0 * d, w, rows, d, vocab);
#pragma omp parallel for schedule(static) if (rows * vocab >= kParallelMin)
    for (std::int64_t r = 0; r < rows; ++r) {
      Real* row = logits + r * vocab;
      Real mx = -std::numeric_limits<Real>::infinity();
#pragma omp simd reduction(max : mx)
      for (int j = 0; j < vocab; ++j) mx = std::max(mx, row[j]);
      Real sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < vocab; ++j) sum += exp_fast(row[j] - mx);
      const Real lse = mx + std::log(sum);
      const std::int32_t target = targets[r0 + r];
      scratch.row_loss[r] = static_cast<double>(lse) - static_cast<double>(row[target]);
      if (with_grad) {
#pragma omp simd
        for (int j = 0; j < vocab; ++j) row[j] = exp_fast(row[j] - lse) * grad_scale;
        row[target] -= grad_scale;
      }
    }
    for (std::int64_t r = 0; r < rows; ++r) total += scratch.row_loss[r];
    if (with_grad) {
      linear_backward_input(dx + r0 * d, logits, w, rows, d, vocab);
      linear_backward_weight(dw, logits, x + r0 * d, rows, d, vocab);
    }
  }
  return total;
}

template double lm_head_cross_entropy<float>(const float*, const float*, const std::int32_t*, std::int64_t, int,
                                             int, const CrossEntropyScratch<float>&, float, float*, float*);
template double lm_head_cross_entropy<double>(const double*, const double*, const std::int32_t*, std::int64_t, int,
                                              int, const CrossEntropyScratch<double>&, double, double*, double*);

}  // namespace attnres::kernels
