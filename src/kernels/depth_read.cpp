#include "kernels/depth_read.hpp"

#include <algorithm>
#include <cmath>

#include "util/threads.hpp"

namespace attnres::kernels {

std::int64_t depth_read_scratch_size(std::int64_t n_tok, int d) { return num_chunks(n_tok) * kMaxRoutes * d; }

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

// Mixing coefficient of source s for output o (the routes' weights, or their mean).
template <class Real>
inline Real mix_coefficient(const DepthRead<Real>& rd, Real (*alpha)[kMaxSources], int o, int s) {
  if (!rd.average) return alpha[o][s];
  Real sum = 0;
  for (int r = 0; r < rd.n_routes; ++r) sum += alpha[r][s];
  return sum / Real(rd.n_routes);
}

}  // namespace

template <class Real>
void depth_read_forward(const DepthRead<Real>& rd, Real* const* out, Real* rms, Real* logits) {
  const int n = rd.n_sources, d = rd.d;
  const int n_out = rd.average ? 1 : rd.n_routes;
  const Real* q0 = rd.queries[0];
  const Real* q1 = rd.n_routes > 1 ? rd.queries[1] : nullptr;
  const Real* gamma = rd.gamma;
#pragma omp parallel for schedule(static) if (rd.n_tok * d * n >= kParallelMin)
  for (std::int64_t t = 0; t < rd.n_tok; ++t) {
    Real r[kMaxSources];
    Real alpha[kMaxRoutes][kMaxSources];
    Real z[kMaxRoutes][kMaxSources];
    // One pass over each source: its sum of squares and its dot with every query.
    for (int s = 0; s < n; ++s) {
      const Real* v = rd.sources[s] + t * d;
      Real ss = 0, dot0 = 0, dot1 = 0;
      if (q1 != nullptr && q0 != nullptr) {
#pragma omp simd reduction(+ : ss, dot0, dot1)
        for (int k = 0; k < d; ++k) {
          ss += v[k] * v[k];
          dot0 += q0[k] * gamma[k] * v[k];
          dot1 += q1[k] * gamma[k] * v[k];
        }
      } else if (q0 != nullptr) {
#pragma omp simd reduction(+ : ss, dot0)
        for (int k = 0; k < d; ++k) {
          ss += v[k] * v[k];
          dot0 += q0[k] * gamma[k] * v[k];
        }
      } else {
        // Route 0 is never uniform in practice; keep the general case correct anyway.
#pragma omp simd reduction(+ : ss, dot1)
        for (int k = 0; k < d; ++k) {
          ss += v[k] * v[k];
          if (q1 != nullptr) dot1 += q1[k] * gamma[k] * v[k];
        }
      }
      r[s] = Real(1) / std::sqrt(ss / Real(d) + rd.eps);
      z[0][s] = r[s] * dot0;
      z[1][s] = r[s] * dot1;
      rms[t * n + s] = r[s];
    }
    for (int ro = 0; ro < rd.n_routes; ++ro) {
      const bool uniform = rd.queries[ro] == nullptr;
      if (!uniform) std::copy(z[ro], z[ro] + n, logits + (ro * rd.n_tok + t) * n);
      depth_weights(z[ro], n, uniform, alpha[ro]);
    }
    for (int o = 0; o < n_out; ++o) {
      Real* h = out[o] + t * d;
      std::fill(h, h + d, Real(0));
      for (int s = 0; s < n; ++s) {
        const Real c = mix_coefficient(rd, alpha, o, s);
        const Real* v = rd.sources[s] + t * d;
#pragma omp simd
        for (int k = 0; k < d; ++k) h[k] += c * v[k];
      }
    }
  }
}

template <class Real>
void depth_read_route_from_logits(const DepthRead<Real>& rd, int route, const Real* logits, Real* out) {
  const int n = rd.n_sources, d = rd.d;
  const bool uniform = rd.queries[route] == nullptr;
#pragma omp parallel for schedule(static) if (rd.n_tok * d * n >= kParallelMin)
  for (std::int64_t t = 0; t < rd.n_tok; ++t) {
    // The forward's steps for this route: the same weights from the same logits, the same mix.
    Real alpha[kMaxSources];
    depth_weights(uniform ? nullptr : logits + (route * rd.n_tok + t) * n, n, uniform, alpha);
    Real* h = out + t * d;
    std::fill(h, h + d, Real(0));
    for (int s = 0; s < n; ++s) {
      const Real c = alpha[s];
      const Real* v = rd.sources[s] + t * d;
#pragma omp simd
      for (int k = 0; k < d; ++k) h[k] += c * v[k];
    }
  }
}

