#include "kernels/attention.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/avx512_tiles.hpp"
#include "kernels/gemm_bf16_avx512.hpp"
#include "kernels/scratch.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

// The same blocks as the fp32 kernel (attention.cpp): a block of 64 queries of one (batch, head)
// against every key it sees, an exact softmax, memory O(T) per thread. The products run on
// 14 x 32 register tiles (kernels/avx512_tiles.hpp):
//   forward   S^T = scale K Q^T  (tiles: 14 keys x 32 queries, k = head_dim)
//             softmax down each column of S^T (16 queries per vector), P^T rounded
//             O = P V            (14 queries x 32 dims, k = keys: A is P^T's rows)
//   backward  S^T as above, dP^T = V dO^T, dS^T = P^T (dP^T - D) in fp32, rounded;
//             dQ = scale dS K    (A: dS^T's rows)
//             dK += scale dS^T Q, dV += P^T dO  (A: 14 adjacent rows of dS^T and P^T, read in
//                                               place (the tile's RowStride): no transposed copy)
// Two microkernels, one set of blocks (template parameter Dot):
//   fma     one fp32 FMA per product of bf16-rounded fp32 operands (Intel: VDPBF16PS runs at half
//           the FMA rate there);
//   dpbf16  VDPBF16PS on bf16 pairs (AMD Zen 4/5: twice the FMA rate), every operand packed as
//           pairs along its product's k: head_dim for S and dP, keys for O and dQ, queries for dK
//           and dV (kPair = 2 values per step; P and dS get pair copies after the softmax).
// Every operand is rounded to bf16 once: Q, K, V and dO while they are copied per head (Q^T and
// dO^T transposed; K and V, the A operands of the score products, in panels of 14 keys, k-major,
// so that a tile reads one contiguous 14 x head_dim panel), P and dS as the softmax writes them
// (fma) or as their pair copies are made (dpbf16).
// Products of zero terms (keys after a query) are skipped or multiply exact zeros; that changes
// no result. Each output element is written by one task in a fixed order: bit-identical for any
// thread count.

bool attention_bf16_supported(const AttentionShape& s) {
#if ATTNRES_AVX512_CODE
  return avx512::cpu_has_avx512() && s.head_dim % 16 == 0 && s.head_dim <= kMaxHeadDim;
#else
  (void)s;
  return false;
#endif
}

#if ATTNRES_AVX512_CODE
namespace {

using namespace avx512;

constexpr int kQueryBlock = 64;
constexpr int kMR = 14, kNV = 2, kNR = 16 * kNV;

// Values of a product's k per microkernel step: 1 (fma) or 2 (dpbf16's pairs).
template <Dot D>
constexpr int kPair = D == Dot::fma ? 1 : 2;

std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

// Stride of a transposed per-head copy of n tokens: room for a whole last block of queries and
// for the microkernel's reads past the last valid row or column (their results are discarded).
std::int64_t transposed_stride(std::int64_t n) { return round_up(n, kQueryBlock) + 2 * kNR; }

// Floats (or pair words) of one head's key panels: ceil(n / 14) panels of [hd / kPair][14], the
// last one zero-padded.
template <Dot D>
std::int64_t panels_size(std::int64_t n, int hd) { return (n + kMR - 1) / kMR * kMR * hd / kPair<D>; }

// Rows of a per-head token-major copy of n tokens (pack_token_rows): one per token (fma) or token
// pair (dpbf16), and two of zeros.
template <Dot D>
std::int64_t token_rows(std::int64_t n) { return (n + kPair<D> - 1) / kPair<D> + 2; }

template <Dot D, int MR, int NV, int RowStride = 1>
ATTNRES_DPBF16_INLINE void tile(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t steps,
                                __m512 (&acc)[MR][NV]) {
  if constexpr (D == Dot::fma) fma_tile<MR, NV, RowStride>(a, lda, b, ldb, steps, acc);
  else dp_tile<MR, NV, RowStride>(a, lda, b, ldb, steps, acc);
}

// ---- per-head copies ---------------------------------------------------------------------------

// The panels of n rows of one head (src[t * lds + e], t < n, e < hd): panel p holds rows 14p ..
// 14p + 13, k-major (fma: out[p * 14 hd + e * 14 + r]; dpbf16: the pairs of e), rounded to bf16;
// rows past n are zero.
template <Dot D>
ATTNRES_DPBF16_TARGET void pack_key_panels(const float* src, std::int64_t lds, std::int64_t n, int hd, float* out) {
  for (std::int64_t t0 = 0; t0 < n; t0 += kMR) {
    const std::int64_t rows = std::min<std::int64_t>(kMR, n - t0);
    if constexpr (D == Dot::fma) pack_panel_rows<kMR>(src + t0 * lds, lds, rows, hd, out + t0 * hd);
    else pack_pairs_rows<kMR>(src + t0 * lds, lds, rows, hd, out + t0 * hd / 2);
  }
}

// The transpose of `rows` tokens of one head, rounded: fma: dst[e * ldt + t] = src[t * lds + e];
// dpbf16: dst[s * ldt + t] = the pair (src[t][2s], src[t][2s + 1]). hd % 16 == 0; zeros up to ldt.
template <Dot D>
ATTNRES_DPBF16_TARGET void pack_transposed(const float* src, std::int64_t lds, std::int64_t rows, int hd, float* dst,
                                           std::int64_t ldt) {
  const int steps = hd / kPair<D>;
  for (std::int64_t t0 = 0; t0 < rows; t0 += 16)
    for (int s0 = 0; s0 < steps; s0 += 16) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j) {
        const float* row = src + (t0 + j) * lds;
        if (t0 + j >= rows) r[j] = _mm512_setzero_si512();
        else if constexpr (D == Dot::fma) r[j] = _mm512_castps_si512(round_bf16(_mm512_loadu_ps(row + s0)));
        else r[j] = cvt32(row + 2 * s0, hd - 2 * s0);
      }
      transpose16(r);
      for (int c = 0; c < std::min(16, steps - s0); ++c) _mm512_storeu_si512(dst + (s0 + c) * ldt + t0, r[c]);
    }
  for (int e = 0; e < steps; ++e) std::fill(dst + e * ldt + round_up(rows, 16), dst + (e + 1) * ldt, 0.0f);
}

