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
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda::kern {

namespace {

// ============================== SIMT kernels ===================================================

constexpr int kSimtRows = 32;  // query (or key) rows per block: 4 lanes each, 128 threads
constexpr int kSimtTile = 32;  // rows per shared-memory tile of the other operand

// Dot product of this lane's elements (e = part + 4 i) with a shared-memory row, summed over
// the row's 4 lanes (lanes 4j..4j+3 of a warp share a row).
template <int EPL>
__device__ __forceinline__ float row_dot(const float (&x)[EPL], const float* srow, int part, int hd) {
  float p = 0.0f;
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const int idx = part + 4 * e;
    if (idx < hd) p = fmaf(x[e], srow[idx], p);
  }
  p += __shfl_xor_sync(kFullMask, p, 1);
  p += __shfl_xor_sync(kFullMask, p, 2);
  return p;
}

// Loads rows row0 .. row0+31 of one head (zeros beyond seq) into dst [32][hd] as fp32.
template <class T>
__device__ __forceinline__ void load_rows_f32(float* dst, const T* src_head, int row0, int seq, int hd, int d) {
  for (int i = threadIdx.x; i < kSimtTile * hd; i += blockDim.x) {
    const int j = i / hd, e = i - j * hd;
    const int row = row0 + j;
    dst[i] = row < seq ? to_float(src_head[std::int64_t(row) * d + e]) : 0.0f;
  }
}

// Shared memory: K and V tiles [32][hd] (fp32), then the block's scores [32 rows][33].
template <class T, int EPL>
__global__ void __launch_bounds__(128) attn_fwd_simt(const T* q, const T* k, const T* v, T* out, float* lse, int seq,
                                                     int n_heads, int hd, float scale) {
  extern __shared__ float sm[];
  float* sK = sm;
  float* sV = sm + kSimtTile * hd;
  const int part = threadIdx.x & 3, row = threadIdx.x >> 2;
  float* sc = sm + 2 * kSimtTile * hd + row * (kSimtTile + 1);  // this row's scores
  const int q0 = blockIdx.x * kSimtRows, h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int d = n_heads * hd;
  const int qi = q0 + row;
  const bool valid = qi < seq;
  const std::int64_t head = b * seq * std::int64_t(d) + std::int64_t(h) * hd;
  float qr[EPL], acc[EPL];
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const int idx = part + 4 * e;
    qr[e] = (valid && idx < hd) ? to_float(q[head + std::int64_t(qi) * d + idx]) : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int last_key = min(q0 + kSimtRows - 1, seq - 1);
  for (int k0 = 0; k0 <= last_key; k0 += kSimtTile) {
    __syncthreads();
    load_rows_f32(sK, k + head, k0, seq, hd, d);
    load_rows_f32(sV, v + head, k0, seq, hd, d);
    __syncthreads();
    float tile_max = -INFINITY;
#pragma unroll 1
    for (int j = 0; j < kSimtTile; ++j) {
      const float dot = row_dot(qr, sK + j * hd, part, hd);  // the same value on the row's 4 lanes
      const float s = k0 + j <= qi ? dot * scale : -INFINITY;
      if (part == 0) sc[j] = s;
      tile_max = fmaxf(tile_max, s);
    }
    __syncwarp();
    // Key 0 is visible to every row (valid or not), so m is finite from the first tile on.
    const float m_new = fmaxf(m, tile_max);
    const float corr = expf(m - m_new);
    l *= corr;
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[e] *= corr;
#pragma unroll 1
    for (int j = 0; j < kSimtTile; ++j) {
      const float p = expf(sc[j] - m_new);
      l += p;
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        const int idx = part + 4 * e;
        if (idx < hd) acc[e] = fmaf(p, sV[j * hd + idx], acc[e]);
      }
    }
    __syncwarp();  // sc is rewritten by the next tile
    m = m_new;
  }
  if (!valid) return;
  const float inv = 1.0f / l;
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const int idx = part + 4 * e;
    if (idx < hd) out[head + std::int64_t(qi) * d + idx] = from_float<T>(acc[e] * inv);
  }
  if (part == 0) lse[(b * n_heads + h) * seq + qi] = m + logf(l);
}

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

