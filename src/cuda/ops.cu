// Elementwise, normalisation, loss and optimizer kernels of the CUDA backend (kernels.hpp).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda::kern {

namespace {

constexpr int kWarpsPerBlock = 8;  // warp-per-token kernels: 8 warps x 8 tokens = one 64-token chunk
constexpr int kTokensPerWarp = static_cast<int>(kChunkTokens) / kWarpsPerBlock;

// ---- embedding ------------------------------------------------------------------------------

__global__ void embedding_forward_kernel(float* out, const std::int32_t* tokens, const float* table, std::int64_t n,
                                         int d) {
  const std::int64_t total = n * d;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / d;
    const int k = static_cast<int>(i - t * d);
    out[i] = table[std::int64_t(tokens[t]) * d + k];
  }
}

// One block per distinct token id; threads over columns; positions in ascending order.
__global__ void embedding_backward_kernel(float* dtable, const std::int32_t* ids, const std::int32_t* starts,
                                          const std::int32_t* positions, const float* dout, int d) {
  const int u = blockIdx.x;
  const std::int64_t row = std::int64_t(ids[u]) * d;
  const int p0 = starts[u], p1 = starts[u + 1];
  for (int k = threadIdx.x; k < d; k += blockDim.x) {
    float acc = dtable[row + k];
    for (int p = p0; p < p1; ++p) acc += dout[std::int64_t(positions[p]) * d + k];
    dtable[row + k] = acc;
  }
}

// ---- RMSNorm --------------------------------------------------------------------------------

// One warp per token.
template <class T>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const float* x, const float* w, std::int64_t n, int d,
                                       float eps) {
  const int lane = threadIdx.x & 31;
  const std::int64_t t = blockIdx.x * std::int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (t >= n) return;
  const float* xt = x + t * d;
  float ss = 0;
  for (int k = lane; k < d; k += 32) ss += xt[k] * xt[k];
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  if (lane == 0) rstd[t] = r;
  T* yt = y + t * d;
  for (int k = lane; k < d; k += 32) yt[k] = from_float<T>(w != nullptr ? xt[k] * r * w[k] : xt[k] * r);
}

// Block = 8 warps = one chunk of 64 tokens, 8 per warp. Per-warp weight-gradient partials live in
// shared memory [8][d]; the block adds them in warp order into partial[chunk][d].
__global__ void rmsnorm_backward_kernel(float* dx, bool accumulate, const float* dy, const float* x, const float* w,
                                        const float* rstd, std::int64_t n, int d, float* partial) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  float* acc = smem + warp * d;
  for (int k = lane; k < d; k += 32) acc[k] = 0;
  for (int i = 0; i < kTokensPerWarp; ++i) {
    const std::int64_t t = blockIdx.x * kChunkTokens + warp * kTokensPerWarp + i;
    if (t >= n) break;
    const float* xt = x + t * d;
    const float* gt = dy + t * d;
    float* dxt = dx + t * d;
    const float r = rstd[t];
    float dot = 0;
    for (int k = lane; k < d; k += 32) dot += xt[k] * (w != nullptr ? w[k] : 1.0f) * gt[k];
    dot = warp_sum(dot);
    const float coef = r * r * r * dot / static_cast<float>(d);
    for (int k = lane; k < d; k += 32) {
      const float g = r * (w != nullptr ? w[k] : 1.0f) * gt[k] - xt[k] * coef;
      dxt[k] = accumulate ? dxt[k] + g : g;
      acc[k] += gt[k] * xt[k] * r;
    }
  }
  sum_warp_partials(partial + blockIdx.x * std::int64_t(d), smem, kWarpsPerBlock, d);
}

