// First: it includes <immintrin.h> with GCC 12's false-positive warnings silenced (see there).
#include "kernels/avx512_tiles.hpp"

#include "kernels/fast_math.hpp"

namespace attnres::kernels {

#if ATTNRES_AVX512_CODE
// exp_shifted's 8-lane loop, 16 values per step: each lane's exponential is exp8's arithmetic
// (exp16 spells out the multiply-adds GCC contracts exp8's into), and the two halves of a step
// are added to the 8 lane sums one after the other, low half first, as exp8's loop adds two of
// its steps; values past the last multiple of 8 take the scalar tail, as there. So the stored
// exponentials and the sum are exp_shifted's bits (FastMath.ExpShiftedOnSixteenLanesGivesEightLanesBits).
// 0.64x the 8-lane loop's time over rows of 8,192 on Zen 5 (docs/performance.md).
ATTNRES_AVX512_TARGET float exp_shifted_avx512(float* x, int n, float shift) {
  const __m512 sh = _mm512_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  const int vec = n / 8 * 8;
  int j = 0;
  for (; j + 16 <= vec; j += 16) {
    const __m512 e = avx512::exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), sh));
    _mm512_storeu_ps(x + j, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(e, 1));
  }
  if (j < vec) {  // 8 left: exp8's last step
    const __m512 e = avx512::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(0xff, x + j), sh));
    _mm512_mask_storeu_ps(x + j, 0xff, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
  }
  alignas(32) float lane[8];
  _mm256_store_ps(lane, acc);
  float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (j = vec; j < n; ++j) sum += (x[j] = exp_fast(x[j] - shift));
  return sum;
}
#endif

}  // namespace attnres::kernels
