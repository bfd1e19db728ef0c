// The AttnRes depth read (spec §2, §5, §6): per token, a softmax over earlier block outputs
// with RMS-normalised keys and raw values. One call serves one or two routes over the same
// sources (RD-AttnRes), sharing the RMS factors and the key-norm weight: the sources are read
// once per pass whatever the number of routes. Only per-token RMS factors and logits are saved.
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
};

// out[r]: [n_tok, d] per route (out[0] alone when average). rms: [n_tok, n_sources].
// logits: [n_routes, n_tok, n_sources] (rows of uniform routes are left alone).
template <class Real>
void depth_read_forward(const DepthRead<Real>& read, Real* const* out, Real* rms, Real* logits);

// Recomputes one route's output out [n_tok, d] from the logits the forward saved (no pass over
// the sources for RMS factors and dots): bit-identical to that route's forward output. Not for
// averaged reads (their single output mixes both routes).
template <class Real>
void depth_read_route_from_logits(const DepthRead<Real>& read, int route, const Real* logits, Real* out);

// dout[r] per route (dout[0] alone when average). Accumulates (+=) into dsources[s],
// dqueries[r] (skipped where null) and dgamma. Parameter gradients are summed over tokens
// in fixed chunk order. scratch: depth_read_scratch_size.
template <class Real>
void depth_read_backward(const DepthRead<Real>& read, const Real* rms, const Real* logits, const Real* const* dout,
                         Real* const* dsources, Real* const* dqueries, Real* dgamma, Real* scratch);

std::int64_t depth_read_scratch_size(std::int64_t n_tok, int d);

// The depth distribution of one token and route: alpha = softmax(logits) or uniform.
template <class Real>
void depth_weights(const Real* logits, int n_sources, bool uniform, Real* alpha);

}  // namespace attnres::kernels
