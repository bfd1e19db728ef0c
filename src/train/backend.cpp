// make_inference_backend and make_train_backend: --device parsed once, for both roles.
#include <optional>

#include "train/backend.hpp"
#include "train/device_backends.hpp"
#include "train/inference.hpp"
#include "util/error.hpp"

namespace attnres {

namespace {

// "cpu": nullopt; "cuda": default_gpu; "cuda:N": N.
std::optional<int> parse_device(const std::string& device, int default_gpu) {
  if (device == "cpu") return std::nullopt;
  require(device == "cuda" || device.rfind("cuda:", 0) == 0, "--device must be cpu, cuda or cuda:N (got '", device,
          "')");
  int index = default_gpu;
  if (device.size() > 5) {
    try {
      std::size_t used = 0;
      index = std::stoi(device.substr(5), &used);
      require(used == device.size() - 5 && index >= 0, "");
    } catch (const std::exception&) {
      fail("--device cuda:N needs a GPU index N >= 0 (got '", device, "')");
    }
  }
  return index;
}

#ifndef ATTNRES_WITH_CUDA
[[noreturn]] void no_cuda_backend(const std::string& device) {
  fail("--device ", device, ": this attnres was built without the CUDA backend (CMake found no CUDA toolkit); "
       "rebuild on a machine with nvcc (docs/cuda.md), or use --device cpu");
}
#endif

// The GPU `device` names, checked to exist in this build and process; -1 for the CPU.
int checked_gpu(const std::string& device, int default_gpu) {
  const std::optional<int> gpu = parse_device(device, default_gpu);
  if (!gpu) return -1;
#ifdef ATTNRES_WITH_CUDA
  detail::check_cuda_device(*gpu);
  return *gpu;
#else
  no_cuda_backend(device);
#endif
}

}  // namespace

bool cuda_backend_built() {
#ifdef ATTNRES_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Decoder> InferenceBackend::decoder(int) {
  fail("incremental decoding (sample) is not available on ", describe(), "; use the CPU");
}

std::unique_ptr<InferenceBackend> make_inference_backend(const std::string& device, const ModelConfig& config,
                                                         int max_batch, int max_seq,
                                                         kernels::MatmulPrecision precision) {
  [[maybe_unused]] const int gpu = checked_gpu(device, 0);
#ifdef ATTNRES_WITH_CUDA
  if (gpu >= 0) return detail::make_cuda_inference_backend(gpu, config, max_batch, max_seq, precision);
#endif
  return detail::make_cpu_inference_backend(config, max_batch, max_seq, precision);
}

int check_train_device(const std::string& device, int local_rank) { return checked_gpu(device, local_rank); }

std::unique_ptr<TrainBackend> make_train_backend(const std::string& device, const TrainConfig& config,
                                                 int micro_batch, int local_micro, dist::Communicator& comm) {
  [[maybe_unused]] const int gpu = check_train_device(device, comm.local_rank());
#ifdef ATTNRES_WITH_CUDA
  if (gpu >= 0) return detail::make_cuda_train_backend(gpu, config, micro_batch, local_micro, comm);
#endif
  return detail::make_cpu_train_backend(config, micro_batch, local_micro);
}

}  // namespace attnres
