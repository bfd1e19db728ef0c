// SwiGLU activation: act = silu(gate) * up, elementwise.
#pragma once

#include <cstdint>

namespace attnres::kernels {

template <class Real>
void swiglu_forward(Real* act, const Real* gate, const Real* up, std::int64_t n);

// dgate, dup overwritten.
template <class Real>
void swiglu_backward(Real* dgate, Real* dup, const Real* dact, const Real* gate, const Real* up, std::int64_t n);

}  // namespace attnres::kernels
