// Delta AttnRes's options on the GPU (kernels.hpp; the CPU's kernels/delta_read and
// model/delta_trunk.cpp): the null source's broadcast and its gradient (a column sum over tokens),
// the gates' values and gradients. The reads themselves are depth_read.cu's kernels (the stream,
// the gate and the V route's own key norm are fields of DepthReadForward / DepthReadBackward).
// Sums over tokens go per 64-token chunk in token order (one block per chunk), then over the chunks
// in order: deterministic whatever the scheduling.
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda::kern {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoidf(float z) { return 1.0f / (1.0f + expf(-z)); }

__global__ void broadcast_kernel(float* out, const float* v, std::int64_t total, int d) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x)
    out[i] = v[i % d];
}

// partial[chunk, k] = sum over the chunk's tokens (in order) of x[t, k]; block = one chunk.
__global__ void column_partials_kernel(float* partial, const float* x, std::int64_t n_tok, int d) {
  const std::int64_t t0 = blockIdx.x * kChunkTokens;
  const std::int64_t t1 = t0 + kChunkTokens < n_tok ? t0 + kChunkTokens : n_tok;
  for (int k = threadIdx.x; k < d; k += blockDim.x) {
    float s = 0.0f;
    for (std::int64_t t = t0; t < t1; ++t) s += x[t * d + k];
    partial[blockIdx.x * std::int64_t(d) + k] = s;
  }
}

__global__ void gate_vector_forward_kernel(float* g, const float* bias, std::int64_t total, int d) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x)
    g[i] = sigmoidf(g[i] + bias[i % d]);
}

// dg = sum_r dh_r c_r at element i (routes in order, as kernels/delta_read_backward).
__device__ __forceinline__ float gate_grad(const DeltaGateBackward& a, std::int64_t i) {
  float dg = 0.0f;
  for (int r = 0; r < a.n_routes; ++r) dg += a.dh[r][i] * a.c[r][i];
  return dg;
}

// The scalar gates: partial[chunk] = sum of dg over the chunk's elements. Thread i sums the
// elements i, i + 256, ... of the chunk, then thread 0 adds the 256 sums in order.
__global__ void gate_scalar_partials_kernel(DeltaGateBackward a, float* partial) {
  __shared__ float part[kThreads];
  const std::int64_t t0 = blockIdx.x * kChunkTokens;
  const std::int64_t t1 = t0 + kChunkTokens < a.n_tok ? t0 + kChunkTokens : a.n_tok;
  float s = 0.0f;
  for (std::int64_t i = t0 * a.d + threadIdx.x; i < t1 * a.d; i += blockDim.x) s += gate_grad(a, i);
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x != 0) return;
  float total = 0.0f;
  for (int w = 0; w < kThreads; ++w) total += part[w];
  partial[blockIdx.x] = total;
}

// dparam[0] += the chunks' sums in order, through the sigmoid for sigmoid_scalar.
__global__ void gate_scalar_finish_kernel(DeltaGateBackward a, const float* partial, std::int64_t chunks,
                                          float* dparam) {
  float total = 0.0f;
  for (std::int64_t c = 0; c < chunks; ++c) total += partial[c];
  if (a.gate == kernels::DeltaGate::sigmoid_scalar) {
    const float g = sigmoidf(a.param[0]);
    total = total * g * (1.0f - g);
  }
  dparam[0] += total;
}

__global__ void gate_vector_backward_kernel(DeltaGateBackward a, float* dp, std::int64_t total) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x)
    dp[i] = gate_grad(a, i) * a.g[i] * (1.0f - a.g[i]);
}

__global__ void gate_scale_kernel(float* out, const float* dh, DeltaGateBackward a, std::int64_t total) {
  const bool vector = a.gate == kernels::DeltaGate::sigmoid_vector;
  float gs = 1.0f;
  if (a.gate == kernels::DeltaGate::sigmoid_scalar) gs = sigmoidf(a.param[0]);
  else if (a.gate == kernels::DeltaGate::learnable_alpha) gs = a.param[0];
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x)
    out[i] = (vector ? a.g[i] : gs) * dh[i];
}

}  // namespace

void delta_broadcast(float* out, const float* v, std::int64_t n_tok, int d, Stream stream) {
  const std::int64_t total = n_tok * d;
  if (total == 0) return;
  broadcast_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(out, v, total, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

std::int64_t delta_scratch_floats(std::int64_t n_tok, int d) { return num_chunks(n_tok) * d; }

void delta_column_sum(float* out, const float* x, std::int64_t n_tok, int d, float* scratch, Stream stream) {
  const std::int64_t chunks = num_chunks(n_tok);
  if (chunks == 0) return;
  column_partials_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(scratch, x, n_tok, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
  sum_chunks(out, scratch, chunks, d, d, stream);
}

void delta_gate_vector_forward(float* g, const float* bias, std::int64_t n_tok, int d, Stream stream) {
  const std::int64_t total = n_tok * d;
  if (total == 0) return;
  gate_vector_forward_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(g, bias, total, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void delta_gate_backward(const DeltaGateBackward& a, float* dparam, float* dp, float* scratch, Stream stream) {
  require(a.n_routes >= 1 && a.n_routes <= 2, "delta_gate_backward: ", a.n_routes, " routes");
  const std::int64_t total = a.n_tok * a.d;
  if (total == 0) return;
  switch (a.gate) {
    case kernels::DeltaGate::none: return;
    case kernels::DeltaGate::sigmoid_scalar:
    case kernels::DeltaGate::learnable_alpha: {
      const std::int64_t chunks = num_chunks(a.n_tok);
      gate_scalar_partials_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(a, scratch);
      ATTNRES_CUDA_CHECK_LAUNCH();
      gate_scalar_finish_kernel<<<1, 1, 0, stream>>>(a, scratch, chunks, dparam);
      ATTNRES_CUDA_CHECK_LAUNCH();
      return;
    }
    case kernels::DeltaGate::sigmoid_vector:
      gate_vector_backward_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(a, dp, total);
      ATTNRES_CUDA_CHECK_LAUNCH();
      return;
  }
}

void delta_gate_scale(float* out, const float* dh, const DeltaGateBackward& a, Stream stream) {
  const std::int64_t total = a.n_tok * a.d;
  if (total == 0) return;
  gate_scale_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(out, dh, a, total);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda::kern
