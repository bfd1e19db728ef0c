// The AttnRes depth read on the GPU (kernels/depth_read semantics, spec §2, §5, §6): one warp per
// token, the token's slice of every vector held in registers (VPL values per lane, element
// k = lane + 32 i, so each warp load is one coalesced 128-byte row segment).
//
// Forward: ONE pass over the sources. Each source is loaded once; its sum of squares and its
// dot with every route's query*gamma are warp-reduced, giving r_s and the logits z_rs, and the
// mix is accumulated with an online softmax (running max and sum, as in flash attention), so
// no second pass over the sources is needed. The following RMSNorm is fused (h stays in
// registers). RD's two routes share the pass, the RMS factors and gamma (Delta AttnRes's V route
// the pass and the RMS factors; its key norm is its own, gamma1). Delta's reads also add the gated
// mix to the stream before the norm (residual, gate).
//
// Backward (spec §6): two passes per token, as on the CPU: c_rs = g_r . v_s, then
// dv_s += sum_r (alpha_rs g_r + delta_rs r_s u_r) - r_s^2 (sum_r delta_rs z_rs)/d v_s; in the
// second pass each source's loads are all issued before its stores (one round trip a source).
// Query and gamma gradients are summed per 64-token chunk (one block) in a fixed warp order,
// then over chunks in a fixed order (deterministic).
//
// Batched over a group of reads (issue #49): the reads of a block share their completed blocks
// as sources. Each read's kernel then runs the first pass over all its sources (its delta needs
// every c) but the second only over its own (the block's partial sum); for the shared ones it
// stores the five coefficients of the update above. After the group's last read, one pass over
// each shared source (depth_read_group_kernel) adds every read's share, the reads in the order
// they ran, with the same update arithmetic (source_grad): one read-modify-write of a shared
// source's gradient per group instead of one per read.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda::kern {

namespace {

constexpr int kWarps = 8;
constexpr int kTokensPerWarp = static_cast<int>(kChunkTokens) / kWarps;

template <int VPL>
__device__ __forceinline__ void load_slice(float (&v)[VPL], const float* p, int d, int lane) {
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int k = lane + 32 * i;
    v[i] = k < d ? p[k] : 0.0f;
  }
}

// One route's online-softmax mix. Explicit fmaf pins the arithmetic, so the forward and the
// value-route recompute (same z, same sources) give bit-identical results.
template <int VPL>
struct OnlineMix {
  float acc[VPL];
  float m, l;

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int i = 0; i < VPL; ++i) acc[i] = 0.0f;
    m = -INFINITY;
    l = 0.0f;
  }
  __device__ __forceinline__ void add(float z, const float (&v)[VPL]) {
    const float m_new = fmaxf(m, z);
    const float corr = expf(m - m_new);  // 0 for the first source (m = -inf)
    const float p = expf(z - m_new);
    l = fmaf(l, corr, p);
#pragma unroll
    for (int i = 0; i < VPL; ++i) acc[i] = fmaf(p, v[i], acc[i] * corr);
    m = m_new;
  }
  __device__ __forceinline__ void add_uniform(const float (&v)[VPL]) {
#pragma unroll
    for (int i = 0; i < VPL; ++i) acc[i] += v[i];
  }
  // h = sum_s alpha_s v_s: acc / l, or the mean (alpha = 1/n) for a uniform route.
  __device__ __forceinline__ void finish(bool uniform, int n, float (&h)[VPL]) const {
    const float inv = uniform ? 1.0f / static_cast<float>(n) : 1.0f / l;
#pragma unroll
    for (int i = 0; i < VPL; ++i) h[i] = acc[i] * inv;
  }
};

// x = h * rstd * w (kernels/rmsnorm forward), rstd = 1/sqrt(mean(h^2) + eps); h is 0 beyond d.
template <int VPL, class T>
__device__ __forceinline__ void norm_store(const float (&h)[VPL], const float* w, T* x, float* rstd, int d, float eps,
                                           int lane) {
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < VPL; ++i) ss = fmaf(h[i], h[i], ss);
  ss = warp_sum(ss);
  // The weights are loaded before the first store: interleaved, each load would wait for the
  // previous element's store (the compiler cannot rule out that x aliases w).
  float wv[VPL];
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int k = lane + 32 * i;
    wv[i] = k < d ? w[k] : 0.0f;
  }
  const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  if (lane == 0) *rstd = r;
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int k = lane + 32 * i;
    if (k < d) x[k] = from_float<T>(h[i] * r * wv[i]);
  }
}

