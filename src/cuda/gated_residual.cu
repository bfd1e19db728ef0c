// The Gated Residual's elementwise and normalisation kernels on the GPU (kernels.hpp; the CPU's
// kernels/gated_residual, docs/delta-gated-spec.md §2): CudaModel (cuda_model_gated_residual.cpp)
// runs W_down, W_up and W_inject through cuBLASLt between them. Each kernel keeps the CPU kernel's
// arithmetic (the same products in the same order, fp32); the branch norm's weight gradient sums
// per 64-token chunk (one block, tokens in order) and then over chunks (sum_chunks): deterministic.
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace attnres::cuda::kern {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;  // warp-per-row kernels: 8 rows per block

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

// H[t, i, :] = emb[t, :] for every branch i.
__global__ void gr_expand_kernel(float* H, const float* emb, std::int64_t total, int n, int d) {
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = e / d, t = row / n;
    H[e] = emb[t * d + (e - row * d)];
  }
}

// demb[t, :] += sum_i dH[t, i, :] (branches in order; kernels::stream_reduce).
__global__ void gr_reduce_kernel(float* demb, const float* dH, std::int64_t total, int n, int d) {
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = e / d, k = e - t * d;
    const float* h = dH + t * n * d + k;
    float s = h[0];
    for (int i = 1; i < n; ++i) s += h[i * d];
    demb[e] += s;
  }
}

// One warp per branch row (t, i): rms = 1 / sqrt(mean(H^2) + eps) (when compute, else given) and
// hn = H rms (1 + w_i) in the GEMM operand type.
template <class T>
__global__ void gr_norm_kernel(T* hn, float* rms, bool compute, const float* H, const float* w, std::int64_t rows,
                               int n, int d, float eps) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = blockIdx.x * std::int64_t(kWarps) + threadIdx.x / 32;
  if (row >= rows) return;
  const float* h = H + row * d;
  float r;
  if (compute) {
    float ss = 0;
    for (int k = lane; k < d; k += 32) ss += h[k] * h[k];
    ss = warp_sum(ss);
    r = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    if (lane == 0) rms[row] = r;
  } else {
    r = rms[row];
  }
  const float* wi = w + (row % n) * d;
  T* out = hn + row * d;
  for (int k = lane; k < d; k += 32) out[k] = from_float<T>(h[k] * r * (1.0f + wi[k]));
}

// p *= scale (in place) and a = SiLU(p) in the operand type.
template <class T>
__global__ void gr_silu_kernel(T* a, float* p, std::int64_t total, float scale) {
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const float v = p[e] * scale;
    p[e] = v;
    a[e] = from_float<T>(v * sigmoid(v));
  }
}

// x[t, k] = (1/n) sum_i sigmoid(q[t, i, k]) Hn[t, i, k], Hn recomputed in fp32 from H.
template <class T>
__global__ void gr_mix_kernel(T* x, const float* q, const float* H, const float* rms, const float* w,
                              std::int64_t total, int n, int d, float inv_n) {
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = e / d, k = e - t * d;
    float acc = 0;
    for (int i = 0; i < n; ++i) {
      const std::int64_t row = t * n + i, at = row * d + k;
      const float hn = H[at] * rms[row] * (1.0f + w[i * d + k]);
      acc += sigmoid(q[at]) * hn;
    }
    x[e] = from_float<T>(acc * inv_n);
  }
}

// beta = 2 sigmoid(s / n), in place.
__global__ void gr_write_gates_kernel(float* beta, std::int64_t total, float inv_n) {
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x)
    beta[e] = 2.0f * sigmoid(beta[e] * inv_n);
}

// out[t, i, :] = H[t, i, :] + beta[t, i] y[t, :].
__global__ void gr_write_forward_kernel(float* out, const float* H, const float* beta, const float* y,
                                        std::int64_t total, int n, int d) {
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = e / d, t = row / n;
    out[e] = H[e] + beta[row] * y[t * d + (e - row * d)];
  }
}

// One warp per token: ds_n[t, i] = <dH_i, y> beta_i (1 - beta_i / 2) / n (operand type) and
// dy[t, :] = sum_i beta_i dH_i (fp32).
template <class T>
__global__ void gr_write_backward_kernel(float* dy, T* ds_n, const float* dH, const float* y, const float* beta,
                                         std::int64_t n_tok, int n, int d, float inv_n) {
  const int lane = threadIdx.x & 31;
  const std::int64_t t = blockIdx.x * std::int64_t(kWarps) + threadIdx.x / 32;
  if (t >= n_tok) return;
  const float* yt = y + t * d;
  const float* g = dH + t * n * d;
  const float* b = beta + t * n;
  for (int i = 0; i < n; ++i) {
    float dot = 0;
    for (int k = lane; k < d; k += 32) dot += g[i * d + k] * yt[k];
    dot = warp_sum(dot);
    if (lane == 0) ds_n[t * n + i] = from_float<T>(dot * b[i] * (1.0f - b[i] / 2.0f) * inv_n);
  }
  for (int k = lane; k < d; k += 32) {
    float acc = 0;
    for (int i = 0; i < n; ++i) acc += b[i] * g[i * d + k];
    dy[t * d + k] = acc;
  }
}

