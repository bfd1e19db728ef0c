#include "cuda/check.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "util/error.hpp"

namespace attnres::cuda {

void throw_cuda_error(int status, const char* call, const char* file, int line) {
  const auto e = static_cast<cudaError_t>(status);
  fail("CUDA error ", cudaGetErrorName(e), " (", status, ") in ", call, " at ", file, ":", line, ": ",
       cudaGetErrorString(e));
}

void throw_cublas_error(int status, const char* call, const char* file, int line) {
  const auto s = static_cast<cublasStatus_t>(status);
  fail("cuBLASLt error ", cublasLtGetStatusName(s), " (", status, ") in ", call, " at ", file, ":", line, ": ",
       cublasLtGetStatusString(s));
}

}  // namespace attnres::cuda
