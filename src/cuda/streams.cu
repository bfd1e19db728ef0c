// The n-stream residual state of hyper-connections (hc) and mHC (mhc) on the GPU (kernels.hpp; the
// CPU's kernels/streams, kernels/hyper_connection and kernels/mhc): the entry, the exit, the
// shared write H' = alpha_r^T H + beta y and its backward, and the per-token parts of the HC and
// mHC modules. The modules' projections (HC's n+2 rows, mHC's phi) are GEMMs that CudaModel runs
// through cuBLASLt between these kernels (cuda_model_streams.cpp). Every coefficient, the tanh,
// sigmoid and Sinkhorn maps and the state itself stay fp32 in both precisions.
//
// Per-token kernels run one warp per token (8 warps a block: one 64-token chunk); their parameter
// gradient partials are summed per chunk in warp order (sum_warp_partials), then over chunks in
// order (sum_chunks): deterministic.
#include <cmath>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda::kern {

namespace {

constexpr int kWarps = 8;  // one 64-token chunk per block, 8 tokens per warp
constexpr int kTokensPerWarp = static_cast<int>(kChunkTokens) / kWarps;
constexpr int kThreads = 256;
constexpr int kMaxN = kMaxStreamsGpu;
constexpr int kMaxM = kMaxN * (kMaxN + 2);  // coefficients per token
constexpr int kMaxAcc = kMaxM + 3;          // per-chunk accumulators (HC: m + 2, mHC: m + 3)

__device__ __forceinline__ std::int64_t global_warp() {
  return blockIdx.x * std::int64_t(blockDim.x / 32) + threadIdx.x / 32;
}
__device__ __forceinline__ std::int64_t warp_count() { return std::int64_t(gridDim.x) * (blockDim.x / 32); }

// ---- the shared state ops ---------------------------------------------------------------------

__global__ void stream_expand_kernel(float* streams, const float* x, std::int64_t n_tok, int n, int d, float scale) {
  const std::int64_t total = n_tok * n * d;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / (std::int64_t(n) * d);
    const int k = static_cast<int>(i % d);
    streams[i] = scale * x[t * d + k];
  }
}

__global__ void stream_reduce_kernel(float* x, const float* streams, std::int64_t n_tok, int n, int d, float scale) {
  const std::int64_t total = n_tok * d;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / d;
    const int k = static_cast<int>(i - t * d);
    const float* h = streams + t * n * d + k;
    float s = h[0];
    for (int j = 1; j < n; ++j) s += h[std::int64_t(j) * d];
    x[i] = scale * s;
  }
}

// out_k = sum_i alpha[i, k+1] H_i + beta_k y, per element.
__global__ void stream_write_forward_kernel(float* out, const float* streams, StreamCoef c, const float* y,
                                            std::int64_t n_tok, int n, int d) {
  const std::int64_t total = n_tok * n * d;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / (std::int64_t(n) * d);
    const int rem = static_cast<int>(i - t * n * d);
    const int k = rem / d, e = rem - k * d;
    const float* alpha = c.alpha + t * c.stride;
    const float* H = streams + t * n * d + e;
    float a = 0;
    for (int j = 0; j < n; ++j) a = fmaf(alpha[j * (n + 1) + k + 1], H[std::int64_t(j) * d], a);
    out[i] = fmaf(c.beta[t * c.stride + k], y[t * d + e], a);
  }
}

// One warp per token: dbeta_k = <dout_k, y>, dy = sum_k beta_k dout_k.
__global__ void stream_write_backward_kernel(float* dy, float* dbeta, const float* dout, const float* y, StreamCoef c,
                                             std::int64_t n_tok, int n, int d) {
  const int lane = threadIdx.x & 31;
  for (std::int64_t t = global_warp(); t < n_tok; t += warp_count()) {
    const float* yt = y + t * d;
    const float* g = dout + t * n * d;
    const float* beta = c.beta + t * c.stride;
    for (int k = 0; k < n; ++k) {
      float s = 0;
      for (int e = lane; e < d; e += 32) s = fmaf(yt[e], g[std::int64_t(k) * d + e], s);
      s = warp_sum(s);
      if (lane == 0) dbeta[t * n + k] = s;
    }
    for (int e = lane; e < d; e += 32) {
      float a = 0;
      for (int k = 0; k < n; ++k) a = fmaf(beta[k], g[std::int64_t(k) * d + e], a);
      dy[t * d + e] = a;
    }
  }
}

