// The Gated Residual of Qwen3.8-Flash-Next (docs/delta-gated-spec.md §2): n branches per token,
// stored [n_tok, n, d] like the hyper-connection streams (streams.hpp). One module per sublayer:
//   read:  Hn_i = RMSNorm(H_i) (1 + w_i)      (per branch, zero-centred weight w [n d])
//          p = W_down vec(Hn) / n,  a = SiLU(p),  G = sigmoid(W_up a)   (W_down [r, n d], W_up [n d, r])
//          x = (1/n) sum_i G_i Hn_i            (the sublayer's input: it replaces the pre-norm)
//   write: beta = 2 sigmoid(W_inject vec(Hn) / n),  H'_i = H_i + beta_i y   (W_inject [n, n d])
// The final mixer is a read without a write (w_inject null). The backward is §2.4's, split as the
// trunk runs it: the write's (before the sublayer body's backward, which needs dy), then the read's
// (after it, with the body input's gradient).
#pragma once

#include <cstdint>

namespace attnres::kernels {

template <class Real>
struct GatedResidual {
  const Real* H = nullptr;  // the branches entering the module [n_tok, n, d]
  std::int64_t n_tok = 0;
  int n = 0;  // branches
  int d = 0;
  int r = 0;  // the read gate's bottleneck width
  Real eps = 0;
  const Real* norm = nullptr;      // [n d], applied as 1 + w
  const Real* w_down = nullptr;    // [r, n d]
  const Real* w_up = nullptr;      // [n d, r]
  const Real* w_inject = nullptr;  // [n, n d]; null: the final mixer (no write)
};

// What a module keeps per token for its backward (and the diagnostics): the branch RMS factors
// [n_tok, n], W_down's output p before the SiLU [n_tok, r] (a and G are recomputed from it), the
// write gates beta [n_tok, n] (null for the final mixer) and, when not null, the read gates'
// mean over channels per branch [n_tok, n] (diagnostics only).
template <class Real>
struct GatedResidualSaved {
  Real* rms = nullptr;
  Real* p = nullptr;
  Real* beta = nullptr;
  Real* gate_mean = nullptr;
};

// Every pointer accumulates (+=); w_inject is unused for the final mixer.
template <class Real>
struct GatedResidualGrads {
  Real* norm = nullptr;
  Real* w_down = nullptr;
  Real* w_up = nullptr;
  Real* w_inject = nullptr;
};

// x [n_tok, d]: the sublayer input; fills saved (beta only with a write). scratch: gr_scratch_size.
template <class Real>
void gr_read_forward(const GatedResidual<Real>& m, Real* x, const GatedResidualSaved<Real>& saved, Real* scratch);

// out [n_tok, n, d] = H_i + beta_i y (out may alias H).
template <class Real>
void gr_write_forward(Real* out, const Real* H, const Real* beta, const Real* y, std::int64_t n_tok, int n, int d);

// Given dout = dL/dH': dy [n_tok, d] = sum_i beta_i dout_i (overwritten) and ds [n_tok, n], the
// gradient of the write gate's pre-sigmoid, dbeta_i beta_i (1 - beta_i / 2) with dbeta_i = <dout_i, y>.
// dL/dH gets dout itself (the residual path) from the caller: gr_read_backward adds into it.
template <class Real>
void gr_write_backward(Real* dy, Real* ds, const Real* dout, const Real* y, const Real* beta, std::int64_t n_tok,
                       int n, int d);

// Given dx (the sublayer input's gradient) and ds (gr_write_backward's; null for the final mixer):
// dH += the module's gradient of its branches (dH may hold dout already); the parameter gradients
// accumulate, summed over tokens in fixed chunk order (independent of the thread count).
template <class Real>
void gr_read_backward(const GatedResidual<Real>& m, const GatedResidualSaved<Real>& saved, const Real* dx,
                      const Real* ds, Real* dH, const GatedResidualGrads<Real>& grads, Real* scratch);

std::int64_t gr_scratch_size(std::int64_t n_tok, int n, int d, int r);

}  // namespace attnres::kernels
