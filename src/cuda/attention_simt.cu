// The SIMT attention kernels (fp32 FMA arithmetic, any element type, head_dim <= 256): 4 lanes
// per query (or key) row, 32 rows per block, K/V (or Q/dO) tiles of 32 rows in shared memory as
// fp32. Used in fp32 mode and for head dims without a tensor-core kernel; attention.cu dispatches.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/attention_impl.cuh"

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

int simt_epl(int hd) {
  require(hd >= 1 && hd <= 256, "CUDA attention: head_dim ", hd, " must be at most 256");
  return hd <= 64 ? 16 : (hd <= 128 ? 32 : 64);
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

}  // namespace

void simt_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, DType type,
                            const AttentionShape& s, Stream stream) {
  if (type == DType::f32) simt_forward_t<float>(out, lse, q, k, v, s, stream);
  else simt_forward_t<bf16>(out, lse, q, k, v, s, stream);
}

void simt_attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                             const void* v, const float* lse, const float* delta, DType type, const AttentionShape& s,
                             Stream stream) {
  if (type == DType::f32) simt_backward_t<float>(dq, dk, dv, dout, q, k, v, lse, delta, s, stream);
  else simt_backward_t<bf16>(dq, dk, dv, dout, q, k, v, lse, delta, s, stream);
}

}  // namespace attnres::cuda::kern
