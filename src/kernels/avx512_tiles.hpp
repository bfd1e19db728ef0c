// AVX-512 building blocks of the bf16-contract kernels (kernels/gemm_bf16_avx512.cpp, the bf16
// attention): rounding to bf16 exactly like round_to_bf16, a 16x16 transpose of 32-bit elements,
// panel packing, and the register-tiled FMA microkernel with its masked C epilogue.
//
// The contract of every bf16 kernel (kernels/gemm_bf16.hpp): operands rounded to bf16, products
// summed in fp32. A product of two bf16 values is exact in fp32 (8 + 8 significant bits), so an
// fp32 FMA of bf16-rounded operands adds exactly that product with one rounding: the FMA
// microkernel below keeps the contract while running at the fp32 FMA rate, which on Intel cores
// is twice that of VDPBF16PS (measured: docs/performance.md).
//
// Only functions carrying these target attributes use AVX-512: the build stays on -mno-avx512f
// (GCC 12, top-level CMakeLists.txt), and callers dispatch on the CPU at run time.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define ATTNRES_AVX512_CODE 1
// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_* operands) when they are
// inlined into target("avx512f") functions: a false positive (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#define ATTNRES_AVX512_CODE 0
#endif

#if ATTNRES_AVX512_CODE
// Kernels: AVX-512 F/BW/VL/DQ and FMA (every AVX-512 CPU this project meets: Skylake-SP and later,
// Zen 4 and later). The plain-F helpers are also inlined into the AMX functions (whose target
// is a superset of avx512f but does not name fma).
#define ATTNRES_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define ATTNRES_AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"), always_inline)) inline
#define ATTNRES_AVX512F_INLINE __attribute__((target("avx512f"), always_inline)) inline

namespace attnres::kernels::avx512 {

// The first `valid` lanes of 16 (valid <= 0: none).
ATTNRES_AVX512F_INLINE __mmask16 lanes(std::int64_t valid) {
  return valid >= 16 ? __mmask16(0xffff) : valid <= 0 ? __mmask16(0) : __mmask16((1u << valid) - 1u);
}

// round_to_bf16 on 16 lanes, bit for bit (kernels/gemm_bf16.cpp): nearest, ties to even; zero and
// denormals to signed zero; NaN stays (quiet) NaN; overflow rounds to infinity. Integer
// arithmetic only, so it needs no AVX512_BF16 and matches the scalar function everywhere.
ATTNRES_AVX512F_INLINE __m512 round_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  const __mmask16 tiny = _mm512_testn_epi32_mask(u, exponent);  // zero or denormal
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), exponent);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  r = _mm512_mask_mov_epi32(r, tiny, _mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  return _mm512_castsi512_ps(r);
}

// Sum and maximum of 16 lanes in a fixed order (halves, then quarters, ...). Not GCC 12's
// _mm512_reduce_*_ps, which trip its -Wmaybe-uninitialized false positive (bug 105593).
ATTNRES_AVX512_INLINE __m128 fold_halves(__m512 v, bool max) {
  const __m256 lo = _mm512_castps512_ps256(v), hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xee));
  const __m256 h = max ? _mm256_max_ps(lo, hi) : _mm256_add_ps(lo, hi);
  const __m128 a = _mm256_castps256_ps128(h), b = _mm256_extractf128_ps(h, 1);
  return max ? _mm_max_ps(a, b) : _mm_add_ps(a, b);
}
ATTNRES_AVX512_INLINE float reduce_add(__m512 v) {
  const __m128 q = fold_halves(v, false);
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}
ATTNRES_AVX512_INLINE float reduce_max(__m512 v) {
  const __m128 q = fold_halves(v, true);
  const __m128 d = _mm_max_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_max_ss(d, _mm_movehdup_ps(d)));
}

// In-register transpose of a 16x16 matrix of 32-bit elements (r[i] = row i).
ATTNRES_AVX512F_INLINE void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c.
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);       // lanes 0, 2 of rows 0-3 and 4-7
    t[4 + c] = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);   // lanes 1, 3
    t[8 + c] = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
    r[4 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xdd);
  }
}

