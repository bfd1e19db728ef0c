#include "kernels/hyper_connection.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/reduce.hpp"
#include "kernels/row_ops.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

namespace {

// The dynamic projections have n+2 rows: W_alpha's n+1, then w_beta.
inline int proj_rows(int n) { return n + 2; }

// Scalar accumulators per chunk: A's n(n+1), B's n, s_alpha, s_beta.
inline int scalar_count(int n) { return stream_coefficient_count(n) + 2; }

template <class Real>
struct HcScratch {
  Real* wg;      // [n+2, d]: the projection rows times gamma
  Real* acc_w;   // [chunks, n+2, d]
  Real* acc_s;   // [chunks, scalar_count]
  Real* rows;    // [chunks, d]
};

template <class Real>
HcScratch<Real> carve(Real* p, std::int64_t n_tok, int n, int d) {
  const std::int64_t chunks = num_chunks(n_tok);
  HcScratch<Real> s;
  s.wg = p;
  s.acc_w = s.wg + proj_rows(n) * d;
  s.acc_s = s.acc_w + chunks * proj_rows(n) * d;
  s.rows = s.acc_s + chunks * scalar_count(n);
  return s;
}

template <class Real>
const Real* proj_row(const HyperConnection<Real>& hc, int r) {
  return r <= hc.n ? hc.w_alpha + static_cast<std::int64_t>(r) * hc.d : hc.w_beta;
}

template <class Real>
void scale_projections(const HyperConnection<Real>& hc, Real* wg) {
  for (int r = 0; r < proj_rows(hc.n); ++r) {
    const Real* w = proj_row(hc, r);
    for (int k = 0; k < hc.d; ++k) wg[r * hc.d + k] = w[k] * hc.norm[k];
  }
}

template <class Real>
void check(const HyperConnection<Real>& hc) {
  require(hc.n >= 1 && hc.n <= kMaxStreams, "hyper-connections need 1 to ", kMaxStreams, " streams, got ", hc.n);
  require(hc.A != nullptr && hc.B != nullptr, "hyper-connections need A and B");
  require(!hc.dynamic() || (hc.w_beta != nullptr && hc.s_alpha != nullptr && hc.s_beta != nullptr &&
                            hc.norm != nullptr),
          "dynamic hyper-connections need w_alpha, w_beta, s_alpha, s_beta and the norm weight");
}

}  // namespace

std::int64_t hc_scratch_size(std::int64_t n_tok, int n, int d) {
  return proj_rows(n) * static_cast<std::int64_t>(d) +
         num_chunks(n_tok) * (proj_rows(n) * static_cast<std::int64_t>(d) + scalar_count(n) + d);
}

template <class Real>
StreamCoefficients<Real> hc_coefficients(const HyperConnection<Real>& hc, const Real* coef) {
  if (!hc.dynamic()) return {hc.A, hc.B, 0};
  return {coef, coef + hc.n * (hc.n + 1), stream_coefficient_count(hc.n)};
}

