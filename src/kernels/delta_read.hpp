// Delta AttnRes's read (docs/delta-gated-spec.md §1.2-1.4): an AttnRes depth read over the deltas,
// c = sum_s alpha_s v_s (kernels/depth_read: RMS-normalised keys, raw values, no temperature), added
// to the residual stream through a gate, h = x + g ⊙ c, instead of replacing it. One call serves
// one route (Q/K) or two (plus the V route, whose query and key-norm weight are its own: unlike
// RD's value route the routes share no key norm, so each is its own single-route depth read over
// the same sources). The gate is shared by the routes. What the backward needs is kept by the
// caller: per route the mix c and the logits, the sources' RMS factors, the vector gate's values.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "kernels/depth_read.hpp"

namespace attnres::kernels {

// The gate g of h = x + g c (§1.3): none (g = 1), sigmoid(logit) (one scalar per read),
// sigmoid(W x + b) per channel from the stream, or a learned factor a (0 at init: pre-norm).
enum class DeltaGate { none, sigmoid_scalar, sigmoid_vector, learnable_alpha };
inline constexpr std::array kDeltaGates = {DeltaGate::none, DeltaGate::sigmoid_scalar, DeltaGate::sigmoid_vector,
                                           DeltaGate::learnable_alpha};
std::string to_string(DeltaGate gate);

template <class Real>
struct DeltaRead {
  DepthRead<Real> routes[kMaxRoutes];  // single-route reads over the same sources (n_routes of them)
  int n_routes = 1;
  const Real* x = nullptr;  // the stream [n_tok, d]
  DeltaGate gate = DeltaGate::none;
  const Real* gate_param = nullptr;  // logit [1], alpha [1] or W [d, d] ([out, in])
  const Real* gate_bias = nullptr;   // sigmoid_vector: b [d]
  std::int64_t n_tok() const { return routes[0].n_tok; }
  int d() const { return routes[0].d; }
};

// The forward's record, which the backward reads (buffers of the caller).
template <class Real>
struct DeltaReadState {
  Real* c[kMaxRoutes] = {};       // per route: the mix [n_tok, d]
  Real* logits[kMaxRoutes] = {};  // per route: [n_tok, n_sources]
  Real* alpha[kMaxRoutes] = {};   // per route: the weights [n_tok, n_sources]
  Real* rms = nullptr;            // [n_tok, n_sources], shared by the routes
  Real* g = nullptr;              // sigmoid_vector: the gates [n_tok, d] (else unused)
};

template <class Real>
struct DeltaReadGrads {
  const Real* dh[kMaxRoutes] = {};  // per route: the gradient of h [n_tok, d]
  Real* const* dsources = nullptr;  // += per source [n_tok, d]
  Real* dqueries[kMaxRoutes] = {};  // += per route [d]
  Real* dgamma[kMaxRoutes] = {};    // += per route [d]
  Real* dx = nullptr;               // += [n_tok, d]: the stream's gradient (dh and the vector gate's path)
  Real* dgate_param = nullptr;      // += as gate_param
  Real* dgate_bias = nullptr;       // += [d]
};

// h[r] = x + g ⊙ c[r] per route; fills state.
template <class Real>
void delta_read_forward(const DeltaRead<Real>& read, const DeltaReadState<Real>& state, Real* const* h);

// work: two [n_tok, d] buffers (g ⊙ dh, and the vector gate's pre-activation gradient);
// scratch: delta_read_scratch_size. Parameter gradients are summed over tokens in fixed order.
template <class Real>
void delta_read_backward(const DeltaRead<Real>& read, const DeltaReadState<Real>& state,
                         const DeltaReadGrads<Real>& grads, Real* work0, Real* work1, Real* scratch);

std::int64_t delta_read_scratch_size(std::int64_t n_tok, int d);

}  // namespace attnres::kernels
