// The CUDA backend loads cuBLASLt on its first call, not when a program starts
// (src/cuda/cublaslt_lazy.cpp): 60 ms of CPU saved at every start of a program that links it.
// Needs no GPU: cublasLtGetStatusName is a plain function of the library. Only in builds with the
// CUDA backend (tests/train/CMakeLists.txt).
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace {

bool cublaslt_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find("libcublasLt") != std::string::npos;
}

}  // namespace

TEST(CublasLtLazy, LoadedByTheFirstCallNotAtStart) {
  // CTest runs each test in a process of its own: nothing here has called cuBLASLt yet.
  EXPECT_FALSE(cublaslt_mapped()) << "libcublasLt is loaded at start: is it linked again (src/cuda/CMakeLists.txt)?";
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_TRUE(cublaslt_mapped());
}
