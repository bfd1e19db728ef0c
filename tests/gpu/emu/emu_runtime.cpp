// Mock CUDA runtime: host memory, synchronous everything, and the kernel-launch emulator.
#include "emu_device.hpp"
#include <cublasLt.h>
#include <cstdio>
#include <functional>
#include <mutex>

namespace emu {
void run_launch(dim3 grid, dim3 block, std::size_t smem, const std::function<void()>& body) {
  const int T = static_cast<int>(block.x * block.y * block.z);
  b_dim = {block.x, block.y, block.z};
  g_dim = {grid.x, grid.y, grid.z};
  const int n_warps = (T + 31) / 32;
  std::unique_ptr<std::barrier<>> block_bar;
  std::vector<std::unique_ptr<std::barrier<>>> warp_bars(n_warps);
  std::vector<unsigned char> slots(static_cast<std::size_t>(n_warps) * 32 * 8);
  unsigned char* dyn = static_cast<unsigned char*>(std::aligned_alloc(1024, ((smem + 1023) / 1024 + 1) * 1024));
  std::barrier<> phase(T);
  const std::size_t n_blocks = std::size_t(grid.x) * grid.y * grid.z;
  auto worker = [&](int tid) {
    for (std::size_t blk = 0; blk < n_blocks; ++blk) {
      if (tid == 0) {
        block_bar = std::make_unique<std::barrier<>>(T);
        for (int w = 0; w < n_warps; ++w) warp_bars[w] = std::make_unique<std::barrier<>>(std::min(32, T - 32 * w));
        std::memset(dyn, 0xff, smem);  // uninitialised shared memory reads as NaN
      }
      phase.arrive_and_wait();
      b_idx = {static_cast<unsigned>(blk % grid.x), static_cast<unsigned>((blk / grid.x) % grid.y),
               static_cast<unsigned>(blk / (std::size_t(grid.x) * grid.y))};
      t_idx = {static_cast<unsigned>(tid % block.x), static_cast<unsigned>((tid / block.x) % block.y),
               static_cast<unsigned>(tid / (block.x * block.y))};
      ctx.block = block_bar.get();
      ctx.warp = warp_bars[tid / 32].get();
      ctx.slots = reinterpret_cast<unsigned char(*)[8]>(slots.data() + (tid / 32) * 32 * 8);
      ctx.lane = tid % 32;
      ctx.dyn = dyn;
      body();
      ctx.block->arrive_and_drop();
      ctx.warp->arrive_and_drop();
      phase.arrive_and_wait();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < T; ++t) threads.emplace_back(worker, t);
  worker(0);
  for (auto& t : threads) t.join();
  std::free(dyn);
}
}  // namespace emu

extern "C" {
cudaError_t cudaMalloc(void** p, size_t n) { *p = std::aligned_alloc(256, (n + 255) / 256 * 256 + 256); std::memset(*p, 0xff, n); return cudaSuccess; }
cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
cudaError_t cudaMallocHost(void** p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaFreeHost(void* p) { std::free(p); return cudaSuccess; }
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) { std::memmove(d, s, n); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t) { return cudaMemcpy(d, s, n, k); }
cudaError_t cudaMemset(void* d, int v, size_t n) { std::memset(d, v, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) { std::memset(d, v, n); return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = reinterpret_cast<cudaStream_t>(0x1234); return cudaSuccess; }
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* c) { *c = 1; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) { std::memset(p, 0, sizeof(*p)); std::strcpy(p->name, "CPU emulator"); p->major = 9; p->totalGlobalMem = 1ull << 34; return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "emu"; }
const char* cudaGetErrorString(cudaError_t) { return "emu"; }
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = nullptr; return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { *ms = 1; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t* f, size_t* t) { *f = 1; *t = 1; return cudaSuccess; }
const char* cublasLtGetStatusName(cublasStatus_t) { return "emu"; }
const char* cublasLtGetStatusString(cublasStatus_t) { return "emu"; }
}