// out[k] += sum over chunks c (ascending) of partial[c * stride + k], k < width. Block = 32
// columns x 8 warps; warp w sums a fixed contiguous range of chunks, warp 0 adds the 8 results
// in order: a fixed order whatever the scheduling.
__global__ void sum_chunks_kernel(float* out, const float* partial, std::int64_t chunks, std::int64_t stride,
                                  int width) {
  __shared__ float part[kWarpsPerBlock][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int k = blockIdx.x * 32 + lane;
  const std::int64_t per = (chunks + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const std::int64_t c0 = warp * per, c1 = c0 + per < chunks ? c0 + per : chunks;
  float s = 0;
  if (k < width)
    for (std::int64_t c = c0; c < c1; ++c) s += partial[c * stride + k];
  part[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && k < width) {
    float total = 0;
    for (int wi = 0; wi < kWarpsPerBlock; ++wi) total += part[wi][lane];
    out[k] += total;
  }
}

// ---- RoPE, SwiGLU, adds and casts -----------------------------------------------------------

// The kernels before issue #49's vectorisation: one element a thread, one tensor a RoPE launch.
// Kept as the fallback where 16-byte accesses do not fit and as check (e)'s reference.
template <class T>
__global__ void rope_kernel(T* x, std::int64_t rows, int seq, int n_heads, int head_dim, const float* cos,
                            const float* sin, float sign) {
  const int half = head_dim / 2;
  const std::int64_t total = rows * n_heads * half;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % half);
    const std::int64_t rh = i / half;
    const int h = static_cast<int>(rh % n_heads);
    const std::int64_t r = rh / n_heads;
    const std::int64_t pos = r % seq;
    T* x1 = x + r * (std::int64_t(n_heads) * head_dim) + h * head_dim;
    T* x2 = x1 + half;
    const float a = to_float(x1[j]), b = to_float(x2[j]);
    const float c = cos[pos * half + j], s = sign * sin[pos * half + j];
    x1[j] = from_float<T>(a * c - b * s);
    x2[j] = from_float<T>(b * c + a * s);
  }
}

template <class T>
__global__ void swiglu_forward_kernel(T* act, const T* gate, const T* up, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float g = to_float(gate[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    act[i] = from_float<T>(g * sig * to_float(up[i]));
  }
}

template <class T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dact, const T* gate, const T* up, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float g = to_float(gate[i]), u = to_float(up[i]), da = to_float(dact[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    const float silu = g * sig;
    dgate[i] = from_float<T>(da * u * sig * (1.0f + g * (1.0f - sig)));
    dup[i] = from_float<T>(da * silu);
  }
}

// Issue #49 (the bandwidth-bound rest): the same kernels moving kVec16<T> elements a thread through
// 16-byte loads and stores, RoPE of q and k in one launch. The per-element arithmetic is the
// kernels' above with the fused multiply-adds written out (the contraction nvcc and GCC choose for
// them: FMA into the first product), so that it cannot depend on how a compiler contracts
// vectorised code: bit-identical results (check (e) compares them on the same inputs).
template <class T>
inline constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

// V elements of p (16-byte aligned) as floats, V * sizeof(T) a multiple of 16.
template <class T, int V>
__device__ __forceinline__ void load_vec(float (&out)[V], const T* p) {
  constexpr int per = kVec16<T>;
  static_assert(V % per == 0);
#pragma unroll
  for (int c = 0; c < V / per; ++c) {
    const uint4 u = reinterpret_cast<const uint4*>(p)[c];
    T v[per];
    memcpy(static_cast<void*>(v), &u, 16);
#pragma unroll
    for (int e = 0; e < per; ++e) out[c * per + e] = to_float(v[e]);
  }
}

template <class T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[V]) {
  constexpr int per = kVec16<T>;
  static_assert(V % per == 0);
#pragma unroll
  for (int c = 0; c < V / per; ++c) {
    T v[per];
#pragma unroll
    for (int e = 0; e < per; ++e) v[e] = from_float<T>(in[c * per + e]);
    uint4 u;
    memcpy(&u, v, 16);
    reinterpret_cast<uint4*>(p)[c] = u;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// The rotation of V pairs (x[e], x[half + e]) by (c, s): a c - b s and b c + a s.
template <class T, int V>
__device__ __forceinline__ void rope_rotate(T* x, int half, const float (&c)[V], const float (&s)[V]) {
  float a[V], b[V], o1[V], o2[V];
  load_vec<T, V>(a, x);
  load_vec<T, V>(b, x + half);
#pragma unroll
  for (int e = 0; e < V; ++e) {
    o1[e] = fmaf(a[e], c[e], -(b[e] * s[e]));
    o2[e] = fmaf(b[e], c[e], a[e] * s[e]);
  }
  store_vec<T, V>(x, o1);
  store_vec<T, V>(x + half, o2);
}

// One thread per (row, head, kVec16<T> pairs) of q and k (k may be null); cos / sin loaded once
// for both. head_dim / 2 a multiple of kVec16<T>.
template <class T>
__global__ void rope_qk_kernel(T* q, T* k, std::int64_t rows, int seq, int n_heads, int head_dim, const float* cos,
                               const float* sin, float sign) {
  constexpr int V = kVec16<T>;
  const int half = head_dim / 2, groups = half / V;
  const std::int64_t total = rows * n_heads * groups;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % groups) * V;
    const std::int64_t rh = i / groups;
    const int h = static_cast<int>(rh % n_heads);
    const std::int64_t r = rh / n_heads;
    const std::int64_t pos = r % seq;
    float c[V], s[V];
    load_vec<float, V>(c, cos + pos * half + j);
    load_vec<float, V>(s, sin + pos * half + j);
#pragma unroll
    for (int e = 0; e < V; ++e) s[e] = sign * s[e];
    const std::int64_t at = r * (std::int64_t(n_heads) * head_dim) + h * head_dim + j;
    rope_rotate<T, V>(q + at, half, c, s);
    if (k != nullptr) rope_rotate<T, V>(k + at, half, c, s);
  }
}

