// The measurement inside one `attnres bench` worker process: full training steps of a model on
// random tokens through its TrainBackend (train/backend.hpp: accumulate, finish_gradient, update
// with clipping at 1.0 and AdamW, one micro-batch: what `attnres train` does per step), on any
// device the backend has. The parent (bench.hpp) starts one process per measurement, so each
// arm's peak memory is its own, and reads the single JSON line the worker prints.
#pragma once

#include <cstdint>
#include <string>

namespace attnres::bench {

// The hidden `bench --worker` flags.
struct WorkerOptions {
  std::string model_json;   // the model config (ModelConfig's JSON)
  std::string paired_json;  // a second config: time both alternately in this process
  std::string device = "cpu";
  std::string precision;         // fp32 | bf16 (empty: fp32)
  std::string paired_precision;  // the second config's (an "@bf16" arm beside an fp32 one); empty: `precision`
  int batch = 0, seq = 0, steps = 0, warmup = 0, threads = 0;
  std::uint64_t seed = 1;
};

// Runs the measurement and prints its result to stdout as one JSON line:
// - one model: its step times (wall and CPU, forward + backward and the update apart), first and
//   last loss, parameter count, peak and starting resident memory;
// - two models (paired_json): both stepped alternately on the same tokens (A B, then B A, ...),
//   so that both see the same machine from one moment to the next; the per-step ratio B/A is far
//   steadier on a shared machine than the ratio of two separate runs. (Memory is not measured.)
void run_worker(const WorkerOptions& options);

}  // namespace attnres::bench
