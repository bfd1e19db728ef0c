#include "kernels/attention.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/avx512_tiles.hpp"
#include "kernels/gemm_bf16_avx512.hpp"
#include "kernels/scratch.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

// The same blocks as the fp32 kernel (attention.cpp): a block of 64 queries of one (batch, head)
// against every key it sees, an exact softmax, memory O(T) per thread. The products run on the
// FMA microkernel of kernels/avx512_tiles.hpp with 14 x 32 register tiles:
//   forward   S^T = scale K Q^T  (tiles: 14 keys x 32 queries, k = head_dim)
//             softmax down each column of S^T (16 queries per vector), P^T rounded in place
//             O = P V            (14 queries x 32 dims, k = keys: A is P^T's rows)
//   backward  S^T as above, dP^T = V dO^T, dS^T = P^T (dP^T - D) in fp32, rounded;
//             dQ = scale dS K    (A: dS^T's rows)
//             dK += scale dS^T Q, dV += P^T dO  (A: 14 adjacent rows of dS^T and P^T, read in
//                                               place (fma_tile's RowStride): no transposed copy)
// Every operand is rounded to bf16 once: Q, K, V and dO while they are copied per head (Q^T and
// dO^T transposed; K and V, the A operands of the score products, in panels of 14 keys, k-major,
// so that a tile reads one contiguous 14 x head_dim panel), P and dS as the softmax writes them.
// Products of zero terms (keys after a query) are skipped; that changes no result. Each output element is written by one task in a fixed order: bit-identical for any
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

std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

// Stride of a transposed per-head copy of n tokens: room for a whole last block of queries and
// for the microkernel's reads past the last valid row or column (their results are discarded).
std::int64_t transposed_stride(std::int64_t n) { return round_up(n, kQueryBlock) + 2 * kNR; }

// Floats of one head's key panels: ceil(n / 14) panels of [hd][14], the last one zero-padded.
std::int64_t panels_size(std::int64_t n, int hd) { return (n + kMR - 1) / kMR * kMR * hd; }

// The panels of n rows of one head (src[t * lds + e], t < n, e < hd): panel p holds rows 14p ..
// 14p + 13 as out[p * 14 hd + e * 14 + r], rounded to bf16; rows past n are zero.
ATTNRES_AVX512_TARGET void pack_key_panels(const float* src, std::int64_t lds, std::int64_t n, int hd, float* out) {
  for (std::int64_t t0 = 0; t0 < n; t0 += kMR)
    pack_panel_rows<kMR>(src + t0 * lds, lds, std::min<std::int64_t>(kMR, n - t0), hd, out + t0 * hd);
}

// dst[e * ldt + t] = round(src[t * lds + e]) for t < rows, e < hd (hd % 16 == 0), zeros up to ldt.
ATTNRES_AVX512_TARGET void transpose_rounded(const float* src, std::int64_t lds, std::int64_t rows, int hd, float* dst,
                                             std::int64_t ldt) {
  for (std::int64_t t0 = 0; t0 < rows; t0 += 16)
    for (int e0 = 0; e0 < hd; e0 += 16) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j)
        r[j] = t0 + j < rows ? _mm512_castps_si512(round_bf16(_mm512_loadu_ps(src + (t0 + j) * lds + e0)))
                             : _mm512_setzero_si512();
      transpose16(r);
      for (int c = 0; c < 16; ++c) _mm512_storeu_si512(dst + (e0 + c) * ldt + t0, r[c]);
    }
  for (int e = 0; e < hd; ++e) std::fill(dst + e * ldt + round_up(rows, 16), dst + (e + 1) * ldt, 0.0f);
}

// dst[t * hd + e] = round(src[t * lds + e]) for t < rows, then two rows of zeros.
ATTNRES_AVX512_TARGET void copy_rounded(const float* src, std::int64_t lds, std::int64_t rows, int hd, float* dst) {
  for (std::int64_t t = 0; t < rows; ++t)
    for (int e = 0; e < hd; e += 16) _mm512_storeu_ps(dst + t * hd + e, round_bf16(_mm512_loadu_ps(src + t * lds + e)));
  std::fill(dst + rows * hd, dst + (rows + 2) * hd, 0.0f);
}

