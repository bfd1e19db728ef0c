#include "util/threads.hpp"
#include "kernels/swiglu.hpp"

#include <algorithm>
#include <cmath>

// First: it includes <immintrin.h> with GCC 12's false-positive warnings silenced (see there).
#include "kernels/avx512_tiles.hpp"

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
// With the avx512 fp32 backend (fp32_wide_lanes()) the same loops run on 16 lanes.
namespace {
inline __m256 sigmoid8(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}

#if ATTNRES_WIDE_LANES
// The 8-lane loops' arithmetic on 16 lanes, written operation for operation as there, so each
// lane gets the same bits (exp16 spells out the multiply-adds GCC contracts exp8's into;
// FastMath.SwigluOnSixteenLanesGivesEightLanesBits compares them). Elements [i0, i1); a last
// step of fewer than 16 is masked.
ATTNRES_AVX512_INLINE __m512 sigmoid16(__m512 g) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, avx512::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

// Loads and stores of a step: whole (full) or the first `valid` lanes (the last step only: a masked
// store every step made the loops slower than the 8-lane ones inside a training step on Zen 5).
template <bool Full>
ATTNRES_AVX512_INLINE __m512 load16(const float* p, __mmask16 valid) {
  return Full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(valid, p);
}
template <bool Full>
ATTNRES_AVX512_INLINE void store16(float* p, __mmask16 valid, __m512 x) {
  if (Full) _mm512_storeu_ps(p, x);
  else _mm512_mask_storeu_ps(p, valid, x);
}

template <bool Full>
ATTNRES_AVX512_INLINE void swiglu_forward16(float* act, const float* gate, const float* up, __mmask16 valid) {
  const __m512 g = load16<Full>(gate, valid);
  store16<Full>(act, valid, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid16(g)), load16<Full>(up, valid)));
}

template <bool Full>
ATTNRES_AVX512_INLINE void swiglu_backward16(float* dgate, float* dup, const float* dact, const float* gate,
                                             const float* up, __mmask16 valid) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 g = load16<Full>(gate, valid);
  const __m512 sig = sigmoid16(g);
  const __m512 da = load16<Full>(dact, valid);
  const __m512 dsilu = _mm512_mul_ps(sig, _mm512_add_ps(one, _mm512_mul_ps(g, _mm512_sub_ps(one, sig))));
  store16<Full>(dgate, valid, _mm512_mul_ps(_mm512_mul_ps(da, load16<Full>(up, valid)), dsilu));
  store16<Full>(dup, valid, _mm512_mul_ps(da, _mm512_mul_ps(g, sig)));
}

ATTNRES_AVX512_TARGET void swiglu_forward_avx512(float* act, const float* gate, const float* up, std::int64_t i0,
                                                 std::int64_t i1) {
  std::int64_t i = i0;
  for (; i + 16 <= i1; i += 16) swiglu_forward16<true>(act + i, gate + i, up + i, 0xffff);
  if (i < i1) swiglu_forward16<false>(act + i, gate + i, up + i, avx512::lanes(i1 - i));
}

ATTNRES_AVX512_TARGET void swiglu_backward_avx512(float* dgate, float* dup, const float* dact, const float* gate,
                                                  const float* up, std::int64_t i0, std::int64_t i1) {
  std::int64_t i = i0;
  for (; i + 16 <= i1; i += 16) swiglu_backward16<true>(dgate + i, dup + i, dact + i, gate + i, up + i, 0xffff);
  if (i < i1) swiglu_backward16<false>(dgate + i, dup + i, dact + i, gate + i, up + i, avx512::lanes(i1 - i));
}

// Elements per task of the 16-lane loops (any split gives the same results: elementwise).
constexpr std::int64_t kWideBlock = 4096;
#endif
}  // namespace

template <>
void swiglu_forward<float>(float* act, const float* gate, const float* up, std::int64_t n) {
  const std::int64_t vec = n / 8 * 8;
#if ATTNRES_WIDE_LANES
  if (fp32_wide_lanes()) {
    const std::int64_t blocks = (vec + kWideBlock - 1) / kWideBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (std::int64_t b = 0; b < blocks; ++b)
      swiglu_forward_avx512(act, gate, up, b * kWideBlock, std::min(vec, (b + 1) * kWideBlock));
  } else
#endif
  {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (std::int64_t i = 0; i < vec; i += 8) {
      const __m256 g = _mm256_loadu_ps(gate + i);
      _mm256_storeu_ps(act + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(g)), _mm256_loadu_ps(up + i)));
    }
  }
  for (std::int64_t i = vec; i < n; ++i) act[i] = gate[i] / (1.0f + exp_fast(-gate[i])) * up[i];
}

template <>
void swiglu_backward<float>(float* dgate, float* dup, const float* dact, const float* gate, const float* up,
                            std::int64_t n) {
  const std::int64_t vec = n / 8 * 8;
#if ATTNRES_WIDE_LANES
  if (fp32_wide_lanes()) {
    const std::int64_t blocks = (vec + kWideBlock - 1) / kWideBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (std::int64_t b = 0; b < blocks; ++b)
      swiglu_backward_avx512(dgate, dup, dact, gate, up, b * kWideBlock, std::min(vec, (b + 1) * kWideBlock));
  } else
#endif
  {
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