template <class T, int EPL>
__global__ void __launch_bounds__(128) attn_bwd_dq_simt(const T* q, const T* k, const T* v, const T* dout,
                                                        const float* lse, const float* delta, T* dq, int seq,
                                                        int n_heads, int hd, float scale) {
  extern __shared__ float sm[];
  float* sK = sm;
  float* sV = sm + kSimtTile * hd;
  const int part = threadIdx.x & 3, row = threadIdx.x >> 2;
  const int q0 = blockIdx.x * kSimtRows, h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int d = n_heads * hd;
  const int qi = q0 + row;
  const bool valid = qi < seq;
  const std::int64_t head = b * seq * std::int64_t(d) + std::int64_t(h) * hd;
  float qr[EPL], dor[EPL], dqa[EPL];
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const int idx = part + 4 * e;
    const bool in = valid && idx < hd;
    qr[e] = in ? to_float(q[head + std::int64_t(qi) * d + idx]) : 0.0f;
    dor[e] = in ? to_float(dout[head + std::int64_t(qi) * d + idx]) : 0.0f;
    dqa[e] = 0.0f;
  }
  const std::int64_t stat = (b * n_heads + h) * seq + qi;
  const float li = valid ? lse[stat] : 0.0f;
  const float Di = valid ? delta[stat] : 0.0f;
  const int last_key = min(q0 + kSimtRows - 1, seq - 1);
  for (int k0 = 0; k0 <= last_key; k0 += kSimtTile) {
    __syncthreads();
    load_rows_f32(sK, k + head, k0, seq, hd, d);
    load_rows_f32(sV, v + head, k0, seq, hd, d);
    __syncthreads();
#pragma unroll 1
    for (int j = 0; j < kSimtTile; ++j) {
      const float s = row_dot(qr, sK + j * hd, part, hd);
      const float dp = row_dot(dor, sV + j * hd, part, hd);
      const float p = (valid && k0 + j <= qi) ? expf(s * scale - li) : 0.0f;
      const float ds = p * (dp - Di);
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        const int idx = part + 4 * e;
        if (idx < hd) dqa[e] = fmaf(ds, sK[j * hd + idx], dqa[e]);
      }
    }
  }
  if (!valid) return;
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const int idx = part + 4 * e;
    if (idx < hd) dq[head + std::int64_t(qi) * d + idx] = from_float<T>(dqa[e] * scale);
  }
}

// One block per tile of 32 keys; query tiles from the key tile on (causal).
template <class T, int EPL>
__global__ void __launch_bounds__(128) attn_bwd_dkdv_simt(const T* q, const T* k, const T* v, const T* dout,
                                                          const float* lse, const float* delta, T* dk, T* dv,
                                                          int seq, int n_heads, int hd, float scale) {
  extern __shared__ float sm[];
  float* sQ = sm;
  float* sdO = sm + kSimtTile * hd;
  float* slse = sm + 2 * kSimtTile * hd;
  float* sD = slse + kSimtTile;
  const int part = threadIdx.x & 3, row = threadIdx.x >> 2;
  const int k0 = blockIdx.x * kSimtRows, h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int d = n_heads * hd;
  const int kj = k0 + row;
  const bool valid = kj < seq;
  const std::int64_t head = b * seq * std::int64_t(d) + std::int64_t(h) * hd;
  const std::int64_t stat0 = (b * n_heads + h) * seq;
  float kr[EPL], vr[EPL], dka[EPL], dva[EPL];
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const int idx = part + 4 * e;
    const bool in = valid && idx < hd;
    kr[e] = in ? to_float(k[head + std::int64_t(kj) * d + idx]) : 0.0f;
    vr[e] = in ? to_float(v[head + std::int64_t(kj) * d + idx]) : 0.0f;
    dka[e] = dva[e] = 0.0f;
  }
  for (int q0 = k0; q0 < seq; q0 += kSimtTile) {
    __syncthreads();
    load_rows_f32(sQ, q + head, q0, seq, hd, d);
    load_rows_f32(sdO, dout + head, q0, seq, hd, d);
    for (int i = threadIdx.x; i < kSimtTile; i += blockDim.x) {
      const bool in = q0 + i < seq;
      slse[i] = in ? lse[stat0 + q0 + i] : 0.0f;
      sD[i] = in ? delta[stat0 + q0 + i] : 0.0f;
    }
    __syncthreads();
#pragma unroll 1
    for (int i = 0; i < kSimtTile; ++i) {
      const int qi = q0 + i;
      const float s = row_dot(kr, sQ + i * hd, part, hd);
      const float dp = row_dot(vr, sdO + i * hd, part, hd);
      const float p = (valid && qi < seq && kj <= qi) ? expf(s * scale - slse[i]) : 0.0f;
      const float ds = p * (dp - sD[i]);
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        const int idx = part + 4 * e;
        if (idx < hd) {
          dva[e] = fmaf(p, sdO[i * hd + idx], dva[e]);
          dka[e] = fmaf(ds, sQ[i * hd + idx], dka[e]);
        }
      }
    }
  }
  if (!valid) return;
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const int idx = part + 4 * e;
    if (idx < hd) {
      dk[head + std::int64_t(kj) * d + idx] = from_float<T>(dka[e] * scale);
      dv[head + std::int64_t(kj) * d + idx] = from_float<T>(dva[e]);
    }
  }
}

