#include "kernels/value_residual.hpp"

#include <algorithm>

#include "kernels/reduce.hpp"
#include "kernels/row_ops.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

std::string to_string(VresMode mode) {
  switch (mode) {
    case VresMode::fixed: return "fixed";
    case VresMode::learned_convex: return "learned_convex";
    case VresMode::learned_pair: return "learned_pair";
    case VresMode::constant: return "constant";
  }
  return "?";
}

int vres_parameter_count(VresMode mode) {
  switch (mode) {
    case VresMode::learned_convex: return 1;
    case VresMode::learned_pair: return 2;
    default: return 0;
  }
}

template <class Real>
std::array<Real, 2> vres_lambdas(VresMode mode, const Real* params, Real constant1, Real constant2) {
  switch (mode) {
    case VresMode::fixed: return {Real(0.5), Real(0.5)};
    case VresMode::learned_convex: return {params[0], Real(1) - params[0]};
    case VresMode::learned_pair: return {params[0], params[1]};
    case VresMode::constant: break;
  }
  return {constant1, constant2};
}

template <class Real>
void vres_parameter_gradients(VresMode mode, Real dlambda1, Real dlambda2, Real* dparams) {
  if (mode == VresMode::learned_convex) dparams[0] += dlambda1 - dlambda2;
  if (mode == VresMode::learned_pair) {
    dparams[0] += dlambda1;
    dparams[1] += dlambda2;
  }
}

std::int64_t value_residual_scratch_size(std::int64_t n_tok) { return 2 * num_chunks(n_tok); }

template <class Real>
void value_residual_forward(const ValueResidual<Real>& vr, Real* out) {
  const std::int64_t n = vr.n_tok * vr.d;
  const Real l1 = vr.lambda1, l2 = vr.lambda2;
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) out[i] = l1 * vr.v1[i] + l2 * vr.vn[i];
}

template <class Real>
void value_residual_backward(const ValueResidual<Real>& vr, const Real* dout, Real* dvn, Real* dv1, Real* dlambda,
                             Real* scratch) {
  const int d = vr.d;
  const std::int64_t chunks = num_chunks(vr.n_tok);
  const Real l1 = vr.lambda1, l2 = vr.lambda2;
#pragma omp parallel for schedule(static) if (vr.n_tok * d >= kParallelMin)
  for (std::int64_t ch = 0; ch < chunks; ++ch) {
    Real s1 = 0, s2 = 0;
    const std::int64_t t_end = std::min(vr.n_tok, (ch + 1) * kReduceChunk);
    for (std::int64_t t = ch * kReduceChunk; t < t_end; ++t) {
      const Real* g = dout + t * d;
      if (dlambda != nullptr) {
        s1 += dot(g, vr.v1 + t * d, d);
        s2 += dot(g, vr.vn + t * d, d);
      }
      Real* a = dv1 + t * d;
      Real* b = dvn + t * d;
#pragma omp simd
      for (int k = 0; k < d; ++k) {
        const Real gk = g[k];
        a[k] += l1 * gk;
        b[k] = l2 * gk;
      }
    }
    scratch[2 * ch] = s1;
    scratch[2 * ch + 1] = s2;
  }
  if (dlambda != nullptr) sum_chunks_into(dlambda, scratch, chunks, 2);
}

#define ATTNRES_INSTANTIATE(Real)                                                                              \
  template std::array<Real, 2> vres_lambdas<Real>(VresMode, const Real*, Real, Real);                         \
  template void vres_parameter_gradients<Real>(VresMode, Real, Real, Real*);                                   \
  template void value_residual_forward<Real>(const ValueResidual<Real>&, Real*);                               \
  template void value_residual_backward<Real>(const ValueResidual<Real>&, const Real*, Real*, Real*, Real*,    \
                                              Real*);
ATTNRES_INSTANTIATE(float)
ATTNRES_INSTANTIATE(double)
#undef ATTNRES_INSTANTIATE

}  // namespace attnres::kernels