// Lanes j of a 16-query group whose query (position base + j) sees key kk, and j < valid.
ATTNRES_AVX512_INLINE __mmask16 visible(std::int64_t kk, std::int64_t base, std::int64_t valid) {
  const std::int64_t first = kk - base;  // the first lane that sees kk
  const __mmask16 causal = first <= 0 ? __mmask16(0xffff) : first >= 16 ? __mmask16(0) : __mmask16(0xffffu << first);
  return causal & lanes(valid);
}

// s_t[kk * 64 + q] = alpha * sum_e a[kk][e] b_t[e * ldb + q] for keys kk < nk and the block's
// queries, in 14 x 32 tiles, A from its key panels (pack_key_panels); tiles whose every key comes
// after every query are skipped (the softmax never reads them). pos0: the block's first position.
ATTNRES_AVX512_INLINE void scores_transposed(const float* a_panels, const float* b_t, std::int64_t ldb, int hd,
                                             float alpha, std::int64_t nk, int qn, std::int64_t pos0, float* s_t) {
  for (std::int64_t k0 = 0; k0 < nk; k0 += kMR)
    for (int q0 = 0; q0 < qn; q0 += kNR) {
      if (k0 > pos0 + q0 + kNR - 1) continue;
      __m512 acc[kMR][kNV];
      zero_tile(acc);
      fma_tile(a_panels + k0 * hd, kMR, b_t + q0, ldb, hd, acc);
      store_tile(acc, std::min<std::int64_t>(kMR, nk - k0), kNR, alpha, 0.0f, s_t + k0 * kQueryBlock + q0, kQueryBlock);
    }
}

// out[q * ldo + e] = alpha * sum_{kk < steps(q)} p_t[kk * 64 + q] v[kk * hd + e] (+ beta * out) for
// q < qn, e < hd, where steps = min(nk, pos0 + q-tile end): the keys the tile's queries see.
ATTNRES_AVX512_INLINE void rows_times(const float* p_t, const float* v, int hd, std::int64_t nk, int qn,
                                      std::int64_t pos0, float alpha, float* out, std::int64_t ldo) {
  for (int q0 = 0; q0 < qn; q0 += kMR) {
    const int rows = std::min(kMR, qn - q0);
    const std::int64_t steps = std::min<std::int64_t>(nk, pos0 + q0 + rows);
    for (int e0 = 0; e0 < hd; e0 += kNR) {
      __m512 acc[kMR][kNV];
      zero_tile(acc);
      fma_tile(p_t + q0, kQueryBlock, v + e0, hd, steps, acc);
      store_tile(acc, rows, std::min(kNR, hd - e0), alpha, 0.0f, out + q0 * ldo + e0, ldo);
    }
  }
}

// Per-head copies shared by the blocks of a call.
struct HeadCopies {
  std::int64_t heads = 0, tq = 0, rows_q = 0, rows_k = 0;
  std::int64_t panels = 0;  // floats per head of k_p and v_p
  float* q_t = nullptr;  // [head][hd][tq]
  float* k_p = nullptr;  // [head] key panels (pack_key_panels)
  float* v_p = nullptr;  // [head] value panels     (backward)
  float* do_t = nullptr; // [head][hd][tq]          (backward)
  float* q_r = nullptr;  // [head][rows_q + 2][hd]  (backward)
  float* k_r = nullptr;  // [head][rows_k + 2][hd]  (backward)
  float* v_r = nullptr;  // [head][rows_k + 2][hd]  (forward)
  float* do_r = nullptr; // [head][rows_q + 2][hd]  (backward)
};

// ---- forward ------------------------------------------------------------------------------