template <int VPL>
__device__ __forceinline__ void store_slice(const float (&h)[VPL], float* p, int d, int lane) {
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int k = lane + 32 * i;
    if (k < d) p[k] = h[i];
  }
}

// Delta AttnRes: the stream's slice xr and the gate's gv (1 without a gate; kernels/delta_read's
// scalar_gate, or the vector gate's row).
template <int VPL>
__device__ __forceinline__ void delta_stream_gate(float (&xr)[VPL], float (&gv)[VPL], const DepthReadForward& a,
                                                  std::int64_t t, int lane) {
  load_slice(xr, a.residual + t * a.d, a.d, lane);
  if (a.gate == kernels::DeltaGate::sigmoid_vector) {
    load_slice(gv, a.gate_param + t * a.d, a.d, lane);
    return;
  }
  float g = 1.0f;
  if (a.gate == kernels::DeltaGate::sigmoid_scalar) g = 1.0f / (1.0f + expf(-a.gate_param[0]));
  else if (a.gate == kernels::DeltaGate::learnable_alpha) g = a.gate_param[0];
#pragma unroll
  for (int i = 0; i < VPL; ++i) gv[i] = g;
}

// h = x + g c in place (c = h on entry, kept in mix when not null). Without a gate g is 1 and
// x + 1 * c is x + c exactly.
template <int VPL>
__device__ __forceinline__ void delta_add(float (&h)[VPL], const float (&xr)[VPL], const float (&gv)[VPL], float* mix,
                                          std::int64_t t, int d, int lane) {
  if (mix != nullptr) store_slice(h, mix + t * d, d, lane);
#pragma unroll
  for (int i = 0; i < VPL; ++i) h[i] = fmaf(gv[i], h[i], xr[i]);
}

// Shared memory: u_r = q_r * gamma [2][d] (0 beyond d and for uniform routes).
template <int VPL, class T>
__global__ void __launch_bounds__(32 * kWarps) depth_read_forward_kernel(DepthReadForward a) {
  extern __shared__ float su[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = a.n_sources, d = a.d;
  const bool two = a.n_routes > 1;
  const float* q0 = a.queries[0];
  const float* q1 = two ? a.queries[1] : nullptr;
  for (int k = threadIdx.x; k < 32 * VPL; k += blockDim.x) {
    su[k] = (k < d && q0 != nullptr) ? q0[k] * a.gamma[k] : 0.0f;
    su[32 * VPL + k] = (k < d && q1 != nullptr) ? q1[k] * (a.gamma1 != nullptr ? a.gamma1 : a.gamma)[k] : 0.0f;
  }
  __syncthreads();
  const std::int64_t t = blockIdx.x * std::int64_t(kWarps) + warp;
  if (t >= a.n_tok) return;  // whole warp; no block-level synchronisation below
  OnlineMix<VPL> mix0, mix1;
  mix0.init();
  mix1.init();
  for (int s = 0; s < n; ++s) {
    float v[VPL];
    load_slice(v, a.sources[s] + t * d, d, lane);
    float ss = 0.0f, dot0 = 0.0f, dot1 = 0.0f;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      ss = fmaf(v[i], v[i], ss);
      dot0 = fmaf(su[lane + 32 * i], v[i], dot0);
      dot1 = fmaf(su[32 * VPL + lane + 32 * i], v[i], dot1);
    }
    ss = warp_sum(ss);
    if (q0 != nullptr) dot0 = warp_sum(dot0);
    if (q1 != nullptr) dot1 = warp_sum(dot1);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + a.eps);
    if (lane == 0) a.rms[t * n + s] = r;
    if (q0 != nullptr) {
      const float z = r * dot0;
      if (lane == 0) a.logits[t * n + s] = z;
      mix0.add(z, v);
    } else {
      mix0.add_uniform(v);
    }
    if (two) {
      if (q1 != nullptr) {
        const float z = r * dot1;
        if (lane == 0) a.logits[(a.n_tok + t) * n + s] = z;
        mix1.add(z, v);
      } else {
        mix1.add_uniform(v);
      }
    }
  }
  float h[VPL];
  mix0.finish(q0 == nullptr, n, h);
  // Delta AttnRes (kernels/delta_read_forward): the stream and the gate, applied to each route.
  float xr[VPL], gv[VPL];
  if (a.residual != nullptr) delta_stream_gate(xr, gv, a, t, lane);
  if (two) {
    float hv[VPL];
    mix1.finish(q1 == nullptr, n, hv);
    if (a.average) {
#pragma unroll
      for (int i = 0; i < VPL; ++i) h[i] = (h[i] + hv[i]) * 0.5f;
    } else {
      if (a.residual != nullptr) delta_add(hv, xr, gv, a.mixv, t, d, lane);
      if (a.hv != nullptr) store_slice(hv, a.hv + t * d, d, lane);
      norm_store(hv, a.norm_w, static_cast<T*>(a.xv) + t * d, a.rstdv + t, d, a.eps, lane);
    }
  }
  if (a.residual != nullptr) delta_add(h, xr, gv, a.mix, t, d, lane);
  store_slice(h, a.h + t * d, d, lane);
  norm_store(h, a.norm_w, static_cast<T*>(a.x) + t * d, a.rstd + t, d, a.eps, lane);
}

