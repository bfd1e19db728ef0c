// The AttnRes depth read (spec §2, §5, §6): per token, a softmax over earlier block outputs
// with RMS-normalised keys and raw values. One call serves one or two routes over the same
// sources (RD-AttnRes), sharing the RMS factors and the key-norm weight: the sources are read
// once per pass whatever the number of routes. Only per-token RMS factors, logits and weights are
// saved.
// An output can carry its sublayer's input RMSNorm (RD's value route): the read then emits the
// normalised row, and the backward recomputes the mix per token instead of storing it.
#pragma once

#include <cstdint>

namespace attnres::kernels {

inline constexpr int kMaxSources = 256;
inline constexpr int kMaxRoutes = 2;

template <class Real>
struct DepthRead {
  const Real* const* sources = nullptr;  // n_sources pointers, each [n_tok, d]
  int n_sources = 0;
  std::int64_t n_tok = 0;
  int d = 0;
  Real eps = 0;
  const Real* gamma = nullptr;  // key-norm weight [d], shared by the routes
  int n_routes = 1;
  const Real* queries[kMaxRoutes] = {};  // pseudo-query [d] per route; nullptr = uniform route
  bool average = false;                  // a single output, the mean of the routes' mixes
  // Where set, output o is RMSNorm(mix_o) * out_norm[o] (with eps above) instead of mix_o.
  const Real* out_norm[kMaxRoutes] = {};
};

// What the backward reads and accumulates into (entries of unused outputs/routes are ignored).
template <class Real>
struct DepthReadGrads {
  const Real* dout[kMaxRoutes] = {};  // per output [n_tok, d]: the gradient of out[o] as the forward wrote it
  Real* const* dsources = nullptr;    // += per source [n_tok, d]
  Real* dqueries[kMaxRoutes] = {};    // += per route [d]; null = not wanted
  Real* dgamma = nullptr;             // += [d]
  Real* dout_norm[kMaxRoutes] = {};   // += per normalised output [d]: its norm weight's gradient
  Real* out[kMaxRoutes] = {};         // optional, per normalised output: receives the forward's out[o]
                                      // again, bit for bit (for the weight gradient that reads it);
                                      // may be dout[o]'s buffer, which it then overwrites
};

// out[r]: [n_tok, d] per route (out[0] alone when average). rms: [n_tok, n_sources].
// logits: [n_routes, n_tok, n_sources] (rows of uniform routes are left alone).
// alpha: [n_routes, n_tok, n_sources], the depth weights depth_weights makes of the logits (or
// uniform), kept so that the backward takes no exponentials (a sixth of its time at d = 64).
template <class Real>
void depth_read_forward(const DepthRead<Real>& read, Real* const* out, Real* rms, Real* logits, Real* alpha);

// Parameter gradients are summed over tokens in fixed chunk order. scratch: depth_read_scratch_size.
template <class Real>
void depth_read_backward(const DepthRead<Real>& read, const Real* rms, const Real* logits, const Real* alpha,
                         const DepthReadGrads<Real>& grads, Real* scratch);

std::int64_t depth_read_scratch_size(std::int64_t n_tok, int d);

// The depth distribution of one token and route: alpha = softmax(logits) or uniform.
template <class Real>
void depth_weights(const Real* logits, int n_sources, bool uniform, Real* alpha);

}  // namespace attnres::kernels
