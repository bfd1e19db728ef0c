#include "kernels/mudd.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/depth_read.hpp"
#include "kernels/gemm.hpp"
#include "kernels/reduce.hpp"
#include "kernels/row_ops.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

std::string to_string(Gelu kind) { return kind == Gelu::erf ? "erf" : "tanh"; }

int mudd_hidden_width(int n_ways, int n_sources, int expand, int round) {
  require(n_ways >= 1 && n_sources >= 1 && expand >= 1 && round >= 0, "bad MUDD generator shape: ways ", n_ways,
          ", sources ", n_sources, ", expand ", expand, ", round ", round);
  const int k = n_ways * n_sources * expand;
  return round > 0 ? (k / round + 1) * round : k;
}

template <class Real>
Real gelu_and_derivative(Real h, Gelu kind, Real* derivative) {
  if (kind == Gelu::erf) {  // h Phi(h); Phi(h) + h phi(h)
    const Real cdf = Real(0.5) * (Real(1) + std::erf(h * Real(0.70710678118654752440)));
    if (derivative != nullptr) *derivative = cdf + h * std::exp(Real(-0.5) * h * h) * Real(0.39894228040143267794);
    return h * cdf;
  }
  const Real s = Real(0.79788456080286535588);
  const Real th = std::tanh(s * (h + Real(0.044715) * h * h * h));
  if (derivative != nullptr)
    *derivative = Real(0.5) * (Real(1) + th) + Real(0.5) * h * (Real(1) - th * th) * s * (Real(1) + Real(0.134145) * h * h);
  return Real(0.5) * h * (Real(1) + th);
}

template <class Real>
Real gelu(Real h, Gelu kind) {
  return gelu_and_derivative(h, kind, static_cast<Real*>(nullptr));
}

template <class Real>
Real gelu_derivative(Real h, Gelu kind) {
  Real derivative;
  gelu_and_derivative(h, kind, &derivative);
  return derivative;
}

namespace {

// The scratch regions (forward: y and g; backward: all).
template <class Real>
struct MuddScratch {
  Real* delta;     // [n_tok, C*S]: dL/d dw per token
  Real* act;       // [n_tok, K]: GELU(h), then dL/dh
  Real* slope;     // [n_tok, K]: GELU'(h)
  Real* normed;    // [n_tok, d]: the generator's normalised input, then its gradient
  Real* acc_a;     // [chunks, C*S]
  Real* acc_post;  // [chunks, d]
  Real* acc_gen;   // [chunks, d]
  Real* rows;      // [chunks, 2d]: the R stream's recomputed mix and its gradient
};

template <class Real>
MuddScratch<Real> carve(Real* p, std::int64_t n_tok, int d, int cs, int k) {
  const std::int64_t chunks = num_chunks(n_tok);
  MuddScratch<Real> s;
  s.delta = p;
  s.act = s.delta + n_tok * cs;
  s.slope = s.act + n_tok * k;
  s.normed = s.slope + n_tok * k;
  s.acc_a = s.normed + n_tok * d;
  s.acc_post = s.acc_a + chunks * cs;
  s.acc_gen = s.acc_post + chunks * d;
  s.rows = s.acc_gen + chunks * d;
  return s;
}

// y = RMSNorm(x) (times w when set) for one row with the factor r.
template <class Real>
void norm_row(Real* y, const Real* x, Real r, const Real* w, int d) {
  if (w != nullptr) {
    scale_row(y, x, r, w, d);
    return;
  }
#pragma omp simd
  for (int k = 0; k < d; ++k) y[k] = x[k] * r;
}

// The generator input normalised, for every token (rms: written when set, else read).
template <class Real>
void normalise_inputs(const MuddDa<Real>& da, Real* normed, Real* rms_out, const Real* rms_in) {
  const int d = da.d;
#pragma omp parallel for schedule(static) if (da.n_tok * d >= kParallelMin)
  for (std::int64_t t = 0; t < da.n_tok; ++t) {
    const Real* x = da.x + t * d;
    Real r;
    if (rms_out != nullptr) rms_out[t] = r = inverse_rms(x, d, da.eps);
    else r = rms_in[t];
    norm_row(normed + t * d, x, r, da.gen_norm, d);
  }
}

template <class Real>
void check(const MuddDa<Real>& da) {
  require(da.n_ways >= 1 && da.n_ways <= kMaxWays, "a MUDD DA has 1 to ", kMaxWays, " ways, got ", da.n_ways);
  require(da.n_sources >= 1 && da.n_sources <= kMaxSources, "a MUDD DA reads 1 to ", kMaxSources,
          " sources, got ", da.n_sources);
  require(da.a != nullptr, "a MUDD DA needs its static weights a");
  require(da.x != nullptr || (!da.dynamic() && !da.prepost()), "a MUDD DA with a generator or PrePostDANorm needs x");
  require(!da.dynamic() || (da.w2 != nullptr && da.hidden >= 1), "a MUDD generator needs W2 and a hidden width");
}

}  // namespace