// Route 1 again, from its saved logits: the same loads and the same OnlineMix arithmetic.
template <int VPL, class T>
__global__ void __launch_bounds__(32 * kWarps) depth_read_value_kernel(DepthReadForward a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t t = blockIdx.x * std::int64_t(kWarps) + warp;
  if (t >= a.n_tok) return;
  const int n = a.n_sources, d = a.d;
  const float* q1 = a.queries[1];
  OnlineMix<VPL> mix1;
  mix1.init();
  for (int s = 0; s < n; ++s) {
    float v[VPL];
    load_slice(v, a.sources[s] + t * d, d, lane);
    if (q1 != nullptr) mix1.add(a.logits[(a.n_tok + t) * n + s], v);
    else mix1.add_uniform(v);
  }
  float hv[VPL];
  mix1.finish(q1 == nullptr, n, hv);
  if (a.hv != nullptr) store_slice(hv, a.hv + t * d, d, lane);
  norm_store(hv, a.norm_w, static_cast<T*>(a.xv) + t * d, a.rstdv + t, d, a.eps, lane);
}

// alpha = softmax(z) over n sources (kernels/depth_weights), or uniform; lanes own s = lane + 32 j.
__device__ __forceinline__ void depth_weights_lanes(float* alpha, const float* z, bool uniform, int n, int lane) {
  if (uniform) {
    const float u = 1.0f / static_cast<float>(n);
    for (int s = lane; s < n; s += 32) alpha[s] = u;
    return;
  }
  float mx = -INFINITY;
  for (int s = lane; s < n; s += 32) mx = fmaxf(mx, z[s]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int s = lane; s < n; s += 32) {
    const float e = expf(z[s] - mx);
    alpha[s] = e;
    sum += e;
  }
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int s = lane; s < n; s += 32) alpha[s] *= inv;
}

// The update of one source element by one read (both routes; a one-route read has zeros in
// route 1's coefficients and gradient). Shared by the immediate pass and the group pass, so a
// source's gradient gets the same arithmetic either way.
struct SourceCoefs {
  float al0, al1, b0, b1, kv;
};
__device__ __forceinline__ float source_grad(float dv, float v, float g0, float g1, float u0, float u1,
                                             const SourceCoefs& c) {
  dv += fmaf(c.b0, u0, c.al0 * g0);
  dv += fmaf(c.b1, u1, c.al1 * g1);
  return fmaf(-c.kv, v, dv);
}