// ============================== WMMA kernels (bf16) ============================================

namespace wmma = nvcuda::wmma;
constexpr int kTile = 64;  // queries and keys per tile; 4 warps x 16 rows

template <int HD>
struct Wl {
  static constexpr int LDH = HD + 8;     // bf16 [64][HD] tiles (padding against bank conflicts)
  static constexpr int LDS = kTile + 4;  // fp32 [64][64] score tiles
  static constexpr int LDP = kTile + 8;  // bf16 [64][64] probability tiles
  static constexpr int LDO = HD + 4;     // fp32 [64][HD] output accumulator
  static constexpr std::size_t kH = sizeof(bf16) * kTile * LDH;
  static constexpr std::size_t kS = sizeof(float) * kTile * LDS;
  static constexpr std::size_t kP = sizeof(bf16) * kTile * LDP;
  static constexpr std::size_t kO = sizeof(float) * kTile * LDO;
  static constexpr std::size_t kStats = sizeof(float) * 2 * kTile;
  static constexpr std::size_t fwd_smem = 3 * kH + kS + kP + kO;
  static constexpr std::size_t bwd_smem = 4 * kH + 2 * kS + 2 * kP + kStats;
};

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBc = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragBr = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Rows row0 .. row0+63 of one head into dst [64][LDH] (zeros beyond seq), 16 bytes at a time.
// Requires d % 8 == 0 and 16-byte aligned tensors (true for head_dim 64 / 128 and arena buffers).
template <int HD>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src_head, int row0, int seq, int d) {
  constexpr int kChunks = HD / 8;
  for (int c = threadIdx.x; c < kTile * kChunks; c += blockDim.x) {
    const int r = c / kChunks, cc = c - r * kChunks;
    const int row = row0 + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row < seq) val = *reinterpret_cast<const uint4*>(src_head + std::int64_t(row) * d + cc * 8);
    *reinterpret_cast<uint4*>(dst + r * Wl<HD>::LDH + cc * 8) = val;
  }
}

// C[16 x 16] = A[16 x K] B[K x 16] with A rows from `a` (row-major, lda) and B = the transpose
// of rows of `bt` (bt row-major [16][K], read as col-major), K = kk_count * 16.
__device__ __forceinline__ void mma_abt(FragC& c, const bf16* a, int lda, const bf16* bt, int ldb, int kk_count) {
  wmma::fill_fragment(c, 0.0f);
  for (int kk = 0; kk < kk_count; ++kk) {
    FragA fa;
    FragBc fb;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
    wmma::load_matrix_sync(fb, bt + kk * 16, ldb);
    wmma::mma_sync(c, fa, fb, c);
  }
}

// Writes a warp's 16 x 16 accumulator (times `scale`) to rows row0.. of a head's column col0..,
// through a 16 x 16 fp32 staging area owned by the warp; rows >= seq are skipped.
__device__ __forceinline__ void store_frag(FragC& c, float scale, float* stage, int ld_stage, bf16* dst_head,
                                           int row0, int col0, int seq, int d, int lane) {
#pragma unroll
  for (int i = 0; i < c.num_elements; ++i) c.x[i] *= scale;
  wmma::store_matrix_sync(stage, c, ld_stage, wmma::mem_row_major);
  __syncwarp();
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int idx = lane * 8 + e;
    const int rr = idx / 16, cc = idx % 16;
    if (row0 + rr < seq)
      dst_head[std::int64_t(row0 + rr) * d + col0 + cc] = __float2bfloat16_rn(stage[rr * ld_stage + cc]);
  }
  __syncwarp();
}

