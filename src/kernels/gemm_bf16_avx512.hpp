// The AVX-512 backends of kernels::gemm_bf16 (dispatched from kernels/gemm_bf16.cpp): packed
// panels and a 14 x 32 register tile, every C element summed by one thread in k order, so the
// result is bit-identical for any thread count.
//   fma:    operands rounded to bf16 and kept as fp32, one FMA per product (AVX-512F);
//   dpbf16: operands packed as bf16 pairs, VDPBF16PS (AVX512_BF16), two products per lane and
//           instruction, the odd k's product added first (the instruction's order).
// Both compute the products of the bf16-rounded operands exactly and sum them in fp32; they
// differ from each other (and from AMX and the fallback) only in the fp32 summation order.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attnres::kernels::avx512 {

enum class Dot { fma, dpbf16 };

bool cpu_has_avx512();       // AVX-512 F, BW, VL, DQ, FMA, and the OS saves the ZMM state
bool cpu_has_avx512_bf16();  // ... and AVX512_BF16
bool cpu_is_amd();

// C[m,n] = alpha * op(A) op(B) + beta * C (C not read when beta == 0); m, n, k > 0. packed_b: op(B)
// as pack_b wrote it for the same dot, trans_b, n and k (b is then not read), or null.
void gemm_bf16(Dot dot, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc, const float* packed_b = nullptr);

// op(B) (n columns, k deep) in the panel layout gemm_bf16 packs it into: packed_b_size floats, to be
// used by several products (64-byte aligned).
std::size_t packed_b_size(Dot dot, std::int64_t n, std::int64_t k);
void pack_b(Dot dot, bool trans_b, std::int64_t n, std::int64_t k, const float* b, std::int64_t ldb, float* out);

}  // namespace attnres::kernels::avx512
