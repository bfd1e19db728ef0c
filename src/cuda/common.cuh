// Device helpers shared by the .cu files: element loads/stores in fp32 or bf16, warp and
// block reductions, launch-size helpers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.hpp"

namespace attnres::cuda::kern {

using bf16 = __nv_bfloat16;
inline constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// Sum over the 32 lanes; every lane gets the result (butterfly: the same order on every lane).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}
__device__ __forceinline__ double warp_sum(double x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// The second step of a block's chunked reduction: once every warp w has its partials in
// smem[w * width + k], out[k] = their sum in warp order (a fixed order). Call from every thread.
__device__ __forceinline__ void sum_warp_partials(float* out, const float* smem, int warps, int width) {
  __syncthreads();
  for (int k = threadIdx.x; k < width; k += blockDim.x) {
    float s = 0;
    for (int w = 0; w < warps; ++w) s += smem[w * width + k];
    out[k] = s;
  }
}

inline unsigned grid_for(std::int64_t n, int threads, std::int64_t max_blocks = 65535LL * 16) {
  std::int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return static_cast<unsigned>(blocks);
}

}  // namespace attnres::cuda::kern
