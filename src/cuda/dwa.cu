// DenseFormer's depth-weighted averages on the GPU (kernels.hpp; the CPU's kernels/dwa): the
// forward mixes, per element, the block outputs with the DWA's scalar weights in source order
// (fused multiply-adds, the CPU's arithmetic); the backward scatters alpha_j * dout into each
// source's gradient and sums <dout, X_j> over tokens per 64-token chunk (one block, warps in a
// fixed order), then over chunks in order (sum_chunks): deterministic.
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda::kern {

namespace {

constexpr int kWarps = 8;  // one 64-token chunk per block, 8 tokens per warp
constexpr int kTokensPerWarp = static_cast<int>(kChunkTokens) / kWarps;
constexpr int kThreads = 256;

__global__ void dwa_forward_kernel(float* out, const float* const* sources, const float* alpha, int n_sources,
                                   std::int64_t total) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float a = alpha[0] * sources[0][i];
    for (int s = 1; s < n_sources; ++s) a = fmaf(alpha[s], sources[s][i], a);
    out[i] = a;
  }
}

// Block = 8 warps = one chunk of 64 tokens. Per-warp partials of <dout, X_s> live in shared
// memory [8][n_sources]; the block adds them in warp order into partial[chunk][n_sources].
__global__ void dwa_backward_kernel(const float* dout, const float* const* sources, float* const* dsources,
                                    const float* alpha, int n_sources, std::int64_t n_tok, int d, float* partial) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  float* acc = smem + warp * n_sources;
  for (int s = lane; s < n_sources; s += 32) acc[s] = 0;
  __syncwarp();
  for (int i = 0; i < kTokensPerWarp; ++i) {
    const std::int64_t t = blockIdx.x * kChunkTokens + warp * kTokensPerWarp + i;
    if (t >= n_tok) break;
    const float* g = dout + t * d;
    for (int s = 0; s < n_sources; ++s) {
      const float* v = sources[s] + t * d;
      float* dv = dsources[s] + t * d;
      const float a = alpha[s];
      float dot = 0;
      for (int k = lane; k < d; k += 32) {
        dot = fmaf(g[k], v[k], dot);
        dv[k] = fmaf(a, g[k], dv[k]);
      }
      dot = warp_sum(dot);
      if (lane == 0) acc[s] += dot;
    }
  }
  sum_warp_partials(partial + blockIdx.x * std::int64_t(n_sources), smem, kWarps, n_sources);
}

}  // namespace

void dwa_forward(const Dwa& a, float* out, Stream stream) {
  const std::int64_t total = a.n_tok * a.d;
  if (total == 0) return;
  dwa_forward_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(out, a.sources, a.alpha, a.n_sources, total);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

std::int64_t dwa_scratch_floats(std::int64_t n_tok, int n_sources) { return num_chunks(n_tok) * n_sources; }

void dwa_backward(const Dwa& a, const float* dout, float* const* dsources, float* dalpha, float* scratch,
                  Stream stream) {
  const std::int64_t chunks = num_chunks(a.n_tok);
  if (chunks == 0) return;
  const std::size_t smem = sizeof(float) * kWarps * static_cast<std::size_t>(a.n_sources);
  require(smem <= 48 * 1024, "dwa_backward: too many sources (", a.n_sources, ")");
  dwa_backward_kernel<<<static_cast<unsigned>(chunks), 32 * kWarps, smem, stream>>>(
      dout, a.sources, dsources, a.alpha, a.n_sources, a.n_tok, a.d, scratch);
  ATTNRES_CUDA_CHECK_LAUNCH();
  sum_chunks(dalpha, scratch, chunks, a.n_sources, a.n_sources, stream);
}

}  // namespace attnres::cuda::kern
