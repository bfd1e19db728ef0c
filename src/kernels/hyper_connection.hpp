// Hyper-Connections (baselines-spec §3), one module per sublayer over the n-stream state
// (streams.hpp). Static: alpha = A ([n, n+1]: column 0 = A_m, columns 1..n = A_r), beta = B.
// Dynamic, per token, with Hbar_i = RMSNorm_gamma(H_i) row by row:
//   alpha = s_alpha * tanh(Hbar W_alpha^T) + A,   beta = s_beta * tanh(Hbar w_beta) + B
// (tanh off: the plain projections). The read h_0 = sum_i alpha[i,0] H_i feeds the sublayer; the
// write is stream_write_forward with these coefficients.
// Saved per token (dynamic only): alpha and beta (coef), the tanh values (act, same layout, or the
// pre-activations without tanh) and the n row RMS factors. Static HC saves nothing.
#pragma once

#include <cstdint>

#include "kernels/streams.hpp"

namespace attnres::kernels {

template <class Real>
struct HyperConnection {
  const Real* streams = nullptr;  // H [n_tok, n, d]
  std::int64_t n_tok = 0;
  int n = 0;
  int d = 0;
  Real eps = 0;
  const Real* A = nullptr;  // [n, n+1]
  const Real* B = nullptr;  // [n]
  // Dynamic part (w_alpha == nullptr: static HC).
  const Real* w_alpha = nullptr;  // [n+1, d]
  const Real* w_beta = nullptr;   // [d]
  const Real* s_alpha = nullptr;  // [1]
  const Real* s_beta = nullptr;   // [1]
  const Real* norm = nullptr;     // gamma [d]
  bool tanh = true;

  bool dynamic() const { return w_alpha != nullptr; }
};

// Every pointer accumulates (+=); the dynamic ones are ignored for static HC.
template <class Real>
struct HyperConnectionGrads {
  Real* A = nullptr;
  Real* B = nullptr;
  Real* w_alpha = nullptr;
  Real* w_beta = nullptr;
  Real* s_alpha = nullptr;
  Real* s_beta = nullptr;
  Real* norm = nullptr;
};

// h0 [n_tok, d]: the sublayer input. Dynamic: coef and act [n_tok, n(n+2)], rms [n_tok, n] are
// written (static: unused, may be null). scratch: hc_scratch_size.
template <class Real>
void hc_forward(const HyperConnection<Real>& hc, Real* h0, Real* coef, Real* act, Real* rms, Real* scratch);

// The coefficients the write (and its backward) use: the saved per-token ones, or A and B.
template <class Real>
StreamCoefficients<Real> hc_coefficients(const HyperConnection<Real>& hc, const Real* coef);

// Given dh0 (the sublayer input's gradient), dout (the new streams' gradient) and dbeta (from
// stream_write_backward): dstreams [n_tok, n, d] = the streams' gradient (overwritten; must not
// alias dout), parameter gradients summed over tokens in fixed chunk order.
template <class Real>
void hc_backward(const HyperConnection<Real>& hc, const Real* coef, const Real* act, const Real* rms, const Real* dh0,
                 const Real* dout, const Real* dbeta, Real* dstreams, const HyperConnectionGrads<Real>& grads,
                 Real* scratch);

std::int64_t hc_scratch_size(std::int64_t n_tok, int n, int d);

}  // namespace attnres::kernels
