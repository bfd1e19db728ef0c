// Internal to the CUDA attention (attention.cu dispatches, attention_simt.cu and attention_wmma.cu
// implement): the entry points of the two implementations and what they share. Semantics and
// layouts are those of kernels.hpp's attention_forward/backward (see attention.cu).
#pragma once

#include <cstddef>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda::kern {

// Raises a kernel's dynamic shared-memory limit when it needs more than the default 48 KiB.
template <class Kernel>
void allow_smem(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    ATTNRES_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// SIMT (attention_simt.cu): any element type, head_dim <= 256.
void simt_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, DType type,
                            const AttentionShape& s, Stream stream);
void simt_attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                             const void* v, const float* lse, const float* delta, DType type, const AttentionShape& s,
                             Stream stream);

// Tensor cores (attention_wmma.cu): bf16, head_dim 64 or 128 (attention_has_wmma).
void wmma_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                            const AttentionShape& s, Stream stream);
void wmma_attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                             const void* v, const float* lse, const float* delta, const AttentionShape& s,
                             Stream stream);

}  // namespace attnres::cuda::kern