// Token-major copy of `rows` tokens of one head, rounded, then zeros (token_rows<D> rows in all):
// fma: dst[t * hd + e] = src[t * lds + e]; dpbf16: dst[s * hd + e] = the pair (src[2s][e],
// src[2s + 1][e]), the B operand of a product over tokens.
template <Dot D>
ATTNRES_DPBF16_TARGET void pack_token_rows(const float* src, std::int64_t lds, std::int64_t rows, int hd, float* dst) {
  const std::int64_t steps = (rows + kPair<D> - 1) / kPair<D>;
  for (std::int64_t t = 0; t < steps; ++t)
    for (int e = 0; e < hd; e += 16) {
      if constexpr (D == Dot::fma) {
        _mm512_storeu_ps(dst + t * hd + e, round_bf16(_mm512_loadu_ps(src + t * lds + e)));
      } else {
        const __m256i even = cvt16(src + 2 * t * lds + e, 16);
        const __m256i odd = 2 * t + 1 < rows ? cvt16(src + (2 * t + 1) * lds + e, 16) : _mm256_setzero_si256();
        _mm512_storeu_si512(dst + t * hd + e, pairs(even, odd));
      }
    }
  std::fill(dst + steps * hd, dst + token_rows<D>(rows) * hd, 0.0f);
}

// Pair copies of a block's P^T or dS^T ([keys][64 queries], fp32) for dpbf16, rounded to bf16;
// query lanes from qn on are zero in both.
// Along the keys (the A operand of O = P V and dQ = dS K): out[s * 64 + q] = (x[2s][q], x[2s + 1][q]).
ATTNRES_DPBF16_TARGET void pair_keys(const float* x_t, std::int64_t nk, int qn, float* out) {
  for (std::int64_t s = 0; s < (nk + 1) / 2; ++s)
    for (int g = 0; g < kQueryBlock; g += 16) {
      const __m256i even = cvt16(x_t + 2 * s * kQueryBlock + g, qn - g);
      const __m256i odd = 2 * s + 1 < nk ? cvt16(x_t + (2 * s + 1) * kQueryBlock + g, qn - g) : _mm256_setzero_si256();
      _mm512_storeu_si512(out + s * kQueryBlock + g, pairs(even, odd));
    }
}
// Along the queries (the A operand of dK = dS^T Q and dV = P^T dO): out[kk * 32 + j] =
// (x[kk][2j], x[kk][2j + 1]).
ATTNRES_DPBF16_TARGET void pair_queries(const float* x_t, std::int64_t nk, int qn, float* out) {
  for (std::int64_t kk = 0; kk < nk; ++kk) {
    _mm512_storeu_si512(out + kk * 32, cvt32(x_t + kk * kQueryBlock, qn));
    _mm512_storeu_si512(out + kk * 32 + 16, cvt32(x_t + kk * kQueryBlock + 32, qn - 32));
  }
}

