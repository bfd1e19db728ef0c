#include "kernels/rmsnorm.hpp"

#include <cmath>

#include "kernels/reduce.hpp"
#include "kernels/row_ops.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

std::int64_t rmsnorm_scratch_size(std::int64_t n, int d) { return num_chunks(n) * d; }

template <class Real>
void rmsnorm_forward(Real* y, Real* rstd, const Real* x, const Real* w, std::int64_t n, int d, Real eps) {
#pragma omp parallel for schedule(static) if (n * d >= kParallelMin)
  for (std::int64_t t = 0; t < n; ++t) {
    rstd[t] = inverse_rms(x + t * d, d, eps);
    scale_row(y + t * d, x + t * d, rstd[t], w, d);
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
    for (std::int64_t t = c * kReduceChunk; t < end; ++t)
      rmsnorm_row_backward(dx + t * d, acc, dy + t * d, x + t * d, w, rstd[t], d);
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
