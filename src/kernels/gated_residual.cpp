// The Gated Residual module (gated_residual.hpp), forward and the hand-written backward of
// docs/delta-gated-spec.md §2.4. The three projections are fixed-block GEMMs (gemm.hpp: results
// independent of the thread count), the norm weight's gradient a chunked reduction.
#include "kernels/gated_residual.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/elementwise.hpp"
#include "kernels/gemm.hpp"
#include "kernels/reduce.hpp"
#include "kernels/row_ops.hpp"
#include "kernels/streams.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

namespace {

template <class Real>
inline Real sigmoid(Real z) {
  return Real(1) / (Real(1) + std::exp(-z));
}

// The module's working buffers: the normalised branches Hn, the read gates G, a temporary of the
// same size (dL/dq, then the projections' input gradients), dL/dHn [n_tok, n d]; the SiLU output a
// and its gradient [n_tok, r]; ds / n [n_tok, n]; the norm weight's per-chunk partial sums.
template <class Real>
struct GrScratch {
  Real *hn, *gate, *tmp, *dhn, *a, *da, *ds, *partial;
};

template <class Real>
GrScratch<Real> carve(Real* p, std::int64_t n_tok, int n, int d, int r) {
  const std::int64_t nd = static_cast<std::int64_t>(n) * d;
  GrScratch<Real> s;
  s.hn = p;
  s.gate = s.hn + n_tok * nd;
  s.tmp = s.gate + n_tok * nd;
  s.dhn = s.tmp + n_tok * nd;
  s.a = s.dhn + n_tok * nd;
  s.da = s.a + n_tok * r;
  s.ds = s.da + n_tok * r;
  s.partial = s.ds + n_tok * n;
  return s;
}

template <class Real>
void check(const GatedResidual<Real>& m) {
  require(m.n >= 1 && m.n <= kMaxStreams, "the gated residual needs 1 to ", kMaxStreams, " branches, got ", m.n);
  require(m.r >= 1, "the gated residual's rank must be at least 1");
  require(m.H != nullptr && m.norm != nullptr && m.w_down != nullptr && m.w_up != nullptr,
          "the gated residual needs its branches, norm weight, W_down and W_up");
}

// Hn = RMSNorm(H_i) (1 + w_i) per branch (rms given: the backward recomputes Hn bit for bit).
template <class Real>
void normalise(const GatedResidual<Real>& m, const Real* rms, Real* hn) {
  const int n = m.n, d = m.d;
#pragma omp parallel for schedule(static) if (m.n_tok * n * d >= kParallelMin)
  for (std::int64_t t = 0; t < m.n_tok; ++t)
    for (int i = 0; i < n; ++i) {
      const std::int64_t row = (t * n + i) * d;
      const Real rr = rms[t * n + i];
      const Real* w = m.norm + static_cast<std::int64_t>(i) * d;
      for (int k = 0; k < d; ++k) hn[row + k] = m.H[row + k] * rr * (Real(1) + w[k]);
    }
}

// a = SiLU(p) and G = sigmoid(W_up a): the read gates from the saved p.
template <class Real>
void read_gates(const GatedResidual<Real>& m, const Real* p, Real* a, Real* gate) {
  const std::int64_t nd = static_cast<std::int64_t>(m.n) * m.d, nr = m.n_tok * m.r;
  for (std::int64_t e = 0; e < nr; ++e) a[e] = p[e] * sigmoid(p[e]);
  linear_forward_fixed(gate, a, m.w_up, m.n_tok, m.r, nd);
  const std::int64_t total = m.n_tok * nd;
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (std::int64_t e = 0; e < total; ++e) gate[e] = sigmoid(gate[e]);
}

}  // namespace

std::int64_t gr_scratch_size(std::int64_t n_tok, int n, int d, int r) {
  const std::int64_t nd = static_cast<std::int64_t>(n) * d;
  return 4 * n_tok * nd + 2 * n_tok * r + n_tok * n + num_chunks(n_tok) * nd;
}

