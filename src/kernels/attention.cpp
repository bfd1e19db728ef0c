#include "util/threads.hpp"
#include "kernels/attention.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/fast_math.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_f32.hpp"

namespace attnres::kernels {

// Both passes work on blocks of kQueryBlock queries of one (batch, head): the block's scores
// against every key it may see (S = Q K^T, at most kQueryBlock x T, so memory stays O(T)) and the
// products with V, dO, K and Q are GEMMs (block_gemm: the fp32 GEMM backend of float models,
// kernels/gemm_f32.hpp, else OpenBLAS); only the softmax is written out here. Every output element
// is written by one task in a fixed order, whatever the thread count (the GEMMs run
// single-threaded inside the parallel region).
namespace {
constexpr int kQueryBlock = 64;
// The backward's keys per block: one pass of the fp32 GEMM's summation. Tiles of P and dS are
// kQueryBlock x kKeyBlock, their rows kTileLd apart (not a multiple of 1 KB: spread over L1's sets).
constexpr int kKeyBlock = static_cast<int>(kFp32GemmPass);
constexpr int kTileLd = kKeyBlock + 16;

// C = alpha op(A) op(B) + beta C with beta 0 or 1, on the backend of the Linear layers.
template <class Real>
void block_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, Real alpha, const Real* a,
                std::int64_t lda, const Real* b, std::int64_t ldb, Real beta, Real* c, std::int64_t ldc) {
  if constexpr (std::is_same_v<Real, float>) {
    if (own_fp32_gemm()) {
      gemm_f32(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta != 0.0f, c, ldc);
      return;
    }
  }
  gemm<Real>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// op(B) of one (batch, head)'s keys (K^T or V^T against a block's queries, K or V against its
// scores), shared by the head's query blocks, each of which multiplies by a block of it (the keys
// it sees, or a key block of them). Float models on the own fp32 GEMM pack it once per head rather
// than once per product (gemm_f32_packed: the bits of gemm_f32 on that block); otherwise the
// product reads it in place.
template <class Real>
class KeyOperand {
 public:
  // op(B) = B^T (trans) or B, where B is `keys` rows of `hd` values, `ld` apart.
  void set(bool trans, int keys, int hd, const Real* b, std::int64_t ld) {
    trans_ = trans;
    b_ = b;
    ld_ = ld;
    if constexpr (std::is_same_v<Real, float>) {
      packed_now_ = own_fp32_gemm();
      if (packed_now_) packed_.pack(trans, trans ? keys : hd, trans ? hd : keys, b, ld);
    }
  }
  // C[m, blk.n] = alpha A op(B)[blk] (+ C when accumulate), A stored [m, blk.k] (blk.k0 a multiple
  // of kFp32GemmPass, blk.n0 of 16: kernels/gemm_f32.hpp).
  void multiply(int m, const Fp32Block& blk, Real alpha, const Real* a, std::int64_t lda, bool accumulate, Real* c,
                std::int64_t ldc) const {
    if constexpr (std::is_same_v<Real, float>) {
      if (packed_now_) return gemm_f32_packed(m, alpha, a, lda, packed_, blk, accumulate, c, ldc);
    }
    const Real* b = trans_ ? b_ + blk.n0 * ld_ + blk.k0 : b_ + blk.k0 * ld_ + blk.n0;  // B^T's (k0, n0) is B's (n0, k0)
    block_gemm<Real>(false, trans_, m, blk.n, blk.k, alpha, a, lda, b, ld_, accumulate ? Real(1) : Real(0), c, ldc);
  }

 private:
  bool trans_ = false, packed_now_ = false;
  const Real* b_ = nullptr;
  std::int64_t ld_ = 0;
  Fp32PackedB packed_;
};

template <class Real>
Real* grow(std::vector<Real>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}


template <class Real>
inline Real dot(const Real* a, const Real* b, int n) {
  Real s = 0;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace

template <class Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v, const AttentionShape& s) {
  const int hd = s.head_dim, nh = s.n_heads, d = nh * hd;
  const Real scale = Real(1) / std::sqrt(Real(hd));
  const bool wide = fp32_wide_lanes();
  const std::int64_t blocks = (s.q_len + kQueryBlock - 1) / kQueryBlock, tasks = s.batch * nh * blocks;
  const std::int64_t work = s.batch * nh * std::int64_t(s.q_len) * (s.q_pos0 + s.q_len) * hd;
  const int keys = s.q_pos0 + s.q_len;
  // Each head's K^T and V, shared by its query blocks (whichever threads run them).
  thread_local std::vector<KeyOperand<Real>> shared;
  if (shared.size() < static_cast<std::size_t>(2 * s.batch * nh)) shared.resize(static_cast<std::size_t>(2 * s.batch * nh));
  KeyOperand<Real>* const operands = shared.data();
#pragma omp parallel for schedule(static) if (s.batch * nh > 1 && work >= kParallelMin)
  for (std::int64_t bh = 0; bh < s.batch * nh; ++bh) {
    const std::int64_t krow = bh / nh * s.kv_stride * d + bh % nh * hd;
    operands[2 * bh].set(true, keys, hd, k + krow, d);
    operands[2 * bh + 1].set(false, keys, hd, v + krow, d);
  }
#pragma omp parallel if (tasks > 1 && work >= kParallelMin)
  {
    thread_local std::vector<Real> scratch;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const int i0 = static_cast<int>(task % blocks) * kQueryBlock;
      const std::int64_t bh = task / blocks;
      const int h = static_cast<int>(bh % nh);
      const std::int64_t b = bh / nh;
      const int qn = std::min(kQueryBlock, s.q_len - i0);
      const int nk = s.q_pos0 + i0 + qn;  // keys the block's last query sees
      const std::int64_t qrow = (b * s.q_len + i0) * d + h * hd;
      Real* p = grow(scratch, static_cast<std::size_t>(qn) * nk);
      operands[2 * bh].multiply(qn, {.k = hd, .n = nk}, scale, q + qrow, d, false, p, nk);
      for (int r = 0; r < qn; ++r) {
        Real* row = p + static_cast<std::int64_t>(r) * nk;
        const int n = s.q_pos0 + i0 + r + 1;  // causal: keys 0 .. position
        const Real m = row_max(row, n);
        const Real l = exp_shifted(row, n, m, wide);
        const Real inv = Real(1) / l;
#pragma omp simd
        for (int j = 0; j < n; ++j) row[j] *= inv;
        std::fill(row + n, row + nk, Real(0));
        lse[(b * nh + h) * s.q_len + i0 + r] = m + std::log(l);
      }
      operands[2 * bh + 1].multiply(qn, {.k = nk, .n = hd}, Real(1), p, nk, false, out + qrow, d);
    }
  }
}

template <class Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k, const Real* v,
                        const Real* out, const Real* lse, const AttentionShape& s) {
  const int hd = s.head_dim, nh = s.n_heads, d = nh * hd, T = s.q_len;
  const Real scale = Real(1) / std::sqrt(Real(hd));
  const bool wide = fp32_wide_lanes();
  // One task per (batch, head), which alone sums the head's dK and dV. Its keys go in blocks of
  // kKeyBlock and each key block meets the query blocks that see it, in order, one tile of P and
  // dS at a time: the key block's rows of dK and dV stay in cache while every later query block
  // adds to them, and the tiles are read in place. A query block's dQ gets one product per key
  // block; a key block being one pass of the fp32 GEMM's summation (kernels/gemm_f32.hpp), that is
  // the sum of one product over all the keys, bit for bit, on the own fp32 kernel.
#pragma omp parallel if (s.batch * nh > 1 && s.batch * T * T * hd >= kParallelMin)
  {
    thread_local std::vector<Real> scratch;
    thread_local KeyOperand<Real> keys_t, values_t, keys;  // K^T, V^T, K of the task's head
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < s.batch * nh; ++task) {
      const int h = static_cast<int>(task % nh);
      const std::int64_t b = task / nh;
      const std::int64_t base = b * T * d + h * hd;
      keys_t.set(true, T, hd, k + base, d);
      values_t.set(true, T, hd, v + base, d);
      keys.set(false, T, hd, k + base, d);
      for (int j = 0; j < T; ++j) {
        std::fill(dk + base + static_cast<std::int64_t>(j) * d, dk + base + static_cast<std::int64_t>(j) * d + hd, Real(0));
        std::fill(dv + base + static_cast<std::int64_t>(j) * d, dv + base + static_cast<std::int64_t>(j) * d + hd, Real(0));
      }
      Real* p = grow(scratch, 2 * static_cast<std::size_t>(kQueryBlock) * kTileLd + static_cast<std::size_t>(T));
      Real* ds = p + kQueryBlock * kTileLd;
      Real* D = ds + kQueryBlock * kTileLd;  // D = dO . O of each query, for dS = P (dP - D)
      for (int i = 0; i < T; ++i) D[i] = dot(dout + base + static_cast<std::int64_t>(i) * d, out + base + static_cast<std::int64_t>(i) * d, hd);
      for (int j0 = 0; j0 < T; j0 += kKeyBlock) {
        const int j1 = std::min(T, j0 + kKeyBlock);
        for (int i0 = j0; i0 < T; i0 += kQueryBlock) {  // (query blocks before j0 see none of the keys)
          const int qn = std::min(kQueryBlock, T - i0), cols = std::min(j1, i0 + qn) - j0;
          const std::int64_t qrow = base + static_cast<std::int64_t>(i0) * d;
          // The tile's P = exp(scale Q K^T - lse), zero above the diagonal, and dP = dO V^T.
          keys_t.multiply(qn, {.k = hd, .n0 = j0, .n = cols}, scale, q + qrow, d, false, p, kTileLd);
          values_t.multiply(qn, {.k = hd, .n0 = j0, .n = cols}, Real(1), dout + qrow, d, false, ds, kTileLd);
          for (int r = 0; r < qn; ++r) {
            Real* prow = p + static_cast<std::int64_t>(r) * kTileLd;
            Real* srow = ds + static_cast<std::int64_t>(r) * kTileLd;
            const int n = std::min(cols, i0 + r + 1 - j0);  // causal: keys j0 .. position
            exp_shifted(prow, n, lse[(b * nh + h) * T + i0 + r], wide);
            std::fill(prow + n, prow + cols, Real(0));
            const Real Di = D[i0 + r];
#pragma omp simd
            for (int j = 0; j < n; ++j) srow[j] = prow[j] * (srow[j] - Di);
            std::fill(srow + n, srow + cols, Real(0));
          }
          // dQ (+)= scale dS K; dK += scale dS^T Q; dV += P^T dO.
          const std::int64_t krow = base + static_cast<std::int64_t>(j0) * d;
          keys.multiply(qn, {.k0 = j0, .k = cols, .n = hd}, scale, ds, kTileLd, j0 > 0, dq + qrow, d);
          block_gemm<Real>(true, false, cols, hd, qn, scale, ds, kTileLd, q + qrow, d, Real(1), dk + krow, d);
          block_gemm<Real>(true, false, cols, hd, qn, Real(1), p, kTileLd, dout + qrow, d, Real(1), dv + krow, d);
        }
      }
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttentionShape&);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                        const AttentionShape&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, const AttentionShape&);
template void attention_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, const double*, const AttentionShape&);

}  // namespace attnres::kernels