// P and dS as the softmax writes them: rounded to bf16 for the FMA tiles; left in fp32 for the
// pair copies, whose conversion rounds them the same way.
template <Dot D>
ATTNRES_AVX512_INLINE __m512 rounded(__m512 x) {
  if constexpr (D == Dot::fma) return round_bf16(x);
  else return x;
}

// Lanes j of a 16-query group whose query (position base + j) sees key kk, and j < valid.
ATTNRES_AVX512_INLINE __mmask16 visible(std::int64_t kk, std::int64_t base, std::int64_t valid) {
  const std::int64_t first = kk - base;  // the first lane that sees kk
  const __mmask16 causal = first <= 0 ? __mmask16(0xffff) : first >= 16 ? __mmask16(0) : __mmask16(0xffffu << first);
  return causal & lanes(valid);
}

// ---- the block products ------------------------------------------------------------------------

// s_t[kk * 64 + q] = alpha * sum_e a[kk][e] b_t[e][q] for keys kk < nk and the block's queries, in
// 14 x 32 tiles, A from its key panels (pack_key_panels), B transposed (pack_transposed, row stride
// ldb); tiles whose every key comes after every query are skipped (the softmax never reads
// them). pos0: the block's first position.
template <Dot D>
ATTNRES_DPBF16_INLINE void scores_transposed(const float* a_panels, const float* b_t, std::int64_t ldb, int hd,
                                             float alpha, std::int64_t nk, int qn, std::int64_t pos0, float* s_t) {
  const int steps = hd / kPair<D>;
  for (std::int64_t k0 = 0; k0 < nk; k0 += kMR)
    for (int q0 = 0; q0 < qn; q0 += kNR) {
      if (k0 > pos0 + q0 + kNR - 1) continue;
      __m512 acc[kMR][kNV];
      zero_tile(acc);
      tile<D>(a_panels + k0 * steps, kMR, b_t + q0, ldb, steps, acc);
      store_tile(acc, std::min<std::int64_t>(kMR, nk - k0), kNR, alpha, 0.0f, s_t + k0 * kQueryBlock + q0, kQueryBlock);
    }
}

// out[q * ldo + e] = alpha * sum_{kk < seen(q)} x[kk][q] v[kk][e] for q < qn, e < hd, where seen =
// min(nk, pos0 + q-tile end): the keys the tile's queries see. x: P^T or dS^T as [keys][64] (fma)
// or pair_keys' copy (dpbf16); v: pack_token_rows' copy of the keys' rows.
template <Dot D>
ATTNRES_DPBF16_INLINE void rows_times(const float* x, const float* v, int hd, std::int64_t nk, int qn, std::int64_t pos0,
                                      float alpha, float* out, std::int64_t ldo) {
  for (int q0 = 0; q0 < qn; q0 += kMR) {
    const int rows = std::min(kMR, qn - q0);
    const std::int64_t seen = std::min<std::int64_t>(nk, pos0 + q0 + rows);
    for (int e0 = 0; e0 < hd; e0 += kNR) {
      __m512 acc[kMR][kNV];
      zero_tile(acc);
      tile<D>(x + q0, kQueryBlock, v + e0, hd, (seen + kPair<D> - 1) / kPair<D>, acc);
      store_tile(acc, rows, std::min(kNR, hd - e0), alpha, 0.0f, out + q0 * ldo + e0, ldo);
    }
  }
}

// Per-head copies shared by the blocks of a call (fma: bf16-rounded floats; dpbf16: pair words).
struct HeadCopies {
  std::int64_t heads = 0, tq = 0, rows_q = 0, rows_k = 0;
  std::int64_t panels = 0;            // floats per head of k_p and v_p
  std::int64_t q_rows = 0, k_rows = 0;  // floats per head of q_r, do_r and of k_r, v_r
  float* q_t = nullptr;  // [head] pack_transposed of Q
  float* k_p = nullptr;  // [head] key panels (pack_key_panels)
  float* v_p = nullptr;  // [head] value panels         (backward)
  float* do_t = nullptr; // [head] pack_transposed of dO (backward)
  float* q_r = nullptr;  // [head] pack_token_rows of Q  (backward)
  float* k_r = nullptr;  // [head] ... of K              (backward)
  float* v_r = nullptr;  // [head] ... of V              (forward)
  float* do_r = nullptr; // [head] ... of dO             (backward)
};