template <int HD>
__global__ void __launch_bounds__(128) attn_fwd_wmma(const bf16* q, const bf16* k, const bf16* v, bf16* out,
                                                     float* lse, int seq, int n_heads, float scale) {
  using L = Wl<HD>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = reinterpret_cast<bf16*>(smem_raw + L::kH);
  bf16* sV = reinterpret_cast<bf16*>(smem_raw + 2 * L::kH);
  float* sS = reinterpret_cast<float*>(smem_raw + 3 * L::kH);
  bf16* sP = reinterpret_cast<bf16*>(smem_raw + 3 * L::kH + L::kS);
  float* sO = reinterpret_cast<float*>(smem_raw + 3 * L::kH + L::kS + L::kP);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qt = blockIdx.x, h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int d = n_heads * HD;
  const int q0 = qt * kTile;
  const std::int64_t head = b * seq * std::int64_t(d) + std::int64_t(h) * HD;
  load_tile<HD>(sQ, q + head, q0, seq, d);
  for (int i = threadIdx.x; i < kTile * L::LDO; i += blockDim.x) sO[i] = 0.0f;
  // Softmax bookkeeping: lanes 2r', 2r'+1 of warp w own row r = 16 w + r', half a row each.
  const int r = warp * 16 + (lane >> 1), half = lane & 1;
  const int qi = q0 + r;
  float m_i = -INFINITY, l_i = 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's K and V are no longer read
    load_tile<HD>(sK, k + head, k0, seq, d);
    load_tile<HD>(sV, v + head, k0, seq, d);
    __syncthreads();
    // S = Q K^T for the warp's 16 rows.
    for (int nb = 0; nb < kTile / 16; ++nb) {
      FragC c;
      mma_abt(c, sQ + warp * 16 * L::LDH, L::LDH, sK + nb * 16 * L::LDH, L::LDH, HD / 16);
      wmma::store_matrix_sync(sS + warp * 16 * L::LDS + nb * 16, c, L::LDS, wmma::mem_row_major);
    }
    __syncwarp();
    float* srow = sS + r * L::LDS + half * 32;
    float mx = -INFINITY;
    for (int j = 0; j < 32; ++j) {
      const int key = k0 + half * 32 + j;
      const float s = key <= qi ? srow[j] * scale : -INFINITY;
      srow[j] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    const float m_new = fmaxf(m_i, mx);  // finite: key 0 is visible to every row
    const float corr = expf(m_i - m_new);
    float sum = 0.0f;
    bf16* prow = sP + r * L::LDP + half * 32;
    for (int j = 0; j < 32; ++j) {
      const float p = expf(srow[j] - m_new);
      sum += p;
      prow[j] = __float2bfloat16_rn(p);
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    l_i = l_i * corr + sum;
    m_i = m_new;
    float* orow = sO + r * L::LDO + half * (HD / 2);
    for (int e = 0; e < HD / 2; ++e) orow[e] *= corr;
    __syncwarp();
    // O += P V for the warp's rows.
    for (int nb = 0; nb < HD / 16; ++nb) {
      FragC c;
      float* o = sO + warp * 16 * L::LDO + nb * 16;
      wmma::load_matrix_sync(c, o, L::LDO, wmma::mem_row_major);
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA fa;
        FragBr fb;
        wmma::load_matrix_sync(fa, sP + warp * 16 * L::LDP + kk * 16, L::LDP);
        wmma::load_matrix_sync(fb, sV + kk * 16 * L::LDH + nb * 16, L::LDH);
        wmma::mma_sync(c, fa, fb, c);
      }
      wmma::store_matrix_sync(o, c, L::LDO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (qi >= seq) return;
  const float inv = 1.0f / l_i;
  const float* orow = sO + r * L::LDO + half * (HD / 2);
  bf16* og = out + head + std::int64_t(qi) * d + half * (HD / 2);
  for (int e = 0; e < HD / 2; ++e) og[e] = __float2bfloat16_rn(orow[e] * inv);
  if (half == 0) lse[(b * n_heads + h) * seq + qi] = m_i + logf(l_i);
}

// dQ: one block per query tile, key tiles 0..qt.
template <int HD>
__global__ void __launch_bounds__(128) attn_bwd_dq_wmma(const bf16* q, const bf16* k, const bf16* v,
                                                        const bf16* dout, const float* lse, const float* delta,
                                                        bf16* dq, int seq, int n_heads, float scale) {
  using L = Wl<HD>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sdO = reinterpret_cast<bf16*>(smem_raw + L::kH);
  bf16* sK = reinterpret_cast<bf16*>(smem_raw + 2 * L::kH);
  bf16* sV = reinterpret_cast<bf16*>(smem_raw + 3 * L::kH);
  float* sS = reinterpret_cast<float*>(smem_raw + 4 * L::kH);
  float* sdP = reinterpret_cast<float*>(smem_raw + 4 * L::kH + L::kS);
  bf16* sdS = reinterpret_cast<bf16*>(smem_raw + 4 * L::kH + 2 * L::kS);
  float* slse = reinterpret_cast<float*>(smem_raw + 4 * L::kH + 2 * L::kS + 2 * L::kP);
  float* sD = slse + kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qt = blockIdx.x, h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int d = n_heads * HD;
  const int q0 = qt * kTile;
  const std::int64_t head = b * seq * std::int64_t(d) + std::int64_t(h) * HD;
  const std::int64_t stat0 = (b * n_heads + h) * seq;
  load_tile<HD>(sQ, q + head, q0, seq, d);
  load_tile<HD>(sdO, dout + head, q0, seq, d);
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    const bool in = q0 + i < seq;
    slse[i] = in ? lse[stat0 + q0 + i] : 0.0f;
    sD[i] = in ? delta[stat0 + q0 + i] : 0.0f;
  }
  FragC dqf[HD / 16];
#pragma unroll
  for (int nb = 0; nb < HD / 16; ++nb) wmma::fill_fragment(dqf[nb], 0.0f);
  const int r = warp * 16 + (lane >> 1), half = lane & 1;
  const int qi = q0 + r;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    load_tile<HD>(sK, k + head, k0, seq, d);
    load_tile<HD>(sV, v + head, k0, seq, d);
    __syncthreads();
    for (int nb = 0; nb < kTile / 16; ++nb) {
      FragC c;
      mma_abt(c, sQ + warp * 16 * L::LDH, L::LDH, sK + nb * 16 * L::LDH, L::LDH, HD / 16);
      wmma::store_matrix_sync(sS + warp * 16 * L::LDS + nb * 16, c, L::LDS, wmma::mem_row_major);
      mma_abt(c, sdO + warp * 16 * L::LDH, L::LDH, sV + nb * 16 * L::LDH, L::LDH, HD / 16);
      wmma::store_matrix_sync(sdP + warp * 16 * L::LDS + nb * 16, c, L::LDS, wmma::mem_row_major);
    }
    __syncwarp();
    {
      const float li = slse[r], Di = sD[r];
      const float* srow = sS + r * L::LDS + half * 32;
      const float* dprow = sdP + r * L::LDS + half * 32;
      bf16* dsrow = sdS + r * L::LDP + half * 32;
      for (int j = 0; j < 32; ++j) {
        const int key = k0 + half * 32 + j;
        const float p = (qi < seq && key <= qi) ? expf(srow[j] * scale - li) : 0.0f;
        dsrow[j] = __float2bfloat16_rn(p * (dprow[j] - Di));
      }
    }
    __syncwarp();
    // dQ += dS K for the warp's rows.
#pragma unroll
    for (int nb = 0; nb < HD / 16; ++nb) {
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA fa;
        FragBr fb;
        wmma::load_matrix_sync(fa, sdS + warp * 16 * L::LDP + kk * 16, L::LDP);
        wmma::load_matrix_sync(fb, sK + kk * 16 * L::LDH + nb * 16, L::LDH);
        wmma::mma_sync(dqf[nb], fa, fb, dqf[nb]);
      }
    }
  }
  // The warp's own rows of sS serve as staging (no other warp touches them).
  float* stage = sS + warp * 16 * L::LDS;
#pragma unroll
  for (int nb = 0; nb < HD / 16; ++nb)
    store_frag(dqf[nb], scale, stage, L::LDS, dq + head, q0 + warp * 16, nb * 16, seq, d, lane);
}

