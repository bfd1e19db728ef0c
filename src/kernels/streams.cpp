#include "kernels/streams.hpp"

#include "kernels/row_ops.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

template <class Real>
void stream_expand(Real* streams, const Real* x, std::int64_t n_tok, int n, int d, Real scale) {
#pragma omp parallel for schedule(static) if (n_tok * n * d >= kParallelMin)
  for (std::int64_t t = 0; t < n_tok; ++t)
    for (int i = 0; i < n; ++i) {
      Real* h = streams + (t * n + i) * d;
      const Real* xt = x + t * d;
#pragma omp simd
      for (int k = 0; k < d; ++k) h[k] = scale * xt[k];
    }
}

template <class Real>
void stream_reduce(Real* x, const Real* streams, std::int64_t n_tok, int n, int d, Real scale) {
#pragma omp parallel for schedule(static) if (n_tok * n * d >= kParallelMin)
  for (std::int64_t t = 0; t < n_tok; ++t) {
    const Real* h = streams + t * n * d;
    Real* xt = x + t * d;
#pragma omp simd
    for (int k = 0; k < d; ++k) {
      Real s = h[k];
      for (int i = 1; i < n; ++i) s += h[i * d + k];
      xt[k] = scale * s;
    }
  }
}

template <class Real>
void stream_write_forward(Real* out, const Real* streams, const StreamCoefficients<Real>& coef, const Real* y,
                          std::int64_t n_tok, int n, int d) {
  require(n >= 1 && n <= kMaxStreams, "1 to ", kMaxStreams, " streams, got ", n);
#pragma omp parallel for schedule(static) if (n_tok * n * d >= kParallelMin)
  for (std::int64_t t = 0; t < n_tok; ++t) {
    const Real* alpha = detail::alpha_of(coef, t);
    const Real* beta = detail::beta_of(coef, t);
    // inputs: the n streams, then y; c[k][i] = alpha[i][k+1], c[k][n] = beta_k
    const Real* v[kMaxStreams + 1];
    Real* h[kMaxStreams];
    Real c[kMaxStreams * (kMaxStreams + 1)];
    for (int i = 0; i < n; ++i) {
      v[i] = streams + (t * n + i) * d;
      h[i] = out + (t * n + i) * d;
    }
    v[n] = y + t * d;
    for (int k = 0; k < n; ++k) {
      for (int i = 0; i < n; ++i) c[k * (n + 1) + i] = alpha[i * (n + 1) + k + 1];
      c[k * (n + 1) + n] = beta[k];
    }
    mix_rows(n, h, v, c, n + 1, n + 1, d);
  }
}

template <class Real>
void stream_write_backward(Real* dy, Real* dbeta, const Real* dout, const Real* y, const StreamCoefficients<Real>& coef,
                           std::int64_t n_tok, int n, int d) {
  require(n >= 1 && n <= kMaxStreams, "1 to ", kMaxStreams, " streams, got ", n);
#pragma omp parallel for schedule(static) if (n_tok * n * d >= kParallelMin)
  for (std::int64_t t = 0; t < n_tok; ++t) {
    const Real* g[kMaxStreams];
    for (int k = 0; k < n; ++k) g[k] = dout + (t * n + k) * d;
    const Real* yt = y + t * d;
    dots(n, yt, g, d, dbeta + t * n);
    Real* dyt = dy + t * d;
    mix_rows(1, &dyt, g, detail::beta_of(coef, t), n, n, d);
  }
}

#define ATTNRES_INSTANTIATE(Real)                                                                              \
  template void stream_expand<Real>(Real*, const Real*, std::int64_t, int, int, Real);                         \
  template void stream_reduce<Real>(Real*, const Real*, std::int64_t, int, int, Real);                         \
  template void stream_write_forward<Real>(Real*, const Real*, const StreamCoefficients<Real>&, const Real*,   \
                                           std::int64_t, int, int);                                            \
  template void stream_write_backward<Real>(Real*, Real*, const Real*, const Real*,                            \
                                            const StreamCoefficients<Real>&, std::int64_t, int, int);
ATTNRES_INSTANTIATE(float)
ATTNRES_INSTANTIATE(double)
#undef ATTNRES_INSTANTIATE

}  // namespace attnres::kernels