ATTNRES_AVX512_TARGET void forward_block(float* out, float* lse, const HeadCopies& hc, const AttentionShape& s,
                                         std::int64_t bh, int i0, float* s_t) {
  const int hd = s.head_dim, d = s.n_heads * hd;
  const std::int64_t b = bh / s.n_heads, h = bh % s.n_heads;
  const int qn = std::min(kQueryBlock, s.q_len - i0);
  const std::int64_t pos0 = s.q_pos0 + i0, nk = pos0 + qn;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  scores_transposed(hc.k_p + bh * hc.panels, hc.q_t + bh * hd * hc.tq + i0, hc.tq, hd, scale, nk, qn, pos0, s_t);
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
      _mm512_storeu_ps(row, round_bf16(_mm512_mul_ps(_mm512_loadu_ps(row), inv)));
    }
    alignas(64) float m16[16], s16[16];
    _mm512_store_ps(m16, mx);
    _mm512_store_ps(s16, sum);
    for (int j = 0; j < std::min(16, qn - q0); ++j) lse[bh * s.q_len + i0 + q0 + j] = m16[j] + std::log(s16[j]);
  }
  rows_times(s_t, hc.v_r + bh * (hc.rows_k + 2) * hd, hd, nk, qn, pos0, 1.0f,
             out + (b * s.q_len + i0) * d + h * hd, d);
}

void make_forward_copies(HeadCopies& hc, const float* q, const float* k, const float* v, const AttentionShape& s) {
  thread_local Scratch<float> sq, sk, sv;
  const int hd = s.head_dim, d = s.n_heads * hd;
  hc.heads = s.batch * s.n_heads;
  hc.rows_q = s.q_len;
  hc.rows_k = s.q_pos0 + s.q_len;
  hc.tq = transposed_stride(hc.rows_q);
  hc.panels = panels_size(hc.rows_k, hd);
  hc.q_t = sq.get(static_cast<std::size_t>(hc.heads * hd * hc.tq));
  hc.k_p = sk.get(static_cast<std::size_t>(hc.heads * hc.panels));
  hc.v_r = sv.get(static_cast<std::size_t>(hc.heads * (hc.rows_k + 2) * hd));
#pragma omp parallel for schedule(static) if (hc.heads > 1 && hc.heads * hc.rows_k * hd >= kParallelMin)
  for (std::int64_t bh = 0; bh < hc.heads; ++bh) {
    const std::int64_t b = bh / s.n_heads, h = bh % s.n_heads;
    transpose_rounded(q + b * s.q_len * d + h * hd, d, hc.rows_q, hd, hc.q_t + bh * hd * hc.tq, hc.tq);
    pack_key_panels(k + b * s.kv_stride * d + h * hd, d, hc.rows_k, hd, hc.k_p + bh * hc.panels);
    copy_rounded(v + b * s.kv_stride * d + h * hd, d, hc.rows_k, hd, hc.v_r + bh * (hc.rows_k + 2) * hd);
  }
}

// ---- backward -----------------------------------------------------------------------------

struct BackwardScratch {
  float *s_t, *dp_t;  // [keys][64]: S^T then P^T; dP^T then dS^T
};