// Block = 8 warps = one chunk of 64 tokens (8 per warp). Shared memory: u_r = q_r * gamma [2][d],
// the block's ordered partial sums [2][d], then per warp 7 arrays of n floats.
template <int VPL>
__global__ void __launch_bounds__(32 * kWarps) depth_read_backward_kernel(DepthReadBackward a) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = a.n_sources, d = a.d, R = a.n_routes;
  const bool has0 = a.queries[0] != nullptr;
  const bool has1 = R > 1 && a.queries[1] != nullptr;
  float* su = smem;            // [2][d]
  float* sacc = smem + 2 * d;  // [2][d]
  float* ws = smem + 4 * d + warp * 7 * n;
  float* sr = ws;          // r_s
  float* sz0 = ws + n;     // logits, route 0
  float* sz1 = ws + 2 * n; // logits, route 1
  float* sa0 = ws + 3 * n; // alpha, route 0
  float* sa1 = ws + 4 * n; // alpha, route 1
  float* sd0 = ws + 5 * n; // c_s * gscale, then delta_s, route 0
  float* sd1 = ws + 6 * n; // same, route 1
  for (int k = threadIdx.x; k < d; k += blockDim.x) {
    su[k] = has0 ? a.queries[0][k] * a.gamma[k] : 0.0f;
    su[d + k] = has1 ? a.queries[1][k] * (a.gamma1 != nullptr ? a.gamma1 : a.gamma)[k] : 0.0f;
  }
  __syncthreads();
  // With averaged routes each route sees half of the output's gradient.
  const float gscale = a.average ? 1.0f / static_cast<float>(R) : 1.0f;
  float acc0[VPL], acc1[VPL];  // sum over tokens, sources of delta_rs * r_s * v_s (= delta n_s)
