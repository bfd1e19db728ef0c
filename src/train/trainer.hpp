// The training loop: data order, AdamW with schedule and clipping, validation milestones,
// atomic checkpoints, exact resume, NaN guard, and clean stops on SIGINT/SIGTERM.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "train/train_config.hpp"

namespace attnres {

struct TrainRunOptions {
  std::string data_dir;
  std::string out_dir;
  bool resume = false;
  const std::atomic<bool>* stop = nullptr;  // set asynchronously (signals): save and return
  bool progress = true;                     // status line and messages on stderr
  std::string label;                        // prefix of the status line (e.g. "rd seed 2")
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
  std::int64_t peak_rss_bytes = 0;
  std::string weights_path;  // OUT/model.safetensors
};

// Files in OUT: config.toml, metrics.jsonl (one JSON object per step and per evaluation),
// model.safetensors (weights, config in metadata), checkpoint.safetensors (weights, AdamW
// moments and the training state) and, once finished, train_result.json; each written
// atomically.
TrainResult train(const TrainConfig& config, const TrainRunOptions& options);

// The config with model.vocab_size filled from the prepared data (checked against it).
TrainConfig resolve_vocab(TrainConfig config, const std::string& data_dir);

std::int64_t peak_rss_bytes();

}  // namespace attnres
