#include "kernels/mhc.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/gemm.hpp"
#include "kernels/row_ops.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

namespace {

// Half-step h (1-based) normalises columns or rows.
inline bool normalises_columns(int h, SinkhornOrder order) {
  return (h % 2 == 1) == (order == SinkhornOrder::col_row);
}

// m *= 1 / its column (or row) sums, each sum taken in index order (one division per line: the
// divisions dominated the module's per-token cost).
template <class Real>
void normalise(Real* m, int n, bool columns) {
  for (int a = 0; a < n; ++a) {
    const int step = columns ? n : 1;
    Real* line = columns ? m + a : m + a * n;
    Real s = 0;
    for (int b = 0; b < n; ++b) s += line[b * step];
    const Real inv = Real(1) / s;
    for (int b = 0; b < n; ++b) line[b * step] *= inv;
  }
}

template <class Real>
void exp_shifted(Real* out, const Real* logits, int n) {
  Real mx = logits[0];
  for (int e = 1; e < n * n; ++e) mx = std::max(mx, logits[e]);
  for (int e = 0; e < n * n; ++e) out[e] = std::exp(logits[e] - mx);
}

template <class Real>
Real sigmoid(Real x) {
  return Real(1) / (Real(1) + std::exp(-x));
}

template <class Real>
void check(const ManifoldHyperConnection<Real>& m) {
  require(m.n >= 1 && m.n <= kMaxStreams, "mHC needs 1 to ", kMaxStreams, " streams, got ", m.n);
  require(m.sinkhorn_iters >= 1, "mHC needs at least one Sinkhorn iteration, got ", m.sinkhorn_iters);
  require(m.phi != nullptr && m.alpha != nullptr && m.bias != nullptr, "mHC needs phi, alpha and the bias");
}

// The per-chunk accumulators: the bias's n(n+2) and alpha's 3.
inline int acc_count(int n) { return stream_coefficient_count(n) + 3; }

}  // namespace

std::string to_string(SinkhornOrder order) { return order == SinkhornOrder::col_row ? "col_row" : "row_col"; }

std::int64_t sinkhorn_work_size(int n, int iters) { return (2 * static_cast<std::int64_t>(iters) + 1) * n * n; }

template <class Real>
void sinkhorn_forward(Real* out, const Real* logits, int n, int iters, SinkhornOrder order) {
  exp_shifted(out, logits, n);
  for (int h = 1; h <= 2 * iters; ++h) normalise(out, n, normalises_columns(h, order));
}

template <class Real>
void sinkhorn_backward(Real* dlogits, const Real* logits, const Real* dout, int n, int iters, SinkhornOrder order,
                       Real* work) {
  // work[h] = the iterate after half-step h (work[0] = exp), exactly as the forward computes them.
  const int nn = n * n;
  exp_shifted(work, logits, n);
  for (int h = 1; h <= 2 * iters; ++h) {
    std::copy(work + (h - 1) * nn, work + h * nn, work + h * nn);
    normalise(work + h * nn, n, normalises_columns(h, order));
  }
  // Half-step B = A / s (s: A's sums along the axis): G_A = (G_B - sum_axis(G_B * B)) / s.
  Real g[kMaxStreams * kMaxStreams];
  std::copy(dout, dout + nn, g);
  for (int h = 2 * iters; h >= 1; --h) {
    const Real* A = work + (h - 1) * nn;
    const Real* B = work + h * nn;
    const bool columns = normalises_columns(h, order);
    const int step = columns ? n : 1;
    for (int a = 0; a < n; ++a) {
      const int base = columns ? a : a * n;
      Real s = 0, gb = 0;
      for (int b = 0; b < n; ++b) s += A[base + b * step];
      for (int b = 0; b < n; ++b) gb += g[base + b * step] * B[base + b * step];
      const Real inv = Real(1) / s;
      for (int b = 0; b < n; ++b) g[base + b * step] = (g[base + b * step] - gb) * inv;
    }
  }
  for (int e = 0; e < nn; ++e) dlogits[e] = g[e] * work[e];
}

template <class Real>
StreamCoefficients<Real> mhc_coefficients(const ManifoldHyperConnection<Real>& m, const Real* coef) {
  return {coef, coef + m.n * (m.n + 1), stream_coefficient_count(m.n)};
}

