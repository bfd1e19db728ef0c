// The tensor-core attention kernels (bf16, head_dim 64 or 128): 64x64 tiles, 4 warps of 16 rows,
// bf16 WMMA products with fp32 accumulation; the softmax runs in fp32 on shared-memory score tiles,
// probabilities rounded to bf16 before the P.V product (as in FlashAttention). attention.cu dispatches.
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/attention_impl.cuh"

namespace attnres::cuda::kern {

namespace {

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

}  // namespace

void wmma_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                            const AttentionShape& s, Stream stream) {
  if (s.head_dim == 64) wmma_forward<64>(out, lse, q, k, v, s, stream);
  else wmma_forward<128>(out, lse, q, k, v, s, stream);
}

void wmma_attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                             const void* v, const float* lse, const float* delta, const AttentionShape& s,
                             Stream stream) {
  if (s.head_dim == 64) wmma_backward<64>(dq, dk, dv, dout, q, k, v, lse, delta, s, stream);
  else wmma_backward<128>(dq, dk, dv, dout, q, k, v, lse, delta, s, stream);
}

}  // namespace attnres::cuda::kern
