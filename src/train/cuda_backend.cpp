// The CUDA backends (`--device cuda`): CudaModel for inference, and with CudaAdamW for training,
// on one GPU. Micro-batch gradients are accumulated on the device in the same tree order as the
// CPU (dist/tree_sum.hpp); across ranks they are summed by NCCL when the build has it, otherwise
// through host memory by the MPI communicator (slower, but the same tree order as the CPU).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/cuda_model.hpp"
#include "cuda/gemm.hpp"
#include "cuda/kernels.hpp"
#include "model/family.hpp"
#include "model/safetensors.hpp"
#include "train/device_backends.hpp"
#include "util/error.hpp"

namespace attnres::detail {

namespace {

// The inference role on a CudaModel, shared by both CUDA backends (Interface: InferenceBackend
// or TrainBackend).
template <class Interface>
class CudaModelBackend : public Interface {
 public:
  const ModelConfig& config() const override { return model_.config(); }
  const ParamLayout& layout() const override { return model_.layout(); }
  std::string describe() const override {
    return concat("cuda:", model_.device(), name_.empty() ? "" : " (" + name_ + ")", ", ",
                  kernels::to_string(model_.precision()));
  }

  using Interface::load_weights;
  void load_weights(const SafetensorsFile& file, const std::string& path) override {
    std::vector<float> params(static_cast<std::size_t>(model_.n_params()));
    attnres::load_weights<float>(file, path, model_.config(), model_.layout(), params);
    model_.load_params_from_host(params);
  }
  double loss(std::span<const std::int32_t> tokens, int batch, int seq) override {
    return model_.forward(tokens, batch, seq);
  }
  void logits(std::span<const std::int32_t> inputs, int batch, int seq, std::span<float> out) override {
    model_.logits(inputs, batch, seq, out);
  }

 protected:
  CudaModelBackend(int device, const ModelConfig& config, int max_batch, int max_seq,
                   kernels::MatmulPrecision precision, bool with_grad)
      : model_(config, max_batch, max_seq, precision, with_grad, device) {
    for (const auto& info : cuda::list_devices())
      if (info.index == device) name_ = info.name;
  }

  cuda::CudaModel model_;
  std::string name_;
};

class CudaInferenceBackend final : public CudaModelBackend<InferenceBackend> {
 public:
  CudaInferenceBackend(int device, const ModelConfig& config, int max_batch, int max_seq,
                       kernels::MatmulPrecision precision)
      : CudaModelBackend(device, config, max_batch, max_seq, precision, false) {}
};

class CudaTrainBackend final : public CudaModelBackend<TrainBackend> {
 public:
  CudaTrainBackend(int device, const TrainConfig& config, int micro_batch, int local_micro, dist::Communicator& comm)
      : CudaModelBackend(device, config.model, micro_batch, config.seq_len, config.precision, true),
        opt_(model_.layout(), config.adamw(), device),
        local_micro_(local_micro),
        n_(model_.n_params()) {
    if (local_micro_ > 1) {
      const int levels = std::bit_width(static_cast<unsigned>(local_micro_));
      for (int l = 0; l < levels; ++l) levels_.emplace_back(static_cast<std::size_t>(n_) * sizeof(float));
    }
    if (comm.distributed() && cuda::GradAllReduce::available()) {
      std::string id;
      if (comm.is_root()) {
        const std::vector<char> raw = cuda::GradAllReduce::nccl_unique_id();
        id.assign(raw.begin(), raw.end());
      }
      comm.broadcast(id);
      nccl_ = std::make_unique<cuda::GradAllReduce>(comm.rank(), comm.world(),
                                                    std::span<const char>(id.data(), id.size()), device);
    }
  }

  void init_params(std::uint64_t seed, double perturbation) override { model_.init_params(seed, perturbation); }

  void load_state(std::span<const float> params, std::span<const float> m, std::span<const float> v,
                  std::int64_t adam_steps) override {
    model_.load_params_from_host(params);
    opt_.load_state_from_host(m, v);
    opt_.set_steps(adam_steps);
  }

  HostTrainState host_state() override {
    const auto n = static_cast<std::size_t>(n_);
    params_.resize(n);
    m_.resize(n);
    v_.resize(n);
    model_.copy_params_to_host(params_);
    opt_.copy_state_to_host(m_, v_);
    return {params_, m_, v_, opt_.steps()};
  }

  double accumulate(std::span<const std::int32_t> tokens, int batch, int seq) override {
    const double loss = model_.forward_backward(tokens, batch, seq);
    if (local_micro_ > 1) add_leaf();
    return loss;
  }