// A thread's buffers for one block: S^T then P^T, dP^T then dS^T ([keys][64]); for dpbf16 the pair
// copies of P and dS along the keys (pairs) and along the queries (p_rows, ds_rows).
struct BlockScratch {
  float *s_t = nullptr, *dp_t = nullptr, *pairs = nullptr, *p_rows = nullptr, *ds_rows = nullptr;
};

template <Dot D>
BlockScratch block_scratch(std::int64_t keys, bool backward) {
  thread_local Scratch<float> st, sdp, sp, spr, sdr;
  const auto rows = static_cast<std::size_t>(keys + 2 * kNR);  // the tiles read up to 13 rows past the last key
  BlockScratch w;
  w.s_t = st.get(rows * kQueryBlock);
  if (backward) w.dp_t = sdp.get(rows * kQueryBlock);
  if constexpr (D == Dot::dpbf16) {
    w.pairs = sp.get(rows * kQueryBlock);
    if (backward) {
      w.p_rows = spr.get(rows * kQueryBlock / 2);
      w.ds_rows = sdr.get(rows * kQueryBlock / 2);
    }
  }
  return w;
}

// ---- forward ------------------------------------------------------------------------------

template <Dot D>
ATTNRES_DPBF16_TARGET void forward_block(float* out, float* lse, const HeadCopies& hc, const AttentionShape& s,
                                         std::int64_t bh, int i0, const BlockScratch& w) {
  const int hd = s.head_dim, d = s.n_heads * hd;
  const std::int64_t b = bh / s.n_heads, h = bh % s.n_heads;
  const int qn = std::min(kQueryBlock, s.q_len - i0);
  const std::int64_t pos0 = s.q_pos0 + i0, nk = pos0 + qn;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* s_t = w.s_t;
  scores_transposed<D>(hc.k_p + bh * hc.panels, hc.q_t + bh * (hd / kPair<D>) * hc.tq + i0, hc.tq, hd, scale, nk, qn,
                       pos0, s_t);
  // Softmax down each query's column; rows after a query's position are zero.
  for (int q0 = 0; q0 < qn; q0 += 16) {
    const std::int64_t base = pos0 + q0, seen = std::min(nk, base + 16);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (std::int64_t kk = 0; kk < seen; ++kk)
      mx = _mm512_mask_max_ps(mx, visible(kk, base, qn - q0), mx, _mm512_loadu_ps(s_t + kk * kQueryBlock + q0));
    __m512 sum = _mm512_setzero_ps();
    for (std::int64_t kk = 0; kk < seen; ++kk) {
      float* row = s_t + kk * kQueryBlock + q0;
      const __m512 e = _mm512_maskz_mov_ps(visible(kk, base, qn - q0), exp16(_mm512_sub_ps(_mm512_loadu_ps(row), mx)));
      _mm512_storeu_ps(row, e);
      sum = _mm512_add_ps(sum, e);
    }
    for (std::int64_t kk = seen; kk < nk; ++kk) _mm512_storeu_ps(s_t + kk * kQueryBlock + q0, _mm512_setzero_ps());
    const __m512 inv = _mm512_maskz_div_ps(lanes(qn - q0), _mm512_set1_ps(1.0f), sum);  // lanes past qn: 0
    for (std::int64_t kk = 0; kk < seen; ++kk) {
      float* row = s_t + kk * kQueryBlock + q0;
      _mm512_storeu_ps(row, rounded<D>(_mm512_mul_ps(_mm512_loadu_ps(row), inv)));
    }
    alignas(64) float m16[16], s16[16];
    _mm512_store_ps(m16, mx);
    _mm512_store_ps(s16, sum);
    for (int j = 0; j < std::min(16, qn - q0); ++j) lse[bh * s.q_len + i0 + q0 + j] = m16[j] + std::log(s16[j]);
  }
  const float* p = s_t;
  if constexpr (D == Dot::dpbf16) {
    pair_keys(s_t, nk, qn, w.pairs);
    p = w.pairs;
  }
  rows_times<D>(p, hc.v_r + bh * hc.k_rows, hd, nk, qn, pos0, 1.0f, out + (b * s.q_len + i0) * d + h * hd, d);
}

