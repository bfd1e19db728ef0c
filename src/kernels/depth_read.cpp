#include "kernels/depth_read.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/row_ops.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

// Per chunk: query accumulators, norm-weight accumulators, w*gamma per route, one mix row and
// the normalised outputs' mix gradients.
namespace {
constexpr int kScratchRows = 4 * kMaxRoutes + 1;
}

std::int64_t depth_read_scratch_size(std::int64_t n_tok, int d) { return num_chunks(n_tok) * kScratchRows * d; }

template <class Real>
void depth_weights(const Real* logits, int n_sources, bool uniform, Real* alpha) {
  if (uniform) {
    std::fill(alpha, alpha + n_sources, Real(1) / Real(n_sources));
    return;
  }
  Real mx = logits[0];
  for (int s = 1; s < n_sources; ++s) mx = std::max(mx, logits[s]);
  Real sum = 0;
  for (int s = 0; s < n_sources; ++s) sum += (alpha[s] = std::exp(logits[s] - mx));
  const Real inv = Real(1) / sum;
  for (int s = 0; s < n_sources; ++s) alpha[s] *= inv;
}

namespace {

// Mixing coefficients of output o over the sources: the route's weights, or the routes' mean.
template <class Real>
void mix_coefficients(const DepthRead<Real>& rd, const Real* const* alpha, int o, Real* c) {
  for (int s = 0; s < rd.n_sources; ++s) {
    if (!rd.average) {
      c[s] = alpha[o][s];
      continue;
    }
    Real sum = 0;
    for (int r = 0; r < rd.n_routes; ++r) sum += alpha[r][s];
    c[s] = sum / Real(rd.n_routes);
  }
}

// The per-token passes over L1-resident rows, each in one sweep whatever the number of routes
// (RD's second route reuses every load). Fixed summation order; explicit 8-lane code for float.
// The mixes and multi-row dot products are row_ops.hpp's (shared with the residual-mixing ops).

// out[0] = v . v, out[1 + i] = (q[i] * gamma) . v for NQ queries.
template <int NQ, class Real>
void source_stats(const Real* v, const Real* const* q, const Real* gamma, int d, Real* out) {
  for (int i = 0; i <= NQ; ++i) out[i] = 0;
  for (int k = 0; k < d; ++k) {
    out[0] += v[k] * v[k];
    for (int i = 0; i < NQ; ++i) out[1 + i] += q[i][k] * gamma[k] * v[k];
  }
}

#if defined(__AVX2__) && defined(__FMA__)
template <int NQ>
void source_stats(const float* v, const float* const* q, const float* gamma, int d, float* out) {
  __m256 a[1 + NQ];
  for (int i = 0; i <= NQ; ++i) a[i] = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 <= d; k += 8) {
    const __m256 x = _mm256_loadu_ps(v + k), g = _mm256_loadu_ps(gamma + k);
    a[0] = _mm256_fmadd_ps(x, x, a[0]);
    for (int i = 0; i < NQ; ++i) a[1 + i] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(q[i] + k), g), x, a[1 + i]);
  }
  for (int i = 0; i <= NQ; ++i) out[i] = hsum8(a[i]);
  for (; k < d; ++k) {
    out[0] += v[k] * v[k];
    for (int i = 0; i < NQ; ++i) out[1 + i] += q[i][k] * gamma[k] * v[k];
  }
}

#endif

// Runtime query counts (0-2) to the template above.
template <class Real>
void source_stats(int n_q, const Real* v, const Real* const* q, const Real* gamma, int d, Real* out) {
  if (n_q == 0) source_stats<0>(v, q, gamma, d, out);
  else if (n_q == 1) source_stats<1>(v, q, gamma, d, out);
  else source_stats<2>(v, q, gamma, d, out);
}

// One source row's gradient for NR routes, in one pass:
// dv += sum_r (a_r g_r + b_r u_r) - kv v,  acc_r += b_r v  (u_r = w_r * gamma; zero for uniform routes).
template <int NR, class Real>
void source_gradient_row(Real* dv, Real* acc, const Real* v, const Real* const* g, const Real* u, const Real* a,
                         const Real* b, Real kv, int d) {
#pragma omp simd
  for (int k = 0; k < d; ++k) {
    Real x = dv[k] - kv * v[k];
    for (int r = 0; r < NR; ++r) {
      x += a[r] * g[r][k] + b[r] * u[r * d + k];
      acc[r * d + k] += b[r] * v[k];
    }
    dv[k] = x;
  }
}