  void finish_gradient(dist::Communicator& comm, int micro_batches) override {
    float* grads = model_.device_grads();
    const cuda::Stream stream = model_.stream();
    if (local_micro_ > 1) {  // the stored subtrees, combined from the smallest (PairwiseSum::result)
      bool have = false;
      for (std::size_t level = 0; level < levels_.size(); ++level) {
        if (((count_ >> level) & 1u) == 0) continue;
        if (!have) copy(grads, levels_[level].as<float>());
        else cuda::kern::add_into(grads, levels_[level].as<float>(), n_, stream);
        have = true;
      }
      count_ = 0;
    }
    if (comm.distributed()) {
      if (nccl_ != nullptr) {
        nccl_->sum_grads(model_);
      } else {
        staging_.resize(static_cast<std::size_t>(n_));
        model_.copy_grads_to_host(staging_);
        comm.sum(staging_);
        ATTNRES_CUDA_CHECK(cudaMemcpyAsync(grads, staging_.data(), staging_.size() * sizeof(float),
                                           cudaMemcpyHostToDevice, stream));
      }
    }
    if (micro_batches > 1) cuda::kern::divide(grads, static_cast<float>(micro_batches), n_, stream);
  }

  double update(double lr, double max_norm) override { return opt_.step(model_, lr, max_norm); }

 private:
  void copy(float* to, const float* from) {
    ATTNRES_CUDA_CHECK(cudaMemcpyAsync(to, from, static_cast<std::size_t>(n_) * sizeof(float),
                                       cudaMemcpyDeviceToDevice, model_.stream()));
  }

  // PairwiseSum::add on the device: merge with the stored left sibling of each completed pair.
  void add_leaf() {
    require(count_ < static_cast<std::size_t>(local_micro_), "more micro-batches than the step has");
    float* leaf = model_.device_grads();
    std::size_t i = count_++;
    std::size_t level = 0;
    for (; i & 1u; i >>= 1, ++level) cuda::kern::add_into(leaf, levels_[level].as<float>(), n_, model_.stream());
    copy(levels_[level].as<float>(), leaf);
  }

  cuda::CudaAdamW opt_;
  int local_micro_;
  std::int64_t n_;
  std::vector<cuda::DeviceBuffer> levels_;  // one partial gradient sum per tree level
  std::size_t count_ = 0;
  std::unique_ptr<cuda::GradAllReduce> nccl_;
  std::vector<float> params_, m_, v_, staging_;  // host mirrors
};

}  // namespace

void check_cuda_device(int device) {
  const auto devices = cuda::list_devices();
  require(!devices.empty(), "--device cuda: no CUDA GPU is visible to this process (check nvidia-smi and "
          "CUDA_VISIBLE_DEVICES), or use --device cpu");
  require(device < static_cast<int>(devices.size()), "--device cuda:", device, ": only ", devices.size(),
          " GPU(s) visible");
}

namespace {

// The CUDA kernels cover what the family's record says (model/family.hpp's cuda_refusal): a mode
// or an option they lack is refused by name before any work, never run on the CPU instead.
void require_cuda_support(const ModelConfig& config) {
  const std::string lacking = cuda_refusal(config);
  require(lacking.empty(), "--device cuda: ", lacking, " has no CUDA implementation; use --device cpu");
}

}  // namespace

// The constructors take a GPU that passed check_cuda_device (backend.cpp).
std::unique_ptr<InferenceBackend> make_cuda_inference_backend(int device, const ModelConfig& config, int max_batch,
                                                              int max_seq, kernels::MatmulPrecision precision) {
  require_cuda_support(config);
  return std::make_unique<CudaInferenceBackend>(device, config, max_batch, max_seq, precision);
}

std::unique_ptr<TrainBackend> make_cuda_train_backend(int device, const TrainConfig& config, int micro_batch,
                                                      int local_micro, dist::Communicator& comm) {
  require_cuda_support(config.model);
  return std::make_unique<CudaTrainBackend>(device, config, micro_batch, local_micro, comm);
}

double cuda_bf16_gemm_gflops(int device, std::int64_t m, std::int64_t n, std::int64_t k, int reps) {
  ATTNRES_CUDA_CHECK(cudaSetDevice(device));
  const auto elements = [](std::int64_t rows, std::int64_t cols) { return std::size_t(rows) * std::size_t(cols); };
  cuda::DeviceBuffer a(elements(m, k) * 2), b(elements(n, k) * 2), c(elements(m, n) * 2);
  ATTNRES_CUDA_CHECK(cudaMemset(a.data(), 0, a.bytes()));
  ATTNRES_CUDA_CHECK(cudaMemset(b.data(), 0, b.bytes()));
  cudaStream_t stream = nullptr;
  ATTNRES_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  ATTNRES_CUDA_CHECK(cudaEventCreate(&e0));
  ATTNRES_CUDA_CHECK(cudaEventCreate(&e1));
  double best = 0;
  {
    cuda::Gemm gemm(stream);
    const auto call = [&] {
      gemm.run(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, cuda::DType::bf16, 0.0f, nullptr, c.data(), n,
               cuda::DType::bf16);
    };
    constexpr int kCalls = 10;
    for (int i = 0; i < 3; ++i) call();
    for (int rep = 0; rep < reps; ++rep) {
      ATTNRES_CUDA_CHECK(cudaEventRecord(e0, stream));
      for (int i = 0; i < kCalls; ++i) call();
      ATTNRES_CUDA_CHECK(cudaEventRecord(e1, stream));
      ATTNRES_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      ATTNRES_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      best = std::max(best, kCalls * 2.0 * double(m) * double(n) * double(k) / (double(ms) * 1e-3) / 1e9);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
  return best;
}

}  // namespace attnres::detail