ATTNRES_AVX512_TARGET void backward_head(float* dq, float* dk, float* dv, const float* out,
                                         const float* lse, const HeadCopies& hc, const AttentionShape& s,
                                         std::int64_t bh, const BackwardScratch& w) {
  const int hd = s.head_dim, d = s.n_heads * hd, T = s.q_len;
  const std::int64_t b = bh / s.n_heads, h = bh % s.n_heads, base = b * T * d + h * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* q_t = hc.q_t + bh * hd * hc.tq;
  const float* k_p = hc.k_p + bh * hc.panels;
  const float* v_p = hc.v_p + bh * hc.panels;
  const float* do_t = hc.do_t + bh * hd * hc.tq;
  const float* q_r = hc.q_r + bh * (hc.rows_q + 2) * hd;
  const float* k_r = hc.k_r + bh * (hc.rows_k + 2) * hd;
  const float* do_r = hc.do_r + bh * (hc.rows_q + 2) * hd;
  for (int t = 0; t < T; ++t) {
    std::fill(dk + base + std::int64_t(t) * d, dk + base + std::int64_t(t) * d + hd, 0.0f);
    std::fill(dv + base + std::int64_t(t) * d, dv + base + std::int64_t(t) * d + hd, 0.0f);
  }
  for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
    const int qn = std::min(kQueryBlock, T - i0);
    const std::int64_t nk = i0 + qn;
    scores_transposed(k_p, q_t + i0, hc.tq, hd, scale, nk, qn, i0, w.s_t);
    scores_transposed(v_p, do_t + i0, hc.tq, hd, 1.0f, nk, qn, i0, w.dp_t);
    // D = dO . O per query, in fp32, with dO rounded as in dP (the sum over keys of P dP it stands
    // for then cancels against dP better: dS sums to nearly zero over each query's keys).
    alignas(64) float dd[kQueryBlock] = {};
    for (int j = 0; j < qn; ++j) {
      const float* o = out + base + std::int64_t(i0 + j) * d;
      const float* g = do_r + std::int64_t(i0 + j) * hd;
      __m512 acc = _mm512_setzero_ps();
      for (int e = 0; e < hd; e += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(g + e), _mm512_loadu_ps(o + e), acc);
      dd[j] = reduce_add(acc);
    }
    // P^T = exp(S^T - lse), dS^T = P^T (dP^T - D); both rounded in place, zero after each query.
    for (int q0 = 0; q0 < qn; q0 += 16) {
      const std::int64_t qbase = i0 + q0, seen = std::min(nk, qbase + 16);
      const __m512 l = _mm512_maskz_loadu_ps(lanes(qn - q0), lse + bh * T + i0 + q0);
      const __m512 dvec = _mm512_load_ps(dd + q0);
      for (std::int64_t kk = 0; kk < seen; ++kk) {
        float* sp = w.s_t + kk * kQueryBlock + q0;
        float* dp = w.dp_t + kk * kQueryBlock + q0;
        const __m512 p = _mm512_maskz_mov_ps(visible(kk, qbase, qn - q0), exp16(_mm512_sub_ps(_mm512_loadu_ps(sp), l)));
        _mm512_storeu_ps(dp, round_bf16(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp), dvec))));
        _mm512_storeu_ps(sp, round_bf16(p));
      }
      for (std::int64_t kk = seen; kk < nk; ++kk) {  // keys none of the 16 queries sees
        _mm512_storeu_ps(w.s_t + kk * kQueryBlock + q0, _mm512_setzero_ps());
        _mm512_storeu_ps(w.dp_t + kk * kQueryBlock + q0, _mm512_setzero_ps());
      }
    }
    // Query lanes past qn were not written (q0 >= qn): their rows of P and dS are never read.
    // dQ = scale dS K.
    rows_times(w.dp_t, k_r, hd, nk, qn, i0, scale, dq + base + std::int64_t(i0) * d, d);
    // dK += scale dS^T Q, dV += P^T dO: key tiles; queries before a tile's first key see none of it.
    for (std::int64_t k0 = 0; k0 < nk; k0 += kMR) {
      const std::int64_t rows = std::min<std::int64_t>(kMR, nk - k0), s0 = std::max<std::int64_t>(0, k0 - i0);
      for (int e0 = 0; e0 < hd; e0 += kNR) {
        const std::int64_t cols = std::min(kNR, hd - e0);
        __m512 acc[kMR][kNV];
        zero_tile(acc);
        fma_tile<kMR, kNV, kQueryBlock>(w.dp_t + k0 * kQueryBlock + s0, 1, q_r + (i0 + s0) * hd + e0, hd, qn - s0, acc);
        store_tile(acc, rows, cols, scale, 1.0f, dk + base + k0 * d + e0, d);
        zero_tile(acc);
        fma_tile<kMR, kNV, kQueryBlock>(w.s_t + k0 * kQueryBlock + s0, 1, do_r + (i0 + s0) * hd + e0, hd, qn - s0, acc);
        store_tile(acc, rows, cols, 1.0f, 1.0f, dv + base + k0 * d + e0, d);
      }
    }
  }
}

