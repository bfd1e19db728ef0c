// MUDDFormer's DA modules on the GPU (kernels.hpp; the CPU's kernels/mudd): the per-token parts.
// The generator's two GEMMs run through cuBLASLt in CudaModel (cuda_model_mudd.cpp); here are its
// input norm, GELU and the C-way depth mix, forward and backward. The mix is one warp per token,
// fused multiply-adds in source order as on the CPU; the backward sums its parameter gradients
// (a, the post norm, the generator norm) per warp over 8 tokens into its own partial row, then
// over the rows in order (sum_chunks): deterministic.
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda::kern {

namespace {

constexpr int kWarps = 8;  // one 64-token chunk per block, 8 tokens per warp
constexpr int kTokensPerWarp = static_cast<int>(kChunkTokens) / kWarps;
constexpr int kThreads = 256;

// kernels/mudd's gelu_and_derivative in fp32.
__device__ __forceinline__ float gelu_value(float h, kernels::Gelu kind, float* derivative) {
  if (kind == kernels::Gelu::erf) {
    const float cdf = 0.5f * (1.0f + erff(h * 0.70710678118654752440f));
    if (derivative != nullptr) *derivative = cdf + h * expf(-0.5f * h * h) * 0.39894228040143267794f;
    return h * cdf;
  }
  const float s = 0.79788456080286535588f;
  const float th = tanhf(s * (h + 0.044715f * h * h * h));
  if (derivative != nullptr)
    *derivative = 0.5f * (1.0f + th) + 0.5f * h * (1.0f - th * th) * s * (1.0f + 0.134145f * h * h);
  return 0.5f * h * (1.0f + th);
}

__global__ void mudd_gelu_kernel(float* act, const float* hidden, std::int64_t n, kernels::Gelu kind) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    act[i] = gelu_value(hidden[i], kind, nullptr);
}

__global__ void mudd_gelu_backward_kernel(float* dh, const float* hidden, std::int64_t n, kernels::Gelu kind) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float slope;
    gelu_value(hidden[i], kind, &slope);
    dh[i] *= slope;
  }
}

// The mix of way c at element k of a token (offset off): sum_j w[j] X_j[k], source order.
__device__ __forceinline__ float mix_at(const MuddMix& m, const float* w, std::int64_t off) {
  float acc = w[0] * m.sources[0][off];
  for (int s = 1; s < m.n_sources; ++s) acc = fmaf(w[s], m.sources[s][off], acc);
  return acc;
}

// One warp per token.
__global__ void mudd_mix_forward_kernel(MuddMix m, float* dw) {
  const int lane = threadIdx.x & 31;
  const std::int64_t t = blockIdx.x * std::int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (t >= m.n_tok) return;
  const int S = m.n_sources, C = m.n_ways, cs = C * S, d = m.d, R = C - 1;
  const float* w = m.a;
  if (dw != nullptr) {  // dw = generator output + a, kept for the backward
    float* row = dw + t * cs;
    for (int i = lane; i < cs; i += 32) row[i] += m.a[i];
    __syncwarp();
    w = row;
  }
  const std::int64_t base = t * d;
  for (int k = lane; k < d; k += 32)
    for (int c = 0; c < C; ++c) m.out[c][base + k] = mix_at(m, w + c * S, base + k);
  if (m.post_norm == nullptr) return;
  // PrePostDANorm: x_c = x + mix_c, R's mix normalised first.
  float ss = 0;
  for (int k = lane; k < d; k += 32) ss += m.out[R][base + k] * m.out[R][base + k];
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + m.eps);
  for (int k = lane; k < d; k += 32) {
    const float x = m.x[base + k];
    for (int c = 0; c < R; ++c) m.out[c][base + k] = x + m.out[c][base + k];
    m.out[R][base + k] = x + m.out[R][base + k] * r * m.post_norm[k];
  }
}

