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
  const std::int64_t blocks = (s.q_len + kQueryBlock - 1) / kQueryBlock, tasks = s.batch * nh * blocks;
  const std::int64_t work = s.batch * nh * std::int64_t(s.q_len) * (s.q_pos0 + s.q_len) * hd;
#pragma omp parallel if (tasks > 1 && work >= kParallelMin)
  {
    thread_local std::vector<Real> scratch;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const int i0 = static_cast<int>(task % blocks) * kQueryBlock;
      const int h = static_cast<int>((task / blocks) % nh);
      const std::int64_t b = task / (blocks * nh);
      const int qn = std::min(kQueryBlock, s.q_len - i0);
      const int nk = s.q_pos0 + i0 + qn;  // keys the block's last query sees
      const std::int64_t qrow = (b * s.q_len + i0) * d + h * hd, krow = b * s.kv_stride * d + h * hd;
      Real* p = grow(scratch, static_cast<std::size_t>(qn) * nk);
      block_gemm<Real>(false, true, qn, nk, hd, scale, q + qrow, d, k + krow, d, Real(0), p, nk);
      for (int r = 0; r < qn; ++r) {
        Real* row = p + static_cast<std::int64_t>(r) * nk;
        const int n = s.q_pos0 + i0 + r + 1;  // causal: keys 0 .. position
        const Real m = row_max(row, n);
        const Real l = exp_shifted(row, n, m);
        const Real inv = Real(1) / l;
#pragma omp simd
        for (int j = 0; j < n; ++j) row[j] *= inv;
        std::fill(row + n, row + nk, Real(0));
        lse[(b * nh + h) * s.q_len + i0 + r] = m + std::log(l);
      }
      block_gemm<Real>(false, false, qn, hd, nk, Real(1), p, nk, v + krow, d, Real(0), out + qrow, d);
    }
  }
}

template <class Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k, const Real* v,
                        const Real* out, const Real* lse, const AttentionShape& s) {
  const int hd = s.head_dim, nh = s.n_heads, d = nh * hd, T = s.q_len;
  const Real scale = Real(1) / std::sqrt(Real(hd));
  // One task per (batch, head): dk and dv of a head are summed by that task alone, query block
  // after query block.
#pragma omp parallel if (s.batch * nh > 1 && s.batch * T * T * hd >= kParallelMin)
  {
    thread_local std::vector<Real> scratch;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < s.batch * nh; ++task) {
      const int h = static_cast<int>(task % nh);
      const std::int64_t b = task / nh;
      const std::int64_t base = b * T * d + h * hd;
      for (int j = 0; j < T; ++j) {
        std::fill(dk + base + static_cast<std::int64_t>(j) * d, dk + base + static_cast<std::int64_t>(j) * d + hd, Real(0));
        std::fill(dv + base + static_cast<std::int64_t>(j) * d, dv + base + static_cast<std::int64_t>(j) * d + hd, Real(0));
      }
      Real* p = grow(scratch, 2 * static_cast<std::size_t>(std::min(T, kQueryBlock)) * T);
      for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int qn = std::min(kQueryBlock, T - i0), nk = i0 + qn;
        Real* ds = p + static_cast<std::int64_t>(qn) * nk;
        const std::int64_t qrow = base + static_cast<std::int64_t>(i0) * d;
        // P = exp(scale Q K^T - lse), zero above the diagonal; dP = dO V^T.
        block_gemm<Real>(false, true, qn, nk, hd, scale, q + qrow, d, k + base, d, Real(0), p, nk);
        block_gemm<Real>(false, true, qn, nk, hd, Real(1), dout + qrow, d, v + base, d, Real(0), ds, nk);
        for (int r = 0; r < qn; ++r) {
          Real* prow = p + static_cast<std::int64_t>(r) * nk;
          Real* srow = ds + static_cast<std::int64_t>(r) * nk;
          const int n = i0 + r + 1;
          const std::int64_t row = qrow + static_cast<std::int64_t>(r) * d;
          exp_shifted(prow, n, lse[(b * nh + h) * T + i0 + r]);
          std::fill(prow + n, prow + nk, Real(0));
          // dS = P (dP - D), D = dO . O of the row.
          const Real D = dot(dout + row, out + row, hd);
#pragma omp simd
          for (int j = 0; j < n; ++j) srow[j] = prow[j] * (srow[j] - D);
          std::fill(srow + n, srow + nk, Real(0));
        }
        // dQ = scale dS K; dK += scale dS^T Q; dV += P^T dO.
        block_gemm<Real>(false, false, qn, hd, nk, scale, ds, nk, k + base, d, Real(0), dq + qrow, d);
        block_gemm<Real>(true, false, nk, hd, qn, scale, ds, nk, q + qrow, d, Real(1), dk + base, d);
        block_gemm<Real>(true, false, nk, hd, qn, Real(1), p, nk, dout + qrow, d, Real(1), dv + base, d);
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
