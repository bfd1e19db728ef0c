// make_inference_backend and make_train_backend: --device parsed once, for both roles.
#include <algorithm>
#include <optional>
#include <vector>

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

namespace {

class RecomputeDecoder final : public Decoder {
 public:
  RecomputeDecoder(InferenceBackend& backend, int batch) : backend_(backend), batch_(batch) {
    require(batch >= 1, "a decoder needs at least one row");
  }

  void append(std::span<const std::int32_t> inputs, int seq, std::span<float> out) override {
    const ModelConfig& c = backend_.config();
    const auto vocab = static_cast<std::size_t>(c.vocab_size);
    const auto rows = static_cast<std::size_t>(batch_);
    require(seq >= 1 && inputs.size() == rows * static_cast<std::size_t>(seq), "decoder: ", inputs.size(),
            " inputs for ", batch_, " rows of ", seq);
    require(out.size() >= rows * vocab, "decoder: the output holds ", out.size(), " logits, not ", rows * vocab);
    require(length_ + seq <= c.max_seq_len, "the context is full (", c.max_seq_len, " tokens)");
    const auto old_len = static_cast<std::size_t>(length_);
    length_ += seq;
    const auto len = static_cast<std::size_t>(length_);
    std::vector<std::int32_t> grown(rows * len);  // [batch, length]: each row's context so far
    for (std::size_t b = 0; b < rows; ++b) {
      std::copy_n(context_.begin() + static_cast<std::ptrdiff_t>(b * old_len), old_len,
                  grown.begin() + static_cast<std::ptrdiff_t>(b * len));
      std::copy_n(inputs.begin() + static_cast<std::ptrdiff_t>(b * static_cast<std::size_t>(seq)), seq,
                  grown.begin() + static_cast<std::ptrdiff_t>(b * len + old_len));
    }
    context_.swap(grown);
    logits_.resize(rows * len * vocab);
    backend_.logits(context_, batch_, length_, logits_);
    for (std::size_t b = 0; b < rows; ++b)
      std::copy_n(logits_.begin() + static_cast<std::ptrdiff_t>((b * len + len - 1) * vocab), vocab,
                  out.begin() + static_cast<std::ptrdiff_t>(b * vocab));
  }

  int length() const override { return length_; }

 private:
  InferenceBackend& backend_;
  int batch_;
  int length_ = 0;
  std::vector<std::int32_t> context_;
  std::vector<float> logits_;
};

}  // namespace

std::unique_ptr<Decoder> make_recompute_decoder(InferenceBackend& backend, int batch) {
  return std::make_unique<RecomputeDecoder>(backend, batch);
}

std::unique_ptr<Decoder> InferenceBackend::decoder(int batch) { return make_recompute_decoder(*this, batch); }

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

double gpu_bf16_gemm_gflops(const std::string& device, std::int64_t m, std::int64_t n, std::int64_t k, int reps) {
  const int gpu = checked_gpu(device, 0);
  require(gpu >= 0, "gpu_bf16_gemm_gflops: --device ", device, " is not a GPU");
  require(m >= 1 && n >= 1 && k >= 1 && reps >= 1, "gpu_bf16_gemm_gflops: shape and repetitions must be positive");
#ifdef ATTNRES_WITH_CUDA
  return detail::cuda_bf16_gemm_gflops(gpu, m, n, k, reps);
#else
  return 0;  // not reached: checked_gpu fails without the CUDA backend
#endif
}

}  // namespace attnres