template <class Real>
void mhc_forward(const ManifoldHyperConnection<Real>& mh, Real* h_in, Real* coef, Real* z, Real* rms) {
  check(mh);
  const int n = mh.n, d = mh.d, nd = n * d, m = stream_coefficient_count(n);
  linear_forward_fixed(z, mh.streams, mh.phi, mh.n_tok, nd, m);  // x phi^T; the RMS factor follows
#pragma omp parallel for schedule(static) if (mh.n_tok * nd >= kParallelMin)
  for (std::int64_t t = 0; t < mh.n_tok; ++t) {
    const Real* x = mh.streams + t * nd;
    const Real r = inverse_rms(x, nd, mh.eps);
    rms[t] = r;
    Real* zt = z + t * m;
    for (int c = 0; c < m; ++c) zt[c] *= r;
    Real* a = coef + t * m;
    Real* beta = a + n * (n + 1);
    Real res[kMaxStreams * kMaxStreams], M[kMaxStreams * kMaxStreams];
    for (int i = 0; i < n; ++i) {
      a[i * (n + 1)] = sigmoid(mh.alpha[0] * zt[i] + mh.bias[i]) + mh.pre_eps;
      beta[i] = Real(2) * sigmoid(mh.alpha[1] * zt[n + i] + mh.bias[n + i]);
    }
    for (int e = 0; e < n * n; ++e) res[e] = mh.alpha[2] * zt[2 * n + e] + mh.bias[2 * n + e];
    sinkhorn_forward(M, res, n, mh.sinkhorn_iters, mh.order);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) a[j * (n + 1) + i + 1] = M[i * n + j];
    const Real* xs[kMaxStreams];
    Real c[kMaxStreams];
    for (int i = 0; i < n; ++i) {
      xs[i] = x + i * d;
      c[i] = a[i * (n + 1)];
    }
    Real* h = h_in + t * d;
    mix_rows(1, &h, xs, c, n, n, d);
  }
}

std::int64_t mhc_scratch_size(std::int64_t n_tok, int n, int sinkhorn_iters) {
  return n_tok * stream_coefficient_count(n) + num_chunks(n_tok) * (acc_count(n) + sinkhorn_work_size(n, sinkhorn_iters));
}

template <class Real>
void mhc_backward(const ManifoldHyperConnection<Real>& mh, const Real* coef, const Real* z, const Real* rms,
                  const Real* dh_in, const Real* dout, const Real* dpost, Real* dstreams,
                  const ManifoldHyperConnectionGrads<Real>& gr, Real* scratch) {
  check(mh);
  const int n = mh.n, d = mh.d, nd = n * d, m = stream_coefficient_count(n), na = acc_count(n);
  const std::int64_t chunks = num_chunks(mh.n_tok), work_size = sinkhorn_work_size(n, mh.sinkhorn_iters);
  Real* gz = scratch;                        // [n_tok, m]: dL/dz
  Real* acc = gz + mh.n_tok * m;             // [chunks, m + 3]
  Real* work = acc + chunks * na;            // [chunks, work_size]
  // Pass 1, per token: the coefficients' gradients, through the maps to z.
#pragma omp parallel for schedule(static) if (mh.n_tok * nd * (n + 1) >= kParallelMin)
  for (std::int64_t ch = 0; ch < chunks; ++ch) {
    Real* ac = acc + ch * na;
    Real* wk = work + ch * work_size;
    std::fill(ac, ac + na, Real(0));
    const std::int64_t t_end = std::min(mh.n_tok, (ch + 1) * kReduceChunk);
    for (std::int64_t t = ch * kReduceChunk; t < t_end; ++t) {
      const Real* x = mh.streams + t * nd;
      const Real* gmix[kMaxStreams + 1];
      gmix[0] = dh_in + t * d;
      for (int k = 0; k < n; ++k) gmix[1 + k] = dout + (t * n + k) * d;
      Real dalpha[kMaxStreams * (kMaxStreams + 1)];
      for (int i = 0; i < n; ++i) dots(n + 1, x + i * d, gmix, d, dalpha + i * (n + 1));
      const Real* zt = z + t * m;
      const Real* dp = dpost + t * n;
      Real g[kMaxStreams * (kMaxStreams + 2)];  // dL/dH~, laid out as z
      for (int i = 0; i < n; ++i) {
        const Real sp = sigmoid(mh.alpha[0] * zt[i] + mh.bias[i]);
        g[i] = dalpha[i * (n + 1)] * sp * (Real(1) - sp);
        const Real so = sigmoid(mh.alpha[1] * zt[n + i] + mh.bias[n + i]);
        g[n + i] = dp[i] * Real(2) * so * (Real(1) - so);
      }
      Real res[kMaxStreams * kMaxStreams], dres[kMaxStreams * kMaxStreams];
      for (int e = 0; e < n * n; ++e) res[e] = mh.alpha[2] * zt[2 * n + e] + mh.bias[2 * n + e];
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) dres[i * n + j] = dalpha[j * (n + 1) + i + 1];
      sinkhorn_backward(g + 2 * n, res, dres, n, mh.sinkhorn_iters, mh.order, wk);
      Real* gzt = gz + t * m;
      for (int c = 0; c < m; ++c) {
        const int slice = c < n ? 0 : (c < 2 * n ? 1 : 2);
        ac[c] += g[c];
        ac[m + slice] += g[c] * zt[c];
        gzt[c] = mh.alpha[slice] * g[c];
      }
    }
  }
  // dL/d(normalised v) = gz phi, into dstreams.
  linear_backward_input_fixed(dstreams, gz, mh.phi, mh.n_tok, nd, m);
  // Pass 2, per token: the flattened RMSNorm's backward in place, then the width paths.