// The width paths' dots of one token: dalpha[i (n+1) + c] = <H_i, gmix_c> with gmix_0 = dh and
// gmix_{1+k} = dout_k (every lane gets every value).
__device__ void width_dots(float* dalpha, const float* H, const float* dh, const float* dout, int n, int d, int lane) {
  for (int c = 0; c <= n; ++c) {
    const float* g = c == 0 ? dh : dout + std::int64_t(c - 1) * d;
    for (int i = 0; i < n; ++i) {
      const float* h = H + std::int64_t(i) * d;
      float s = 0;
      for (int e = lane; e < d; e += 32) s = fmaf(h[e], g[e], s);
      dalpha[i * (n + 1) + c] = warp_sum(s);
    }
  }
}

// dH_i (=, or += when accumulate) sum_c coef[i (n+1) + c] gmix_c, over the lane's elements.
__device__ void width_mix(float* dH, const float* coef, const float* dh, const float* dout, int n, int d, int lane,
                          bool accumulate) {
  for (int i = 0; i < n; ++i) {
    const float* a = coef + i * (n + 1);
    float* out = dH + std::int64_t(i) * d;
    for (int e = lane; e < d; e += 32) {
      float s = accumulate ? out[e] : 0.0f;
      s = fmaf(a[0], dh[e], s);
      for (int k = 0; k < n; ++k) s = fmaf(a[k + 1], dout[std::int64_t(k) * d + e], s);
      out[e] = s;
    }
  }
}

// ---- hyper-connections ------------------------------------------------------------------------

// wg [n+2, d]: the projection rows (W_alpha's n+1, then w_beta) times the norm weight.
__global__ void hc_scale_projections_kernel(float* wg, HyperConnection hc) {
  const int np = hc.n + 2;
  const std::int64_t total = std::int64_t(np) * hc.d;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / hc.d), k = static_cast<int>(i % hc.d);
    const float w = r <= hc.n ? hc.w_alpha[i] : hc.w_beta[k];
    wg[i] = w * hc.norm[k];
  }
}

// One warp per token: (dynamic) each stream's RMS factor, the coefficients from the projections'
// dots proj [n_tok n, n+2], their tanh; then h0 = sum_i alpha[i, 0] H_i.
__global__ void hc_forward_kernel(HyperConnection hc, const float* proj, float* h0, float* coef, float* act,
                                  float* rms) {
  const int lane = threadIdx.x & 31;
  const int n = hc.n, d = hc.d, m = n * (n + 2), np = n + 2;
  const bool dyn = hc.w_alpha != nullptr;
  for (std::int64_t t = global_warp(); t < hc.n_tok; t += warp_count()) {
    const float* H = hc.streams + t * n * d;
    float read[kMaxN];
    for (int i = 0; i < n; ++i) read[i] = hc.A[i * (n + 1)];
    if (dyn) {
      float* a = coef + t * m;
      float* tau = act + t * m;
      const float sa = *hc.s_alpha, sb = *hc.s_beta;
      for (int i = 0; i < n; ++i) {
        const float* h = H + std::int64_t(i) * d;
        float ss = 0;
        for (int e = lane; e < d; e += 32) ss = fmaf(h[e], h[e], ss);
        ss = warp_sum(ss);
        const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + hc.eps);
        const float* p = proj + (t * n + i) * np;
        for (int c = 0; c <= n + 1; ++c) {
          const float z = r * p[c];
          const float tv = hc.tanh ? tanhf(z) : z;
          const bool is_beta = c == n + 1;
          const int at = is_beta ? n * (n + 1) + i : i * (n + 1) + c;
          const float v = is_beta ? fmaf(sb, tv, hc.B[i]) : fmaf(sa, tv, hc.A[at]);
          if (c == 0) read[i] = v;
          if (lane == 0) {
            tau[at] = tv;
            a[at] = v;
          }
        }
        if (lane == 0) rms[t * n + i] = r;
      }
    }
    float* out = h0 + t * d;
    for (int e = lane; e < d; e += 32) {
      float s = 0;
      for (int i = 0; i < n; ++i) s = fmaf(read[i], H[std::int64_t(i) * d + e], s);
      out[e] = s;
    }
  }
}

