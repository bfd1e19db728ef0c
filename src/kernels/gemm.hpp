// Row-major GEMMs through CBLAS (OpenBLAS), in the shapes a Linear layer needs.
// Weights are stored [out, in] like PyTorch's nn.Linear.
#pragma once

#include <cstdint>

namespace attnres::kernels {

// C[m,n] = alpha * op(A) op(B) + beta * C, row-major, op = transpose when the flag is set.
template <class Real>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, Real alpha,
          const Real* a, std::int64_t lda, const Real* b, std::int64_t ldb, Real beta, Real* c, std::int64_t ldc);

// y[n,out] = x[n,in] W[out,in]^T   (y += ... when accumulate)
template <class Real>
void linear_forward(Real* y, const Real* x, const Real* w, std::int64_t n, std::int64_t in, std::int64_t out,
                    bool accumulate = false);

// dx[n,in] = dy[n,out] W[out,in]   (dx += ... when accumulate)
template <class Real>
void linear_backward_input(Real* dx, const Real* dy, const Real* w, std::int64_t n, std::int64_t in,
                           std::int64_t out, bool accumulate = false);

// dW[out,in] += dy[n,out]^T x[n,in]
template <class Real>
void linear_backward_weight(Real* dw, const Real* dy, const Real* x, std::int64_t n, std::int64_t in,
                            std::int64_t out);

}  // namespace attnres::kernels