// dK, dV: one block per key tile, query tiles kt.. (causal).
template <int HD>
__global__ void __launch_bounds__(128) attn_bwd_dkdv_wmma(const bf16* q, const bf16* k, const bf16* v,
                                                          const bf16* dout, const float* lse, const float* delta,
                                                          bf16* dk, bf16* dv, int seq, int n_heads, float scale) {
  using L = Wl<HD>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = reinterpret_cast<bf16*>(smem_raw + L::kH);
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw + 2 * L::kH);
  bf16* sdO = reinterpret_cast<bf16*>(smem_raw + 3 * L::kH);
  float* sST = reinterpret_cast<float*>(smem_raw + 4 * L::kH);          // [key][query]
  float* sdPT = reinterpret_cast<float*>(smem_raw + 4 * L::kH + L::kS);  // [key][query]
  bf16* sPT = reinterpret_cast<bf16*>(smem_raw + 4 * L::kH + 2 * L::kS);
  bf16* sdST = reinterpret_cast<bf16*>(smem_raw + 4 * L::kH + 2 * L::kS + L::kP);
  float* slse = reinterpret_cast<float*>(smem_raw + 4 * L::kH + 2 * L::kS + 2 * L::kP);
  float* sD = slse + kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kt = blockIdx.x, h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int d = n_heads * HD;
  const int k0 = kt * kTile;
  const std::int64_t head = b * seq * std::int64_t(d) + std::int64_t(h) * HD;
  const std::int64_t stat0 = (b * n_heads + h) * seq;
  load_tile<HD>(sK, k + head, k0, seq, d);
  load_tile<HD>(sV, v + head, k0, seq, d);
  FragC dkf[HD / 16], dvf[HD / 16];