// Block = 8 warps = one chunk of 64 tokens, a warp per token: the width paths (dstreams =
// sum_c alpha[i, c] gmix_c, overwritten), the chunk's partial sums of dalpha, dbeta and (dynamic)
// the scales' gradients into partial[chunk][n(n+1) + n + 2], and (dynamic) gproj [n_tok n, n+2] =
// r_i c_ir: the projections' pre-activation gradients times the stream's RMS factor.
__global__ void hc_backward_width_kernel(HyperConnection hc, const float* coef, const float* act, const float* rms,
                                         const float* dh0, const float* dout, const float* dbeta, float* dstreams,
                                         float* gproj, float* partial) {
  __shared__ float smem[kWarps * kMaxAcc];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int n = hc.n, d = hc.d, m = n * (n + 2), np = n + 2, ns = m + 2;
  const bool dyn = hc.w_alpha != nullptr;
  float* acc = smem + warp * ns;
  for (int i = lane; i < ns; i += 32) acc[i] = 0;
  __syncwarp();
  for (int it = 0; it < kTokensPerWarp; ++it) {
    const std::int64_t t = blockIdx.x * kChunkTokens + warp * kTokensPerWarp + it;
    if (t >= hc.n_tok) break;
    const float* H = hc.streams + t * n * d;
    const float* alpha = dyn ? coef + t * m : hc.A;
    const float* dh = dh0 + t * d;
    const float* g = dout + t * n * d;
    float dalpha[kMaxN * (kMaxN + 1)];
    width_dots(dalpha, H, dh, g, n, d, lane);
    width_mix(dstreams + t * n * d, alpha, dh, g, n, d, lane, false);
    const float* db = dbeta + t * n;
    if (lane == 0) {
      for (int i = 0; i < n * (n + 1); ++i) acc[i] += dalpha[i];
      for (int i = 0; i < n; ++i) acc[n * (n + 1) + i] += db[i];
      if (dyn) {
        const float* tau = act + t * m;
        const float sa = *hc.s_alpha, sb = *hc.s_beta;
        for (int i = 0; i < n; ++i) {
          float* gp = gproj + (t * n + i) * np;
          const float r = rms[t * n + i];
          for (int j = 0; j <= n; ++j) {
            const float gv = dalpha[i * (n + 1) + j], tv = tau[i * (n + 1) + j];
            acc[ns - 2] += gv * tv;
            gp[j] = r * (sa * gv * (hc.tanh ? 1.0f - tv * tv : 1.0f));
          }
          const float tb = tau[n * (n + 1) + i];
          acc[ns - 1] += db[i] * tb;
          gp[n + 1] = r * (sb * db[i] * (hc.tanh ? 1.0f - tb * tb : 1.0f));
        }
      }
    }
  }
  sum_warp_partials(partial + blockIdx.x * std::int64_t(ns), smem, kWarps, ns);
}

