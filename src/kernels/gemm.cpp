#include "kernels/gemm.hpp"

#include <cblas.h>

#include <algorithm>

#include <type_traits>

#include "kernels/gemm_bf16.hpp"
#include "kernels/gemm_f32.hpp"
#include "util/error.hpp"

namespace attnres::kernels {

namespace {
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k, float alpha, const float* a,
               blasint lda, const float* b, blasint ldb, float beta, float* c, blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k, double alpha,
               const double* a, blasint lda, const double* b, blasint ldb, double beta, double* c, blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
// The Linear GEMMs: fp32 on the fp32 GEMM backend (kernels/gemm_f32.hpp: the AVX2 kernel or
// OpenBLAS), fp64 through BLAS, or bf16 operands with fp32 accumulation.
template <class Real>
void linear_gemm(MatmulPrecision precision, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                 std::int64_t k, const Real* a, std::int64_t lda, const Real* b, std::int64_t ldb, Real beta, Real* c,
                 std::int64_t ldc) {
  if (precision == MatmulPrecision::bf16) {
    if constexpr (std::is_same_v<Real, float>) {
      gemm_bf16(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
      return;
    } else {
      fail("bf16 matmuls need a float model (this one computes in double)");
    }
  }
  if constexpr (std::is_same_v<Real, float>) {
    if (own_fp32_gemm()) {
      gemm_f32(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta != 0.0f, c, ldc);
      return;
    }
  }
  gemm<Real>(trans_a, trans_b, m, n, k, Real(1), a, lda, b, ldb, beta, c, ldc);
}
}  // namespace

template <class Real>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, Real alpha, const Real* a,
          std::int64_t lda, const Real* b, std::int64_t ldb, Real beta, Real* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  blas_gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
            static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
            static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

template <class Real>
void linear_forward(Real* y, const Real* x, const Real* w, std::int64_t n, std::int64_t in, std::int64_t out,
                    bool accumulate, MatmulPrecision precision) {
  linear_gemm<Real>(precision, false, true, n, out, in, x, in, w, in, accumulate ? Real(1) : Real(0), y, out);
}

template <class Real>
void linear_backward_input(Real* dx, const Real* dy, const Real* w, std::int64_t n, std::int64_t in,
                           std::int64_t out, bool accumulate, MatmulPrecision precision) {
  linear_gemm<Real>(precision, false, false, n, in, out, dy, out, w, in, accumulate ? Real(1) : Real(0), dx, in);
}

template <class Real>
void linear_backward_weight(Real* dw, const Real* dy, const Real* x, std::int64_t n, std::int64_t in,
                            std::int64_t out, MatmulPrecision precision) {
  linear_gemm<Real>(precision, true, false, out, in, n, dy, out, x, in, Real(1), dw, in);
}

namespace {
constexpr std::int64_t kFixedRows = 256;  // rows per block (forward, input gradient)
constexpr std::int64_t kFixedCols = 64;   // weight-gradient input columns per block

// Every block must run on one BLAS thread whatever the count. Inside an active parallel region
// OpenBLAS (OpenMP build) runs single-threaded; with one OpenMP thread OpenBLAS has one too
// (set_num_threads sets both). A region is skipped (run inactive, which saves the fork on a busy
// machine) only for products OpenBLAS runs single-threaded anyway: m*n*k <= 65536 *
// GEMM_MULTITHREAD_THRESHOLD (4, its default) in interface/gemm.c.
constexpr std::int64_t kSingleThreadedBlasWork = 65536 * 4;
}  // namespace

template <class Real>
void linear_forward_fixed(Real* y, const Real* x, const Real* w, std::int64_t n, std::int64_t in, std::int64_t out) {
  const std::int64_t blocks = (n + kFixedRows - 1) / kFixedRows;
#pragma omp parallel for schedule(static) if (n * in * out > kSingleThreadedBlasWork)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t r0 = b * kFixedRows, rows = std::min(kFixedRows, n - r0);
    gemm<Real>(false, true, rows, out, in, Real(1), x + r0 * in, in, w, in, Real(0), y + r0 * out, out);
  }
}

template <class Real>
void linear_backward_input_fixed(Real* dx, const Real* dy, const Real* w, std::int64_t n, std::int64_t in,
                                 std::int64_t out) {
  const std::int64_t blocks = (n + kFixedRows - 1) / kFixedRows;
#pragma omp parallel for schedule(static) if (n * in * out > kSingleThreadedBlasWork)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t r0 = b * kFixedRows, rows = std::min(kFixedRows, n - r0);
    gemm<Real>(false, false, rows, in, out, Real(1), dy + r0 * out, out, w, in, Real(0), dx + r0 * in, in);
  }
}

template <class Real>
void linear_backward_weight_fixed(Real* dw, const Real* dy, const Real* x, std::int64_t n, std::int64_t in,
                                  std::int64_t out) {
  const std::int64_t blocks = (in + kFixedCols - 1) / kFixedCols;
#pragma omp parallel for schedule(static) if (n * in * out > kSingleThreadedBlasWork)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t c0 = b * kFixedCols, cols = std::min(kFixedCols, in - c0);
    gemm<Real>(true, false, out, cols, n, Real(1), dy, out, x + c0, in, Real(1), dw + c0, in);
  }
}

#define ATTNRES_INSTANTIATE(Real)                                                                              \
  template void linear_forward_fixed<Real>(Real*, const Real*, const Real*, std::int64_t, std::int64_t,       \
                                           std::int64_t);                                                     \
  template void linear_backward_input_fixed<Real>(Real*, const Real*, const Real*, std::int64_t, std::int64_t, \
                                                  std::int64_t);                                              \
  template void linear_backward_weight_fixed<Real>(Real*, const Real*, const Real*, std::int64_t, std::int64_t, \
                                                   std::int64_t);                                             \
  template void gemm<Real>(bool, bool, std::int64_t, std::int64_t, std::int64_t, Real, const Real*,           \
                           std::int64_t, const Real*, std::int64_t, Real, Real*, std::int64_t);               \
  template void linear_forward<Real>(Real*, const Real*, const Real*, std::int64_t, std::int64_t, std::int64_t, \
                                     bool, MatmulPrecision);                                                   \
  template void linear_backward_input<Real>(Real*, const Real*, const Real*, std::int64_t, std::int64_t,      \
                                            std::int64_t, bool, MatmulPrecision);                              \
  template void linear_backward_weight<Real>(Real*, const Real*, const Real*, std::int64_t, std::int64_t,     \
                                             std::int64_t, MatmulPrecision);
ATTNRES_INSTANTIATE(float)
ATTNRES_INSTANTIATE(double)
#undef ATTNRES_INSTANTIATE

}  // namespace attnres::kernels