template <Dot D>
void make_forward_copies(HeadCopies& hc, const float* q, const float* k, const float* v, const AttentionShape& s) {
  thread_local Scratch<float> sq, sk, sv;
  const int hd = s.head_dim, d = s.n_heads * hd;
  hc.heads = s.batch * s.n_heads;
  hc.rows_q = s.q_len;
  hc.rows_k = s.q_pos0 + s.q_len;
  hc.tq = transposed_stride(hc.rows_q);
  hc.panels = panels_size<D>(hc.rows_k, hd);
  hc.k_rows = token_rows<D>(hc.rows_k) * hd;
  hc.q_t = sq.get(static_cast<std::size_t>(hc.heads * hd / kPair<D> * hc.tq));
  hc.k_p = sk.get(static_cast<std::size_t>(hc.heads * hc.panels));
  hc.v_r = sv.get(static_cast<std::size_t>(hc.heads * hc.k_rows));
#pragma omp parallel for schedule(static) if (hc.heads > 1 && hc.heads * hc.rows_k * hd >= kParallelMin)
  for (std::int64_t bh = 0; bh < hc.heads; ++bh) {
    const std::int64_t b = bh / s.n_heads, h = bh % s.n_heads;
    pack_transposed<D>(q + b * s.q_len * d + h * hd, d, hc.rows_q, hd, hc.q_t + bh * hd / kPair<D> * hc.tq, hc.tq);
    pack_key_panels<D>(k + b * s.kv_stride * d + h * hd, d, hc.rows_k, hd, hc.k_p + bh * hc.panels);
    pack_token_rows<D>(v + b * s.kv_stride * d + h * hd, d, hc.rows_k, hd, hc.v_r + bh * hc.k_rows);
  }
}

template <Dot D>
void forward(float* out, float* lse, const float* q, const float* k, const float* v, const AttentionShape& s) {
  HeadCopies hc;
  make_forward_copies<D>(hc, q, k, v, s);
  const std::int64_t blocks = (s.q_len + kQueryBlock - 1) / kQueryBlock, tasks = hc.heads * blocks;
  const std::int64_t work = hc.heads * std::int64_t(s.q_len) * (s.q_pos0 + s.q_len) * s.head_dim;
#pragma omp parallel if (tasks > 1 && work >= kParallelMin)
  {
    const BlockScratch w = block_scratch<D>(hc.rows_k, false);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task)
      forward_block<D>(out, lse, hc, s, task / blocks, static_cast<int>(task % blocks) * kQueryBlock, w);
  }
}

// ---- backward -----------------------------------------------------------------------------

