#include "cuda/buffer.hpp"

#include <cuda_runtime_api.h>

#include "cuda/check.hpp"

namespace attnres::cuda {

const char* to_string(DType t) { return t == DType::f32 ? "fp32" : "bf16"; }

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) ATTNRES_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);  // no throw from a destructor; errors resurface elsewhere
}

PinnedBuffer::PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) ATTNRES_CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
}

}  // namespace attnres::cuda
