#include "util/threads.hpp"
#include "kernels/swiglu.hpp"

#include <cmath>

#include "kernels/fast_math.hpp"

namespace attnres::kernels {

template <class Real>
void swiglu_forward(Real* act, const Real* gate, const Real* up, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const Real g = gate[i];
    const Real sig = Real(1) / (Real(1) + exp_fast(-g));
    act[i] = g * sig * up[i];
  }
}

template <class Real>
void swiglu_backward(Real* dgate, Real* dup, const Real* dact, const Real* gate, const Real* up, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const Real g = gate[i];
    const Real sig = Real(1) / (Real(1) + exp_fast(-g));
    const Real silu = g * sig;
    // d silu/dg = sig * (1 + g * (1 - sig))
    dgate[i] = dact[i] * up[i] * sig * (Real(1) + g * (Real(1) - sig));
    dup[i] = dact[i] * silu;
  }
}

template void swiglu_forward<float>(float*, const float*, const float*, std::int64_t);
template void swiglu_forward<double>(double*, const double*, const double*, std::int64_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*, std::int64_t);
template void swiglu_backward<double>(double*, double*, const double*, const double*, const double*,
                                      std::int64_t);

}  // namespace attnres::kernels
