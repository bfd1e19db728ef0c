// CPU stand-in for cuda/gemm.cpp (same header): row-major loops, fp32 accumulation.
#include "cuda/gemm.hpp"
#include <cuda_bf16.h>
#include <vector>

namespace attnres::cuda {
struct Gemm::Plan {};
Gemm::Gemm(Stream stream, std::size_t ws) : stream_(stream), workspace_(ws) {}
Gemm::~Gemm() = default;
namespace {
float get(const void* p, DType t, std::int64_t i) {
  return t == DType::f32 ? static_cast<const float*>(p)[i] : __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
void put(void* p, DType t, std::int64_t i, float v) {
  if (t == DType::f32) static_cast<float*>(p)[i] = v;
  else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}
}  // namespace
void Gemm::run(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a,
               std::int64_t lda, const void* b, std::int64_t ldb, DType ab, float beta, const void* c, void* d,
               std::int64_t ldc, DType cd) {
  if (beta == 0.0f || c == nullptr) { beta = 0; c = d; }
  std::vector<float> out(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float s = 0;
      for (std::int64_t l = 0; l < k; ++l)
        s += get(a, ab, ta ? l * lda + i : i * lda + l) * get(b, ab, tb ? j * ldb + l : l * ldb + j);
      out[i * n + j] = alpha * s + (beta != 0 ? beta * get(c, cd, i * ldc + j) : 0.0f);
    }
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) put(d, cd, i * ldc + j, out[i * n + j]);
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
