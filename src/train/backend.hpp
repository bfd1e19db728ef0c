// Where a training run computes: the model, its optimizer and the step's gradient on one device
// (the CPU, or one GPU with the CUDA backend). The training loop (trainer.cpp) owns everything
// else (data order, schedule, loss bookkeeping, checkpoints, evaluation milestones) and talks to
// the device only through this interface, so both devices share it. It extends the inference
// role (train/inference.hpp: weights, loss, logits), which validation uses.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "dist/communicator.hpp"
#include "train/inference.hpp"
#include "train/train_config.hpp"

namespace attnres {

// Host views of the whole training state (for checkpoints).
struct HostTrainState {
  std::span<const float> params, m, v;  // ParamLayout order
  std::int64_t adam_steps = 0;
};

class TrainBackend : public InferenceBackend {
 public:
  // model/param_layout.hpp's init_params (perturbation > 0: a twin).
  virtual void init_params(std::uint64_t seed, double perturbation) = 0;
  // Weights, moments and AdamW's step count, e.g. from a checkpoint.
  virtual void load_state(std::span<const float> params, std::span<const float> m, std::span<const float> v,
                          std::int64_t adam_steps) = 0;
  // The state as host arrays (the CPU's own buffers; a GPU copies into a host mirror).
  virtual HostTrainState host_state() = 0;

  // One micro-batch ([batch, seq+1] tokens): forward, backward, and its gradient added to this
  // step's sum in the fixed tree order (dist/tree_sum.hpp). Returns its mean loss.
  virtual double accumulate(std::span<const std::int32_t> tokens, int batch, int seq) = 0;
  // Ends the step's gradient: the sum over this rank's micro-batches, summed across ranks, divided
  // by the number of micro-batches over all ranks (so it is the gradient of the mean loss).
  virtual void finish_gradient(dist::Communicator& comm, int micro_batches) = 0;
  // Clips the gradient's global norm to max_norm (0: off) and applies AdamW at lr. Returns the
  // norm before clipping.
  virtual double update(double lr, double max_norm) = 0;
};

// `device`: "cpu", "cuda" (the GPU of this rank's local index) or "cuda:N". Sized for
// micro-batches of `micro_batch` sequences, of which this rank computes `local_micro` per step.
std::unique_ptr<TrainBackend> make_train_backend(const std::string& device, const TrainConfig& config,
                                                 int micro_batch, int local_micro, dist::Communicator& comm);

// The bf16 GEMM rate of the GPU `device` names ("cuda", "cuda:N"): cuBLASLt with bf16 operands,
// fp32 accumulation and bf16 output on C[m,n] = A[m,k] B[n,k]^T (a Linear's forward), the best of
// `reps` batches of 10 calls after 3 warm-up calls, in GFLOP/s: the reference of `attnres bench
// --device cuda`'s MFU (tests/gpu/check.sh (d) measures the same on 8192^3). An Error for the CPU or
// a build without the CUDA backend.
double gpu_bf16_gemm_gflops(const std::string& device, std::int64_t m, std::int64_t n, std::int64_t k, int reps);

// Checks, without building anything, that this process can train on `device` as
// make_train_backend would (a valid name; for a GPU, a build with the CUDA backend and that GPU
// visible); throws Error saying what is missing. Returns the GPU index, or -1 for the CPU.
int check_train_device(const std::string& device, int local_rank = 0);

}  // namespace attnres