// The read's mean and gates: with gx = dx / n, dHn = G gx (fp32) and dq = Hn gx G (1 - G) (operand
// type), G = sigmoid(q).
template <class T>
__global__ void gr_gate_backward_kernel(float* dhn, T* dq, const float* q, const float* dx, const float* H,
                                        const float* rms, const float* w, std::int64_t total, int n, int d,
                                        float inv_n) {
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = e / d, k = e - row * d, t = row / n;
    const int i = static_cast<int>(row - t * n);
    const float gx = dx[t * d + k] * inv_n, g = sigmoid(q[e]);
    const float hn = H[e] * rms[row] * (1.0f + w[i * d + k]);
    dhn[e] = g * gx;
    dq[e] = from_float<T>(hn * gx * g * (1.0f - g));
  }
}

// dp = da SiLU'(p) / n (operand type), SiLU'(p) = sigmoid(p) (1 + p (1 - sigmoid(p))).
template <class T>
__global__ void gr_silu_backward_kernel(T* dp, const float* da, const float* p, std::int64_t total, float inv_n) {
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const float v = p[e], sg = sigmoid(v);
    dp[e] = from_float<T>(da[e] * (sg * (1.0f + v * (1.0f - sg)) * inv_n));
  }
}

// One warp per branch row: with N = rms H, dN = dHn (1 + w), dH += rms (dN - (<N, dN> / d) N).
__global__ void gr_norm_backward_kernel(float* dH, const float* dhn, const float* H, const float* rms, const float* w,
                                        std::int64_t rows, int n, int d) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = blockIdx.x * std::int64_t(kWarps) + threadIdx.x / 32;
  if (row >= rows) return;
  const float rr = rms[row];
  const float* h = H + row * d;
  const float* g = dhn + row * d;
  const float* wi = w + (row % n) * d;
  float proj = 0;
  for (int k = lane; k < d; k += 32) proj += h[k] * rr * g[k] * (1.0f + wi[k]);
  proj = warp_sum(proj) / static_cast<float>(d);
  float* out = dH + row * d;
  for (int k = lane; k < d; k += 32) out[k] += rr * (g[k] * (1.0f + wi[k]) - proj * h[k] * rr);
}

// One block per 64-token chunk, threads over the n d weights: partial[c][e] = sum over the chunk's
// tokens, in order, of dHn N.
__global__ void gr_norm_weight_kernel(float* partial, const float* dhn, const float* H, const float* rms,
                                      std::int64_t n_tok, int n, int d) {
  const std::int64_t nd = std::int64_t(n) * d, t0 = blockIdx.x * kChunkTokens;
  const std::int64_t t1 = t0 + kChunkTokens < n_tok ? t0 + kChunkTokens : n_tok;
  for (std::int64_t e = threadIdx.x; e < nd; e += blockDim.x) {
    const std::int64_t i = e / d;
    float acc = 0;
    for (std::int64_t t = t0; t < t1; ++t) acc += dhn[t * nd + e] * H[t * nd + e] * rms[t * n + i];
    partial[blockIdx.x * nd + e] = acc;
  }
}

unsigned rows_grid(std::int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }

}  // namespace