// One warp per stream row: the row RMSNorm's backward given rows = r * (dL/dHbar * gamma) (the
// GEMM gproj wg): dH_i += rows_i - r^2 <H_i, rows_i> / d H_i.
__global__ void hc_backward_norm_kernel(HyperConnection hc, const float* rms, const float* rows, float* dstreams) {
  const int lane = threadIdx.x & 31;
  const int d = hc.d;
  const std::int64_t n_rows = hc.n_tok * hc.n;
  for (std::int64_t q = global_warp(); q < n_rows; q += warp_count()) {
    const float* h = hc.streams + q * d;
    const float* row = rows + q * d;
    float s = 0;
    for (int e = lane; e < d; e += 32) s = fmaf(h[e], row[e], s);
    s = warp_sum(s);
    const float r = rms[q];
    const float cx = r * r * s / static_cast<float>(d);
    float* dh = dstreams + q * d;
    for (int e = lane; e < d; e += 32) dh[e] += row[e] - cx * h[e];
  }
}

// acc [n+2, d] = sum over rows of gproj^T H: W_r's gradient is gamma acc_r, gamma's sum_r W_r acc_r.
__global__ void hc_backward_params_kernel(HyperConnection hc, const float* acc, float* dw_alpha, float* dw_beta,
                                          float* dnorm) {
  const int d = hc.d, np = hc.n + 2;
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < d; k += gridDim.x * blockDim.x) {
    float gn = dnorm[k];
    for (int r = 0; r < np; ++r) {
      const float a = acc[std::int64_t(r) * d + k];
      float* gw = r <= hc.n ? dw_alpha + std::int64_t(r) * d : dw_beta;
      gw[k] += a * hc.norm[k];
      gn += a * (r <= hc.n ? hc.w_alpha[std::int64_t(r) * d + k] : hc.w_beta[k]);
    }
    dnorm[k] = gn;
  }
}

// ---- mHC --------------------------------------------------------------------------------------

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// Half-step h (1-based) normalises columns (kernels/mhc.cpp's normalises_columns).
__device__ __forceinline__ bool normalises_columns(int h, bool col_row) { return (h % 2 == 1) == col_row; }

__device__ void sinkhorn_normalise(float* m, int n, bool columns) {
  const int step = columns ? n : 1;
  for (int a = 0; a < n; ++a) {
    float* line = columns ? m + a : m + a * n;
    float s = 0;
    for (int b = 0; b < n; ++b) s += line[b * step];
    const float inv = 1.0f / s;
    for (int b = 0; b < n; ++b) line[b * step] *= inv;
  }
}

__device__ void sinkhorn_exp(float* out, const float* logits, int n) {
  float mx = logits[0];
  for (int e = 1; e < n * n; ++e) mx = fmaxf(mx, logits[e]);
  for (int e = 0; e < n * n; ++e) out[e] = expf(logits[e] - mx);
}

// One warp per token: z (the GEMM x phi^T, in place) times the state's RMS factor, the
// coefficients (every lane computes them alike; lane 0 stores), then h_in = sum_i H_pre[i] x_i.
__global__ void mhc_forward_kernel(Mhc mh, float* z, float* h_in, float* coef, float* rms) {
  const int lane = threadIdx.x & 31;
  const int n = mh.n, d = mh.d, nd = n * d, m = n * (n + 2);
  for (std::int64_t t = global_warp(); t < mh.n_tok; t += warp_count()) {
    const float* x = mh.streams + t * nd;
    float ss = 0;
    for (int e = lane; e < nd; e += 32) ss = fmaf(x[e], x[e], ss);
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(nd) + mh.eps);
    float* zt = z + t * m;
    float zl[kMaxM];
    for (int c = 0; c < m; ++c) zl[c] = r * zt[c];
    __syncwarp();
    if (lane == 0) {
      rms[t] = r;
      for (int c = 0; c < m; ++c) zt[c] = zl[c];
    }
    float a[kMaxM];  // alpha [n, n+1] then beta [n]
    for (int i = 0; i < n; ++i) {
      a[i * (n + 1)] = sigmoidf(mh.alpha[0] * zl[i] + mh.bias[i]) + mh.pre_eps;
      a[n * (n + 1) + i] = 2.0f * sigmoidf(mh.alpha[1] * zl[n + i] + mh.bias[n + i]);
    }
    float res[kMaxN * kMaxN], M[kMaxN * kMaxN];
    for (int e = 0; e < n * n; ++e) res[e] = mh.alpha[2] * zl[2 * n + e] + mh.bias[2 * n + e];
    sinkhorn_exp(M, res, n);
    for (int h = 1; h <= 2 * mh.iters; ++h) sinkhorn_normalise(M, n, normalises_columns(h, mh.col_row));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) a[j * (n + 1) + i + 1] = M[i * n + j];
    if (lane == 0)
      for (int c = 0; c < m; ++c) coef[t * m + c] = a[c];
    float* out = h_in + t * d;
    for (int e = lane; e < d; e += 32) {
      float s = 0;
      for (int i = 0; i < n; ++i) s = fmaf(a[i * (n + 1)], x[std::int64_t(i) * d + e], s);
      out[e] = s;
    }
  }
}