#pragma unroll
  for (int nb = 0; nb < HD / 16; ++nb) {
    wmma::fill_fragment(dkf[nb], 0.0f);
    wmma::fill_fragment(dvf[nb], 0.0f);
  }
  const int r = warp * 16 + (lane >> 1), half = lane & 1;  // key row
  const int kj = k0 + r;
  const int n_qt = (seq + kTile - 1) / kTile;
  for (int qt = kt; qt < n_qt; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();
    load_tile<HD>(sQ, q + head, q0, seq, d);
    load_tile<HD>(sdO, dout + head, q0, seq, d);
    for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
      const bool in = q0 + i < seq;
      slse[i] = in ? lse[stat0 + q0 + i] : 0.0f;
      sD[i] = in ? delta[stat0 + q0 + i] : 0.0f;
    }
    __syncthreads();
    // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys.
    for (int nb = 0; nb < kTile / 16; ++nb) {
      FragC c;
      mma_abt(c, sK + warp * 16 * L::LDH, L::LDH, sQ + nb * 16 * L::LDH, L::LDH, HD / 16);
      wmma::store_matrix_sync(sST + warp * 16 * L::LDS + nb * 16, c, L::LDS, wmma::mem_row_major);
      mma_abt(c, sV + warp * 16 * L::LDH, L::LDH, sdO + nb * 16 * L::LDH, L::LDH, HD / 16);
      wmma::store_matrix_sync(sdPT + warp * 16 * L::LDS + nb * 16, c, L::LDS, wmma::mem_row_major);
    }
    __syncwarp();
    {
      const float* srow = sST + r * L::LDS + half * 32;
      const float* dprow = sdPT + r * L::LDS + half * 32;
      bf16* prow = sPT + r * L::LDP + half * 32;
      bf16* dsrow = sdST + r * L::LDP + half * 32;
      for (int j = 0; j < 32; ++j) {
        const int c = half * 32 + j;
        const int qi = q0 + c;
        const float p = (qi < seq && kj <= qi) ? expf(srow[j] * scale - slse[c]) : 0.0f;
        prow[j] = __float2bfloat16_rn(p);
        dsrow[j] = __float2bfloat16_rn(p * (dprow[j] - sD[c]));
      }
    }
    __syncwarp();
    // dV += P^T dO, dK += dS^T Q for the warp's keys.