template <class Real>
void gr_read_forward(const GatedResidual<Real>& m, Real* x, const GatedResidualSaved<Real>& saved, Real* scratch) {
  check(m);
  const int n = m.n, d = m.d;
  const std::int64_t nd = static_cast<std::int64_t>(n) * d, T = m.n_tok;
  const GrScratch<Real> s = carve(scratch, T, n, d, m.r);
#pragma omp parallel for schedule(static) if (T * nd >= kParallelMin)
  for (std::int64_t e = 0; e < T * n; ++e) saved.rms[e] = inverse_rms(m.H + e * d, d, m.eps);
  normalise(m, saved.rms, s.hn);
  // p = W_down vec(Hn) / n: the / n of both reference codes (spec §2.1).
  linear_forward_fixed(saved.p, s.hn, m.w_down, T, nd, m.r);
  const Real inv_n = Real(1) / static_cast<Real>(n);
  for (std::int64_t e = 0; e < T * m.r; ++e) saved.p[e] *= inv_n;
  read_gates(m, saved.p, s.a, s.gate);
#pragma omp parallel for schedule(static) if (T * nd >= kParallelMin)
  for (std::int64_t t = 0; t < T; ++t) {
    const Real* g = s.gate + t * nd;
    const Real* h = s.hn + t * nd;
    Real* xt = x + t * d;
    for (int k = 0; k < d; ++k) {
      Real acc = 0;
      for (int i = 0; i < n; ++i) acc += g[i * d + k] * h[i * d + k];  // branches in order
      xt[k] = acc * inv_n;
    }
    if (saved.gate_mean != nullptr)
      for (int i = 0; i < n; ++i) {
        Real acc = 0;
        for (int k = 0; k < d; ++k) acc += g[i * d + k];
        saved.gate_mean[t * n + i] = acc / static_cast<Real>(d);
      }
  }
  if (m.w_inject == nullptr) return;
  // beta = 2 sigmoid(W_inject vec(Hn) / n), from the read's normalised branches.
  linear_forward_fixed(saved.beta, s.hn, m.w_inject, T, nd, n);
  for (std::int64_t e = 0; e < T * n; ++e) saved.beta[e] = Real(2) * sigmoid(saved.beta[e] * inv_n);
}

template <class Real>
void gr_write_forward(Real* out, const Real* H, const Real* beta, const Real* y, std::int64_t n_tok, int n, int d) {
#pragma omp parallel for schedule(static) if (n_tok * n * d >= kParallelMin)
  for (std::int64_t t = 0; t < n_tok; ++t)
    for (int i = 0; i < n; ++i) {
      const std::int64_t row = (t * n + i) * d;
      const Real b = beta[t * n + i];
      for (int k = 0; k < d; ++k) out[row + k] = H[row + k] + b * y[t * d + k];
    }
}

template <class Real>
void gr_write_backward(Real* dy, Real* ds, const Real* dout, const Real* y, const Real* beta, std::int64_t n_tok,
                       int n, int d) {
#pragma omp parallel for schedule(static) if (n_tok * n * d >= kParallelMin)
  for (std::int64_t t = 0; t < n_tok; ++t) {
    const Real* yt = y + t * d;
    Real* dyt = dy + t * d;
    for (int k = 0; k < d; ++k) dyt[k] = 0;
    for (int i = 0; i < n; ++i) {
      const Real* g = dout + (t * n + i) * d;
      const Real b = beta[t * n + i];
      // d(2 sigmoid(s))/ds = beta (1 - beta / 2)
      ds[t * n + i] = dot(g, yt, d) * b * (Real(1) - b / Real(2));
      for (int k = 0; k < d; ++k) dyt[k] += b * g[k];
    }
  }
}