// One element's SwiGLU and its gradients.
__device__ __forceinline__ float swiglu_value(float g, float u) {
  const float sig = 1.0f / (1.0f + expf(-g));
  return g * sig * u;
}
__device__ __forceinline__ void swiglu_grads(float g, float u, float da, float& dg, float& du) {
  const float sig = 1.0f / (1.0f + expf(-g));
  const float silu = g * sig;
  dg = da * u * sig * fmaf(g, 1.0f - sig, 1.0f);
  du = da * silu;
}

// Elements [0, n / V * V) V a thread, the n % V left one each by the grid's first threads.
template <class T>
__global__ void swiglu_forward_vec_kernel(T* act, const T* gate, const T* up, std::int64_t n) {
  constexpr int V = kVec16<T>;
  const std::int64_t nv = n / V;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < nv;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float g[V], u[V], a[V];
    load_vec<T, V>(g, gate + i * V);
    load_vec<T, V>(u, up + i * V);
#pragma unroll
    for (int e = 0; e < V; ++e) a[e] = swiglu_value(g[e], u[e]);
    store_vec<T, V>(act + i * V, a);
  }
  const std::int64_t t = nv * V + blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (t < n) act[t] = from_float<T>(swiglu_value(to_float(gate[t]), to_float(up[t])));
}

template <class T>
__global__ void swiglu_backward_vec_kernel(T* dgate, T* dup, const T* dact, const T* gate, const T* up,
                                           std::int64_t n) {
  constexpr int V = kVec16<T>;
  const std::int64_t nv = n / V;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < nv;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float g[V], u[V], da[V], dg[V], du[V];
    load_vec<T, V>(g, gate + i * V);
    load_vec<T, V>(u, up + i * V);
    load_vec<T, V>(da, dact + i * V);
#pragma unroll
    for (int e = 0; e < V; ++e) swiglu_grads(g[e], u[e], da[e], dg[e], du[e]);
    store_vec<T, V>(dgate + i * V, dg);
    store_vec<T, V>(dup + i * V, du);
  }
  const std::int64_t t = nv * V + blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (t < n) {
    float dg = 0, du = 0;
    swiglu_grads(to_float(gate[t]), to_float(up[t]), to_float(dact[t]), dg, du);
    dgate[t] = from_float<T>(dg);
    dup[t] = from_float<T>(du);
  }
}

__global__ void add_and_cast_kernel(float* dst, const float* src, bf16* cast, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float s = src[i];
    if (dst != nullptr) dst[i] += s;
    if (cast != nullptr) cast[i] = __float2bfloat16_rn(s);
  }
}

__global__ void divide_kernel(float* x, float divisor, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    x[i] /= divisor;
}

// ---- cross-entropy --------------------------------------------------------------------------

constexpr int kCeThreads = 256;