void make_backward_copies(HeadCopies& hc, const float* q, const float* k, const float* v, const float* dout,
                          const AttentionShape& s) {
  thread_local Scratch<float> sq, sk, sv, sd, rq, rk, rd;
  const int hd = s.head_dim, d = s.n_heads * hd, T = s.q_len;
  hc.heads = s.batch * s.n_heads;
  hc.rows_q = hc.rows_k = T;
  hc.tq = transposed_stride(T);
  hc.panels = panels_size(T, hd);
  const auto transposed = static_cast<std::size_t>(hc.heads * hd * hc.tq);
  const auto rows = static_cast<std::size_t>(hc.heads * (T + 2) * hd);
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
    const std::int64_t t_off = bh * hd * hc.tq, r_off = bh * (T + 2) * hd;
    transpose_rounded(q + src, d, T, hd, hc.q_t + t_off, hc.tq);
    pack_key_panels(k + src, d, T, hd, hc.k_p + bh * hc.panels);
    pack_key_panels(v + src, d, T, hd, hc.v_p + bh * hc.panels);
    transpose_rounded(dout + src, d, T, hd, hc.do_t + t_off, hc.tq);
    copy_rounded(q + src, d, T, hd, hc.q_r + r_off);
    copy_rounded(k + src, d, T, hd, hc.k_r + r_off);
    copy_rounded(dout + src, d, T, hd, hc.do_r + r_off);
  }
}

}  // namespace
#endif  // ATTNRES_AVX512_CODE

void attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                            const AttentionShape& s) {
#if ATTNRES_AVX512_CODE
  if (attention_bf16_supported(s)) {
    HeadCopies hc;
    make_forward_copies(hc, q, k, v, s);
    const std::int64_t blocks = (s.q_len + kQueryBlock - 1) / kQueryBlock, tasks = hc.heads * blocks;
    const std::int64_t work = hc.heads * std::int64_t(s.q_len) * (s.q_pos0 + s.q_len) * s.head_dim;
#pragma omp parallel if (tasks > 1 && work >= kParallelMin)
    {
      thread_local Scratch<float> scores;
      float* s_t = scores.get(static_cast<std::size_t>((hc.rows_k + 2 * kNR) * kQueryBlock));
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t task = 0; task < tasks; ++task)
        forward_block(out, lse, hc, s, task / blocks, static_cast<int>(task % blocks) * kQueryBlock, s_t);
    }
    return;
  }
#endif
  attention_forward<float>(out, lse, q, k, v, s);
}

void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                             const float* v, const float* out, const float* lse, const AttentionShape& s) {
#if ATTNRES_AVX512_CODE
  if (attention_bf16_supported(s)) {
    HeadCopies hc;
    make_backward_copies(hc, q, k, v, dout, s);
    const std::int64_t T = s.q_len;
#pragma omp parallel if (hc.heads > 1 && s.batch * T * T * s.head_dim >= kParallelMin)
    {
      thread_local Scratch<float> st, sdp;
      const std::int64_t rows = T + 2 * kNR;  // the tiles read up to 13 rows past the last key
      const BackwardScratch w{st.get(static_cast<std::size_t>(rows * kQueryBlock)),
                              sdp.get(static_cast<std::size_t>(rows * kQueryBlock))};
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t bh = 0; bh < hc.heads; ++bh) backward_head(dq, dk, dv, out, lse, hc, s, bh, w);
    }
    return;
  }
#endif
  attention_backward<float>(dq, dk, dv, dout, q, k, v, out, lse, s);
}

}  // namespace attnres::kernels