template <Dot D>
ATTNRES_DPBF16_TARGET void backward_head(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                         const float* lse, const HeadCopies& hc, const AttentionShape& s,
                                         std::int64_t bh, const BlockScratch& w) {
  constexpr int u = kPair<D>;
  const int hd = s.head_dim, d = s.n_heads * hd, T = s.q_len;
  const std::int64_t b = bh / s.n_heads, h = bh % s.n_heads, base = b * T * d + h * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* q_t = hc.q_t + bh * hd / u * hc.tq;
  const float* k_p = hc.k_p + bh * hc.panels;
  const float* v_p = hc.v_p + bh * hc.panels;
  const float* do_t = hc.do_t + bh * hd / u * hc.tq;
  const float* q_r = hc.q_r + bh * hc.q_rows;
  const float* k_r = hc.k_r + bh * hc.k_rows;
  const float* do_r = hc.do_r + bh * hc.q_rows;
  for (int t = 0; t < T; ++t) {
    std::fill(dk + base + std::int64_t(t) * d, dk + base + std::int64_t(t) * d + hd, 0.0f);
    std::fill(dv + base + std::int64_t(t) * d, dv + base + std::int64_t(t) * d + hd, 0.0f);
  }
  for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
    const int qn = std::min(kQueryBlock, T - i0);
    const std::int64_t nk = i0 + qn;
    scores_transposed<D>(k_p, q_t + i0, hc.tq, hd, scale, nk, qn, i0, w.s_t);
    scores_transposed<D>(v_p, do_t + i0, hc.tq, hd, 1.0f, nk, qn, i0, w.dp_t);
    // D = dO . O per query, in fp32, with dO rounded as in dP (the sum over keys of P dP it stands
    // for then cancels against dP better: dS sums to nearly zero over each query's keys).
    alignas(64) float dd[kQueryBlock] = {};
    for (int j = 0; j < qn; ++j) {
      const float* o = out + base + std::int64_t(i0 + j) * d;
      const float* g = dout + base + std::int64_t(i0 + j) * d;
      __m512 acc = _mm512_setzero_ps();
      for (int e = 0; e < hd; e += 16)
        acc = _mm512_fmadd_ps(round_bf16(_mm512_loadu_ps(g + e)), _mm512_loadu_ps(o + e), acc);
      dd[j] = reduce_add(acc);
    }
    // P^T = exp(S^T - lse), dS^T = P^T (dP^T - D), zero after each query; rounded (in place for
    // fma, by the pair copies for dpbf16).
    for (int q0 = 0; q0 < qn; q0 += 16) {
      const std::int64_t qbase = i0 + q0, seen = std::min(nk, qbase + 16);
      const __m512 l = _mm512_maskz_loadu_ps(lanes(qn - q0), lse + bh * T + i0 + q0);
      const __m512 dvec = _mm512_load_ps(dd + q0);
      for (std::int64_t kk = 0; kk < seen; ++kk) {
        float* sp = w.s_t + kk * kQueryBlock + q0;
        float* dp = w.dp_t + kk * kQueryBlock + q0;
        const __m512 p = _mm512_maskz_mov_ps(visible(kk, qbase, qn - q0), exp16(_mm512_sub_ps(_mm512_loadu_ps(sp), l)));
        _mm512_storeu_ps(dp, rounded<D>(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp), dvec))));
        _mm512_storeu_ps(sp, rounded<D>(p));
      }
      for (std::int64_t kk = seen; kk < nk; ++kk) {  // keys none of the 16 queries sees
        _mm512_storeu_ps(w.s_t + kk * kQueryBlock + q0, _mm512_setzero_ps());
        _mm512_storeu_ps(w.dp_t + kk * kQueryBlock + q0, _mm512_setzero_ps());
      }
    }
    // Query lanes past qn were not written (q0 >= qn): fma never reads them, the pair copies zero them.
    const float *ds_keys = w.dp_t, *ds_queries = w.dp_t, *p_queries = w.s_t;
    if constexpr (D == Dot::dpbf16) {
      pair_keys(w.dp_t, nk, qn, w.pairs);
      pair_queries(w.dp_t, nk, qn, w.ds_rows);
      pair_queries(w.s_t, nk, qn, w.p_rows);
      ds_keys = w.pairs, ds_queries = w.ds_rows, p_queries = w.p_rows;
    }
    // dQ = scale dS K.
    rows_times<D>(ds_keys, k_r, hd, nk, qn, i0, scale, dq + base + std::int64_t(i0) * d, d);
    // dK += scale dS^T Q, dV += P^T dO: key tiles; queries before a tile's first key see none of
    // it (from an even query for pairs: the one before it multiplies zeros).
    constexpr int row = kQueryBlock / u;  // floats or pair words per key of ds_queries, p_queries
    for (std::int64_t k0 = 0; k0 < nk; k0 += kMR) {
      const std::int64_t rows = std::min<std::int64_t>(kMR, nk - k0), s0 = std::max<std::int64_t>(0, k0 - i0) / u * u;
      const std::int64_t steps = (qn - s0 + u - 1) / u, t0 = (i0 + s0) / u;
      for (int e0 = 0; e0 < hd; e0 += kNR) {
        const std::int64_t cols = std::min(kNR, hd - e0);
        __m512 acc[kMR][kNV];
        zero_tile(acc);
        tile<D, kMR, kNV, row>(ds_queries + k0 * row + s0 / u, 1, q_r + t0 * hd + e0, hd, steps, acc);
        store_tile(acc, rows, cols, scale, 1.0f, dk + base + k0 * d + e0, d);
        zero_tile(acc);
        tile<D, kMR, kNV, row>(p_queries + k0 * row + s0 / u, 1, do_r + t0 * hd + e0, hd, steps, acc);
        store_tile(acc, rows, cols, 1.0f, 1.0f, dv + base + k0 * d + e0, d);
      }
    }
  }
}