// VCVTNEPS2BF16 helpers (AVX512_BF16; the AMX and VDPBF16PS packing). The instruction rounds like
// round_to_bf16 (tested on both paths).
#define ATTNRES_AVX512BF16_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"), always_inline)) inline
// The VDPBF16PS kernels (the GEMM's and attention's dpbf16 paths).
#define ATTNRES_DPBF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16")))
#define ATTNRES_DPBF16_INLINE \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16"), always_inline)) inline

// 16 floats (the first `valid`, the rest zero) -> 16 bf16.
ATTNRES_AVX512BF16_INLINE __m256i cvt16(const float* p, std::int64_t valid) {
  return (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(lanes(valid), p));
}

// 32 floats (the first `valid`, the rest zero) -> 32 bf16, in order.
ATTNRES_AVX512BF16_INLINE __m512i cvt32(const float* p, std::int64_t valid) {
  const __m512 lo = _mm512_maskz_loadu_ps(lanes(valid), p);
  const __m512 hi = _mm512_maskz_loadu_ps(lanes(valid - 16), p + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// Element i of the result: the pair (even[i], odd[i]), even in the low half.
ATTNRES_AVX512F_INLINE __m512i pairs(__m256i even, __m256i odd) {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(even), _mm512_slli_epi32(_mm512_cvtepu16_epi32(odd), 16));
}

// exp_fast (kernels/fast_math.hpp) on 16 lanes: its clamp, Cody-Waite reduction and polynomial.
ATTNRES_AVX512_INLINE __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-87.0f), x));
  const __m512 shifter = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shifter), shifter);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

// ------------------------------------------------------------------------------------------
// Panels for the FMA microkernel: R rows of an operand (R = the tile's MR for A, NR for B) laid
// out k-major, out[k * R + r], each value rounded to bf16 (stored as fp32). Rows r >= valid_rows
// are zero, so edge tiles need no special code.
// ------------------------------------------------------------------------------------------

// Row r of the panel is src[r * ld + k] (k contiguous: A, or B stored transposed).
template <int R>
ATTNRES_AVX512_INLINE void pack_panel_rows(const float* src, std::int64_t ld, std::int64_t valid_rows, std::int64_t k,
                                           float* out) {
  for (int g = 0; g < R; g += 16) {
    const __mmask16 store = lanes(R - g);
    for (std::int64_t k0 = 0; k0 < k; k0 += 16) {
      const __mmask16 kmask = lanes(k - k0);
      __m512i t[16];
      for (int j = 0; j < 16; ++j)
        t[j] = g + j < valid_rows ? _mm512_castps_si512(round_bf16(_mm512_maskz_loadu_ps(kmask, src + (g + j) * ld + k0)))
                                  : _mm512_setzero_si512();
      transpose16(t);
      const std::int64_t kq = std::min<std::int64_t>(16, k - k0);
      for (std::int64_t q = 0; q < kq; ++q) _mm512_mask_storeu_epi32(out + (k0 + q) * R + g, store, t[q]);
    }
  }
}

// Row r of the panel is src[k * ld + r] (k-major: A stored transposed, or B).
template <int R>
ATTNRES_AVX512_INLINE void pack_panel_cols(const float* src, std::int64_t ld, std::int64_t valid_rows, std::int64_t k,
                                           float* out) {
  for (std::int64_t q = 0; q < k; ++q)
    for (int g = 0; g < R; g += 16)
      _mm512_mask_storeu_ps(out + q * R + g, lanes(R - g),
                            round_bf16(_mm512_maskz_loadu_ps(lanes(valid_rows - g), src + q * ld + g)));
}

// ------------------------------------------------------------------------------------------
// The microkernel: acc[i][v] (lanes j) += sum over `steps` of a[s * lda + i * RowStride] *
// b[s * ldb + 16 v + j], s in increasing order, one FMA per product. MR x 16 NV accumulators stay
// in registers. RowStride 1: A's MR values of a step are adjacent (packed panels, k-major A); a
// larger compile-time RowStride (with lda 1) reads MR adjacent rows of a row-major A in place, the
// MR broadcasts of a step then being immediate offsets from one pointer.
// ------------------------------------------------------------------------------------------
template <int MR, int NV, int RowStride = 1>
ATTNRES_AVX512_INLINE void fma_tile(const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                                    std::int64_t steps, __m512 (&acc)[MR][NV]) {
  for (std::int64_t s = 0; s < steps; ++s) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + s * ldb + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a[s * lda + i * RowStride]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
    }
  }
}

