// The n-stream residual state of hyper-connections (baselines-spec §3-4): per token n rows of d,
// stored [n_tok, n, d] (stream-major per token, so a token's state is one n*d vector). One
// sublayer reads h = sum_i alpha[i,0] H_i, runs y = f(h), and writes
//   H_new_k = sum_i alpha[i,k+1] H_i + beta_k y.
// HC (hyper_connection.hpp) and mHC (mhc.hpp) differ only in how alpha and beta come about
// (mHC: H_pre = alpha[:,0], H_res = alpha[:,1:]^T, H_post = beta); the write is shared here.
#pragma once

#include <cstdint>

namespace attnres::kernels {

inline constexpr int kMaxStreams = 8;

// The mixing coefficients of one sublayer, per token or shared by all tokens (static HC).
template <class Real>
struct StreamCoefficients {
  const Real* alpha = nullptr;  // [n, n+1] row-major: alpha[i,0] = stream i's weight in the read,
                                // alpha[i,k+1] = stream i's weight in new stream k
  const Real* beta = nullptr;   // [n]: the sublayer output's weight in new stream k
  std::int64_t stride = 0;      // elements from one token's coefficients to the next; 0 = shared
};

// Per-token coefficients are stored alpha then beta: n(n+1) + n = n(n+2) values.
constexpr int stream_coefficient_count(int n) { return n * (n + 2); }

// Entry: H_k = scale * x for every stream (HC and mHC replicate the embedding with scale 1).
template <class Real>
void stream_expand(Real* streams, const Real* x, std::int64_t n_tok, int n, int d, Real scale = Real(1));

// Exit: x = scale * sum_k H_k, streams in order (scale 1: sum readout; 1/n: mean). Each is the
// other's backward.
template <class Real>
void stream_reduce(Real* x, const Real* streams, std::int64_t n_tok, int n, int d, Real scale = Real(1));

// out [n_tok, n, d] = the new streams (out must not alias streams).
template <class Real>
void stream_write_forward(Real* out, const Real* streams, const StreamCoefficients<Real>& coef, const Real* y,
                          std::int64_t n_tok, int n, int d);

// dy [n_tok, d] = sum_k beta_k dout_k (overwritten); dbeta [n_tok, n]: <dout_k, y> per token (the
// read backward turns it into parameter gradients). The streams' gradient, which needs dout too,
// comes from the read backward (hc_backward, mhc_backward).
template <class Real>
void stream_write_backward(Real* dy, Real* dbeta, const Real* dout, const Real* y, const StreamCoefficients<Real>& coef,
                           std::int64_t n_tok, int n, int d);

namespace detail {

// Token t's alpha (n x (n+1)) and beta.
template <class Real>
inline const Real* alpha_of(const StreamCoefficients<Real>& c, std::int64_t t) {
  return c.alpha + t * c.stride;
}
template <class Real>
inline const Real* beta_of(const StreamCoefficients<Real>& c, std::int64_t t) {
  return c.beta + t * c.stride;
}

}  // namespace detail
}  // namespace attnres::kernels
