// Row-major GEMMs through cuBLASLt, in the shapes of kernels/gemm.hpp.
//
// fp32 operands: CUBLAS_COMPUTE_32F, i.e. plain fp32 FMA (TF32 is never enabled; set
// NVIDIA_TF32_OVERRIDE=0 to also rule it out globally). bf16 operands: bf16 x bf16 products
// accumulated in fp32 (CUBLAS_COMPUTE_32F), output fp32 or bf16. Alpha and beta are fp32.
//
// Algorithms come from cuBLASLt's heuristic, cached per (shape, types, alignments), so repeated
// calls cost one cublasLtMatmul each; a given shape always runs the same algorithm (deterministic).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "cuda/buffer.hpp"

struct CUstream_st;

namespace attnres::cuda {

using Stream = CUstream_st*;  // cudaStream_t

class Gemm {
 public:
  explicit Gemm(Stream stream, std::size_t workspace_bytes = std::size_t(32) << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // D[m,n] = alpha * op(A) op(B) + beta * C, row-major, op = transpose when the flag is set.
  // A and B have type `ab`; C and D have type `cd` and leading dimension ldc. C may equal D
  // (in place) or be null when beta == 0.
  void run(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a,
           std::int64_t lda, const void* b, std::int64_t ldb, DType ab, float beta, const void* c, void* d,
           std::int64_t ldc, DType cd);

  // The Linear shapes (weights [out, in]):
  // y[n,out] = x[n,in] W^T (+ base[n,out] when base is not null; base may equal y).
  void linear_forward(void* y, DType y_type, const void* x, const void* w, DType xw_type, std::int64_t n,
                      std::int64_t in, std::int64_t out, const void* base = nullptr);
  // dx[n,in] = dy[n,out] W   (dx += ... when accumulate)
  void linear_backward_input(void* dx, DType dx_type, const void* dy, const void* w, DType type, std::int64_t n,
                             std::int64_t in, std::int64_t out, bool accumulate = false);
  // dW[out,in] += dy[n,out]^T x[n,in]   (dW fp32)
  void linear_backward_weight(float* dw, const void* dy, const void* x, DType type, std::int64_t n, std::int64_t in,
                              std::int64_t out);

  Stream stream() const { return stream_; }
  std::size_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  struct Plan;
  using Key = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t, int, int, int, int, int, int, int>;
  const Plan& plan(const Key& key);

  Stream stream_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace attnres::cuda