#pragma unroll
  for (int i = 0; i < VPL; ++i) acc0[i] = acc1[i] = 0.0f;

  for (int it = 0; it < kTokensPerWarp; ++it) {
    const std::int64_t t = blockIdx.x * kChunkTokens + warp * kTokensPerWarp + it;
    if (t >= a.n_tok) break;  // whole warp
    for (int s = lane; s < n; s += 32) {
      sr[s] = a.rms[t * n + s];
      if (has0) sz0[s] = a.logits[t * n + s];
      if (has1) sz1[s] = a.logits[(a.n_tok + t) * n + s];
    }
    __syncwarp();
    depth_weights_lanes(sa0, sz0, !has0, n, lane);
    if (R > 1) depth_weights_lanes(sa1, sz1, !has1, n, lane);
    __syncwarp();
    float g0[VPL], g1[VPL];
    load_slice(g0, a.dout[0] + t * d, d, lane);
    if (R > 1) {
      load_slice(g1, (a.average ? a.dout[0] : a.dout[1]) + t * d, d, lane);
    } else {
#pragma unroll
      for (int i = 0; i < VPL; ++i) g1[i] = 0.0f;
    }
    // Pass 1: c_rs = g_r . v_s.
    if (has0 || has1) {
      for (int s = 0; s < n; ++s) {
        float v[VPL];
        load_slice(v, a.sources[s] + t * d, d, lane);
        float c0 = 0.0f, c1 = 0.0f;
#pragma unroll
        for (int i = 0; i < VPL; ++i) {
          c0 = fmaf(g0[i], v[i], c0);
          c1 = fmaf(g1[i], v[i], c1);
        }
        if (has0) c0 = warp_sum(c0);
        if (has1) c1 = warp_sum(c1);
        if (lane == 0) {
          sd0[s] = c0 * gscale;
          sd1[s] = c1 * gscale;
        }
      }
      __syncwarp();
      // delta_rs = alpha_rs (c_rs - sum_s' alpha_rs' c_rs'); every lane sums in the same order.
      float cbar0 = 0.0f, cbar1 = 0.0f;
      if (has0)
        for (int s = 0; s < n; ++s) cbar0 += sa0[s] * sd0[s];
      if (has1)
        for (int s = 0; s < n; ++s) cbar1 += sa1[s] * sd1[s];
      __syncwarp();  // all lanes have read sd before it is overwritten
      for (int s = lane; s < n; s += 32) {
        sd0[s] = has0 ? sa0[s] * (sd0[s] - cbar0) : 0.0f;
        sd1[s] = has1 ? sa1[s] * (sd1[s] - cbar1) : 0.0f;
      }
    } else {
      for (int s = lane; s < n; s += 32) sd0[s] = sd1[s] = 0.0f;
    }
    __syncwarp();
    // The update's coefficients of source s (every lane reads the warp's arrays).
    const auto coefs = [&](int s) {
      SourceCoefs c;
      const float rs = sr[s];
      c.al0 = sa0[s] * gscale;
      c.al1 = R > 1 ? sa1[s] * gscale : 0.0f;
      c.b0 = has0 ? sd0[s] * rs : 0.0f;
      c.b1 = has1 ? sd1[s] * rs : 0.0f;
      float key = 0.0f;
      if (has0) key += sd0[s] * sz0[s];
      if (has1) key += sd1[s] * sz1[s];
      c.kv = rs * rs * key / static_cast<float>(d);
      return c;
    };
    // The shared sources' coefficients, for the group's pass.
    for (int s = lane; s < a.n_deferred; s += 32) {
      const SourceCoefs c = coefs(s);
      float* out = a.coef + (t * a.n_deferred + s) * kDepthReadCoefs;
      out[0] = c.al0;
      out[1] = c.al1;
      out[2] = c.b0;
      out[3] = c.b1;
      out[4] = c.kv;
    }
    // Pass 2 over this read's own sources: their gradients and the query / gamma accumulators.
    for (int s = a.n_deferred; s < n; ++s) {
      const SourceCoefs c = coefs(s);
      const float* vp = a.sources[s] + t * d;
      float* dvp = a.dsources[s] + t * d;
      // Every load of this source's slice and of its gradient first, then the arithmetic and the
      // stores. Interleaved (load, update, store per element), the compiler may not move an
      // element's loads above the previous element's store (dvp and vp might alias, as far as it
      // knows), which made this pass one dependent memory round trip per element. Same
      // arithmetic in the same order: bit-identical results.
      float vs[VPL], dvs[VPL];
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const int k = lane + 32 * i;
        vs[i] = k < d ? vp[k] : 0.0f;
        dvs[i] = k < d ? dvp[k] : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const int k = lane + 32 * i;
        if (k < d) {
          const float v = vs[i];
          dvp[k] = source_grad(dvs[i], v, g0[i], g1[i], su[k], su[d + k], c);
          acc0[i] = fmaf(c.b0, v, acc0[i]);
          acc1[i] = fmaf(c.b1, v, acc1[i]);
        }
      }
    }
    __syncwarp();  // before the next token overwrites this warp's arrays
  }
  // The block's partial: warps added in order 0..7.
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const int k = lane + 32 * i;
        if (k < d) {
          sacc[k] = (w == 0 ? 0.0f : sacc[k]) + acc0[i];
          sacc[d + k] = (w == 0 ? 0.0f : sacc[d + k]) + acc1[i];
        }
      }
    }
    __syncthreads();
  }
  float* out = a.scratch + blockIdx.x * std::int64_t(2 * d);
  for (int k = threadIdx.x; k < 2 * d; k += blockDim.x) out[k] = sacc[k];
}