// One block per row: an online (max, sum of exp) per thread, combined across the block in a fixed
// order, then the gradient in a second pass. V = 1: one logit a thread (fp32 logits: the kernel
// before issue #49, unchanged); V > 1 (issue #49, bf16 logits): V consecutive logits a thread
// through 16-byte loads, their max first, one rescale, then their exps in order (vocab % V == 0).
// dlogits may alias logits (each thread reads its logits before it writes their gradients).
template <class TL, class TD, int V>
__global__ void cross_entropy_kernel(const TL* logits, const std::int32_t* targets, int vocab, double* row_loss,
                                     TD* dlogits, float grad_scale) {
  __shared__ float sm[kCeThreads / 32], ss[kCeThreads / 32];
  __shared__ float lse_shared;
  const std::int64_t r = blockIdx.x;
  const TL* row = logits + r * vocab;
  float m = -INFINITY, s = 0;
  if constexpr (V == 1) {
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
      const float x = to_float(row[j]);
      if (x > m) {
        s = s * expf(m - x) + 1.0f;  // m = -inf: s = 0 * 0 + 1
        m = x;
      } else {
        s += expf(x - m);
      }
    }
  } else {
    for (int j = threadIdx.x * V; j < vocab; j += blockDim.x * V) {
      float x[V];
      load_vec<TL, V>(x, row + j);
      float mx = x[0];
#pragma unroll
      for (int e = 1; e < V; ++e) mx = fmaxf(mx, x[e]);
      if (mx > m) {
        s = s * expf(m - mx);  // m = -inf: s = 0 * 0
        m = mx;
      }
#pragma unroll
      for (int e = 0; e < V; ++e) s += expf(x[e] - m);
    }
  }
  // Combine (m, s) pairs: warp, then block.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(kFullMask, m, o), s2 = __shfl_xor_sync(kFullMask, s, o);
    const float mn = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.0f : s * expf(m - mn)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mn));
    m = mn;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mt = -INFINITY;
    for (int w = 0; w < kCeThreads / 32; ++w) mt = fmaxf(mt, sm[w]);
    float st = 0;
    for (int w = 0; w < kCeThreads / 32; ++w)
      if (sm[w] != -INFINITY) st += ss[w] * expf(sm[w] - mt);
    const float lse = mt + logf(st);
    lse_shared = lse;
    const std::int32_t target = targets[r];
    row_loss[r] = static_cast<double>(lse) - static_cast<double>(to_float(row[target]));
  }
  __syncthreads();
  if (dlogits == nullptr) return;
  const float lse = lse_shared;
  const std::int32_t target = targets[r];
  TD* drow = dlogits + r * vocab;
  if constexpr (V == 1) {
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
      float g = expf(to_float(row[j]) - lse) * grad_scale;
      if (j == target) g -= grad_scale;
      drow[j] = from_float<TD>(g);
    }
  } else {
    for (int j = threadIdx.x * V; j < vocab; j += blockDim.x * V) {
      float x[V];
      load_vec<TL, V>(x, row + j);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        x[e] = expf(x[e] - lse) * grad_scale;
        if (j + e == target) x[e] -= grad_scale;
      }
      store_vec<TD, V>(drow + j, x);
    }
  }
}

__global__ void sum_doubles_kernel(const double* x, std::int64_t n, double* out) {
  __shared__ double part[32];
  double s = 0;
  // Thread i sums a contiguous range, then the 32 warps' lane-sums are combined in a fixed tree.
  const std::int64_t per = (n + blockDim.x - 1) / blockDim.x;
  const std::int64_t i0 = threadIdx.x * per, i1 = i0 + per < n ? i0 + per : n;
  for (std::int64_t i = i0; i < i1; ++i) s += x[i];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) total += part[w];
    out[0] = total;
  }
}

// ---- optimizer --------------------------------------------------------------------------------

constexpr int kNormThreads = 256;

// One block per chunk of kNormChunk elements.
__global__ void sum_squares_kernel(const float* g, std::int64_t n, double* partials) {
  __shared__ double part[kNormThreads / 32];
  const std::int64_t c = blockIdx.x;
  const std::int64_t i0 = c * kNormChunk, i1 = i0 + kNormChunk < n ? i0 + kNormChunk : n;
  double s = 0;
  for (std::int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) s += static_cast<double>(g[i]) * g[i];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kNormThreads / 32; ++w) total += part[w];
    partials[c] = total;
  }
}

__global__ void clip_kernel(const double* partials, std::int64_t chunks, double max_norm, double* norm, float* clip) {
  double total = 0;
  for (std::int64_t c = 0; c < chunks; ++c) total += partials[c];
  const double nrm = sqrt(total);
  norm[0] = nrm;
  clip[0] = 0.0f;
  clip[1] = 1.0f;
  if (max_norm > 0) {
    const double coef = max_norm / (nrm + 1e-6);
    if (coef < 1.0) {
      clip[0] = 1.0f;
      clip[1] = static_cast<float>(coef);
    }
  }
}