#pragma omp parallel for schedule(static) if (mh.n_tok * nd * (n + 1) >= kParallelMin)
  for (std::int64_t t = 0; t < mh.n_tok; ++t) {
    const Real* x = mh.streams + t * nd;
    Real* dx = dstreams + t * nd;
    const Real r = rms[t];
    const Real coef_x = r * r * r * dot(x, dx, nd) / Real(nd);
#pragma omp simd
    for (int k = 0; k < nd; ++k) dx[k] = r * dx[k] - coef_x * x[k];
    const Real* gmix[kMaxStreams + 1];
    gmix[0] = dh_in + t * d;
    for (int k = 0; k < n; ++k) gmix[1 + k] = dout + (t * n + k) * d;
    Real* dH[kMaxStreams];
    for (int i = 0; i < n; ++i) dH[i] = dx + i * d;
    mix_rows<true>(n, dH, gmix, coef + t * m, n + 1, n + 1, d);
    Real* gzt = gz + t * m;
    for (int c = 0; c < m; ++c) gzt[c] *= r;  // for phi's gradient: (r x)^T gz = x^T (r gz)
  }
  linear_backward_weight_fixed(gr.phi, gz, mh.streams, mh.n_tok, nd, m);
  Real total[kMaxStreams * (kMaxStreams + 2) + 3] = {};
  for (std::int64_t ch = 0; ch < chunks; ++ch)
    for (int i = 0; i < na; ++i) total[i] += acc[ch * na + i];
  for (int c = 0; c < m; ++c) gr.bias[c] += total[c];
  for (int s = 0; s < 3; ++s) gr.alpha[s] += total[m + s];
}

#define ATTNRES_INSTANTIATE(Real)                                                                              \
  template void sinkhorn_forward<Real>(Real*, const Real*, int, int, SinkhornOrder);                          \
  template void sinkhorn_backward<Real>(Real*, const Real*, const Real*, int, int, SinkhornOrder, Real*);      \
  template StreamCoefficients<Real> mhc_coefficients<Real>(const ManifoldHyperConnection<Real>&, const Real*); \
  template void mhc_forward<Real>(const ManifoldHyperConnection<Real>&, Real*, Real*, Real*, Real*);           \
  template void mhc_backward<Real>(const ManifoldHyperConnection<Real>&, const Real*, const Real*, const Real*, \
                                   const Real*, const Real*, const Real*, Real*,                               \
                                   const ManifoldHyperConnectionGrads<Real>&, Real*);
ATTNRES_INSTANTIATE(float)
ATTNRES_INSTANTIATE(double)
#undef ATTNRES_INSTANTIATE

}  // namespace attnres::kernels
