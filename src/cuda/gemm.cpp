#include "cuda/gemm.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/check.hpp"
#include "util/error.hpp"

namespace attnres::cuda {

namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::f32 ? CUDA_R_32F : CUDA_R_16BF; }

// Largest power of two (at most 256) dividing the address: cuBLASLt's heuristic assumes 256-byte
// aligned buffers unless told otherwise, and parameter views into the flat buffer need not be.
int alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a == 0) return 256;
  int al = 1;
  while (al < 256 && (a & static_cast<std::uintptr_t>(al)) == 0) al *= 2;
  return al;
}

}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

Gemm::Gemm(Stream stream, std::size_t workspace_bytes) : stream_(stream), workspace_(workspace_bytes) {
  cublasLtHandle_t h = nullptr;
  ATTNRES_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
}

Gemm::~Gemm() {
  plans_.clear();
  if (handle_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

// Key: column-major (transa, transb, m, n, k, lda, ldb, ldc, ab, cd, beta != 0, alignments a b c d).
const Gemm::Plan& Gemm::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  const auto [ta, tb, m, n, k, lda, ldb, ldc, ab_i, cd_i, beta_nz, al_a, al_b, al_c, al_d] = key;
  (void)beta_nz;
  const auto ab = static_cast<DType>(ab_i), cd = static_cast<DType>(cd_i);
  auto p = std::make_unique<Plan>();
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = ta != 0 ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb != 0 ? CUBLAS_OP_T : CUBLAS_OP_N;
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  // Stored shapes (column-major): A is m x k (or k x m when transposed), B is k x n (or n x k).
  ATTNRES_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, cuda_type(ab), ta != 0 ? k : m, ta != 0 ? m : k, lda));
  ATTNRES_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, cuda_type(ab), tb != 0 ? n : k, tb != 0 ? k : n, ldb));
  ATTNRES_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, cuda_type(cd), m, n, ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t ws = workspace_.bytes();
  const std::uint32_t aa = static_cast<std::uint32_t>(al_a), ba = static_cast<std::uint32_t>(al_b),
                      ca = static_cast<std::uint32_t>(al_c), da = static_cast<std::uint32_t>(al_d);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ba, sizeof(ba));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ca, sizeof(ca));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &da, sizeof(da));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->desc, p->a, p->b, p->c, p->c,
                                            pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  ATTNRES_CUBLAS_CHECK(status);
  require(found > 0, "cuBLASLt has no algorithm for a ", to_string(ab), " GEMM (column-major m=", m, " n=", n,
          " k=", k, ", ", to_string(cd), " output)");
  p->algo = result.algo;
  return *plans_.emplace(key, std::move(p)).first->second;
}

void Gemm::run(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const void* a, std::int64_t lda, const void* b, std::int64_t ldb, DType ab, float beta, const void* c,
               void* d, std::int64_t ldc, DType cd) {
  if (m == 0 || n == 0) return;
  if (beta == 0.0f || c == nullptr) {
    beta = 0.0f;
    c = d;
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  const Key key{trans_b ? 1 : 0, trans_a ? 1 : 0, n,  m, k, ldb, lda, ldc, static_cast<int>(ab),
                static_cast<int>(cd), beta != 0.0f ? 1 : 0, alignment(b), alignment(a), alignment(c),
                alignment(d)};
  const Plan& p = plan(key);
  ATTNRES_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.desc, &alpha, b, p.a, a, p.b, &beta,
                                      c, p.c, d, p.c, &p.algo, workspace_.data(), workspace_.bytes(), stream_));
}

void Gemm::linear_forward(void* y, DType y_type, const void* x, const void* w, DType xw_type, std::int64_t n,
                          std::int64_t in, std::int64_t out, const void* base) {
  run(false, true, n, out, in, 1.0f, x, in, w, in, xw_type, base != nullptr ? 1.0f : 0.0f, base, y, out, y_type);
}

void Gemm::linear_backward_input(void* dx, DType dx_type, const void* dy, const void* w, DType type, std::int64_t n,
                                 std::int64_t in, std::int64_t out, bool accumulate) {
  run(false, false, n, in, out, 1.0f, dy, out, w, in, type, accumulate ? 1.0f : 0.0f, accumulate ? dx : nullptr, dx,
      in, dx_type);
}

void Gemm::linear_backward_weight(float* dw, const void* dy, const void* x, DType type, std::int64_t n,
                                  std::int64_t in, std::int64_t out) {
  run(true, false, out, in, n, 1.0f, dy, out, x, in, type, 1.0f, dw, dw, in, DType::f32);
}

}  // namespace attnres::cuda