constexpr int kAdamThreads = 256;

__global__ void adamw_kernel(float* params, float* grads, float* m, float* v, std::int64_t n, AdamWStep st,
                             const float* clip, const std::int64_t* decay_begin, const std::int64_t* decay_end,
                             int n_ranges, bf16* params_bf16) {
  extern __shared__ std::int64_t ranges[];  // [0, n_ranges): begin, [n_ranges, 2 n_ranges): end
  for (int i = threadIdx.x; i < n_ranges; i += blockDim.x) {
    ranges[i] = decay_begin[i];
    ranges[n_ranges + i] = decay_end[i];
  }
  __syncthreads();
  const bool clipping = clip[0] != 0.0f;
  const float c = clip[1];
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    // Last range starting at or before i (binary search over the sorted begins).
    int lo = 0, hi = n_ranges;  // answer in [lo, hi): first begin > i is hi
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (ranges[mid] <= i) lo = mid + 1;
      else hi = mid;
    }
    const bool decay = lo > 0 && i < ranges[n_ranges + lo - 1];
    float g = grads[i];
    if (clipping) {
      g *= c;
      grads[i] = g;
    }
    float p = params[i];
    if (decay) p *= st.decay;
    const float mi = st.beta1 * m[i] + st.one_minus_beta1 * g;
    const float vi = st.beta2 * v[i] + st.one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= st.step_size * mi / (sqrtf(vi) / st.bias2_sqrt + st.eps);
    params[i] = p;
    if (params_bf16 != nullptr) params_bf16[i] = __float2bfloat16_rn(p);
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------

