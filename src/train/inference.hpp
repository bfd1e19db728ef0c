// Where a trained model computes without training: weights loaded from a file, the mean loss of
// a batch, logits, and (on the CPU) KV-cache decoding and the model behind the last pass.
// `attnres eval` and `sample` and an experiment's test NLL and routing diagnostics talk to a
// device only through this interface; TrainBackend (train/backend.hpp) extends it with the
// optimizer and the training step, so the training loop evaluates through the same calls.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kernels/precision.hpp"
#include "model/config.hpp"
#include "model/param_layout.hpp"
#include "model/safetensors.hpp"

namespace attnres {

template <class Real>
class Model;  // model/model.hpp

// Incremental decoding with a KV cache: each appended token costs one step of work. Holds a
// reference to its backend's model, so it must not outlive the backend.
class Decoder {
 public:
  virtual ~Decoder() = default;
  // Appends inputs [batch, seq] at positions length().. and writes the logits of each row's last
  // position into out [batch, vocab]. Earlier positions come from the cache.
  virtual void append(std::span<const std::int32_t> inputs, int seq, std::span<float> out) = 0;
  virtual int length() const = 0;  // positions filled (at most the model's max_seq_len)
};

class InferenceBackend {
 public:
  virtual ~InferenceBackend() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const ParamLayout& layout() const = 0;
  virtual std::string describe() const = 0;  // e.g. "cpu, 2 threads" or "cuda:0 (NVIDIA H200), bf16"

  // Weights from a safetensors file written for this configuration (model/safetensors.hpp):
  // one already read (`file`, read from `path`, which names it in errors), or read here.
  virtual void load_weights(const SafetensorsFile& file, const std::string& path) = 0;
  void load_weights(const std::string& path) { load_weights(read_safetensors(path), path); }
  // Mean next-token loss of [batch, seq+1] tokens, forward only.
  virtual double loss(std::span<const std::int32_t> tokens, int batch, int seq) = 0;
  // Logits [batch, seq, vocab] (host, fp32) for inputs [batch, seq].
  virtual void logits(std::span<const std::int32_t> inputs, int batch, int seq, std::span<float> out) = 0;

  // The model behind this backend when it computes on the host (the CPU), whose depth view and
  // per-pass queries show what the last loss() pass mixed across depth (model/diagnostics.hpp);
  // null where the device keeps nothing on the host (CUDA).
  virtual const Model<float>* host_model() const { return nullptr; }
  // A decoder for `batch` rows with a context of the model's max_seq_len: the CPU's KV cache; on a
  // device without one (CUDA), make_recompute_decoder.
  virtual std::unique_ptr<Decoder> decoder(int batch);
};

// Decoding without a KV cache (`sample --device cuda`): every append recomputes each row's whole
// context with backend.logits() and keeps its last position's logits, a full forward pass per new
// token (milliseconds on a GPU at a model's context length; the CPU decodes with its cache). The
// backend must hold batches of `batch` rows of the model's max_seq_len; the decoder keeps a
// reference to it.
std::unique_ptr<Decoder> make_recompute_decoder(InferenceBackend& backend, int batch);

// `device`: "cpu", "cuda" (GPU 0) or "cuda:N". Sized for batches of up to max_batch sequences
// of up to max_seq tokens; `precision` as train.precision.
std::unique_ptr<InferenceBackend> make_inference_backend(
    const std::string& device, const ModelConfig& config, int max_batch, int max_seq,
    kernels::MatmulPrecision precision = kernels::MatmulPrecision::fp32);

// True when this binary has the CUDA backend.
bool cuda_backend_built();

}  // namespace attnres