template <class Real>
void gr_read_backward(const GatedResidual<Real>& m, const GatedResidualSaved<Real>& saved, const Real* dx,
                      const Real* ds, Real* dH, const GatedResidualGrads<Real>& grads, Real* scratch) {
  check(m);
  const int n = m.n, d = m.d, r = m.r;
  const std::int64_t nd = static_cast<std::int64_t>(n) * d, T = m.n_tok;
  const Real inv_n = Real(1) / static_cast<Real>(n);
  const GrScratch<Real> s = carve(scratch, T, n, d, r);
  normalise(m, saved.rms, s.hn);  // Hn, a and G again, as the forward computed them
  read_gates(m, saved.p, s.a, s.gate);
  // The mean: dHn_i = G_i dx / n; dG_i = Hn_i dx / n, dq = dG G (1 - G) (into tmp).
#pragma omp parallel for schedule(static) if (T * nd >= kParallelMin)
  for (std::int64_t t = 0; t < T; ++t)
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < d; ++k) {
        const std::int64_t e = t * nd + i * d + k;
        const Real gx = dx[t * d + k] * inv_n, g = s.gate[e];
        s.dhn[e] = g * gx;
        s.tmp[e] = s.hn[e] * gx * g * (Real(1) - g);
      }
  // W_up: dW_up += dq^T a; da = dq W_up; dp = da SiLU'(p), kept as dp / n for W_down's two products.
  linear_backward_weight_fixed(grads.w_up, s.tmp, s.a, T, r, nd);
  linear_backward_input_fixed(s.da, s.tmp, m.w_up, T, r, nd);
  for (std::int64_t e = 0; e < T * r; ++e) {
    const Real p = saved.p[e], sg = sigmoid(p);
    s.da[e] *= sg * (Real(1) + p * (Real(1) - sg)) * inv_n;
  }
  linear_backward_weight_fixed(grads.w_down, s.da, s.hn, T, nd, r);
  linear_backward_input_fixed(s.tmp, s.da, m.w_down, T, nd, r);
  add_into(s.dhn, s.tmp, T * nd);
  if (ds != nullptr) {  // the write gate's projection, the same way
    for (std::int64_t e = 0; e < T * n; ++e) s.ds[e] = ds[e] * inv_n;
    linear_backward_weight_fixed(grads.w_inject, s.ds, s.hn, T, nd, n);
    linear_backward_input_fixed(s.tmp, s.ds, m.w_inject, T, nd, n);
    add_into(s.dhn, s.tmp, T * nd);
  }
  // The per-branch norm: N_i = r_i H_i, dw += dHn N, dN = dHn (1 + w),
  // dH_i += r_i (dN_i - (<N_i, dN_i> / d) N_i).
  const std::int64_t chunks = num_chunks(T);
#pragma omp parallel for schedule(static) if (T * nd >= kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    Real* acc = s.partial + c * nd;
    for (std::int64_t e = 0; e < nd; ++e) acc[e] = 0;
    const std::int64_t end = std::min(T, (c + 1) * kReduceChunk);
    for (std::int64_t t = c * kReduceChunk; t < end; ++t)
      for (int i = 0; i < n; ++i) {
        const std::int64_t row = t * nd + i * d;
        const Real rr = saved.rms[t * n + i];
        const Real* h = m.H + row;
        const Real* g = s.dhn + row;
        const Real* w = m.norm + static_cast<std::int64_t>(i) * d;
        Real proj = 0;  // <N_i, dN_i>
        for (int k = 0; k < d; ++k) {
          acc[i * d + k] += g[k] * h[k] * rr;
          proj += h[k] * rr * g[k] * (Real(1) + w[k]);
        }
        proj /= static_cast<Real>(d);
        Real* out = dH + row;
        for (int k = 0; k < d; ++k) out[k] += rr * (g[k] * (Real(1) + w[k]) - proj * h[k] * rr);
      }
  }
  sum_chunks_into(grads.norm, s.partial, chunks, nd);
}

#define ATTNRES_GR_INSTANTIATE(Real)                                                                              \
  template void gr_read_forward<Real>(const GatedResidual<Real>&, Real*, const GatedResidualSaved<Real>&, Real*); \
  template void gr_write_forward<Real>(Real*, const Real*, const Real*, const Real*, std::int64_t, int, int);     \
  template void gr_write_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*, std::int64_t, int,    \
                                        int);                                                                     \
  template void gr_read_backward<Real>(const GatedResidual<Real>&, const GatedResidualSaved<Real>&, const Real*,  \
                                       const Real*, Real*, const GatedResidualGrads<Real>&, Real*);
ATTNRES_GR_INSTANTIATE(float)
ATTNRES_GR_INSTANTIATE(double)
#undef ATTNRES_GR_INSTANTIATE

}  // namespace attnres::kernels