// Block = 8 warps = one chunk of 64 tokens, a warp per token: the coefficients' gradients (the
// width dots with every lane, then lane 0 through the sigmoids and the Sinkhorn backward, its
// iterates recomputed into the warp's work [(2 iters + 1) n^2]) to gz [n_tok, m] = dL/dz (not yet
// times the RMS factor), and the chunk's partial sums of the bias's and alpha's gradients into
// partial[chunk][m + 3].
__global__ void mhc_backward_coef_kernel(Mhc mh, const float* z, const float* dh_in, const float* dout,
                                         const float* dpost, float* gz, float* partial, float* work) {
  __shared__ float smem[kWarps * kMaxAcc];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int n = mh.n, d = mh.d, nd = n * d, m = n * (n + 2), na = m + 3, nn = n * n;
  float* acc = smem + warp * na;
  for (int i = lane; i < na; i += 32) acc[i] = 0;
  __syncwarp();
  float* wk = work + (std::int64_t(blockIdx.x) * kWarps + warp) * (2 * std::int64_t(mh.iters) + 1) * nn;
  for (int it = 0; it < kTokensPerWarp; ++it) {
    const std::int64_t t = blockIdx.x * kChunkTokens + warp * kTokensPerWarp + it;
    if (t >= mh.n_tok) break;
    float dalpha[kMaxN * (kMaxN + 1)];
    width_dots(dalpha, mh.streams + t * nd, dh_in + t * d, dout + t * nd, n, d, lane);
    if (lane != 0) continue;
    const float* zt = z + t * m;
    const float* dp = dpost + t * n;
    float g[kMaxM];  // dL/dH~, laid out as z
    for (int i = 0; i < n; ++i) {
      const float sp = sigmoidf(mh.alpha[0] * zt[i] + mh.bias[i]);
      g[i] = dalpha[i * (n + 1)] * sp * (1.0f - sp);
      const float so = sigmoidf(mh.alpha[1] * zt[n + i] + mh.bias[n + i]);
      g[n + i] = dp[i] * 2.0f * so * (1.0f - so);
    }
    // Sinkhorn backward (kernels/mhc.cpp's sinkhorn_backward): wk[h] = the iterate after half-step h.
    float res[kMaxN * kMaxN];
    for (int e = 0; e < nn; ++e) res[e] = mh.alpha[2] * zt[2 * n + e] + mh.bias[2 * n + e];
    sinkhorn_exp(wk, res, n);
    for (int h = 1; h <= 2 * mh.iters; ++h) {
      for (int e = 0; e < nn; ++e) wk[h * nn + e] = wk[(h - 1) * nn + e];
      sinkhorn_normalise(wk + h * nn, n, normalises_columns(h, mh.col_row));
    }
    float gs[kMaxN * kMaxN];
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) gs[i * n + j] = dalpha[j * (n + 1) + i + 1];
    for (int h = 2 * mh.iters; h >= 1; --h) {
      const float* A = wk + (h - 1) * nn;
      const float* B = wk + h * nn;
      const bool columns = normalises_columns(h, mh.col_row);
      const int step = columns ? n : 1;
      for (int a = 0; a < n; ++a) {
        const int base = columns ? a : a * n;
        float s = 0, gb = 0;
        for (int b = 0; b < n; ++b) s += A[base + b * step];
        for (int b = 0; b < n; ++b) gb += gs[base + b * step] * B[base + b * step];
        const float inv = 1.0f / s;
        for (int b = 0; b < n; ++b) gs[base + b * step] = (gs[base + b * step] - gb) * inv;
      }
    }
    for (int e = 0; e < nn; ++e) g[2 * n + e] = gs[e] * wk[e];
    float* gzt = gz + t * m;
    for (int c = 0; c < m; ++c) {
      const int slice = c < n ? 0 : (c < 2 * n ? 1 : 2);
      acc[c] += g[c];
      acc[m + slice] += g[c] * zt[c];
      gzt[c] = mh.alpha[slice] * g[c];
    }
  }
  sum_warp_partials(partial + blockIdx.x * std::int64_t(na), smem, kWarps, na);
}