void gr_expand(float* H, const float* emb, std::int64_t n_tok, int n, int d, Stream stream) {
  const std::int64_t total = n_tok * n * d;
  if (total == 0) return;
  gr_expand_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(H, emb, total, n, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void gr_reduce(float* demb, const float* dH, std::int64_t n_tok, int n, int d, Stream stream) {
  const std::int64_t total = n_tok * d;
  if (total == 0) return;
  gr_reduce_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(demb, dH, total, n, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void gr_norm(void* hn, DType type, float* rms, bool compute_rms, const float* H, const float* w, std::int64_t n_tok,
             int n, int d, float eps, Stream stream) {
  const std::int64_t rows = n_tok * n;
  if (rows == 0) return;
  if (type == DType::f32)
    gr_norm_kernel<float><<<rows_grid(rows), kThreads, 0, stream>>>(static_cast<float*>(hn), rms, compute_rms, H, w,
                                                                    rows, n, d, eps);
  else
    gr_norm_kernel<bf16><<<rows_grid(rows), kThreads, 0, stream>>>(static_cast<bf16*>(hn), rms, compute_rms, H, w,
                                                                   rows, n, d, eps);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void gr_silu(void* a, DType type, float* p, std::int64_t count, float scale, Stream stream) {
  if (count == 0) return;
  if (type == DType::f32)
    gr_silu_kernel<float><<<grid_for(count, kThreads), kThreads, 0, stream>>>(static_cast<float*>(a), p, count, scale);
  else
    gr_silu_kernel<bf16><<<grid_for(count, kThreads), kThreads, 0, stream>>>(static_cast<bf16*>(a), p, count, scale);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void gr_mix(void* x, DType type, const float* q, const float* H, const float* rms, const float* w, std::int64_t n_tok,
            int n, int d, Stream stream) {
  const std::int64_t total = n_tok * d;
  if (total == 0) return;
  const float inv_n = 1.0f / static_cast<float>(n);
  if (type == DType::f32)
    gr_mix_kernel<float><<<grid_for(total, kThreads), kThreads, 0, stream>>>(static_cast<float*>(x), q, H, rms, w,
                                                                             total, n, d, inv_n);
  else
    gr_mix_kernel<bf16><<<grid_for(total, kThreads), kThreads, 0, stream>>>(static_cast<bf16*>(x), q, H, rms, w,
                                                                            total, n, d, inv_n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void gr_write_gates(float* beta, std::int64_t n_tok, int n, Stream stream) {
  const std::int64_t total = n_tok * n;
  if (total == 0) return;
  gr_write_gates_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(beta, total, 1.0f / static_cast<float>(n));
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void gr_write_forward(float* out, const float* H, const float* beta, const float* y, std::int64_t n_tok, int n, int d,
                      Stream stream) {
  const std::int64_t total = n_tok * n * d;
  if (total == 0) return;
  gr_write_forward_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(out, H, beta, y, total, n, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void gr_write_backward(float* dy, void* ds_n, DType type, const float* dH, const float* y, const float* beta,
                       std::int64_t n_tok, int n, int d, Stream stream) {
  if (n_tok == 0) return;
  const float inv_n = 1.0f / static_cast<float>(n);
  if (type == DType::f32)
    gr_write_backward_kernel<float><<<rows_grid(n_tok), kThreads, 0, stream>>>(dy, static_cast<float*>(ds_n), dH, y,
                                                                               beta, n_tok, n, d, inv_n);
  else
    gr_write_backward_kernel<bf16><<<rows_grid(n_tok), kThreads, 0, stream>>>(dy, static_cast<bf16*>(ds_n), dH, y,
                                                                              beta, n_tok, n, d, inv_n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void gr_gate_backward(float* dhn, void* dq, DType type, const float* q, const float* dx, const float* H,
                      const float* rms, const float* w, std::int64_t n_tok, int n, int d, Stream stream) {
  const std::int64_t total = n_tok * n * d;
  if (total == 0) return;
  const float inv_n = 1.0f / static_cast<float>(n);
  if (type == DType::f32)
    gr_gate_backward_kernel<float><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        dhn, static_cast<float*>(dq), q, dx, H, rms, w, total, n, d, inv_n);
  else
    gr_gate_backward_kernel<bf16><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        dhn, static_cast<bf16*>(dq), q, dx, H, rms, w, total, n, d, inv_n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void gr_silu_backward(void* dp, DType type, const float* da, const float* p, std::int64_t count, int n,
                      Stream stream) {
  if (count == 0) return;
  const float inv_n = 1.0f / static_cast<float>(n);
  if (type == DType::f32)
    gr_silu_backward_kernel<float><<<grid_for(count, kThreads), kThreads, 0, stream>>>(static_cast<float*>(dp), da, p,
                                                                                       count, inv_n);
  else
    gr_silu_backward_kernel<bf16><<<grid_for(count, kThreads), kThreads, 0, stream>>>(static_cast<bf16*>(dp), da, p,
                                                                                      count, inv_n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

std::int64_t gr_scratch_floats(std::int64_t n_tok, int n, int d) { return num_chunks(n_tok) * n * d; }

void gr_norm_backward(float* dH, float* dw, const float* dhn, const float* H, const float* rms, const float* w,
                      std::int64_t n_tok, int n, int d, float* scratch, Stream stream) {
  const std::int64_t rows = n_tok * n, chunks = num_chunks(n_tok);
  if (rows == 0) return;
  gr_norm_backward_kernel<<<rows_grid(rows), kThreads, 0, stream>>>(dH, dhn, H, rms, w, rows, n, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
  gr_norm_weight_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(scratch, dhn, H, rms, n_tok, n, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
  sum_chunks(dw, scratch, chunks, std::int64_t(n) * d, n * d, stream);
}

}  // namespace attnres::cuda::kern
