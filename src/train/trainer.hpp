// The training loop: data order, AdamW with schedule and clipping, validation milestones,
// atomic checkpoints, exact resume, NaN guard, and clean stops on SIGINT/SIGTERM.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.hpp"
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

struct TrainResult {
  bool finished = false;  // false: stopped by a signal, resumable
  std::int64_t params = 0;
  std::int64_t steps = 0;
  std::vector<MilestoneResult> milestones;
  std::vector<std::pair<std::int64_t, double>> curve;  // (tokens, train loss) per step
  double tokens_per_sec = 0;  // over the steps run in this process
  double step_time_ms = 0;
  double reduce_fraction = 0;  // share of step time spent summing gradients across ranks
  std::int64_t peak_rss_bytes = 0;
  std::string weights_path;  // OUT/model.safetensors
};

// Files in OUT: config.toml, metrics.jsonl (one JSON object per step and per evaluation),
// model.safetensors (weights, config in metadata), checkpoint.safetensors (weights, AdamW
// moments and the training state) and, once finished, train_result.json; each written
// atomically. Data parallel over comm's K ranks: the global batch of train.batch_size sequences
// is split into train.micro_batches micro-batches (default: K), each rank computing M/K of them;
// gradients are summed in a fixed tree order, so any K dividing M (with M/K a power of two) gives
// the same weights bit for bit. Resume works with another K.
TrainResult train(const TrainConfig& config, const TrainRunOptions& options);

// The config with model.vocab_size filled from the prepared data (checked against it).
TrainConfig resolve_vocab(TrainConfig config, const std::string& data_dir);

std::int64_t peak_rss_bytes();

}  // namespace attnres