#pragma unroll
    for (int nb = 0; nb < HD / 16; ++nb) {
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA fa;
        FragBr fb;
        wmma::load_matrix_sync(fa, sPT + warp * 16 * L::LDP + kk * 16, L::LDP);
        wmma::load_matrix_sync(fb, sdO + kk * 16 * L::LDH + nb * 16, L::LDH);
        wmma::mma_sync(dvf[nb], fa, fb, dvf[nb]);
        wmma::load_matrix_sync(fa, sdST + warp * 16 * L::LDP + kk * 16, L::LDP);
        wmma::load_matrix_sync(fb, sQ + kk * 16 * L::LDH + nb * 16, L::LDH);
        wmma::mma_sync(dkf[nb], fa, fb, dkf[nb]);
      }
    }
  }
  float* stage = sST + warp * 16 * L::LDS;
#pragma unroll
  for (int nb = 0; nb < HD / 16; ++nb) {
    store_frag(dkf[nb], scale, stage, L::LDS, dk + head, k0 + warp * 16, nb * 16, seq, d, lane);
    store_frag(dvf[nb], 1.0f, stage, L::LDS, dv + head, k0 + warp * 16, nb * 16, seq, d, lane);
  }
}

// ============================== dispatch ========================================================

template <class Kernel>
void allow_smem(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    ATTNRES_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

int simt_epl(int hd) {
  require(hd >= 1 && hd <= 256, "CUDA attention: head_dim ", hd, " must be at most 256");
  return hd <= 64 ? 16 : (hd <= 128 ? 32 : 64);
}

bool use_wmma(DType type, int hd, AttentionImpl impl) {
  if (impl == AttentionImpl::simt) return false;
  const bool ok = attention_has_wmma(type, hd);
  if (impl == AttentionImpl::wmma)
    require(ok, "CUDA attention: the tensor-core kernels need bf16 and head_dim 64 or 128 (got ", to_string(type),
            ", ", hd, ")");
  return ok;
}

template <class T, int EPL>
void simt_forward(void* out, float* lse, const void* q, const void* k, const void* v, const AttentionShape& s,
                  Stream stream) {
  const dim3 grid((s.seq + kSimtRows - 1) / kSimtRows, s.n_heads, static_cast<unsigned>(s.batch));
  const std::size_t smem = sizeof(float) * (2 * kSimtTile * s.head_dim + kSimtRows * (kSimtTile + 1));
  allow_smem(attn_fwd_simt<T, EPL>, smem);
  attn_fwd_simt<T, EPL><<<grid, 128, smem, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                     static_cast<const T*>(v), static_cast<T*>(out), lse, s.seq,
                                                     s.n_heads, s.head_dim, 1.0f / sqrtf(float(s.head_dim)));
  ATTNRES_CUDA_CHECK_LAUNCH();
}

template <class T, int EPL>
void simt_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                   const float* lse, const float* delta, const AttentionShape& s, Stream stream) {
  const dim3 grid((s.seq + kSimtRows - 1) / kSimtRows, s.n_heads, static_cast<unsigned>(s.batch));
  const float scale = 1.0f / sqrtf(float(s.head_dim));
  const std::size_t smem_dq = sizeof(float) * 2 * kSimtTile * s.head_dim;
  allow_smem(attn_bwd_dq_simt<T, EPL>, smem_dq);
  attn_bwd_dq_simt<T, EPL><<<grid, 128, smem_dq, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(dout), lse,
      delta, static_cast<T*>(dq), s.seq, s.n_heads, s.head_dim, scale);
  ATTNRES_CUDA_CHECK_LAUNCH();
  const std::size_t smem_kv = sizeof(float) * (2 * kSimtTile * s.head_dim + 2 * kSimtTile);
  allow_smem(attn_bwd_dkdv_simt<T, EPL>, smem_kv);
  attn_bwd_dkdv_simt<T, EPL><<<grid, 128, smem_kv, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(dout), lse,
      delta, static_cast<T*>(dk), static_cast<T*>(dv), s.seq, s.n_heads, s.head_dim, scale);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

// Elements per lane: fp32 has 16 / 32 / 64 (head_dim <= 64 / 128 / 256); bf16, whose common
// head dims (64, 128) run on tensor cores, has 16 and 64 only (fewer kernels to compile).
template <class T>
int simt_epl_for(int hd) {
  const int epl = simt_epl(hd);
  return std::is_same_v<T, float> || epl == 16 ? epl : 64;
}

