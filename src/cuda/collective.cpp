// GradAllReduce: the multi-GPU seam (cuda_model.hpp). Compiled with NCCL when CMake finds it;
// a single process needs no communication either way.
#include <cstring>

#include "cuda/check.hpp"
#include "cuda/cuda_model.hpp"
#include "util/error.hpp"

#ifdef ATTNRES_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#define ATTNRES_NCCL_CHECK(call)                                                                              \
  do {                                                                                                        \
    const ncclResult_t r_ = (call);                                                                           \
    if (r_ != ncclSuccess) ::attnres::fail("NCCL error in ", #call, " at ", __FILE__, ":", __LINE__, ": ",    \
                                           ncclGetErrorString(r_));                                           \
  } while (0)
#endif

namespace attnres::cuda {

bool GradAllReduce::available() {
#ifdef ATTNRES_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::vector<char> GradAllReduce::nccl_unique_id() {
#ifdef ATTNRES_WITH_NCCL
  ncclUniqueId id;
  ATTNRES_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::vector<char>(id.internal, id.internal + sizeof(id.internal));
#else
  return {};
#endif
}

GradAllReduce::GradAllReduce(int rank, int world, std::span<const char> unique_id, int device) : world_(world) {
  require(world >= 1 && rank >= 0 && rank < world, "GradAllReduce: bad rank ", rank, " of ", world);
  if (world == 1) return;
#ifdef ATTNRES_WITH_NCCL
  ncclUniqueId id;
  require(unique_id.size() == sizeof(id.internal), "GradAllReduce: bad NCCL id");
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  ATTNRES_CUDA_CHECK(cudaSetDevice(device));
  ncclComm_t comm = nullptr;
  ATTNRES_NCCL_CHECK(ncclCommInitRank(&comm, world, id, rank));
  comm_ = comm;
#else
  (void)unique_id;
  (void)device;
  fail("multi-GPU training needs NCCL: this build of the CUDA backend has none");
#endif
}

GradAllReduce::~GradAllReduce() {
#ifdef ATTNRES_WITH_NCCL
  if (comm_ != nullptr) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
#endif
}

void GradAllReduce::sum(float* device_data, std::int64_t n, Stream stream) {
  if (world_ == 1 || n == 0) return;
#ifdef ATTNRES_WITH_NCCL
  ATTNRES_NCCL_CHECK(ncclAllReduce(device_data, device_data, static_cast<std::size_t>(n), ncclFloat32, ncclSum,
                                   static_cast<ncclComm_t>(comm_), stream));
#else
  (void)device_data;
  (void)stream;
#endif
}

}  // namespace attnres::cuda