std::int64_t mudd_scratch_size(std::int64_t n_tok, int d, int n_ways, int n_sources, int hidden) {
  const std::int64_t cs = static_cast<std::int64_t>(n_ways) * n_sources;
  return n_tok * (cs + 2 * static_cast<std::int64_t>(hidden) + d) +
         num_chunks(n_tok) * (cs + 4 * static_cast<std::int64_t>(d));
}

template <class Real>
void mudd_forward(const MuddDa<Real>& da, Real* const* out, Real* dw, Real* hidden, Real* rms, Real* scratch) {
  check(da);
  const int S = da.n_sources, C = da.n_ways, d = da.d, K = da.hidden, cs = C * S;
  const std::int64_t n_tok = da.n_tok;
  if (da.dynamic()) {
    const MuddScratch<Real> sc = carve(scratch, n_tok, d, cs, K);
    normalise_inputs<Real>(da, sc.normed, rms, nullptr);
    linear_forward_fixed(hidden, sc.normed, da.w1, n_tok, d, K);
#pragma omp parallel for schedule(static) if (n_tok * K >= kParallelMin)
    for (std::int64_t i = 0; i < n_tok * K; ++i) sc.act[i] = gelu(hidden[i], da.gelu);
    linear_forward_fixed(dw, sc.act, da.w2, n_tok, K, cs);
#pragma omp parallel for schedule(static) if (n_tok * cs >= kParallelMin)
    for (std::int64_t t = 0; t < n_tok; ++t)
      for (int i = 0; i < cs; ++i) dw[t * cs + i] += da.a[i];
  }
  const int R = C - 1;
#pragma omp parallel for schedule(static) if (n_tok * d * S * C >= kParallelMin)
  for (std::int64_t t = 0; t < n_tok; ++t) {
    const Real* v[kMaxSources];
    for (int s = 0; s < S; ++s) v[s] = da.sources[s] + t * d;
    Real* h[kMaxWays];
    for (int c = 0; c < C; ++c) h[c] = out[c] + t * d;
    const Real* w = da.dynamic() ? dw + t * cs : da.a;
    mix_rows(C, h, v, w, S, S, d);
    if (!da.prepost()) continue;
    // x_c = x + mix_c; the R stream's mix is normalised first.
    scale_row(h[R], h[R], inverse_rms(h[R], d, da.eps), da.post_norm, d);
    const Real* x = da.x + t * d;
    for (int c = 0; c < C; ++c)
#pragma omp simd
      for (int k = 0; k < d; ++k) h[c][k] = x[k] + h[c][k];
  }
}

