// The CPU backends: Model<float> for inference, and with AdamW<float> on host buffers for
// training; training gradients are accumulated over micro-batches in tree order and summed
// across ranks by the communicator.
#include <cstring>

#include "dist/tree_sum.hpp"
#include "kernels/gemm_bf16.hpp"
#include "kernels/gemm_f32.hpp"
#include "model/model.hpp"
#include "model/safetensors.hpp"
#include "optim/adamw.hpp"
#include "train/device_backends.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

namespace attnres::detail {

namespace {

class ModelDecoder final : public Decoder {
 public:
  ModelDecoder(Model<float>& model, int batch)
      : model_(model), cache_(model.config(), batch, model.config().max_seq_len) {}
  void append(std::span<const std::int32_t> inputs, int seq, std::span<float> out) override {
    model_.decode(inputs, cache_.batch, seq, cache_, out);
  }
  int length() const override { return cache_.length; }

 private:
  Model<float>& model_;
  KvCache<float> cache_;
};

// The inference role on a Model<float>, shared by both CPU backends (Interface: InferenceBackend
// or TrainBackend).
template <class Interface>
class CpuModelBackend : public Interface {
 public:
  const ModelConfig& config() const override { return model_.config(); }
  const ParamLayout& layout() const override { return model_.layout(); }
  std::string describe() const override {
    // The matmul kernels decide the last bits of a run (docs/training.md, "CPU kernels and the
    // environment"), so the log names them.
    const bool bf16 = model_.matmul_precision() == kernels::MatmulPrecision::bf16;
    return concat("cpu, ", num_threads(), num_threads() == 1 ? " thread" : " threads",
                  bf16 ? concat(", bf16 matmuls (", kernels::to_string(kernels::bf16_backend()), ")")
                       : concat(", fp32 matmuls (", kernels::to_string(kernels::fp32_gemm_backend()), ")"));
  }

  using Interface::load_weights;
  void load_weights(const SafetensorsFile& file, const std::string& path) override {
    attnres::load_weights<float>(file, path, model_.config(), model_.layout(), model_.params());
  }
  double loss(std::span<const std::int32_t> tokens, int batch, int seq) override {
    return model_.forward(tokens, batch, seq);
  }
  void logits(std::span<const std::int32_t> inputs, int batch, int seq, std::span<float> out) override {
    model_.logits(inputs, batch, seq, out);
  }
  const Model<float>* host_model() const override { return &model_; }
  std::unique_ptr<Decoder> decoder(int batch) override { return std::make_unique<ModelDecoder>(model_, batch); }

 protected:
  CpuModelBackend(const ModelConfig& config, int max_batch, int max_seq, bool with_grad,
                  kernels::MatmulPrecision precision)
      : model_(config, max_batch, max_seq, with_grad) {
    model_.set_matmul_precision(precision);
  }

  Model<float> model_;
};

class CpuInferenceBackend final : public CpuModelBackend<InferenceBackend> {
 public:
  CpuInferenceBackend(const ModelConfig& config, int max_batch, int max_seq, kernels::MatmulPrecision precision)
      : CpuModelBackend(config, max_batch, max_seq, false, precision) {}
};

class CpuTrainBackend final : public CpuModelBackend<TrainBackend> {
 public:
  CpuTrainBackend(const TrainConfig& config, int micro_batch, int local_micro)
      : CpuModelBackend(config.model, micro_batch, config.seq_len, true, config.precision),
        opt_(model_.layout(), config.adamw()),
        local_micro_(local_micro) {
    if (local_micro_ > 1) grad_sum_ = dist::PairwiseSum<float>(model_.grads().size(), static_cast<std::size_t>(local_micro_));
  }

  void init_params(std::uint64_t seed, double perturbation) override {
    attnres::init_params<float>(model_.layout(), seed, model_.params(), perturbation);
  }

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

 private:
  static void copy_into(std::span<const float> from, std::span<float> to) {
    require(from.size() == to.size(), "training state of ", from.size(), " values does not match this model (",
            to.size(), ")");
    std::memcpy(to.data(), from.data(), from.size_bytes());
  }

  AdamW<float> opt_;
  int local_micro_;
  dist::PairwiseSum<float> grad_sum_;
};

}  // namespace

std::unique_ptr<InferenceBackend> make_cpu_inference_backend(const ModelConfig& config, int max_batch, int max_seq,
                                                             kernels::MatmulPrecision precision) {
  return std::make_unique<CpuInferenceBackend>(config, max_batch, max_seq, precision);
}

std::unique_ptr<TrainBackend> make_cpu_train_backend(const TrainConfig& config, int micro_batch, int local_micro) {
  return std::make_unique<CpuTrainBackend>(config, micro_batch, local_micro);
}

}  // namespace attnres::detail