// The routes that have a query (a uniform route takes no dot products): count and indices.
template <class Real>
int routes_with_query(const DepthRead<Real>& rd, const Real** q, int* route) {
  int n_q = 0;
  for (int ro = 0; ro < rd.n_routes; ++ro)
    if (rd.queries[ro] != nullptr) {
      q[n_q] = rd.queries[ro];
      route[n_q++] = ro;
    }
  return n_q;
}

// Tokens whose passes the forward runs phase by phase: the sources' statistics of all of them,
// then their depth weights, then their mixes, then the norms of normalised outputs. Each token's
// arithmetic is unchanged (the same bits); what changes is that independent chains of different
// tokens sit next to each other. Token by token, one token's chain (dots, RMS, softmax, mix,
// norm) outran the core's window: at d = 64 the forward took about 100 cycles per source and
// token with its rows in cache. Grouped: 0.90x (block) and 0.94x (rd) of its time inside a
// d64x12 step (docs/performance.md, 2026-12-05). The backward gained nothing from the same
// grouping and keeps its token-by-token loop.
constexpr int kTokenGroup = 8;
}  // namespace

template <class Real>
void depth_read_forward(const DepthRead<Real>& rd, Real* const* out, Real* rms, Real* logits, Real* alpha) {
  const int n = rd.n_sources, d = rd.d;
  const int n_out = rd.average ? 1 : rd.n_routes;
  const Real* q[kMaxRoutes];
  int route[kMaxRoutes];
  const int n_q = routes_with_query(rd, q, route);
  const std::int64_t groups = (rd.n_tok + kTokenGroup - 1) / kTokenGroup;
#pragma omp parallel for schedule(static) if (rd.n_tok * d * n >= kParallelMin)
  for (std::int64_t grp = 0; grp < groups; ++grp) {
    const std::int64_t t0 = grp * kTokenGroup, t1 = std::min(rd.n_tok, t0 + kTokenGroup);
    Real z[kTokenGroup][kMaxRoutes][kMaxSources];
    // One sweep over each source row: its sum of squares and its dot with every query; then the
    // group's RMS factors at once (8 lanes), and the logits.
    for (std::int64_t t = t0; t < t1; ++t)
      for (int s = 0; s < n; ++s) {
        Real stats[1 + kMaxRoutes];
        source_stats(n_q, rd.sources[s] + t * d, q, rd.gamma, d, stats);
        rms[t * n + s] = stats[0];
        for (int i = 0; i < n_q; ++i) z[t - t0][route[i]][s] = stats[1 + i];
      }
    rms_scales(rms + t0 * n, (t1 - t0) * n, d, rd.eps);
    for (std::int64_t t = t0; t < t1; ++t)
      for (int i = 0; i < n_q; ++i)
        for (int s = 0; s < n; ++s) z[t - t0][route[i]][s] *= rms[t * n + s];
    for (std::int64_t t = t0; t < t1; ++t)
      for (int ro = 0; ro < rd.n_routes; ++ro) {
        const bool uniform = rd.queries[ro] == nullptr;
        const Real* zt = z[t - t0][ro];
        if (!uniform) std::copy(zt, zt + n, logits + (ro * rd.n_tok + t) * n);
        depth_weights(zt, n, uniform, alpha + (ro * rd.n_tok + t) * n);
      }
    for (std::int64_t t = t0; t < t1; ++t) {
      const Real* v[kMaxSources];
      for (int s = 0; s < n; ++s) v[s] = rd.sources[s] + t * d;
      const Real* a[kMaxRoutes];
      for (int ro = 0; ro < rd.n_routes; ++ro) a[ro] = alpha + (ro * rd.n_tok + t) * n;
      Real c[kMaxRoutes][kMaxSources];
      Real* h[kMaxRoutes];
      for (int o = 0; o < n_out; ++o) {
        h[o] = out[o] + t * d;
        mix_coefficients(rd, a, o, c[o]);
      }
      mix_rows(n_out, h, v, &c[0][0], kMaxSources, n, d);
    }
    // Normalised outputs: inverse_rms of each row, the group's roots and divisions at once.
    for (int o = 0; o < n_out; ++o) {
      if (rd.out_norm[o] == nullptr) continue;
      Real r[kTokenGroup];
      for (std::int64_t t = t0; t < t1; ++t) r[t - t0] = dot(out[o] + t * d, out[o] + t * d, d);
      rms_scales(r, t1 - t0, d, rd.eps);
      for (std::int64_t t = t0; t < t1; ++t) scale_row(out[o] + t * d, out[o] + t * d, r[t - t0], rd.out_norm[o], d);
    }
  }
}

