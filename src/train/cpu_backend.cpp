// The CPU backend: Model<float> and AdamW<float> on host buffers; gradients accumulated over
// micro-batches in tree order and summed across ranks by the communicator.
#include <cstring>

#include "dist/tree_sum.hpp"
#include "model/model.hpp"
#include "optim/adamw.hpp"
#include "train/backend.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

namespace attnres {

namespace {

class CpuBackend final : public TrainBackend {
 public:
  CpuBackend(const TrainConfig& config, int micro_batch, int local_micro)
      : model_(config.model, micro_batch, config.seq_len, true),
        opt_(model_.layout(), config.adamw()),
        local_micro_(local_micro) {
    model_.set_matmul_precision(config.precision);
    if (local_micro_ > 1) grad_sum_ = dist::PairwiseSum<float>(model_.grads().size(), static_cast<std::size_t>(local_micro_));
  }

  const ParamLayout& layout() const override { return model_.layout(); }
  std::string describe() const override {
    return concat("cpu, ", num_threads(), num_threads() == 1 ? " thread" : " threads",
                  model_.matmul_precision() == kernels::MatmulPrecision::bf16 ? ", bf16 matmuls" : "");
  }

  void init_params(std::uint64_t seed) override { attnres::init_params<float>(model_.layout(), seed, model_.params()); }

  void load_state(std::span<const float> params, std::span<const float> m, std::span<const float> v,
                  std::int64_t adam_steps) override {
    copy_into(params, model_.params());
    copy_into(m, opt_.m());
    copy_into(v, opt_.v());
    opt_.set_steps(adam_steps);
  }

  HostTrainState host_state() override { return {model_.params(), opt_.m(), opt_.v(), opt_.steps()}; }

  double accumulate(std::span<const std::int32_t> tokens, int batch, int seq) override {
    const double loss = model_.forward_backward(tokens, batch, seq);
    if (local_micro_ > 1) grad_sum_.add(model_.grads());
    return loss;
  }

  void finish_gradient(dist::Communicator& comm, int micro_batches) override {
    if (local_micro_ > 1) {
      grad_sum_.result(model_.grads());
      grad_sum_.reset();
    }
    comm.sum(model_.grads());
    if (micro_batches > 1) {
      const float n = static_cast<float>(micro_batches);
      float* g = model_.grads().data();
      const auto size = static_cast<std::int64_t>(model_.grads().size());
#pragma omp parallel for simd schedule(static) if (size >= kParallelMin)
      for (std::int64_t i = 0; i < size; ++i) g[i] /= n;
    }
  }

  double update(double lr, double max_norm) override {
    const double norm = clip_grad_norm<float>(model_.grads(), max_norm);
    opt_.step(model_.params(), model_.grads(), lr);
    return norm;
  }

  double loss(std::span<const std::int32_t> tokens, int batch, int seq) override {
    return model_.forward(tokens, batch, seq);
  }

 private:
  static void copy_into(std::span<const float> from, std::span<float> to) {
    require(from.size() == to.size(), "training state of ", from.size(), " values does not match this model (",
            to.size(), ")");
    std::memcpy(to.data(), from.data(), from.size_bytes());
  }

  Model<float> model_;
  AdamW<float> opt_;
  int local_micro_;
  dist::PairwiseSum<float> grad_sum_;
};

// The GPU index `device` names, or -1 for the CPU; throws Error for a malformed name.
int gpu_index(const std::string& device, int local_rank) {
  if (device == "cpu") return -1;
  require(device == "cuda" || device.rfind("cuda:", 0) == 0, "--device must be cpu, cuda or cuda:N (got '", device,
          "')");
  if (device.size() <= 5) return local_rank;  // "cuda" (or "cuda:"): the rank's local index
  try {
    std::size_t used = 0;
    const int index = std::stoi(device.substr(5), &used);
    require(used == device.size() - 5 && index >= 0, "");
    return index;
  } catch (const std::exception&) {
    fail("--device cuda:N needs a GPU index N >= 0 (got '", device, "')");
  }
}

}  // namespace

#ifdef ATTNRES_WITH_CUDA
void check_cuda_device(int device);  // cuda_backend.cpp
std::unique_ptr<TrainBackend> make_cuda_train_backend(int device, const TrainConfig& config, int micro_batch,
                                                      int local_micro, dist::Communicator& comm);  // cuda_backend.cpp
bool cuda_backend_built() { return true; }
#else
bool cuda_backend_built() { return false; }
#endif

int check_train_device(const std::string& device, int local_rank) {
  const int gpu = gpu_index(device, local_rank);
  if (gpu < 0) return gpu;
#ifdef ATTNRES_WITH_CUDA
  check_cuda_device(gpu);
  return gpu;
#else
  fail("--device ", device, ": this attnres was built without the CUDA backend (CMake found no CUDA toolkit); "
       "rebuild on a machine with nvcc (docs/cuda.md), or use --device cpu");
#endif
}

std::unique_ptr<TrainBackend> make_train_backend(const std::string& device, const TrainConfig& config,
                                                 int micro_batch, int local_micro, dist::Communicator& comm) {
  [[maybe_unused]] const int gpu = check_train_device(device, comm.local_rank());
#ifdef ATTNRES_WITH_CUDA
  if (gpu >= 0) return make_cuda_train_backend(gpu, config, micro_batch, local_micro, comm);
#endif
  return std::make_unique<CpuBackend>(config, micro_batch, local_micro);
}

}  // namespace attnres