// dq_r += A_r * gamma, dgamma += A_r * q_r (routes in order; route 1 with gamma1 and dgamma1 when
// gamma1 is set), A_r = sum over chunks of the
// partials: 32 columns per block, 8 warps over fixed chunk ranges, then warp 0 in order.
__global__ void depth_read_finalize_kernel(DepthReadBackward a, std::int64_t chunks) {
  __shared__ float part[kWarps][2][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int d = a.d;
  const int k = blockIdx.x * 32 + lane;
  const std::int64_t per = (chunks + kWarps - 1) / kWarps;
  const std::int64_t c0 = warp * per, c1 = c0 + per < chunks ? c0 + per : chunks;
  float s0 = 0.0f, s1 = 0.0f;
  if (k < d)
    for (std::int64_t c = c0; c < c1; ++c) {
      s0 += a.scratch[c * 2 * d + k];
      s1 += a.scratch[c * 2 * d + d + k];
    }
  part[warp][0][lane] = s0;
  part[warp][1][lane] = s1;
  __syncthreads();
  if (warp != 0 || k >= d) return;
  float A[2] = {0.0f, 0.0f};
  for (int w = 0; w < kWarps; ++w) {
    A[0] += part[w][0][lane];
    A[1] += part[w][1][lane];
  }
  for (int r = 0; r < a.n_routes; ++r) {
    if (a.queries[r] == nullptr) continue;
    const bool own = r == 1 && a.gamma1 != nullptr;  // Delta's V route: its own key norm
    if (a.dqueries[r] != nullptr) a.dqueries[r][k] += A[r] * (own ? a.gamma1 : a.gamma)[k];
    (own ? a.dgamma1 : a.dgamma)[k] += A[r] * a.queries[r][k];
  }
}

// The group's pass over its shared sources: block = one chunk of 64 tokens, one thread per
// column (cols_per_thread columns when d exceeds 1024). Per token it loads every read's output
// gradients once, then the shared sources kSrcBatch at a time (all loads of a batch before its
// stores: the compiler may not hoist a load above a store it cannot prove unaliased) and applies
// the reads in order (g.reads[0] first). Each read's query / gamma partial of the chunk is added
// to the one its own kernel left in its scratch (chunk order, then these sources in order).
// NG: the group size rounded up (compile-time register arrays); TWO: some read has two routes.
constexpr int kSrcBatch = 4;

template <int NG, bool TWO>
__global__ void depth_read_group_kernel(DepthReadGroup g, int cols_per_thread) {
  const int G = g.n_reads;
  const DepthReadBackward& a = g.reads[0];
  const int n_def = a.n_deferred, d = a.d;
  const std::int64_t chunk = blockIdx.x;
  const std::int64_t t0 = chunk * kChunkTokens;
  const std::int64_t t1 = t0 + kChunkTokens < a.n_tok ? t0 + kChunkTokens : a.n_tok;
  for (int col = 0; col < cols_per_thread; ++col) {
    const int k = threadIdx.x + col * blockDim.x;
    if (k >= d) break;  // no block-level synchronisation in this kernel
    float u0[NG], u1[NG], acc0[NG], acc1[NG];
#pragma unroll
    for (int j = 0; j < NG; ++j) {
      const DepthReadBackward& r = g.reads[j];
      const bool live = j < G;
      u0[j] = live && r.queries[0] != nullptr ? r.queries[0][k] * r.gamma[k] : 0.0f;
      u1[j] = TWO && live && r.n_routes > 1 && r.queries[1] != nullptr
                  ? r.queries[1][k] * (r.gamma1 != nullptr ? r.gamma1 : r.gamma)[k]
                  : 0.0f;
      acc0[j] = acc1[j] = 0.0f;
    }
    // Summed over each run of kTokensPerWarp tokens first (part), then the runs in order: the
    // same two levels as the read's own kernel (a warp's tokens, then the warps), not one
    // sequential sum over the chunk's 64 tokens and all sources.
    float part0[NG], part1[NG];
#pragma unroll
    for (int j = 0; j < NG; ++j) part0[j] = part1[j] = 0.0f;
    for (std::int64_t t = t0; t < t1; ++t) {
      if (t > t0 && (t - t0) % kTokensPerWarp == 0) {
#pragma unroll
        for (int j = 0; j < NG; ++j) {
          acc0[j] += part0[j];
          acc1[j] += part1[j];
          part0[j] = part1[j] = 0.0f;
        }
      }
      float g0[NG], g1[NG];
#pragma unroll
      for (int j = 0; j < NG; ++j) {
        const DepthReadBackward& r = g.reads[j];
        g0[j] = j < G ? r.dout[0][t * d + k] : 0.0f;
        g1[j] = TWO && j < G && r.n_routes > 1 ? (r.average ? r.dout[0] : r.dout[1])[t * d + k] : 0.0f;
      }
      for (int s0 = 0; s0 < n_def; s0 += kSrcBatch) {
        float v[kSrcBatch], dv[kSrcBatch];
#pragma unroll
        for (int b = 0; b < kSrcBatch; ++b) {
          const int s = s0 + b;
          v[b] = s < n_def ? a.sources[s][t * d + k] : 0.0f;
          dv[b] = s < n_def ? a.dsources[s][t * d + k] : 0.0f;
        }
#pragma unroll
        for (int b = 0; b < kSrcBatch; ++b) {
          const int s = s0 + b;
          if (s >= n_def) break;
#pragma unroll
          for (int j = 0; j < NG; ++j) {
            if (j >= G) break;
            const float* cp = g.reads[j].coef + (t * n_def + s) * kDepthReadCoefs;
            const SourceCoefs c{cp[0], cp[1], cp[2], cp[3], cp[4]};
            dv[b] = source_grad(dv[b], v[b], g0[j], g1[j], u0[j], u1[j], c);
            part0[j] = fmaf(c.b0, v[b], part0[j]);
            if (TWO) part1[j] = fmaf(c.b1, v[b], part1[j]);
          }
        }
#pragma unroll
        for (int b = 0; b < kSrcBatch; ++b) {
          const int s = s0 + b;
          if (s < n_def) a.dsources[s][t * d + k] = dv[b];
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NG; ++j) {
      if (j >= G) break;
      acc0[j] += part0[j];
      acc1[j] += part1[j];
      float* out = g.reads[j].scratch + chunk * 2 * d;
      out[k] += acc0[j];
      out[d + k] += acc1[j];
    }
  }
}

int values_per_lane(int d) {
  require(d >= 1 && d <= kMaxWidth, "CUDA depth read: d_model ", d, " must be at most ", kMaxWidth);
  const int need = (d + 31) / 32;
  for (int v : {4, 8, 12, 16, 20, 24, 28, 32, 64})
    if (need <= v) return v;
  return 64;
}

#define ATTNRES_VPL_DISPATCH(vpl, ...)         \
  switch (vpl) {                               \
    case 4: { constexpr int V = 4; __VA_ARGS__; } break;   \
    case 8: { constexpr int V = 8; __VA_ARGS__; } break;   \
    case 12: { constexpr int V = 12; __VA_ARGS__; } break; \
    case 16: { constexpr int V = 16; __VA_ARGS__; } break; \
    case 20: { constexpr int V = 20; __VA_ARGS__; } break; \
    case 24: { constexpr int V = 24; __VA_ARGS__; } break; \
    case 28: { constexpr int V = 28; __VA_ARGS__; } break; \
    case 32: { constexpr int V = 32; __VA_ARGS__; } break; \
    default: { constexpr int V = 64; __VA_ARGS__; } break; \
  }

void check_read(const DepthReadForward& a) {
  require(a.n_sources >= 1 && a.n_routes >= 1 && a.n_routes <= 2, "CUDA depth read: bad plan");
  require(a.n_routes == 1 || a.average || a.xv != nullptr, "CUDA depth read: a separate value route needs xv");
}

}  // namespace

void depth_read_forward(const DepthReadForward& a, Stream stream) {
  check_read(a);
  if (a.n_tok == 0) return;
  const unsigned blocks = static_cast<unsigned>((a.n_tok + kWarps - 1) / kWarps);
  const int vpl = values_per_lane(a.d);
  if (a.x_type == DType::f32) {
    ATTNRES_VPL_DISPATCH(vpl, depth_read_forward_kernel<V, float>
                         <<<blocks, 32 * kWarps, sizeof(float) * 64 * V, stream>>>(a))
  } else {
    ATTNRES_VPL_DISPATCH(vpl, depth_read_forward_kernel<V, bf16>
                         <<<blocks, 32 * kWarps, sizeof(float) * 64 * V, stream>>>(a))
  }
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void depth_read_recompute_value(const DepthReadForward& a, Stream stream) {
  check_read(a);
  require(a.n_routes == 2 && !a.average, "depth_read_recompute_value: the read has no separate value route");
  if (a.n_tok == 0) return;
  const unsigned blocks = static_cast<unsigned>((a.n_tok + kWarps - 1) / kWarps);
  const int vpl = values_per_lane(a.d);
  if (a.x_type == DType::f32) {
    ATTNRES_VPL_DISPATCH(vpl, depth_read_value_kernel<V, float><<<blocks, 32 * kWarps, 0, stream>>>(a))
  } else {
    ATTNRES_VPL_DISPATCH(vpl, depth_read_value_kernel<V, bf16><<<blocks, 32 * kWarps, 0, stream>>>(a))
  }
  ATTNRES_CUDA_CHECK_LAUNCH();
}

std::int64_t depth_read_scratch_floats(std::int64_t n_tok, int d) { return num_chunks(n_tok) * 2 * d; }

void depth_read_backward(const DepthReadBackward& a, Stream stream) {
  require(a.n_sources >= 1 && a.n_routes >= 1 && a.n_routes <= 2, "CUDA depth read: bad plan");
  require(a.n_deferred >= 0 && a.n_deferred <= a.n_sources && (a.n_deferred == 0 || a.coef != nullptr),
          "CUDA depth read: ", a.n_deferred, " shared sources of ", a.n_sources);
  if (a.n_tok == 0) return;
  const std::int64_t chunks = num_chunks(a.n_tok);
  const std::size_t smem = sizeof(float) * (4 * static_cast<std::size_t>(a.d) +
                                            std::size_t(kWarps) * 7 * static_cast<std::size_t>(a.n_sources));
  const int vpl = values_per_lane(a.d);
  ATTNRES_VPL_DISPATCH(vpl, {
    if (smem > 48 * 1024)
      ATTNRES_CUDA_CHECK(cudaFuncSetAttribute(depth_read_backward_kernel<V>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    depth_read_backward_kernel<V><<<static_cast<unsigned>(chunks), 32 * kWarps, smem, stream>>>(a);
  })
  ATTNRES_CUDA_CHECK_LAUNCH();
  if (a.n_deferred == 0) {
    depth_read_finalize_kernel<<<static_cast<unsigned>((a.d + 31) / 32), 32 * kWarps, 0, stream>>>(a, chunks);
    ATTNRES_CUDA_CHECK_LAUNCH();
  }
}

void depth_read_group_backward(const DepthReadGroup& g, Stream stream) {
  require(g.n_reads >= 1 && g.n_reads <= kMaxReadGroup, "CUDA depth read group: ", g.n_reads, " reads (at most ",
          kMaxReadGroup, ")");
  const DepthReadBackward& a = g.reads[0];
  bool two = false;
  for (int j = 0; j < g.n_reads; ++j) {
    const DepthReadBackward& r = g.reads[j];
    require(r.n_deferred == a.n_deferred && r.n_deferred >= 1 && r.n_deferred <= r.n_sources && r.n_tok == a.n_tok &&
                r.d == a.d && r.coef != nullptr,
            "CUDA depth read group: read ", j, " does not share the group's sources");
    two = two || r.n_routes > 1;
  }
  if (a.n_tok == 0) return;
  const std::int64_t chunks = num_chunks(a.n_tok);
  const int cols = (a.d + 1023) / 1024;                     // columns per thread
  const int threads = ((a.d + cols - 1) / cols + 31) / 32 * 32;  // one column a thread, whole warps
  const auto launch = [&](auto ng) {
    constexpr int NG = decltype(ng)::value;
    if (two) depth_read_group_kernel<NG, true><<<static_cast<unsigned>(chunks), threads, 0, stream>>>(g, cols);
    else depth_read_group_kernel<NG, false><<<static_cast<unsigned>(chunks), threads, 0, stream>>>(g, cols);
  };
  if (g.n_reads <= 2) launch(std::integral_constant<int, 2>{});
  else if (g.n_reads <= 4) launch(std::integral_constant<int, 4>{});
  else launch(std::integral_constant<int, kMaxReadGroup>{});
  ATTNRES_CUDA_CHECK_LAUNCH();
  for (int j = 0; j < g.n_reads; ++j) {
    depth_read_finalize_kernel<<<static_cast<unsigned>((a.d + 31) / 32), 32 * kWarps, 0, stream>>>(g.reads[j],
                                                                                                   chunks);
    ATTNRES_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace attnres::cuda::kern
