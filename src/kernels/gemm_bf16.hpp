// A bf16 GEMM with fp32 inputs, outputs and accumulation: the operands are rounded to bf16
// (round to nearest even) while they are packed, the products (exact in fp32) are summed in
// fp32. On CPUs with AMX-BF16 the work runs on the tile unit (TDPBF16PS); elsewhere a
// portable path rounds copies of the operands and calls OpenBLAS' fp32 sgemm, so both paths
// compute the same products and differ only in the fp32 summation order.
//
// Deterministic: every output element is summed by one thread in a fixed k order, so the AMX
// path gives bit-identical results for any thread count.
#pragma once

#include <cstdint>

namespace attnres::kernels {

enum class Bf16Backend {
  automatic,  // AMX when available, else the fallback
  amx,        // AMX; an error when it is not available
  fallback,   // round to bf16, then cblas_sgemm
};

// True when the CPU has AMX-BF16 and AVX512-BF16 and the OS granted the tile state (asked once).
bool amx_bf16_available();

// fp32 -> nearest bf16 (ties to even), returned as fp32. Denormal inputs become (signed) zero
// and NaN stays NaN, which is what the CPU's VCVTNEPS2BF16 does, so both paths round alike.
float round_to_bf16(float x);
std::uint16_t bf16_bits(float x);  // the same rounding, as the 16-bit pattern

// C[m,n] = alpha * op(A) op(B) + beta * C, row-major like kernels::gemm<float>; op(A) and op(B)
// rounded to bf16. beta == 0: C is not read.
void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc, Bf16Backend backend = Bf16Backend::automatic);

}  // namespace attnres::kernels
