// ResFormer's value residual on the GPU (kernels.hpp; the CPU's kernels/value_residual): V' =
// lambda1 V_1 + lambda2 V_n per element, in the GEMM operand type (fp32 or bf16, fp32 arithmetic),
// with the lambdas read on the device from the layer's parameters (no host synchronisation). The
// backward sums <dV', V_1> and <dV', V_n> per 64-token chunk (one block, warps in a fixed order),
// then one thread adds the chunks in order: deterministic.
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace attnres::cuda::kern {

namespace {

constexpr int kWarps = 8;  // one 64-token chunk per block, 8 tokens per warp
constexpr int kTokensPerWarp = static_cast<int>(kChunkTokens) / kWarps;
constexpr int kThreads = 256;

// kernels::vres_lambdas (kernels/value_residual.cpp), on the device.
struct Lambdas {
  float l1, l2;
};
__device__ __forceinline__ Lambdas lambdas(const ValueResidual& a) {
  switch (a.mode) {
    case kernels::VresMode::fixed: return {0.5f, 0.5f};
    case kernels::VresMode::learned_convex: return {a.params[0], 1.0f - a.params[0]};
    case kernels::VresMode::learned_pair: return {a.params[0], a.params[1]};
    case kernels::VresMode::constant: break;
  }
  return {a.constant1, a.constant2};
}

template <class T>
__global__ void value_residual_forward_kernel(ValueResidual a, T* out, std::int64_t total) {
  const Lambdas l = lambdas(a);
  const T* v1 = static_cast<const T*>(a.v1);
  const T* vn = static_cast<const T*>(a.vn);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(l.l1 * to_float(v1[i]) + l.l2 * to_float(vn[i]));
}

// Block = 8 warps = one chunk of 64 tokens: dvn = lambda2 dv (in place), dv1 += lambda1 dv, and
// when partial is set, partial[chunk][0..1] = the chunk's sums of <dv, v1> and <dv, vn>.
template <class T>
__global__ void value_residual_backward_kernel(ValueResidual a, T* dv, float* dv1, float* partial) {
  __shared__ float acc[kWarps * 2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const Lambdas l = lambdas(a);
  const T* v1 = static_cast<const T*>(a.v1);
  const T* vn = static_cast<const T*>(a.vn);
  float s1 = 0, s2 = 0;
  for (int i = 0; i < kTokensPerWarp; ++i) {
    const std::int64_t t = blockIdx.x * kChunkTokens + warp * kTokensPerWarp + i;
    if (t >= a.n_tok) break;
    const std::int64_t row = t * a.d;
    float d1 = 0, d2 = 0;
    for (int k = lane; k < a.d; k += 32) {
      const float g = to_float(dv[row + k]);
      d1 = fmaf(g, to_float(v1[row + k]), d1);
      d2 = fmaf(g, to_float(vn[row + k]), d2);
      dv1[row + k] = fmaf(l.l1, g, dv1[row + k]);
      dv[row + k] = from_float<T>(l.l2 * g);
    }
    s1 += warp_sum(d1);
    s2 += warp_sum(d2);
  }
  if (partial == nullptr) return;
  if (lane == 0) {
    acc[warp * 2] = s1;
    acc[warp * 2 + 1] = s2;
  }
  sum_warp_partials(partial + blockIdx.x * 2, acc, kWarps, 2);
}

// The chunks in order, then kernels::vres_parameter_gradients: dparams += the lambdas' gradients.
__global__ void value_residual_finalize_kernel(kernels::VresMode mode, const float* partial, std::int64_t chunks,
                                               float* dparams) {
  float g1 = 0, g2 = 0;
  for (std::int64_t c = 0; c < chunks; ++c) {
    g1 += partial[2 * c];
    g2 += partial[2 * c + 1];
  }
  if (mode == kernels::VresMode::learned_convex) dparams[0] += g1 - g2;
  if (mode == kernels::VresMode::learned_pair) {
    dparams[0] += g1;
    dparams[1] += g2;
  }
}

template <class T>
__global__ void add_fp32_kernel(T* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<T>(to_float(dst[i]) + src[i]);
}

}  // namespace

void value_residual_forward(const ValueResidual& a, void* out, Stream stream) {
  const std::int64_t total = a.n_tok * a.d;
  if (total == 0) return;
  if (a.type == DType::f32)
    value_residual_forward_kernel<float><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        a, static_cast<float*>(out), total);
  else
    value_residual_forward_kernel<bf16><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        a, static_cast<bf16*>(out), total);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

std::int64_t value_residual_scratch_floats(std::int64_t n_tok) { return 2 * num_chunks(n_tok); }

void value_residual_backward(const ValueResidual& a, void* dv, float* dv1, float* dparams, float* scratch,
                             Stream stream) {
  const std::int64_t chunks = num_chunks(a.n_tok);
  if (chunks == 0) return;
  const bool learned = dparams != nullptr && kernels::vres_parameter_count(a.mode) > 0;
  float* partial = learned ? scratch : nullptr;
  if (a.type == DType::f32)
    value_residual_backward_kernel<float><<<static_cast<unsigned>(chunks), 32 * kWarps, 0, stream>>>(
        a, static_cast<float*>(dv), dv1, partial);
  else
    value_residual_backward_kernel<bf16><<<static_cast<unsigned>(chunks), 32 * kWarps, 0, stream>>>(
        a, static_cast<bf16*>(dv), dv1, partial);
  ATTNRES_CUDA_CHECK_LAUNCH();
  if (!learned) return;
  value_residual_finalize_kernel<<<1, 1, 0, stream>>>(a.mode, scratch, chunks, dparams);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void add_fp32(void* dst, DType type, const float* src, std::int64_t n, Stream stream) {
  if (n == 0) return;
  if (type == DType::f32)
    add_fp32_kernel<float><<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<float*>(dst), src, n);
  else
    add_fp32_kernel<bf16><<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<bf16*>(dst), src, n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda::kern
