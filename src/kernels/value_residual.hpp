// ResFormer's value residual (baselines-spec §5): attention sublayers after the first mix their
// value projection with the first one's, V' = lambda1 V_1 + lambda2 V_n (the projected values
// before the head split; RoPE never touches V). Per element; nothing is saved beyond V_1 and V_n.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace attnres::kernels {

// How (lambda1, lambda2) come about (vres_mode): fixed 0.5/0.5, one learned scalar p with
// (p, 1 - p), two learned scalars, or two configured constants.
enum class VresMode { fixed, learned_convex, learned_pair, constant };
inline constexpr std::array kVresModes = {VresMode::fixed, VresMode::learned_convex, VresMode::learned_pair,
                                          VresMode::constant};
std::string to_string(VresMode mode);

// Learned scalars per layer: 0, 1 or 2.
int vres_parameter_count(VresMode mode);

// The layer's lambdas from its parameters (vres_parameter_count of them) or the constants.
template <class Real>
std::array<Real, 2> vres_lambdas(VresMode mode, const Real* params, Real constant1, Real constant2);

// dparams += the parameters' gradients given dL/dlambda1 and dL/dlambda2 (convex: g1 - g2).
template <class Real>
void vres_parameter_gradients(VresMode mode, Real dlambda1, Real dlambda2, Real* dparams);

template <class Real>
struct ValueResidual {
  const Real* v1 = nullptr;  // [n_tok, d] the first attention sublayer's values
  const Real* vn = nullptr;  // [n_tok, d] this sublayer's own values
  std::int64_t n_tok = 0;
  int d = 0;
  Real lambda1 = 0;
  Real lambda2 = 1;
};

// out = lambda1 v1 + lambda2 vn (out may alias vn). With (0, 1) out equals vn exactly.
template <class Real>
void value_residual_forward(const ValueResidual<Real>& vr, Real* out);

// dvn = lambda2 dout (overwritten; may alias dout), dv1 += lambda1 dout, and when dlambda is set,
// dlambda[0..1] += sum <dout, v1>, sum <dout, vn> over tokens in fixed chunk order. vn must still
// hold the raw values (not aliased by out). scratch: value_residual_scratch_size.
template <class Real>
void value_residual_backward(const ValueResidual<Real>& vr, const Real* dout, Real* dvn, Real* dv1, Real* dlambda,
                             Real* scratch);

std::int64_t value_residual_scratch_size(std::int64_t n_tok);

}  // namespace attnres::kernels
