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

#if defined(__AVX2__)
// float on 8 lanes: GCC leaves exp_fast scalar in the loops above (fast_math.hpp), and SwiGLU's
// exp was the largest cost outside the GEMMs. Elementwise, so thread count never changes results.
namespace {
inline __m256 sigmoid8(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}
}  // namespace

template <>
void swiglu_forward<float>(float* act, const float* gate, const float* up, std::int64_t n) {
  const std::int64_t vec = n / 8 * 8;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < vec; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    _mm256_storeu_ps(act + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(g)), _mm256_loadu_ps(up + i)));
  }
  for (std::int64_t i = vec; i < n; ++i) act[i] = gate[i] / (1.0f + exp_fast(-gate[i])) * up[i];
}

template <>
void swiglu_backward<float>(float* dgate, float* dup, const float* dact, const float* gate, const float* up,
                            std::int64_t n) {
  const std::int64_t vec = n / 8 * 8;
  const __m256 one = _mm256_set1_ps(1.0f);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < vec; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 sig = sigmoid8(g);
    const __m256 da = _mm256_loadu_ps(dact + i);
    // d silu/dg = sig * (1 + g * (1 - sig))
    const __m256 dsilu = _mm256_mul_ps(sig, _mm256_add_ps(one, _mm256_mul_ps(g, _mm256_sub_ps(one, sig))));
    _mm256_storeu_ps(dgate + i, _mm256_mul_ps(_mm256_mul_ps(da, _mm256_loadu_ps(up + i)), dsilu));
    _mm256_storeu_ps(dup + i, _mm256_mul_ps(da, _mm256_mul_ps(g, sig)));
  }
  for (std::int64_t i = vec; i < n; ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + exp_fast(-g));
    dgate[i] = dact[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    dup[i] = dact[i] * g * sig;
  }
}
#else
template void swiglu_forward<float>(float*, const float*, const float*, std::int64_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*, std::int64_t);
#endif

template void swiglu_forward<double>(double*, const double*, const double*, std::int64_t);
template void swiglu_backward<double>(double*, double*, const double*, const double*, const double*,
                                      std::int64_t);

}  // namespace attnres::kernels