template <class T>
void simt_forward_t(void* out, float* lse, const void* q, const void* k, const void* v, const AttentionShape& s,
                    Stream stream) {
  switch (simt_epl_for<T>(s.head_dim)) {
    case 16: simt_forward<T, 16>(out, lse, q, k, v, s, stream); break;
    case 32:
      if constexpr (std::is_same_v<T, float>) simt_forward<T, 32>(out, lse, q, k, v, s, stream);
      break;
    default: simt_forward<T, 64>(out, lse, q, k, v, s, stream); break;
  }
}

template <class T>
void simt_backward_t(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                     const float* lse, const float* delta, const AttentionShape& s, Stream stream) {
  switch (simt_epl_for<T>(s.head_dim)) {
    case 16: simt_backward<T, 16>(dq, dk, dv, dout, q, k, v, lse, delta, s, stream); break;
    case 32:
      if constexpr (std::is_same_v<T, float>) simt_backward<T, 32>(dq, dk, dv, dout, q, k, v, lse, delta, s, stream);
      break;
    default: simt_backward<T, 64>(dq, dk, dv, dout, q, k, v, lse, delta, s, stream); break;
  }
}

template <int HD>
void wmma_forward(void* out, float* lse, const void* q, const void* k, const void* v, const AttentionShape& s,
                  Stream stream) {
  const dim3 grid((s.seq + kTile - 1) / kTile, s.n_heads, static_cast<unsigned>(s.batch));
  allow_smem(attn_fwd_wmma<HD>, Wl<HD>::fwd_smem);
  attn_fwd_wmma<HD><<<grid, 128, Wl<HD>::fwd_smem, stream>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v), static_cast<bf16*>(out),
      lse, s.seq, s.n_heads, 1.0f / sqrtf(float(HD)));
  ATTNRES_CUDA_CHECK_LAUNCH();
}

template <int HD>
void wmma_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                   const float* lse, const float* delta, const AttentionShape& s, Stream stream) {
  const dim3 grid((s.seq + kTile - 1) / kTile, s.n_heads, static_cast<unsigned>(s.batch));
  const float scale = 1.0f / sqrtf(float(HD));
  allow_smem(attn_bwd_dq_wmma<HD>, Wl<HD>::bwd_smem);
  attn_bwd_dq_wmma<HD><<<grid, 128, Wl<HD>::bwd_smem, stream>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
      static_cast<const bf16*>(dout), lse, delta, static_cast<bf16*>(dq), s.seq, s.n_heads, scale);
  ATTNRES_CUDA_CHECK_LAUNCH();
  allow_smem(attn_bwd_dkdv_wmma<HD>, Wl<HD>::bwd_smem);
  attn_bwd_dkdv_wmma<HD><<<grid, 128, Wl<HD>::bwd_smem, stream>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
      static_cast<const bf16*>(dout), lse, delta, static_cast<bf16*>(dk), static_cast<bf16*>(dv), s.seq, s.n_heads,
      scale);
  ATTNRES_CUDA_CHECK_LAUNCH();
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
  if (use_wmma(type, shape.head_dim, impl)) {
    if (shape.head_dim == 64) wmma_forward<64>(out, lse, q, k, v, shape, stream);
    else wmma_forward<128>(out, lse, q, k, v, shape, stream);
  } else if (type == DType::f32) {
    simt_forward_t<float>(out, lse, q, k, v, shape, stream);
  } else {
    simt_forward_t<bf16>(out, lse, q, k, v, shape, stream);
  }
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
  if (use_wmma(type, shape.head_dim, impl)) {
    if (shape.head_dim == 64) wmma_backward<64>(dq, dk, dv, dout, q, k, v, lse, delta, shape, stream);
    else wmma_backward<128>(dq, dk, dv, dout, q, k, v, lse, delta, shape, stream);
  } else if (type == DType::f32) {
    simt_backward_t<float>(dq, dk, dv, dout, q, k, v, lse, delta, shape, stream);
  } else {
    simt_backward_t<bf16>(dq, dk, dv, dout, q, k, v, lse, delta, shape, stream);
  }
}

}  // namespace attnres::cuda::kern
