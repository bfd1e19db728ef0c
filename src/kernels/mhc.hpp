// Manifold-constrained hyper-connections (baselines-spec §4), one module per sublayer over the
// n-stream state (streams.hpp). Per token, from the whole flattened state v = vec(x) (n*d values,
// stream-major):
//   z = RMSNorm(v) phi^T (no norm weight; phi [n(n+2), n*d], slices [0,n) pre, [n,2n) post,
//   [2n, n(n+2)) res row-major n x n), H~ = alpha_slice * z + b,
//   H_pre = sigmoid(H~_pre) (+ pre_eps), H_post = 2 sigmoid(H~_post), H_res = Sinkhorn(H~_res).
// Read h_in = sum_i H_pre[i] x_i; write x'_i = sum_j H_res[i,j] x_j + H_post[i] y, i.e. the
// shared stream write with alpha[i,0] = H_pre[i], alpha[j,i+1] = H_res[i,j], beta = H_post.
// Saved per token: those coefficients (coef, n(n+2)), z (n(n+2)) and the RMS factor; the backward
// recomputes the sigmoids and the Sinkhorn iterates from z.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "kernels/streams.hpp"

namespace attnres::kernels {

// Sinkhorn-Knopp half-step order per iteration: columns then rows (the paper's eq. 9, row sums
// exact) or rows then columns (Megatron / DeepSeek-V4 code, column sums exact).
enum class SinkhornOrder { col_row, row_col };
inline constexpr std::array kSinkhornOrders = {SinkhornOrder::col_row, SinkhornOrder::row_col};
std::string to_string(SinkhornOrder order);

// out [n, n] = Sinkhorn(exp(logits - max logits)) with iters >= 1 iterations of two half-steps.
template <class Real>
void sinkhorn_forward(Real* out, const Real* logits, int n, int iters, SinkhornOrder order);

// dlogits [n, n] = the gradient through sinkhorn_forward given dout, recomputing the iterates
// (the global max is a constant: the result does not depend on it). work: sinkhorn_work_size.
template <class Real>
void sinkhorn_backward(Real* dlogits, const Real* logits, const Real* dout, int n, int iters, SinkhornOrder order,
                       Real* work);

std::int64_t sinkhorn_work_size(int n, int iters);

template <class Real>
struct ManifoldHyperConnection {
  const Real* streams = nullptr;  // x [n_tok, n, d]
  std::int64_t n_tok = 0;
  int n = 0;
  int d = 0;
  Real eps = 0;                   // the flattened RMSNorm's
  const Real* phi = nullptr;      // [n(n+2), n*d]
  const Real* alpha = nullptr;    // [3]: pre, post, res
  const Real* bias = nullptr;     // [n(n+2)]
  int sinkhorn_iters = 20;
  SinkhornOrder order = SinkhornOrder::col_row;
  Real pre_eps = 0;               // added to H_pre (mhc_pre_eps)
};

template <class Real>
struct ManifoldHyperConnectionGrads {  // all +=
  Real* phi = nullptr;
  Real* alpha = nullptr;
  Real* bias = nullptr;
};

// h_in [n_tok, d]: the sublayer input; coef, z [n_tok, n(n+2)] and rms [n_tok] are saved.
template <class Real>
void mhc_forward(const ManifoldHyperConnection<Real>& mhc, Real* h_in, Real* coef, Real* z, Real* rms);

template <class Real>
StreamCoefficients<Real> mhc_coefficients(const ManifoldHyperConnection<Real>& mhc, const Real* coef);

// Given dh_in, dout (the new streams' gradient) and dpost (stream_write_backward's dbeta):
// dstreams [n_tok, n, d] = the streams' gradient (overwritten; must not alias dout); parameter
// gradients summed over tokens in fixed chunk order (phi's by a GEMM over all tokens).
// scratch: mhc_scratch_size.
template <class Real>
void mhc_backward(const ManifoldHyperConnection<Real>& mhc, const Real* coef, const Real* z, const Real* rms,
                  const Real* dh_in, const Real* dout, const Real* dpost, Real* dstreams,
                  const ManifoldHyperConnectionGrads<Real>& grads, Real* scratch);

std::int64_t mhc_scratch_size(std::int64_t n_tok, int n, int sinkhorn_iters);

}  // namespace attnres::kernels