template <class Real>
void hc_forward(const HyperConnection<Real>& hc, Real* h0, Real* coef, Real* act, Real* rms, Real* scratch) {
  check(hc);
  const int n = hc.n, d = hc.d, m = stream_coefficient_count(n), np = proj_rows(n);
  Real* wg = hc.dynamic() ? scratch : nullptr;  // the forward needs only the scaled projection rows
  if (hc.dynamic()) scale_projections(hc, wg);
#pragma omp parallel for schedule(static) if (hc.n_tok * n * d * (hc.dynamic() ? np : 1) >= kParallelMin)
  for (std::int64_t t = 0; t < hc.n_tok; ++t) {
    const Real* H[kMaxStreams];
    for (int i = 0; i < n; ++i) H[i] = hc.streams + (t * n + i) * d;
    const Real* alpha = hc.A;
    if (hc.dynamic()) {
      // One sweep per stream row: its dots with the n+2 scaled projection rows and with itself.
      const Real* y[kMaxStreams + 3];
      for (int r = 0; r < np; ++r) y[r] = wg + r * d;
      Real* a = coef + t * m;
      Real* tau = act + t * m;
      for (int i = 0; i < n; ++i) {
        y[np] = H[i];
        Real p[kMaxStreams + 3];
        dots(np + 1, H[i], y, d, p);
        const Real r = rms_scale(p[np], d, hc.eps);
        rms[t * n + i] = r;
        for (int c = 0; c <= n; ++c) {
          const Real z = r * p[c];
          tau[i * (n + 1) + c] = hc.tanh ? std::tanh(z) : z;
          a[i * (n + 1) + c] = *hc.s_alpha * tau[i * (n + 1) + c] + hc.A[i * (n + 1) + c];
        }
        const Real z = r * p[n + 1];
        tau[n * (n + 1) + i] = hc.tanh ? std::tanh(z) : z;
        a[n * (n + 1) + i] = *hc.s_beta * tau[n * (n + 1) + i] + hc.B[i];
      }
      alpha = a;
    }
    Real c[kMaxStreams];
    for (int i = 0; i < n; ++i) c[i] = alpha[i * (n + 1)];
    Real* h = h0 + t * d;
    mix_rows(1, &h, H, c, n, n, d);
  }
}

