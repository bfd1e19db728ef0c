// Row-major GEMMs through CBLAS (OpenBLAS), in the shapes a Linear layer needs; the Linear
// shapes optionally in bf16 (MatmulPrecision).
// Weights are stored [out, in] like PyTorch's nn.Linear.
#pragma once

#include <cstdint>

#include "kernels/precision.hpp"

namespace attnres::kernels {

// C[m,n] = alpha * op(A) op(B) + beta * C, row-major, op = transpose when the flag is set.
template <class Real>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, Real alpha,
          const Real* a, std::int64_t lda, const Real* b, std::int64_t ldb, Real beta, Real* c, std::int64_t ldc);

// y[n,out] = x[n,in] W[out,in]^T   (y += ... when accumulate)
template <class Real>
void linear_forward(Real* y, const Real* x, const Real* w, std::int64_t n, std::int64_t in, std::int64_t out,
                    bool accumulate = false, MatmulPrecision precision = MatmulPrecision::fp32);

// dx[n,in] = dy[n,out] W[out,in]   (dx += ... when accumulate)
template <class Real>
void linear_backward_input(Real* dx, const Real* dy, const Real* w, std::int64_t n, std::int64_t in,
                           std::int64_t out, bool accumulate = false,
                           MatmulPrecision precision = MatmulPrecision::fp32);

// dW[out,in] += dy[n,out]^T x[n,in]
template <class Real>
void linear_backward_weight(Real* dw, const Real* dy, const Real* x, std::int64_t n, std::int64_t in,
                            std::int64_t out, MatmulPrecision precision = MatmulPrecision::fp32);

// The three Linear GEMMs with results that do not depend on the thread count (OpenBLAS's own
// threading splits the work differently per count, and its one- and many-thread paths round
// differently). The work is cut into fixed blocks, of rows for the forward and the input gradient
// and of the weight gradient's input columns (each summing over all n rows), and every block is
// one single-threaded BLAS call; the blocks run in parallel. fp32/fp64 only. For the small
// matmuls of the residual-mixing ops, whose parameter gradients must be reproducible.
template <class Real>
void linear_forward_fixed(Real* y, const Real* x, const Real* w, std::int64_t n, std::int64_t in, std::int64_t out);

template <class Real>
void linear_backward_input_fixed(Real* dx, const Real* dy, const Real* w, std::int64_t n, std::int64_t in,
                                 std::int64_t out);

template <class Real>
void linear_backward_weight_fixed(Real* dw, const Real* dy, const Real* x, std::int64_t n, std::int64_t in,
                                  std::int64_t out);

}  // namespace attnres::kernels