template <class Real>
void depth_read_backward(const DepthRead<Real>& rd, const Real* rms, const Real* logits, const Real* alpha_saved,
                         const DepthReadGrads<Real>& gr, Real* scratch) {
  const int n = rd.n_sources, d = rd.d, R = rd.n_routes;
  const int n_out = rd.average ? 1 : R;
  const std::int64_t chunks = num_chunks(rd.n_tok);
  const Real* gamma = rd.gamma;
  // With averaged routes each route sees half of the output's gradient.
  const Real gscale = rd.average ? Real(1) / Real(R) : Real(1);
  const Real* q[kMaxRoutes];
  int route[kMaxRoutes];
  const int n_q = routes_with_query(rd, q, route);
#pragma omp parallel for schedule(static) if (rd.n_tok * d * n >= kParallelMin)
  for (std::int64_t ch = 0; ch < chunks; ++ch) {
    Real* acc = scratch + ch * kScratchRows * d;  // acc[r][k] = sum over tokens, sources of delta * n_s
    Real* acc_norm = acc + kMaxRoutes * d;        // per normalised output: its norm weight's gradient
    Real* u = acc_norm + kMaxRoutes * d;          // u[r] = w_r * gamma (zero for uniform routes)
    Real* mix = u + kMaxRoutes * d;               // a recomputed mix row
    Real* dmix = mix + d;                         // per normalised output: the gradient of its mix
    std::fill(acc, acc + 2 * kMaxRoutes * d, Real(0));
    for (int ro = 0; ro < R; ++ro)
      for (int k = 0; k < d; ++k) u[ro * d + k] = rd.queries[ro] != nullptr ? rd.queries[ro][k] * gamma[k] : Real(0);
    const std::int64_t t_end = std::min(rd.n_tok, (ch + 1) * kReduceChunk);
    for (std::int64_t t = ch * kReduceChunk; t < t_end; ++t) {
      const Real* v[kMaxSources];
      const Real* alpha[kMaxRoutes];  // the forward's weights and logits of this token, per route
      const Real* z[kMaxRoutes];
      Real delta[kMaxRoutes][kMaxSources];
      Real c[kMaxRoutes][kMaxSources];
      for (int s = 0; s < n; ++s) v[s] = rd.sources[s] + t * d;
      for (int ro = 0; ro < R; ++ro) {
        alpha[ro] = alpha_saved + (ro * rd.n_tok + t) * n;
        z[ro] = logits + (ro * rd.n_tok + t) * n;  // read for routes with a query only
      }
      // The gradient of each output's mix: given, or through the output's norm (the mix is
      // recomputed here as in the forward).
      const Real* gout[kMaxRoutes] = {};
      for (int o = 0; o < n_out; ++o) {
        gout[o] = gr.dout[o] + t * d;
        if (rd.out_norm[o] == nullptr) continue;
        mix_coefficients(rd, alpha, o, c[o]);
        mix_rows(1, &mix, v, c[o], kMaxSources, n, d);
        const Real r = inverse_rms(mix, d, rd.eps);
        Real* dm = dmix + o * d;
        rmsnorm_row_backward(dm, acc_norm + o * d, gout[o], mix, rd.out_norm[o], r, d);
        gout[o] = dm;
        // After the gradient row is consumed: out may be dout's buffer (its row is in cache).
        if (gr.out[o] != nullptr) scale_row(gr.out[o] + t * d, mix, r, rd.out_norm[o], d);
      }
      const Real* g[kMaxRoutes] = {};
      for (int ro = 0; ro < R; ++ro) g[ro] = gout[rd.average ? 0 : ro];
      // c_rs = g_r . v_s (one sweep over v_s for all routes with a query);
      // delta_rs = alpha_rs (c_rs - sum_s' alpha_rs' c_rs'), zero for a uniform route.
      const Real* gq[kMaxRoutes] = {};
      for (int i = 0; i < n_q; ++i) gq[i] = g[route[i]];
      for (int ro = 0; ro < R; ++ro) std::fill(delta[ro], delta[ro] + n, Real(0));
      for (int s = 0; s < n; ++s) {
        Real cs[kMaxRoutes] = {};
        dots(n_q, v[s], gq, d, cs);
        for (int i = 0; i < n_q; ++i) delta[route[i]][s] = cs[i] * gscale;
      }
      for (int i = 0; i < n_q; ++i) {
        Real* dl = delta[route[i]];
        const Real* al = alpha[route[i]];
        Real cbar = 0;
        for (int s = 0; s < n; ++s) cbar += al[s] * dl[s];
        for (int s = 0; s < n; ++s) dl[s] = al[s] * (dl[s] - cbar);
      }
      // dv_s = sum_r alpha_rs g_r + r_s sum_r delta_rs u_r - r_s^2 (sum_r delta_rs z_rs)/d v_s
      const Real* r = rms + t * n;
      for (int s = 0; s < n; ++s) {
        Real a[kMaxRoutes], b[kMaxRoutes];
        Real key = 0;
        for (int ro = 0; ro < R; ++ro) {
          a[ro] = alpha[ro][s] * gscale;
          b[ro] = delta[ro][s] * r[s];
          if (rd.queries[ro] != nullptr) key += delta[ro][s] * z[ro][s];
        }
        const Real kv = r[s] * r[s] * key / Real(d);
        if (R == 1) source_gradient_row<1>(gr.dsources[s] + t * d, acc, v[s], g, u, a, b, kv, d);
        else source_gradient_row<2>(gr.dsources[s] + t * d, acc, v[s], g, u, a, b, kv, d);
      }
    }
  }
  // dw_r += acc_r * gamma; dgamma += sum_r acc_r * w_r; dnorm_o += acc_norm_o (chunks summed in order).
#pragma omp parallel for schedule(static) if (chunks * d >= kParallelMin)
  for (int k = 0; k < d; ++k) {
    for (int ro = 0; ro < R; ++ro) {
      if (rd.queries[ro] == nullptr) continue;
      Real a = 0;
      for (std::int64_t ch = 0; ch < chunks; ++ch) a += scratch[ch * kScratchRows * d + ro * d + k];
      if (gr.dqueries[ro] != nullptr) gr.dqueries[ro][k] += a * gamma[k];
      gr.dgamma[k] += a * rd.queries[ro][k];
    }
    for (int o = 0; o < n_out; ++o) {
      if (rd.out_norm[o] == nullptr || gr.dout_norm[o] == nullptr) continue;
      Real a = 0;
      for (std::int64_t ch = 0; ch < chunks; ++ch) a += scratch[(ch * kScratchRows + kMaxRoutes + o) * d + k];
      gr.dout_norm[o][k] += a;
    }
  }
}

template void depth_weights<float>(const float*, int, bool, float*);
template void depth_weights<double>(const double*, int, bool, double*);
template void depth_read_forward<float>(const DepthRead<float>&, float* const*, float*, float*, float*);
template void depth_read_forward<double>(const DepthRead<double>&, double* const*, double*, double*, double*);
template void depth_read_backward<float>(const DepthRead<float>&, const float*, const float*, const float*,
                                         const DepthReadGrads<float>&, float*);
template void depth_read_backward<double>(const DepthRead<double>&, const double*, const double*, const double*,
                                          const DepthReadGrads<double>&, double*);

}  // namespace attnres::kernels