template <class Real>
void hc_backward(const HyperConnection<Real>& hc, const Real* coef, const Real* act, const Real* rms, const Real* dh0,
                 const Real* dout, const Real* dbeta, Real* dstreams, const HyperConnectionGrads<Real>& gr,
                 Real* scratch) {
  check(hc);
  const int n = hc.n, d = hc.d, m = stream_coefficient_count(n), np = proj_rows(n), ns = scalar_count(n);
  const std::int64_t chunks = num_chunks(hc.n_tok);
  const HcScratch<Real> sc = carve(scratch, hc.n_tok, n, d);
  const StreamCoefficients<Real> cv = hc_coefficients(hc, coef);
  const bool dyn = hc.dynamic();
  if (dyn) scale_projections(hc, sc.wg);
  const Real s_alpha = dyn ? *hc.s_alpha : Real(0), s_beta = dyn ? *hc.s_beta : Real(0);
#pragma omp parallel for schedule(static) if (hc.n_tok * n * d * (dyn ? np : 1) >= kParallelMin)
  for (std::int64_t ch = 0; ch < chunks; ++ch) {
    Real* acc_w = sc.acc_w + ch * np * d;
    Real* acc_s = sc.acc_s + ch * ns;
    Real* row = sc.rows + ch * d;
    if (dyn) std::fill(acc_w, acc_w + np * d, Real(0));
    std::fill(acc_s, acc_s + ns, Real(0));
    Real* acc_rows[kMaxStreams + 2];
    for (int r = 0; r < np; ++r) acc_rows[r] = acc_w + r * d;
    const Real* wg_rows[kMaxStreams + 2];
    for (int r = 0; r < np; ++r) wg_rows[r] = sc.wg + r * d;
    const std::int64_t t_end = std::min(hc.n_tok, (ch + 1) * kReduceChunk);
    for (std::int64_t t = ch * kReduceChunk; t < t_end; ++t) {
      const Real* alpha = detail::alpha_of(cv, t);
      const Real* H[kMaxStreams];
      Real* dH[kMaxStreams];
      for (int i = 0; i < n; ++i) {
        H[i] = hc.streams + (t * n + i) * d;
        dH[i] = dstreams + (t * n + i) * d;
      }
      // Width: gmix = [dh0; dout_0..dout_{n-1}]; dalpha[i,c] = <H_i, gmix_c>; dH_i = sum_c alpha[i,c] gmix_c.
      const Real* gmix[kMaxStreams + 1];
      gmix[0] = dh0 + t * d;
      for (int k = 0; k < n; ++k) gmix[1 + k] = dout + (t * n + k) * d;
      Real dalpha[kMaxStreams * (kMaxStreams + 1)];
      for (int i = 0; i < n; ++i) dots(n + 1, H[i], gmix, d, dalpha + i * (n + 1));
      mix_rows(n, dH, gmix, alpha, n + 1, n + 1, d);
      const Real* db = dbeta + t * n;
      for (int i = 0; i < n * (n + 1); ++i) acc_s[i] += dalpha[i];
      for (int i = 0; i < n; ++i) acc_s[n * (n + 1) + i] += db[i];
      if (!dyn) continue;
      // Dynamic: through tanh and the scales to the projections, then each row's RMSNorm.
      const Real* tau = act + t * m;
      for (int i = 0; i < n; ++i) {
        Real c[kMaxStreams + 2];
        for (int j = 0; j <= n; ++j) {
          const Real g = dalpha[i * (n + 1) + j], tv = tau[i * (n + 1) + j];
          acc_s[ns - 2] += g * tv;
          c[j] = s_alpha * g * (hc.tanh ? Real(1) - tv * tv : Real(1));
        }
        const Real tb = tau[n * (n + 1) + i];
        acc_s[ns - 1] += db[i] * tb;
        c[n + 1] = s_beta * db[i] * (hc.tanh ? Real(1) - tb * tb : Real(1));
        // dL/d(Hbar_i) * gamma = sum_r c_r (W_r * gamma); then R-backward (the weight folded in).
        mix_rows(1, &row, wg_rows, c, np, np, d);
        const Real r = rms[t * n + i];
        const Real coef_x = r * r * r * dot(H[i], row, d) / Real(d);
        Real* dh = dH[i];
        const Real* h = H[i];
#pragma omp simd
        for (int k = 0; k < d; ++k) dh[k] += r * row[k] - coef_x * h[k];
        // acc_r += (r c_r) H_i: the projections' (and gamma's) gradients before the gamma factor.
        Real rc[kMaxStreams + 2];
        for (int j = 0; j < np; ++j) rc[j] = r * c[j];
        mix_rows<true>(np, acc_rows, &h, rc, 1, 1, d);
      }
    }
  }
  // Chunk partials, summed in chunk order.
  Real total[kMaxStreams * (kMaxStreams + 2) + 2] = {};
  for (std::int64_t ch = 0; ch < chunks; ++ch)
    for (int i = 0; i < ns; ++i) total[i] += sc.acc_s[ch * ns + i];
  for (int i = 0; i < n * (n + 1); ++i) gr.A[i] += total[i];
  for (int i = 0; i < n; ++i) gr.B[i] += total[n * (n + 1) + i];
  if (!dyn) return;
  *gr.s_alpha += total[ns - 2];
  *gr.s_beta += total[ns - 1];
  // W_r's gradient = gamma * acc_r; gamma's = sum_r W_r * acc_r.
#pragma omp parallel for schedule(static) if (chunks * np * d >= kParallelMin)
  for (int k = 0; k < d; ++k)
    for (int r = 0; r < np; ++r) {
      Real a = 0;
      for (std::int64_t ch = 0; ch < chunks; ++ch) a += sc.acc_w[(ch * np + r) * d + k];
      Real* gw = r <= n ? gr.w_alpha + static_cast<std::int64_t>(r) * d : gr.w_beta;
      gw[k] += a * hc.norm[k];
      gr.norm[k] += a * proj_row(hc, r)[k];
    }
}

#define ATTNRES_INSTANTIATE(Real)                                                                              \
  template StreamCoefficients<Real> hc_coefficients<Real>(const HyperConnection<Real>&, const Real*);         \
  template void hc_forward<Real>(const HyperConnection<Real>&, Real*, Real*, Real*, Real*, Real*);             \
  template void hc_backward<Real>(const HyperConnection<Real>&, const Real*, const Real*, const Real*,          \
                                  const Real*, const Real*, const Real*, Real*,                                \
                                  const HyperConnectionGrads<Real>&, Real*);
ATTNRES_INSTANTIATE(float)
ATTNRES_INSTANTIATE(double)
#undef ATTNRES_INSTANTIATE

}  // namespace attnres::kernels
