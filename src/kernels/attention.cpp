#include "util/threads.hpp"
#include "kernels/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/fast_math.hpp"

namespace attnres::kernels {

namespace {
constexpr int kKeyTile = 64;

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
  const std::int64_t tasks = s.batch * nh * s.q_len;
#pragma omp parallel for schedule(dynamic, 16) if (tasks * s.head_dim * (s.q_pos0 + s.q_len) >= kParallelMin)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const int i = static_cast<int>(task % s.q_len);
    const int h = static_cast<int>((task / s.q_len) % nh);
    const std::int64_t b = task / (static_cast<std::int64_t>(s.q_len) * nh);
    const Real* qi = q + (b * s.q_len + i) * d + h * hd;
    const Real* kb = k + b * s.kv_stride * d + h * hd;
    const Real* vb = v + b * s.kv_stride * d + h * hd;
    const int n_keys = s.q_pos0 + i + 1;

    Real acc[kMaxHeadDim];
    Real scores[kKeyTile];
    std::fill(acc, acc + hd, Real(0));
    Real m = -std::numeric_limits<Real>::infinity(), l = 0;
    for (int j0 = 0; j0 < n_keys; j0 += kKeyTile) {
      const int jn = std::min(kKeyTile, n_keys - j0);
      Real tile_max = -std::numeric_limits<Real>::infinity();
      for (int jj = 0; jj < jn; ++jj) {
        scores[jj] = scale * dot(qi, kb + static_cast<std::int64_t>(j0 + jj) * d, hd);
        tile_max = std::max(tile_max, scores[jj]);
      }
      const Real m_new = std::max(m, tile_max);
      const Real correction = std::exp(m - m_new);  // exp(-inf) = 0 on the first tile
      l *= correction;
#pragma omp simd
      for (int e = 0; e < hd; ++e) acc[e] *= correction;
      Real tile_sum = 0;
#pragma omp simd reduction(+ : tile_sum)
      for (int jj = 0; jj < jn; ++jj) {
        scores[jj] = exp_fast(scores[jj] - m_new);
        tile_sum += scores[jj];
      }
      l += tile_sum;
      for (int jj = 0; jj < jn; ++jj) {
        const Real p = scores[jj];
        const Real* vj = vb + static_cast<std::int64_t>(j0 + jj) * d;
#pragma omp simd
        for (int e = 0; e < hd; ++e) acc[e] += p * vj[e];
      }
      m = m_new;
    }
    Real* oi = out + (b * s.q_len + i) * d + h * hd;
    const Real inv = Real(1) / l;
#pragma omp simd
    for (int e = 0; e < hd; ++e) oi[e] = acc[e] * inv;
    lse[(b * nh + h) * s.q_len + i] = m + std::log(l);
  }
}

template <class Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k, const Real* v,
                        const Real* out, const Real* lse, const AttentionShape& s) {
  const int hd = s.head_dim, nh = s.n_heads, d = nh * hd, T = s.q_len;
  const Real scale = Real(1) / std::sqrt(Real(hd));
  // One task per (batch, head): dk and dv of a head are written by that task alone.
#pragma omp parallel for schedule(dynamic, 1) if (s.batch * T * T * hd >= kParallelMin)
  for (std::int64_t task = 0; task < s.batch * nh; ++task) {
    const int h = static_cast<int>(task % nh);
    const std::int64_t b = task / nh;
    const std::int64_t base = b * T * d + h * hd;
    for (int j = 0; j < T; ++j) {
      std::fill(dk + base + static_cast<std::int64_t>(j) * d, dk + base + static_cast<std::int64_t>(j) * d + hd, Real(0));
      std::fill(dv + base + static_cast<std::int64_t>(j) * d, dv + base + static_cast<std::int64_t>(j) * d + hd, Real(0));
    }
    Real dq_acc[kMaxHeadDim];
    for (int i = 0; i < T; ++i) {
      const std::int64_t row = base + static_cast<std::int64_t>(i) * d;
      const Real* qi = q + row;
      const Real* doi = dout + row;
      const Real D = dot(doi, out + row, hd);
      const Real li = lse[(b * nh + h) * T + i];
      std::fill(dq_acc, dq_acc + hd, Real(0));
      for (int j = 0; j <= i; ++j) {
        const std::int64_t rj = base + static_cast<std::int64_t>(j) * d;
        const Real* kj = k + rj;
        const Real p = exp_fast(scale * dot(qi, kj, hd) - li);
        const Real dp = dot(doi, v + rj, hd);
        const Real ds = p * (dp - D);
        Real* dvj = dv + rj;
        Real* dkj = dk + rj;
        const Real ds_scaled = ds * scale;
#pragma omp simd
        for (int e = 0; e < hd; ++e) {
          dvj[e] += p * doi[e];
          dq_acc[e] += ds * kj[e];
          dkj[e] += ds_scaled * qi[e];
        }
      }
      Real* dqi = dq + row;
#pragma omp simd
      for (int e = 0; e < hd; ++e) dqi[e] = dq_acc[e] * scale;
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
