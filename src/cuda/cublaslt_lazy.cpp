// cuBLASLt, loaded on the first call (dlopen) instead of when a program starts.
//
// libcublasLt.so is 541 MB with about 370,000 relocations: loading it costs a process about
// 60 ms of CPU, every process that links the CUDA backend, most of which never runs a GEMM on a
// GPU (`attnres --version`, every CPU command, each of the test processes; docs/reliability.md
// "Build and test time"). So attnres_cuda does not link it: this file defines the cuBLASLt
// functions the backend calls (gemm.cpp, check.cpp) with their declarations' exact signatures
// (cublasLt.h: a mismatch does not compile), each forwarding to the library's own, which the first
// call loads. The program's code is unchanged, and the CPU emulator (tests/gpu/emu), which links
// its own stand-ins, does not compile this file.
//
// The library: its soname (libcublasLt.so.<CUBLAS_VER_MAJOR>, found as the linker would:
// LD_LIBRARY_PATH, the program's RUNPATH, which has the toolkit's directory for cudart, the
// system's), else the file CMake found (ATTNRES_CUBLASLT_PATH). Neither loads: an attnres::Error
// naming both and why (the first GEMM on a GPU fails with it).
#include <cublasLt.h>
#include <dlfcn.h>

#include <string>

#include "util/error.hpp"

#ifndef ATTNRES_CUBLASLT_PATH
#error "ATTNRES_CUBLASLT_PATH: the cuBLASLt library CMake found (src/cuda/CMakeLists.txt)"
#endif

namespace attnres::cuda {
namespace {

void* cublaslt_library() {
  static void* const library = [] {
    const std::string names[] = {"libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR), ATTNRES_CUBLASLT_PATH};
    std::string why;
    for (const auto& name : names) {
      if (void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
      const char* error = ::dlerror();
      why += "\n  " + (error != nullptr ? std::string(error) : name + ": cannot be loaded");
    }
    fail("the CUDA backend cannot load cuBLASLt ", CUBLAS_VER_MAJOR, ", which its GEMMs need:", why,
         "\ninstall the CUDA toolkit's cuBLASLt (libcublasLt.so.", CUBLAS_VER_MAJOR,
         ") or put its directory in LD_LIBRARY_PATH");
  }();
  return library;
}

// The library's function `name`, of the type of this file's definition of it.
template <class Function>
Function cublaslt_function(Function, const char* name) {
  void* const symbol = ::dlsym(cublaslt_library(), name);
  require(symbol != nullptr, "cuBLASLt (libcublasLt.so.", CUBLAS_VER_MAJOR, ") has no function ", name);
  return reinterpret_cast<Function>(symbol);
}

}  // namespace
}  // namespace attnres::cuda

// Each forwards its arguments to the library's function of the same name, looked up once.
#define ATTNRES_CUBLASLT_FORWARD(name, ...)                                                      \
  static const auto function = ::attnres::cuda::cublaslt_function(&name, #name);                 \
  return function(__VA_ARGS__)
#define ATTNRES_CUBLASLT_API extern "C" __attribute__((visibility("hidden")))

ATTNRES_CUBLASLT_API cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtCreate, handle);
}
ATTNRES_CUBLASLT_API cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtDestroy, handle);
}
ATTNRES_CUBLASLT_API const char* cublasLtGetStatusName(cublasStatus_t status) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtGetStatusName, status);
}
ATTNRES_CUBLASLT_API const char* cublasLtGetStatusString(cublasStatus_t status) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtGetStatusString, status);
}
ATTNRES_CUBLASLT_API cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                                             cudaDataType_t scale) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtMatmulDescCreate, desc, compute, scale);
}
ATTNRES_CUBLASLT_API cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtMatmulDescDestroy, desc);
}
ATTNRES_CUBLASLT_API cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                                   cublasLtMatmulDescAttributes_t attr,
                                                                   const void* buf, size_t bytes) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtMatmulDescSetAttribute, desc, attr, buf, bytes);
}
ATTNRES_CUBLASLT_API cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                                               uint64_t rows, uint64_t cols, int64_t ld) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtMatrixLayoutCreate, layout, type, rows, cols, ld);
}
ATTNRES_CUBLASLT_API cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtMatrixLayoutDestroy, layout);
}
ATTNRES_CUBLASLT_API cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtMatmulPreferenceCreate, pref);
}
ATTNRES_CUBLASLT_API cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtMatmulPreferenceDestroy, pref);
}
ATTNRES_CUBLASLT_API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                         cublasLtMatmulPreferenceAttributes_t attr,
                                                                         const void* buf, size_t bytes) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, bytes);
}
ATTNRES_CUBLASLT_API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
    cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
    cublasLtMatmulHeuristicResult_t results[], int* returned) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtMatmulAlgoGetHeuristic, handle, desc, a, b, c, d, pref, requested, results,
                           returned);
}
ATTNRES_CUBLASLT_API cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                   const void* alpha, const void* A, cublasLtMatrixLayout_t a,
                                                   const void* B, cublasLtMatrixLayout_t b, const void* beta,
                                                   const void* C, cublasLtMatrixLayout_t c, void* D,
                                                   cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t* algo,
                                                   void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  ATTNRES_CUBLASLT_FORWARD(cublasLtMatmul, handle, desc, alpha, A, a, B, b, beta, C, c, D, d, algo, workspace,
                           workspace_bytes, stream);
}