template <class Real>
void depth_read_backward(const DepthRead<Real>& rd, const Real* rms, const Real* logits, const Real* const* dout,
                         Real* const* dsources, Real* const* dqueries, Real* dgamma, Real* scratch) {
  const int n = rd.n_sources, d = rd.d, R = rd.n_routes;
  const std::int64_t chunks = num_chunks(rd.n_tok);
  const Real* gamma = rd.gamma;
  // With averaged routes each route sees half of the output's gradient.
  const Real gscale = rd.average ? Real(1) / Real(R) : Real(1);
#pragma omp parallel for schedule(static) if (rd.n_tok * d * n >= kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    Real* acc = scratch + c * kMaxRoutes * d;  // acc[r][k] = sum over tokens, sources of delta * n_s
    std::fill(acc, acc + R * d, Real(0));
    const std::int64_t t_end = std::min(rd.n_tok, (c + 1) * kReduceChunk);
    for (std::int64_t t = c * kReduceChunk; t < t_end; ++t) {
      Real alpha[kMaxRoutes][kMaxSources];
      Real z[kMaxRoutes][kMaxSources];
      Real delta[kMaxRoutes][kMaxSources];
      const Real* r = rms + t * n;
      const Real* g[kMaxRoutes];
      for (int ro = 0; ro < R; ++ro) {
        g[ro] = (rd.average ? dout[0] : dout[ro]) + t * d;
        const bool uniform = rd.queries[ro] == nullptr;
        if (!uniform) std::copy(logits + (ro * rd.n_tok + t) * n, logits + (ro * rd.n_tok + t + 1) * n, z[ro]);
        depth_weights(z[ro], n, uniform, alpha[ro]);
      }
      // c_rs = g_r . v_s; delta_rs = alpha_rs (c_rs - sum_s' alpha_rs' c_rs')
      for (int ro = 0; ro < R; ++ro) {
        if (rd.queries[ro] == nullptr) {
          std::fill(delta[ro], delta[ro] + n, Real(0));
          continue;
        }
        Real cbar = 0;
        for (int s = 0; s < n; ++s) {
          const Real* v = rd.sources[s] + t * d;
          Real dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int k = 0; k < d; ++k) dot += g[ro][k] * v[k];
          delta[ro][s] = dot * gscale;
          cbar += alpha[ro][s] * delta[ro][s];
        }
        for (int s = 0; s < n; ++s) delta[ro][s] = alpha[ro][s] * (delta[ro][s] - cbar);
      }
      // dv_s = sum_r alpha_rs g_r + r_s sum_r delta_rs u_r - r_s^2 (sum_r delta_rs z_rs)/d v_s, u_r = w_r * gamma
      for (int s = 0; s < n; ++s) {
        const Real* v = rd.sources[s] + t * d;
        Real* dv = dsources[s] + t * d;
        const Real rs = r[s];
        Real a[kMaxRoutes] = {}, b[kMaxRoutes] = {};
        Real key = 0;
        for (int ro = 0; ro < R; ++ro) {
          a[ro] = alpha[ro][s] * gscale;
          b[ro] = rd.queries[ro] != nullptr ? delta[ro][s] * rs : Real(0);
          if (rd.queries[ro] != nullptr) key += delta[ro][s] * z[ro][s];
        }
        const Real kv = rs * rs * key / Real(d);
        for (int ro = 0; ro < R; ++ro) {
          const Real* gr = g[ro];
          const Real* w = rd.queries[ro];
          const Real ar = a[ro], br = b[ro];
          if (w != nullptr) {
            Real* accr = acc + ro * d;
#pragma omp simd
            for (int k = 0; k < d; ++k) {
              dv[k] += ar * gr[k] + br * w[k] * gamma[k];
              accr[k] += br * v[k];
            }
          } else {
#pragma omp simd
            for (int k = 0; k < d; ++k) dv[k] += ar * gr[k];
          }
        }
#pragma omp simd
        for (int k = 0; k < d; ++k) dv[k] -= kv * v[k];
      }
    }
  }
  // dw_r += acc_r * gamma; dgamma += sum_r acc_r * w_r (acc summed over chunks in order).
#pragma omp parallel for schedule(static) if (chunks * d >= kParallelMin)
  for (int k = 0; k < d; ++k) {
    for (int ro = 0; ro < R; ++ro) {
      if (rd.queries[ro] == nullptr) continue;
      Real a = 0;
      for (std::int64_t c = 0; c < chunks; ++c) a += scratch[c * kMaxRoutes * d + ro * d + k];
      if (dqueries[ro] != nullptr) dqueries[ro][k] += a * gamma[k];
      dgamma[k] += a * rd.queries[ro][k];
    }
  }
}

template void depth_weights<float>(const float*, int, bool, float*);
template void depth_weights<double>(const double*, int, bool, double*);
template void depth_read_forward<float>(const DepthRead<float>&, float* const*, float*, float*);
template void depth_read_forward<double>(const DepthRead<double>&, double* const*, double*, double*);
template void depth_read_route_from_logits<float>(const DepthRead<float>&, int, const float*, float*);
template void depth_read_route_from_logits<double>(const DepthRead<double>&, int, const double*, double*);
template void depth_read_backward<float>(const DepthRead<float>&, const float*, const float*, const float* const*,
                                         float* const*, float* const*, float*, float*);
template void depth_read_backward<double>(const DepthRead<double>&, const double*, const double*,
                                          const double* const*, double* const*, double* const*, double*, double*);

}  // namespace attnres::kernels
