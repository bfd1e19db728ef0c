// The training loop: data order, AdamW with schedule and clipping, validation milestones,
// atomic checkpoints, exact resume, NaN guard, and clean stops on SIGINT/SIGTERM.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.hpp"
#include "results/train_result.hpp"
#include "train/train_config.hpp"

namespace attnres {

struct TrainRunOptions {
  std::string data_dir;
  std::string out_dir;
  bool resume = false;
  const std::atomic<bool>* stop = nullptr;  // set asynchronously (signals): save and return
  bool progress = true;                     // status line and messages on stderr
  std::string label;                        // prefix of the status line (e.g. "rd seed 2")
  std::int64_t stop_at_step = 0;            // > 0: save a checkpoint and stop after this step
  std::string device = "cpu";               // cpu | cuda | cuda:N (train/backend.hpp)
  // The processes training together (data parallel); null: this process alone. Every rank
  // calls train() with the same config; rank 0 alone writes files and progress.
  dist::Communicator* comm = nullptr;
};

struct MilestoneResult {
  std::int64_t step = 0;
  std::int64_t tokens = 0;
  double val_nll = 0;
};

// What train() returns: what train_result.json records (results/train_result.hpp; of a stopped
// run only params and steps), and how it ended.
struct TrainResult : results::TrainResult {
  bool finished = false;     // false: stopped by a signal, resumable
  std::string weights_path;  // OUT/model.safetensors
};

// Files in OUT: config.toml, metrics.jsonl (one JSON object per step and per evaluation),
// model.safetensors (weights, config in metadata), the newest train.keep_checkpoints
// checkpoint-STEP.safetensors (weights, AdamW moments and the training state; train/checkpoint.hpp)
// and, once finished, train_result.json; each written atomically. Data parallel over comm's K ranks: the global batch of train.batch_size sequences
// is split into train.micro_batches micro-batches (default: K), each rank computing M/K of them;
// gradients are summed in a fixed tree order, so any K dividing M (with M/K a power of two) gives
// the same weights bit for bit. Resume works with another K.
TrainResult train(const TrainConfig& config, const TrainRunOptions& options);

// The config with model.vocab_size filled from the prepared data (checked against it).
TrainConfig resolve_vocab(TrainConfig config, const std::string& data_dir);

}  // namespace attnres
