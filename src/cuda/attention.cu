// Causal multi-head attention on the GPU, flash style (kernels/attention semantics): keys are
// visited in tiles with an online softmax, only the log-sum-exp per query is saved, and the
// backward recomputes the probabilities. Layout: q, k, v, out [batch, seq, n_heads*head_dim];
// lse and delta [batch, n_heads, seq]; scores scaled by 1/sqrt(head_dim).
//
// Two implementations:
// - SIMT (any element type, head_dim <= 256): fp32 FMA arithmetic, 4 lanes per query (or key)
//   row, 32 rows per block, K/V (or Q/dO) tiles of 32 rows in shared memory as fp32. Used in
//   fp32 mode (exact fp32, no tensor cores) and for head dims without a tensor-core kernel.
// - WMMA (bf16, head_dim 64 or 128): 64x64 tiles, 4 warps of 16 rows, bf16 tensor-core
//   products with fp32 accumulation; the softmax runs in fp32 on shared-memory score tiles.
//   Probabilities are rounded to bf16 before the P.V product (as in FlashAttention).
// Both backward passes are deterministic: dK/dV by one block per key tile, dQ by one block per
// query tile (no atomics), each recomputing the probabilities from lse.
//
// This file: the delta kernel both backward passes use and the dispatch; the kernels are in
// attention_simt.cu and attention_wmma.cu (attention_impl.cuh declares their entry points).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/attention_impl.cuh"

namespace attnres::cuda::kern {

namespace {

// delta[b, h, i] = dout_i . out_i over the head: one warp per (row, head).
template <class T>
__global__ void attn_delta_kernel(const T* dout, const T* out, float* delta, std::int64_t rows, int seq, int n_heads,
                                  int hd) {
  const int lane = threadIdx.x & 31;
  const std::int64_t g = blockIdx.x * std::int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (g >= rows * n_heads) return;
  const std::int64_t row = g / n_heads;
  const int h = static_cast<int>(g - row * n_heads);
  const std::int64_t off = row * n_heads * std::int64_t(hd) + std::int64_t(h) * hd;
  float s = 0.0f;
  for (int e = lane; e < hd; e += 32) s = fmaf(to_float(dout[off + e]), to_float(out[off + e]), s);
  s = warp_sum(s);
  if (lane == 0) {
    const std::int64_t b = row / seq;
    const int i = static_cast<int>(row - b * seq);
    delta[(b * n_heads + h) * seq + i] = s;
  }
}

bool use_wmma(DType type, int hd, AttentionImpl impl) {
  require(impl != AttentionImpl::cudnn,
          "CUDA attention: the cuDNN implementation runs through cuda::Attention, not kern::attention_*");
  if (impl == AttentionImpl::simt) return false;
  const bool ok = attention_has_wmma(type, hd);
  if (impl == AttentionImpl::wmma)
    require(ok, "CUDA attention: the tensor-core kernels need bf16 and head_dim 64 or 128 (got ", to_string(type),
            ", ", hd, ")");
  return ok;
}

void check_shape(const AttentionShape& s) {
  require(s.batch >= 1 && s.batch <= 65535 && s.seq >= 1 && s.n_heads >= 1 && s.n_heads <= 65535,
          "CUDA attention: bad shape");
}

}  // namespace

bool attention_has_wmma(DType type, int head_dim) {
  return type == DType::bf16 && (head_dim == 64 || head_dim == 128);
}

void attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, DType type,
                       const AttentionShape& shape, Stream stream, AttentionImpl impl) {
  check_shape(shape);
  if (use_wmma(type, shape.head_dim, impl)) wmma_attention_forward(out, lse, q, k, v, shape, stream);
  else simt_attention_forward(out, lse, q, k, v, type, shape, stream);
}

void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                        const void* out, const float* lse, float* delta, DType type, const AttentionShape& shape,
                        Stream stream, AttentionImpl impl) {
  check_shape(shape);
  const std::int64_t rows = shape.batch * shape.seq;
  const unsigned blocks = static_cast<unsigned>((rows * shape.n_heads + 7) / 8);
  if (type == DType::f32)
    attn_delta_kernel<float><<<blocks, 256, 0, stream>>>(static_cast<const float*>(dout),
                                                         static_cast<const float*>(out), delta, rows, shape.seq,
                                                         shape.n_heads, shape.head_dim);
  else
    attn_delta_kernel<bf16><<<blocks, 256, 0, stream>>>(static_cast<const bf16*>(dout), static_cast<const bf16*>(out),
                                                        delta, rows, shape.seq, shape.n_heads, shape.head_dim);
  ATTNRES_CUDA_CHECK_LAUNCH();
  if (use_wmma(type, shape.head_dim, impl)) wmma_attention_backward(dq, dk, dv, dout, q, k, v, lse, delta, shape, stream);
  else simt_attention_backward(dq, dk, dv, dout, q, k, v, lse, delta, type, shape, stream);
}

}  // namespace attnres::cuda::kern
