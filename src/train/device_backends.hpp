// Internal to src/train: the per-device backend constructors behind make_inference_backend and
// make_train_backend (backend.cpp), which parse --device and pick one.
#pragma once

#include <memory>

#include "train/backend.hpp"
#include "train/inference.hpp"

namespace attnres::detail {

std::unique_ptr<InferenceBackend> make_cpu_inference_backend(const ModelConfig& config, int max_batch, int max_seq,
                                                             kernels::MatmulPrecision precision);
std::unique_ptr<TrainBackend> make_cpu_train_backend(const TrainConfig& config, int micro_batch, int local_micro);

#ifdef ATTNRES_WITH_CUDA
// cuda_backend.cpp. check_cuda_device: `device` is one of the visible GPUs (an Error otherwise);
// the constructors take a GPU index that passed it.
void check_cuda_device(int device);
std::unique_ptr<InferenceBackend> make_cuda_inference_backend(int device, const ModelConfig& config, int max_batch,
                                                              int max_seq, kernels::MatmulPrecision precision);
std::unique_ptr<TrainBackend> make_cuda_train_backend(int device, const TrainConfig& config, int micro_batch,
                                                      int local_micro, dist::Communicator& comm);
double cuda_bf16_gemm_gflops(int device, std::int64_t m, std::int64_t n, std::int64_t k, int reps);
#endif

}  // namespace attnres::detail