// Block = 8 warps = one chunk of 64 tokens, 8 per warp; warp slot = chunk * 8 + warp owns the rows
// part_a[slot] (cs), part_post[slot] and row[slot] (d).
__global__ void mudd_mix_backward_kernel(MuddMix m, const float* dw, MuddMixGrads g, float* delta, float* part_a,
                                         float* part_post, float* rows) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int S = m.n_sources, C = m.n_ways, cs = C * S, d = m.d, R = C - 1;
  const bool prepost = m.post_norm != nullptr;
  const std::int64_t slot = blockIdx.x * std::int64_t(kWarps) + warp;
  float* acc_a = part_a + slot * cs;
  float* acc_post = prepost ? part_post + slot * d : nullptr;
  float* row = prepost ? rows + slot * d : nullptr;
  for (int i = lane; i < cs; i += 32) acc_a[i] = 0;
  if (prepost)
    for (int k = lane; k < d; k += 32) acc_post[k] = 0;
  __syncwarp();
  for (int i = 0; i < kTokensPerWarp; ++i) {
    const std::int64_t t = blockIdx.x * kChunkTokens + warp * kTokensPerWarp + i;
    if (t >= m.n_tok) break;
    const std::int64_t base = t * d;
    const float* w = dw != nullptr ? dw + t * cs : m.a;
    const float* gc[kernels::kMaxWays];
    for (int c = 0; c < C; ++c) gc[c] = g.dout[c] + base;
    if (prepost) {
      // The residual x gets every stream's gradient; R's mix goes back through the post norm
      // (recomputed: the forward's arithmetic), its gradient into this warp's row.
      const float* wr = w + R * S;
      float ss = 0, dot = 0;
      for (int k = lane; k < d; k += 32) {
        const float mix = mix_at(m, wr, base + k);
        ss += mix * mix;
        dot += mix * m.post_norm[k] * gc[R][k];
      }
      ss = warp_sum(ss);
      dot = warp_sum(dot);
      const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + m.eps);
      const float coef = r * r * r * dot / static_cast<float>(d);
      for (int k = lane; k < d; k += 32) {
        const float mix = mix_at(m, wr, base + k);
        const float gr = gc[R][k];
        row[k] = r * m.post_norm[k] * gr - mix * coef;
        acc_post[k] += gr * mix * r;
        float dx = g.dx[base + k];
        for (int c = 0; c < C; ++c) dx += gc[c][k];
        g.dx[base + k] = dx;
      }
      __syncwarp();
      gc[R] = row;
    }
    // delta[c, s] = <g_c, X_s>;  dX_s += sum_c w[c, s] g_c.
    for (int s = 0; s < S; ++s) {
      const float* v = m.sources[s] + base;
      float* dv = g.dsources[s] + base;
      float dots[kernels::kMaxWays] = {0, 0, 0, 0};
      for (int k = lane; k < d; k += 32) {
        const float x = v[k];
        float a = dv[k];
#pragma unroll
        for (int c = 0; c < kernels::kMaxWays; ++c)
          if (c < C) {
            const float gk = gc[c][k];
            dots[c] = fmaf(gk, x, dots[c]);
            a = fmaf(w[c * S + s], gk, a);
          }
        dv[k] = a;
      }
#pragma unroll
      for (int c = 0; c < kernels::kMaxWays; ++c)
        if (c < C) {
          const float sum = warp_sum(dots[c]);
          if (lane == 0) {
            acc_a[c * S + s] += sum;
            if (delta != nullptr) delta[t * cs + c * S + s] = sum;
          }
        }
    }
  }
}

unsigned warp_grid(std::int64_t n_tok) { return static_cast<unsigned>((n_tok + kWarps - 1) / kWarps); }

}  // namespace

void mudd_gelu(float* act, const float* hidden, std::int64_t n, kernels::Gelu kind, Stream stream) {
  if (n == 0) return;
  mudd_gelu_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(act, hidden, n, kind);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void mudd_gelu_backward(float* dh, const float* hidden, std::int64_t n, kernels::Gelu kind, Stream stream) {
  if (n == 0) return;
  mudd_gelu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dh, hidden, n, kind);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void mudd_mix_forward(const MuddMix& m, float* dw, Stream stream) {
  require(m.n_sources >= 1 && m.n_sources <= kMuddMaxSources && m.n_ways >= 1 && m.n_ways <= kernels::kMaxWays,
          "mudd_mix_forward: bad shape (", m.n_ways, " ways, ", m.n_sources, " sources)");
  if (m.n_tok == 0) return;
  mudd_mix_forward_kernel<<<warp_grid(m.n_tok), kThreads, 0, stream>>>(m, dw);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

std::int64_t mudd_mix_scratch_floats(std::int64_t n_tok, int d, int n_ways, int n_sources) {
  return num_chunks(n_tok) * kWarps * (static_cast<std::int64_t>(n_ways) * n_sources + 2 * std::int64_t(d));
}

void mudd_mix_backward(const MuddMix& m, const float* dw, const MuddMixGrads& g, float* delta, float* scratch,
                       Stream stream) {
  const std::int64_t chunks = num_chunks(m.n_tok);
  if (chunks == 0) return;
  const int cs = m.n_ways * m.n_sources;
  const std::int64_t slots = chunks * kWarps;
  float* part_a = scratch;
  float* part_post = part_a + slots * cs;
  float* rows = part_post + slots * m.d;
  mudd_mix_backward_kernel<<<static_cast<unsigned>(chunks), 32 * kWarps, 0, stream>>>(m, dw, g, delta, part_a,
                                                                                      part_post, rows);
  ATTNRES_CUDA_CHECK_LAUNCH();
  if (g.da != nullptr) sum_chunks(g.da, part_a, slots, cs, cs, stream);
  if (m.post_norm != nullptr && g.dpost_norm != nullptr) sum_chunks(g.dpost_norm, part_post, slots, m.d, m.d, stream);
}

}  // namespace attnres::cuda::kern
