#include "kernels/rmsnorm.hpp"

#include <cmath>

#include "kernels/reduce.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

std::int64_t rmsnorm_scratch_size(std::int64_t n, int d) { return num_chunks(n) * d; }

template <class Real>
void rmsnorm_forward(Real* y, Real* rstd, const Real* x, const Real* w, std::int64_t n, int d, Real eps) {
#pragma omp parallel for schedule(static) if (n * d >= kParallelMin)
  for (std::int64_t t = 0; t < n; ++t) {
    const Real* xt = x + t * d;
    Real* yt = y + t * d;
    Real ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int k = 0; k < d; ++k) ss += xt[k] * xt[k];
    const Real r = Real(1) / std::sqrt(ss / Real(d) + eps);
    rstd[t] = r;
#pragma omp simd
    for (int k = 0; k < d; ++k) yt[k] = xt[k] * r * w[k];
  }
}

template <class Real>
void rmsnorm_backward(Real* dx, Real* dw, const Real* dy, const Real* x, const Real* w, const Real* rstd,
                      std::int64_t n, int d, Real* scratch) {
  const std::int64_t chunks = num_chunks(n);
#pragma omp parallel for schedule(static) if (n * d >= kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    Real* acc = scratch + c * d;
    for (int k = 0; k < d; ++k) acc[k] = 0;
    const std::int64_t end = std::min(n, (c + 1) * kReduceChunk);
    for (std::int64_t t = c * kReduceChunk; t < end; ++t) {
      const Real* xt = x + t * d;
      const Real* gt = dy + t * d;
      Real* dxt = dx + t * d;
      const Real r = rstd[t];
      // dx = r * (w*g) - x * r^3 * sum(x*w*g) / d
      Real dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int k = 0; k < d; ++k) dot += xt[k] * w[k] * gt[k];
      const Real coef = r * r * r * dot / Real(d);
#pragma omp simd
      for (int k = 0; k < d; ++k) {
        dxt[k] = r * w[k] * gt[k] - xt[k] * coef;
        acc[k] += gt[k] * xt[k] * r;
      }
    }
  }
  sum_chunks_into(dw, scratch, chunks, d);
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, std::int64_t, int, float);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, std::int64_t, int, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*,
                                      std::int64_t, int, float*);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*,
                                       const double*, std::int64_t, int, double*);

}  // namespace attnres::kernels