template <Dot D>
void make_backward_copies(HeadCopies& hc, const float* q, const float* k, const float* v, const float* dout,
                          const AttentionShape& s) {
  thread_local Scratch<float> sq, sk, sv, sd, rq, rk, rd;
  const int hd = s.head_dim, d = s.n_heads * hd, T = s.q_len;
  hc.heads = s.batch * s.n_heads;
  hc.rows_q = hc.rows_k = T;
  hc.tq = transposed_stride(T);
  hc.panels = panels_size<D>(T, hd);
  hc.q_rows = hc.k_rows = token_rows<D>(T) * hd;
  const auto transposed = static_cast<std::size_t>(hc.heads * hd / kPair<D> * hc.tq);
  const auto rows = static_cast<std::size_t>(hc.heads * hc.q_rows);
  hc.q_t = sq.get(transposed);
  hc.k_p = sk.get(static_cast<std::size_t>(hc.heads * hc.panels));
  hc.v_p = sv.get(static_cast<std::size_t>(hc.heads * hc.panels));
  hc.do_t = sd.get(transposed);
  hc.q_r = rq.get(rows);
  hc.k_r = rk.get(rows);
  hc.do_r = rd.get(rows);
#pragma omp parallel for schedule(static) if (hc.heads > 1 && hc.heads * T * hd >= kParallelMin)
  for (std::int64_t bh = 0; bh < hc.heads; ++bh) {
    const std::int64_t src = (bh / s.n_heads) * T * d + (bh % s.n_heads) * hd;
    const std::int64_t t_off = bh * hd / kPair<D> * hc.tq, r_off = bh * hc.q_rows;
    pack_transposed<D>(q + src, d, T, hd, hc.q_t + t_off, hc.tq);
    pack_key_panels<D>(k + src, d, T, hd, hc.k_p + bh * hc.panels);
    pack_key_panels<D>(v + src, d, T, hd, hc.v_p + bh * hc.panels);
    pack_transposed<D>(dout + src, d, T, hd, hc.do_t + t_off, hc.tq);
    pack_token_rows<D>(q + src, d, T, hd, hc.q_r + r_off);
    pack_token_rows<D>(k + src, d, T, hd, hc.k_r + r_off);
    pack_token_rows<D>(dout + src, d, T, hd, hc.do_r + r_off);
  }
}

template <Dot D>
void backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
              const float* out, const float* lse, const AttentionShape& s) {
  HeadCopies hc;
  make_backward_copies<D>(hc, q, k, v, dout, s);
#pragma omp parallel if (hc.heads > 1 && s.batch * std::int64_t(s.q_len) * s.q_len * s.head_dim >= kParallelMin)
  {
    const BlockScratch w = block_scratch<D>(s.q_len, true);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t bh = 0; bh < hc.heads; ++bh) backward_head<D>(dq, dk, dv, dout, out, lse, hc, s, bh, w);
  }
}

// The microkernel of a backend: VDPBF16PS where the GEMMs use it (AVX512_BF16 on AMD), FMA elsewhere.
Dot attention_dot(Bf16Backend backend) {
  if (backend == Bf16Backend::automatic) backend = bf16_backend();
  require(bf16_backend_available(backend), "bf16 attention: the ", to_string(backend),
          " backend is not available on this CPU or OS");
  return backend == Bf16Backend::avx512_bf16 ? Dot::dpbf16 : Dot::fma;
}

}  // namespace
#endif  // ATTNRES_AVX512_CODE

void attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                            const AttentionShape& s, Bf16Backend backend) {
#if ATTNRES_AVX512_CODE
  if (attention_bf16_supported(s)) {
    if (attention_dot(backend) == Dot::dpbf16) forward<Dot::dpbf16>(out, lse, q, k, v, s);
    else forward<Dot::fma>(out, lse, q, k, v, s);
    return;
  }
#endif
  (void)backend;
  attention_forward<float>(out, lse, q, k, v, s);
}

void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                             const float* v, const float* out, const float* lse, const AttentionShape& s,
                             Bf16Backend backend) {
#if ATTNRES_AVX512_CODE
  if (attention_bf16_supported(s)) {
    if (attention_dot(backend) == Dot::dpbf16) backward<Dot::dpbf16>(dq, dk, dv, dout, q, k, v, out, lse, s);
    else backward<Dot::fma>(dq, dk, dv, dout, q, k, v, out, lse, s);
    return;
  }
#endif
  (void)backend;
  attention_backward<float>(dq, dk, dv, dout, q, k, v, out, lse, s);
}

}  // namespace attnres::kernels