template <int MR, int NV>
ATTNRES_AVX512_INLINE void zero_tile(__m512 (&acc)[MR][NV]) {
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
}

// C[i][j] = alpha * acc + beta * C for i < rows, j < cols (C not read when beta == 0).
template <int MR, int NV>
ATTNRES_AVX512_INLINE void store_tile(const __m512 (&acc)[MR][NV], std::int64_t rows, std::int64_t cols, float alpha,
                                      float beta, float* c, std::int64_t ldc) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  __mmask16 mask[NV];
  for (int v = 0; v < NV; ++v) mask[v] = lanes(cols - 16 * v);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    if (i >= rows) break;
    float* row = c + i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      __m512 x = _mm512_mul_ps(va, acc[i][v]);
      if (beta != 0.0f) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask[v], row + 16 * v), x);
      _mm512_mask_storeu_ps(row + 16 * v, mask[v], x);
    }
  }
}

// ------------------------------------------------------------------------------------------
// The VDPBF16PS microkernel and its panels: operands as bf16 pairs (k = 2s, 2s + 1) in 32-bit
// words (stored in float buffers), one pair per step; VDPBF16PS adds both products of a pair to
// each fp32 accumulator, the odd k's first (the instruction's order).
// ------------------------------------------------------------------------------------------

// Row r of the panel is src[r * ld + k] (k contiguous): 32 consecutive k of a row are 16 pairs;
// a 16 x 16 transpose turns 16 rows of pairs into 16 steps of rows.
template <int R>
ATTNRES_DPBF16_INLINE void pack_pairs_rows(const float* src, std::int64_t ld, std::int64_t valid_rows, std::int64_t k,
                                           float* out) {
  const std::int64_t steps = (k + 1) / 2;
  for (int g = 0; g < R; g += 16) {
    const __mmask16 store = lanes(R - g);
    for (std::int64_t s0 = 0; s0 < steps; s0 += 16) {
      __m512i t[16];
      for (int j = 0; j < 16; ++j)
        t[j] = g + j < valid_rows ? cvt32(src + (g + j) * ld + 2 * s0, k - 2 * s0) : _mm512_setzero_si512();
      transpose16(t);
      const std::int64_t sq = std::min<std::int64_t>(16, steps - s0);
      for (std::int64_t q = 0; q < sq; ++q) _mm512_mask_storeu_epi32(out + (s0 + q) * R + g, store, t[q]);
    }
  }
}

// Row r of the panel is src[k * ld + r] (k-major): pair rows k = 2s and 2s + 1.
template <int R>
ATTNRES_DPBF16_INLINE void pack_pairs_cols(const float* src, std::int64_t ld, std::int64_t valid_rows, std::int64_t k,
                                           float* out) {
  const std::int64_t steps = (k + 1) / 2;
  for (std::int64_t s = 0; s < steps; ++s)
    for (int g = 0; g < R; g += 16) {
      const __m256i even = cvt16(src + 2 * s * ld + g, valid_rows - g);
      const __m256i odd = 2 * s + 1 < k ? cvt16(src + (2 * s + 1) * ld + g, valid_rows - g) : _mm256_setzero_si256();
      _mm512_mask_storeu_epi32(out + s * R + g, lanes(R - g), pairs(even, odd));
    }
}

// fma_tile on pairs: acc[i][v] += the pair products of a[s * lda + i * RowStride] and
// b[s * ldb + 16 v + j], s in increasing order.
template <int MR, int NV, int RowStride = 1>
ATTNRES_DPBF16_INLINE void dp_tile(const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                                   std::int64_t steps, __m512 (&acc)[MR][NV]) {
  for (std::int64_t s = 0; s < steps; ++s) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_ps(b + s * ldb + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_ps(a[s * lda + i * RowStride]);  // a move: the pair's bits are kept
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
  }
}

}  // namespace attnres::kernels::avx512
#endif  // ATTNRES_AVX512_CODE