// One warp per token, after dstreams = gz phi: the flattened RMSNorm's backward in place, the
// width paths added, and gz times the RMS factor (for phi's gradient x^T (r gz)).
__global__ void mhc_backward_state_kernel(Mhc mh, const float* coef, const float* rms, const float* dh_in,
                                          const float* dout, float* dstreams, float* gz) {
  const int lane = threadIdx.x & 31;
  const int n = mh.n, d = mh.d, nd = n * d, m = n * (n + 2);
  for (std::int64_t t = global_warp(); t < mh.n_tok; t += warp_count()) {
    const float* x = mh.streams + t * nd;
    float* dx = dstreams + t * nd;
    const float r = rms[t];
    float s = 0;
    for (int e = lane; e < nd; e += 32) s = fmaf(x[e], dx[e], s);
    s = warp_sum(s);
    const float cx = r * r * r * s / static_cast<float>(nd);
    for (int e = lane; e < nd; e += 32) dx[e] = r * dx[e] - cx * x[e];
    __syncwarp();
    width_mix(dx, coef + t * m, dh_in + t * d, dout + t * nd, n, d, lane, true);
    for (int c = lane; c < m; c += 32) gz[t * m + c] *= r;
  }
}

unsigned warps_grid(std::int64_t items) { return grid_for(items, kWarps); }

}  // namespace

// ---- launchers --------------------------------------------------------------------------------

