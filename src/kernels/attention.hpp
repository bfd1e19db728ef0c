// Causal multi-head attention in blocks of 64 queries: a block's scores against the keys it
// sees are one GEMM, its softmax is exact (no online rescaling), and the product with V another
// GEMM, so memory is O(T) per thread and no T x T matrix is ever stored. The backward
// recomputes probabilities from the saved log-sum-exp, in tiles of 64 queries x 256 keys (a key
// block's dK and dV stay in cache while the later query blocks add to them). On the own fp32 GEMM
// (kernels/gemm_f32.hpp) each head's K and V are packed once, and the results are those of one
// product per query block over all its keys, bit for bit (tests/kernels/test_gemm_f32.cpp).
#pragma once

#include <cstdint>

#include "kernels/gemm_bf16.hpp"

namespace attnres::kernels {

inline constexpr int kMaxHeadDim = 256;

// q, out: [batch, q_len, n_heads*head_dim]; k, v: [batch, kv_stride, n_heads*head_dim].
// Query i sits at position q_pos0 + i and attends keys 0 .. q_pos0 + i (a KV cache uses
// q_pos0 > 0; training uses q_pos0 = 0 and q_len = kv_stride).
struct AttentionShape {
  std::int64_t batch = 0;
  int q_len = 0;
  int kv_stride = 0;
  int n_heads = 0;
  int head_dim = 0;
  int q_pos0 = 0;
};

// lse: [batch, n_heads, q_len], the log-sum-exp of each query's scaled scores.
template <class Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v, const AttentionShape& s);

// dq, dk, dv are overwritten. Requires q_pos0 == 0 and q_len == kv_stride (training).
template <class Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k, const Real* v,
                        const Real* out, const Real* lse, const AttentionShape& s);

// The bf16 variant (models whose matmul precision is bf16): the operands of the five products (Q,
// K, V, P, dO, dS) rounded to bf16 and the products summed in fp32, as in kernels/gemm_bf16.hpp;
// the softmax statistics (max, sum, lse) and D = dO . O (with dO rounded as in dP = dO V^T, so
// that dS = P (dP - D) cancels as it should) stay fp32. Same blocks and O(T) memory as the fp32
// kernel, on the AVX-512 tiles of kernels/avx512_tiles.hpp: VDPBF16PS on bf16 pairs when the
// backend is avx512-bf16 (what bf16_backend() picks on AMD Zen 4/5), fp32 FMAs of the rounded
// operands otherwise (the two differ only in the fp32 summation order). Where AVX-512 is missing
// or head_dim is not a multiple of 16, the fp32 kernel runs instead. backend: as gemm_bf16's (a
// named one that the CPU lacks is an error).
bool attention_bf16_supported(const AttentionShape& s);
void attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                            const AttentionShape& s, Bf16Backend backend = Bf16Backend::automatic);
void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                             const float* v, const float* out, const float* lse, const AttentionShape& s,
                             Bf16Backend backend = Bf16Backend::automatic);

}  // namespace attnres::kernels
