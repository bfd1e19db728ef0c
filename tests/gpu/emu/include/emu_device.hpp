// CPU emulation of the CUDA execution model for testing kernels without a GPU.
#pragma once
#include <cuda_runtime_api.h>
#include <vector_types.h>
#include <vector_functions.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <cstdio>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>
#include <math.h>

#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)

namespace emu {
struct Dim { unsigned x = 1, y = 1, z = 1; };
inline thread_local Dim t_idx, b_idx;
inline Dim b_dim, g_dim;
struct Ctx {
  std::barrier<>* block = nullptr;
  std::barrier<>* warp = nullptr;
  unsigned char (*slots)[8] = nullptr;  // this warp's 32 shuffle slots
  int lane = 0;
  unsigned char* dyn = nullptr;
};
inline thread_local Ctx ctx;
inline void* dynamic_smem() { return ctx.dyn; }

void run_launch(dim3 grid, dim3 block, std::size_t smem, const std::function<void()>& body);

template <class... P>
struct Launcher {
  void (*kernel)(P...);
  dim3 grid, block;
  std::size_t smem;
  template <class... A>
  void operator()(A&&... a) {
    std::tuple<P...> args(static_cast<P>(std::forward<A>(a))...);
    auto k = kernel;
    run_launch(grid, block, smem, [k, &args] { std::apply(k, args); });
  }
};
template <class... P, class G, class B, class S>
Launcher<P...> launch(void (*kernel)(P...), G grid, B block, S smem, cudaStream_t) {
  return Launcher<P...>{kernel, dim3(grid), dim3(block), static_cast<std::size_t>(smem)};
}
inline dim3 to_dim3(dim3 d) { return d; }
template <class T, class P>
T* a16(P* p) {
  if ((reinterpret_cast<std::uintptr_t>(p) & 15) != 0) { std::fprintf(stderr, "misaligned 16-byte access %p\n", (const void*)p); std::abort(); }
  return reinterpret_cast<T*>(p);
}
}  // namespace emu

#define threadIdx emu::t_idx
#define blockIdx emu::b_idx
#define blockDim emu::b_dim
#define gridDim emu::g_dim

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
  static_assert(sizeof(T) <= 8);
  std::memcpy(emu::ctx.slots[emu::ctx.lane], &v, sizeof(T));
  emu::ctx.warp->arrive_and_wait();
  T r;
  std::memcpy(&r, emu::ctx.slots[emu::ctx.lane ^ o], sizeof(T));
  emu::ctx.warp->arrive_and_wait();
  return r;
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu::ctx.warp->arrive_and_wait(); }
inline void __syncthreads() { emu::ctx.block->arrive_and_wait(); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

template <class F>
inline cudaError_t cudaFuncSetAttribute(F*, cudaFuncAttribute, int) { return cudaSuccess; }