void embedding_forward(float* out, const std::int32_t* tokens, const float* table, std::int64_t n, int d,
                       Stream stream) {
  embedding_forward_kernel<<<grid_for(n * d, 256), 256, 0, stream>>>(out, tokens, table, n, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void embedding_backward(float* dtable, const std::int32_t* ids, const std::int32_t* starts,
                        const std::int32_t* positions, int n_ids, const float* dout, int d, Stream stream) {
  if (n_ids == 0) return;
  embedding_backward_kernel<<<n_ids, d < 256 ? 64 : 256, 0, stream>>>(dtable, ids, starts, positions, dout, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void rmsnorm_forward(void* y, DType y_type, float* rstd, const float* x, const float* w, std::int64_t n, int d,
                     float eps, Stream stream) {
  const unsigned blocks = static_cast<unsigned>((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (y_type == DType::f32)
    rmsnorm_forward_kernel<float><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(static_cast<float*>(y), rstd, x, w, n,
                                                                            d, eps);
  else
    rmsnorm_forward_kernel<bf16><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(static_cast<bf16*>(y), rstd, x, w, n, d,
                                                                           eps);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

std::int64_t rmsnorm_scratch_floats(std::int64_t n, int d) { return num_chunks(n) * d; }

void rmsnorm_backward(float* dx, bool accumulate, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, std::int64_t n, int d, float* scratch, Stream stream) {
  require(d <= kMaxWidth, "CUDA backend: d_model ", d, " exceeds ", kMaxWidth);
  const std::int64_t chunks = num_chunks(n);
  const std::size_t smem = sizeof(float) * kWarpsPerBlock * static_cast<std::size_t>(d);
  if (smem > 48 * 1024)
    ATTNRES_CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  rmsnorm_backward_kernel<<<static_cast<unsigned>(chunks), 32 * kWarpsPerBlock, smem, stream>>>(
      dx, accumulate, dy, x, w, rstd, n, d, scratch);
  ATTNRES_CUDA_CHECK_LAUNCH();
  if (w != nullptr && dw != nullptr) sum_chunks(dw, scratch, chunks, d, d, stream);
}

void sum_chunks(float* out, const float* partial, std::int64_t chunks, std::int64_t stride, int width,
                Stream stream) {
  if (width == 0) return;
  sum_chunks_kernel<<<static_cast<unsigned>((width + 31) / 32), 32 * kWarpsPerBlock, 0, stream>>>(out, partial, chunks,
                                                                                                 stride, width);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

// Issue #49: the widest width the pointers and shape allow (scalar: one element a thread, the
// kernels before; check (e) times both).
namespace {

template <class T>
void rope_launch(T* q, T* k, std::int64_t rows, int seq, int n_heads, int head_dim, const float* cos,
                 const float* sin, float sign, bool scalar, Stream stream) {
  const int half = head_dim / 2;
  if (!scalar && half % kVec16<T> == 0 && aligned16(q) && (k == nullptr || aligned16(k)) && aligned16(cos) &&
      aligned16(sin)) {
    const std::int64_t total = rows * n_heads * (half / kVec16<T>);
    rope_qk_kernel<T><<<grid_for(total, 256), 256, 0, stream>>>(q, k, rows, seq, n_heads, head_dim, cos, sin, sign);
    ATTNRES_CUDA_CHECK_LAUNCH();
    return;
  }
  const std::int64_t total = rows * n_heads * half;
  for (T* x : {q, k}) {
    if (x == nullptr) continue;
    rope_kernel<T><<<grid_for(total, 256), 256, 0, stream>>>(x, rows, seq, n_heads, head_dim, cos, sin, sign);
    ATTNRES_CUDA_CHECK_LAUNCH();
  }
}

template <class T>
void swiglu_forward_launch(T* act, const T* gate, const T* up, std::int64_t n, bool scalar, Stream stream) {
  if (!scalar && aligned16(act) && aligned16(gate) && aligned16(up))
    swiglu_forward_vec_kernel<T><<<grid_for(n / kVec16<T>, 256), 256, 0, stream>>>(act, gate, up, n);
  else
    swiglu_forward_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(act, gate, up, n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

template <class T>
void swiglu_backward_launch(T* dgate, T* dup, const T* dact, const T* gate, const T* up, std::int64_t n, bool scalar,
                            Stream stream) {
  if (!scalar && aligned16(dgate) && aligned16(dup) && aligned16(dact) && aligned16(gate) && aligned16(up))
    swiglu_backward_vec_kernel<T><<<grid_for(n / kVec16<T>, 256), 256, 0, stream>>>(dgate, dup, dact, gate, up, n);
  else
    swiglu_backward_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(dgate, dup, dact, gate, up, n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope(void* q, void* k, DType type, std::int64_t rows, int seq, int n_heads, int head_dim, const float* cos,
          const float* sin, bool inverse, Stream stream, bool scalar) {
  const float sign = inverse ? -1.0f : 1.0f;
  if (type == DType::f32)
    rope_launch(static_cast<float*>(q), static_cast<float*>(k), rows, seq, n_heads, head_dim, cos, sin, sign, scalar,
                stream);
  else
    rope_launch(static_cast<bf16*>(q), static_cast<bf16*>(k), rows, seq, n_heads, head_dim, cos, sin, sign, scalar,
                stream);
}

void swiglu_forward(void* act, const void* gate, const void* up, DType type, std::int64_t n, Stream stream,
                    bool scalar) {
  if (type == DType::f32)
    swiglu_forward_launch(static_cast<float*>(act), static_cast<const float*>(gate), static_cast<const float*>(up), n,
                          scalar, stream);
  else
    swiglu_forward_launch(static_cast<bf16*>(act), static_cast<const bf16*>(gate), static_cast<const bf16*>(up), n,
                          scalar, stream);
}

void swiglu_backward(void* dgate, void* dup, const void* dact, const void* gate, const void* up, DType type,
                     std::int64_t n, Stream stream, bool scalar) {
  if (type == DType::f32)
    swiglu_backward_launch(static_cast<float*>(dgate), static_cast<float*>(dup), static_cast<const float*>(dact),
                           static_cast<const float*>(gate), static_cast<const float*>(up), n, scalar, stream);
  else
    swiglu_backward_launch(static_cast<bf16*>(dgate), static_cast<bf16*>(dup), static_cast<const bf16*>(dact),
                           static_cast<const bf16*>(gate), static_cast<const bf16*>(up), n, scalar, stream);
}

void add_into(float* dst, const float* src, std::int64_t n, Stream stream) {
  add_and_cast(dst, src, nullptr, n, stream);
}

void add_and_cast(float* dst, const float* src, void* cast_bf16, std::int64_t n, Stream stream) {
  if (dst == nullptr && cast_bf16 == nullptr) return;
  add_and_cast_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, src, static_cast<bf16*>(cast_bf16), n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void divide(float* x, float divisor, std::int64_t n, Stream stream) {
  if (n == 0) return;
  divide_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, divisor, n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void cast_to_bf16(void* dst, const float* src, std::int64_t n, Stream stream) {
  add_and_cast(nullptr, src, dst, n, stream);
}

namespace {

template <class TL, class TD>
void cross_entropy_launch(const TL* logits, const std::int32_t* targets, std::int64_t rows, int vocab,
                          double* row_loss, TD* dlogits, float grad_scale, Stream stream) {
  const auto blocks = static_cast<unsigned>(rows);
  constexpr int V = kVec16<TL>;
  if constexpr (std::is_same_v<TL, bf16>) {
    if (vocab % V == 0 && aligned16(logits) && (dlogits == nullptr || aligned16(dlogits))) {
      cross_entropy_kernel<TL, TD, V><<<blocks, kCeThreads, 0, stream>>>(logits, targets, vocab, row_loss, dlogits,
                                                                         grad_scale);
      ATTNRES_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  cross_entropy_kernel<TL, TD, 1><<<blocks, kCeThreads, 0, stream>>>(logits, targets, vocab, row_loss, dlogits,
                                                                     grad_scale);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

template <class TL>
void cross_entropy_dispatch(const TL* logits, const std::int32_t* targets, std::int64_t rows, int vocab,
                            double* row_loss, void* dlogits, DType dlogits_type, float grad_scale, Stream stream) {
  if (dlogits_type == DType::f32)
    cross_entropy_launch(logits, targets, rows, vocab, row_loss, static_cast<float*>(dlogits), grad_scale, stream);
  else
    cross_entropy_launch(logits, targets, rows, vocab, row_loss, static_cast<bf16*>(dlogits), grad_scale, stream);
}

}  // namespace

void cross_entropy(const void* logits, DType logits_type, const std::int32_t* targets, std::int64_t rows, int vocab,
                   double* row_loss, void* dlogits, DType dlogits_type, float grad_scale, Stream stream) {
  if (rows == 0) return;
  require(rows <= 0x7fffffff, "cross_entropy: too many rows");
  require(dlogits == nullptr || dlogits != logits || dlogits_type == logits_type,
          "cross_entropy: dlogits aliases logits of another type");
  if (logits_type == DType::f32)
    cross_entropy_dispatch(static_cast<const float*>(logits), targets, rows, vocab, row_loss, dlogits, dlogits_type,
                           grad_scale, stream);
  else
    cross_entropy_dispatch(static_cast<const bf16*>(logits), targets, rows, vocab, row_loss, dlogits, dlogits_type,
                           grad_scale, stream);
}

void sum_doubles(const double* x, std::int64_t n, double* out, Stream stream) {
  sum_doubles_kernel<<<1, 1024, 0, stream>>>(x, n, out);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void grad_norm(const float* grads, std::int64_t n, double* partials, double max_norm, double* norm, float* clip,
               Stream stream) {
  const std::int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  if (chunks > 0) {
    sum_squares_kernel<<<static_cast<unsigned>(chunks), kNormThreads, 0, stream>>>(grads, n, partials);
    ATTNRES_CUDA_CHECK_LAUNCH();
  }
  clip_kernel<<<1, 1, 0, stream>>>(partials, chunks, max_norm, norm, clip);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void adamw(float* params, float* grads, float* m, float* v, std::int64_t n, const AdamWStep& step, const float* clip,
           const std::int64_t* decay_begin, const std::int64_t* decay_end, int n_decay_ranges, void* params_bf16,
           Stream stream) {
  const std::size_t smem = sizeof(std::int64_t) * 2 * static_cast<std::size_t>(n_decay_ranges);
  require(smem <= 48 * 1024, "adamw: too many weight-decay ranges");
  const std::int64_t blocks = std::min<std::int64_t>((n + kAdamThreads - 1) / kAdamThreads, 132 * 16);
  adamw_kernel<<<static_cast<unsigned>(blocks < 1 ? 1 : blocks), kAdamThreads, smem, stream>>>(
      params, grads, m, v, n, step, clip, decay_begin, decay_end, n_decay_ranges, static_cast<bf16*>(params_bf16));
  ATTNRES_CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda::kern
