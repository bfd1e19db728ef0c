// RMSNorm with a learnable weight: y = x / sqrt(mean(x^2) + eps) * w, per token.
#pragma once

#include <cstdint>

namespace attnres::kernels {

// Saves rstd[t] = 1/sqrt(mean(x_t^2) + eps) for the backward.
template <class Real>
void rmsnorm_forward(Real* y, Real* rstd, const Real* x, const Real* w, std::int64_t n, int d, Real eps);

// dx = (overwritten) input gradient; dw += weight gradient (summed over tokens in fixed
// chunk order, so the result does not depend on the thread count). scratch: rmsnorm_scratch_size.
template <class Real>
void rmsnorm_backward(Real* dx, Real* dw, const Real* dy, const Real* x, const Real* w, const Real* rstd,
                      std::int64_t n, int d, Real* scratch);

std::int64_t rmsnorm_scratch_size(std::int64_t n, int d);

}  // namespace attnres::kernels
