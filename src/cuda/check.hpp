// Error checking for CUDA runtime and cuBLASLt calls: a failure throws attnres::Error naming
// the call, the file and line, and the library's error name and message.
#pragma once

namespace attnres::cuda {

[[noreturn]] void throw_cuda_error(int status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* call, const char* file, int line);

}  // namespace attnres::cuda

// cudaError_t calls (cudaMalloc, cudaMemcpyAsync, ...).
#define ATTNRES_CUDA_CHECK(call)                                                        \
  do {                                                                                  \
    const auto attnres_status_ = (call);                                                \
    if (static_cast<int>(attnres_status_) != 0)                                         \
      ::attnres::cuda::throw_cuda_error(static_cast<int>(attnres_status_), #call, __FILE__, __LINE__); \
  } while (0)

// cublasStatus_t calls (cublasLt*).
#define ATTNRES_CUBLAS_CHECK(call)                                                      \
  do {                                                                                  \
    const auto attnres_status_ = (call);                                                \
    if (static_cast<int>(attnres_status_) != 0)                                         \
      ::attnres::cuda::throw_cublas_error(static_cast<int>(attnres_status_), #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch-configuration errors (not asynchronous faults, which
// surface at the next synchronising call, also checked).
#define ATTNRES_CUDA_CHECK_LAUNCH() ATTNRES_CUDA_CHECK(cudaGetLastError())
