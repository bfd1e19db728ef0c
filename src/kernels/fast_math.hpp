// exp for the hot loops: a Cephes-style polynomial written in plain arithmetic, so the
// compiler vectorises it inside `omp simd` loops (libm's expf is a scalar call there).
// float: ~2 ulp over the range that matters (arguments <= 0 after max-subtraction, and
// SwiGLU's sigmoid); double keeps std::exp, so float64 checks stay exact.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace attnres::kernels {

#pragma omp declare simd
inline float exp_fast(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (pure adds: vectorises without -ffast-math).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // Cody-Waite: r = x - n ln 2
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const std::int32_t e = static_cast<std::int32_t>(n) + 127;
  return y * std::bit_cast<float>(e << 23);
}

inline double exp_fast(double x) { return std::exp(x); }

}  // namespace attnres::kernels