template <class Real>
void mudd_backward(const MuddDa<Real>& da, const Real* dw, const Real* hidden, const Real* rms,
                   const MuddGrads<Real>& gr, Real* scratch) {
  check(da);
  const int S = da.n_sources, C = da.n_ways, d = da.d, K = da.hidden, cs = C * S, R = C - 1;
  const std::int64_t n_tok = da.n_tok, chunks = num_chunks(n_tok);
  const MuddScratch<Real> sc = carve(scratch, n_tok, d, cs, K);
  // Pass 1, per token: the streams' gradients through PrePost's residual and R norm, the
  // aggregate's source gradients, and dL/d dw (delta).
#pragma omp parallel for schedule(static) if (n_tok * d * S * C >= kParallelMin)
  for (std::int64_t ch = 0; ch < chunks; ++ch) {
    Real* acc_a = sc.acc_a + ch * cs;
    Real* acc_post = sc.acc_post + ch * d;
    Real* mix = sc.rows + ch * 2 * d;
    Real* dmix = mix + d;
    std::fill(acc_a, acc_a + cs, Real(0));
    std::fill(acc_post, acc_post + d, Real(0));
    const std::int64_t t_end = std::min(n_tok, (ch + 1) * kReduceChunk);
    for (std::int64_t t = ch * kReduceChunk; t < t_end; ++t) {
      const Real* v[kMaxSources];
      Real* dv[kMaxSources];
      for (int s = 0; s < S; ++s) {
        v[s] = da.sources[s] + t * d;
        dv[s] = gr.dsources[s] + t * d;
      }
      const Real* w = da.dynamic() ? dw + t * cs : da.a;
      const Real* g[kMaxWays];
      for (int c = 0; c < C; ++c) g[c] = gr.dout[c] + t * d;
      if (da.prepost()) {
        Real* dx = gr.dx + t * d;
        for (int c = 0; c < C; ++c)
#pragma omp simd
          for (int k = 0; k < d; ++k) dx[k] += g[c][k];
        mix_rows(1, &mix, v, w + R * S, S, S, d);  // the forward's R mix, bit for bit
        rmsnorm_row_backward(dmix, acc_post, g[R], mix, da.post_norm, inverse_rms(mix, d, da.eps), d);
        g[R] = dmix;
      }
      // delta[c, j] = <g_c, X_j>;  dX_j += sum_c dw[c, j] g_c.
      Real delta[kMaxWays * kMaxSources], wt[kMaxSources * kMaxWays], col[kMaxWays];
      for (int s = 0; s < S; ++s) {
        dots(C, v[s], g, d, col);
        for (int c = 0; c < C; ++c) {
          delta[c * S + s] = col[c];
          wt[s * C + c] = w[c * S + s];
        }
      }
      mix_rows<true>(S, dv, g, wt, C, C, d);
      for (int i = 0; i < cs; ++i) acc_a[i] += delta[i];
      if (da.dynamic()) std::copy(delta, delta + cs, sc.delta + t * cs);
    }
  }
  sum_chunks_into(gr.da, sc.acc_a, chunks, cs);
  if (da.prepost() && gr.dpost_norm != nullptr) sum_chunks_into(gr.dpost_norm, sc.acc_post, chunks, d);
  if (!da.dynamic()) return;

  // Pass 2, the generator over all tokens: dW2 += delta^T GELU(h); dh = (delta W2) GELU'(h);
  // dW1 += dh^T n; dn = dh W1.
#pragma omp parallel for schedule(static) if (n_tok * K >= kParallelMin)
  for (std::int64_t i = 0; i < n_tok * K; ++i) sc.act[i] = gelu_and_derivative(hidden[i], da.gelu, sc.slope + i);
  linear_backward_weight_fixed(gr.dw2, sc.delta, sc.act, n_tok, K, cs);
  linear_backward_input_fixed(sc.act, sc.delta, da.w2, n_tok, K, cs);
#pragma omp parallel for schedule(static) if (n_tok * K >= kParallelMin)
  for (std::int64_t i = 0; i < n_tok * K; ++i) sc.act[i] *= sc.slope[i];
  normalise_inputs<Real>(da, sc.normed, nullptr, rms);
  linear_backward_weight_fixed(gr.dw1, sc.act, sc.normed, n_tok, d, K);
  linear_backward_input_fixed(sc.normed, sc.act, da.w1, n_tok, d, K);

  // Pass 3, per token: the generator norm's backward into dx.
#pragma omp parallel for schedule(static) if (n_tok * d >= kParallelMin)
  for (std::int64_t ch = 0; ch < chunks; ++ch) {
    Real* acc_gen = sc.acc_gen + ch * d;
    std::fill(acc_gen, acc_gen + d, Real(0));
    const std::int64_t t_end = std::min(n_tok, (ch + 1) * kReduceChunk);
    for (std::int64_t t = ch * kReduceChunk; t < t_end; ++t)
      rmsnorm_row_backward_add(gr.dx + t * d, acc_gen, sc.normed + t * d, da.x + t * d, da.gen_norm, rms[t], d);
  }
  if (da.gen_norm != nullptr && gr.dgen_norm != nullptr) sum_chunks_into(gr.dgen_norm, sc.acc_gen, chunks, d);
}

#define ATTNRES_INSTANTIATE(Real)                                                                              \
  template Real gelu_and_derivative<Real>(Real, Gelu, Real*);                                                  \
  template Real gelu<Real>(Real, Gelu);                                                                        \
  template Real gelu_derivative<Real>(Real, Gelu);                                                             \
  template void mudd_forward<Real>(const MuddDa<Real>&, Real* const*, Real*, Real*, Real*, Real*);             \
  template void mudd_backward<Real>(const MuddDa<Real>&, const Real*, const Real*, const Real*,                \
                                    const MuddGrads<Real>&, Real*);
ATTNRES_INSTANTIATE(float)
ATTNRES_INSTANTIATE(double)
#undef ATTNRES_INSTANTIATE

}  // namespace attnres::kernels