void stream_expand(float* streams, const float* x, std::int64_t n_tok, int n, int d, float scale, Stream stream) {
  const std::int64_t total = n_tok * n * d;
  if (total == 0) return;
  stream_expand_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(streams, x, n_tok, n, d, scale);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void stream_reduce(float* x, const float* streams, std::int64_t n_tok, int n, int d, float scale, Stream stream) {
  const std::int64_t total = n_tok * d;
  if (total == 0) return;
  stream_reduce_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(x, streams, n_tok, n, d, scale);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void stream_write_forward(float* out, const float* streams, const StreamCoef& c, const float* y, std::int64_t n_tok,
                          int n, int d, Stream stream) {
  require(n >= 1 && n <= kMaxN, "CUDA backend: 1 to ", kMaxN, " streams, got ", n);
  const std::int64_t total = n_tok * n * d;
  if (total == 0) return;
  stream_write_forward_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(out, streams, c, y, n_tok, n, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void stream_write_backward(float* dy, float* dbeta, const float* dout, const float* y, const StreamCoef& c,
                           std::int64_t n_tok, int n, int d, Stream stream) {
  if (n_tok == 0) return;
  stream_write_backward_kernel<<<warps_grid(n_tok), 32 * kWarps, 0, stream>>>(dy, dbeta, dout, y, c, n_tok, n, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void hc_scale_projections(float* wg, const HyperConnection& hc, Stream stream) {
  const std::int64_t total = std::int64_t(hc.n + 2) * hc.d;
  hc_scale_projections_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(wg, hc);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void hc_forward(const HyperConnection& hc, const float* proj, float* h0, float* coef, float* act, float* rms,
                Stream stream) {
  require(hc.n >= 1 && hc.n <= kMaxN, "CUDA backend: hyper-connections need 1 to ", kMaxN, " streams");
  if (hc.n_tok == 0) return;
  hc_forward_kernel<<<warps_grid(hc.n_tok), 32 * kWarps, 0, stream>>>(hc, proj, h0, coef, act, rms);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void hc_backward_width(const HyperConnection& hc, const float* coef, const float* act, const float* rms,
                       const float* dh0, const float* dout, const float* dbeta, float* dstreams, float* gproj,
                       const HyperConnectionGrads& grads, float* partial, Stream stream) {
  const std::int64_t chunks = num_chunks(hc.n_tok);
  if (chunks == 0) return;
  const int n = hc.n, ns = n * (n + 2) + 2;
  hc_backward_width_kernel<<<static_cast<unsigned>(chunks), 32 * kWarps, 0, stream>>>(hc, coef, act, rms, dh0, dout,
                                                                                      dbeta, dstreams, gproj, partial);
  ATTNRES_CUDA_CHECK_LAUNCH();
  sum_chunks(grads.A, partial, chunks, ns, n * (n + 1), stream);
  sum_chunks(grads.B, partial + n * (n + 1), chunks, ns, n, stream);
  if (hc.w_alpha == nullptr) return;
  sum_chunks(grads.s_alpha, partial + ns - 2, chunks, ns, 1, stream);
  sum_chunks(grads.s_beta, partial + ns - 1, chunks, ns, 1, stream);
}

void hc_backward_norm(const HyperConnection& hc, const float* rms, const float* rows, float* dstreams, Stream stream) {
  if (hc.n_tok == 0) return;
  hc_backward_norm_kernel<<<warps_grid(hc.n_tok * hc.n), 32 * kWarps, 0, stream>>>(hc, rms, rows, dstreams);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void hc_backward_params(const HyperConnection& hc, const float* acc, const HyperConnectionGrads& grads, Stream stream) {
  hc_backward_params_kernel<<<grid_for(hc.d, kThreads), kThreads, 0, stream>>>(hc, acc, grads.w_alpha, grads.w_beta,
                                                                              grads.norm);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

std::int64_t mhc_work_floats(std::int64_t n_tok, int n, int iters) {
  return num_chunks(n_tok) * kWarps * (2 * std::int64_t(iters) + 1) * n * n;
}

void mhc_forward(const Mhc& mh, float* z, float* h_in, float* coef, float* rms, Stream stream) {
  require(mh.n >= 1 && mh.n <= kMaxN, "CUDA backend: mHC needs 1 to ", kMaxN, " streams");
  require(mh.iters >= 1, "mHC needs at least one Sinkhorn iteration");
  if (mh.n_tok == 0) return;
  mhc_forward_kernel<<<warps_grid(mh.n_tok), 32 * kWarps, 0, stream>>>(mh, z, h_in, coef, rms);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void mhc_backward_coef(const Mhc& mh, const float* z, const float* dh_in, const float* dout, const float* dpost,
                       float* gz, float* dbias, float* dalpha, float* partial, float* work, Stream stream) {
  const std::int64_t chunks = num_chunks(mh.n_tok);
  if (chunks == 0) return;
  const int m = mh.n * (mh.n + 2);
  mhc_backward_coef_kernel<<<static_cast<unsigned>(chunks), 32 * kWarps, 0, stream>>>(mh, z, dh_in, dout, dpost, gz,
                                                                                      partial, work);
  ATTNRES_CUDA_CHECK_LAUNCH();
  sum_chunks(dbias, partial, chunks, m + 3, m, stream);
  sum_chunks(dalpha, partial + m, chunks, m + 3, 3, stream);
}

void mhc_backward_state(const Mhc& mh, const float* coef, const float* rms, const float* dh_in, const float* dout,
                        float* dstreams, float* gz, Stream stream) {
  if (mh.n_tok == 0) return;
  mhc_backward_state_kernel<<<warps_grid(mh.n_tok), 32 * kWarps, 0, stream>>>(mh, coef, rms, dh_in, dout, dstreams,
                                                                              gz);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda::kern
