// The LM head fused with softmax cross-entropy: logits are made a chunk of rows at a time
// and turned into their gradient in place, so probabilities for the whole batch never exist.
#pragma once

#include <cstdint>

#include "kernels/gemm.hpp"

namespace attnres::kernels {

template <class Real>
struct CrossEntropyScratch {
  Real* logits = nullptr;      // [rows, vocab]
  double* row_loss = nullptr;  // [rows]
  std::int64_t rows = 0;
};

// Returns the sum over the n tokens of -log softmax(x W^T)[target]. When dx is not null it
// also writes dx = grad_scale * dL/dx and adds grad_scale * dL/dW into dw. `precision` is that of
// the three LM-head GEMMs (the softmax is computed in Real).
template <class Real>
double lm_head_cross_entropy(const Real* x, const Real* w, const std::int32_t* targets, std::int64_t n, int d,
                             int vocab, const CrossEntropyScratch<Real>& scratch, Real grad_scale, Real* dx,
                             Real* dw, MatmulPrecision precision = MatmulPrecision::fp32);

}  // namespace attnres::kernels
