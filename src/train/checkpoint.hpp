// The run directory of `attnres train` (docs/training.md, "Files of a run"): checkpoints and the
// training state they carry, and how a run starts or resumes from them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/loader.hpp"
#include "dist/communicator.hpp"
#include "model/param_layout.hpp"
#include "train/backend.hpp"
#include "train/train_config.hpp"
#include "train/trainer.hpp"

namespace attnres {

// The paths of a run directory's files.
struct RunFiles {
  explicit RunFiles(const std::string& out_dir);
  std::string dir;
  std::string config;      // config.toml
  std::string metrics;     // metrics.jsonl
  std::string weights;     // model.safetensors
  std::string checkpoint;  // checkpoint.safetensors
  std::string result;      // train_result.json (results/train_result.hpp)
};

// The training state that is not in the weights: everything resume needs.
struct TrainState {
  std::int64_t step = 0;
  data::LoaderPosition loader;
  std::int64_t metrics_bytes = 0;  // metrics.jsonl is truncated to this on resume
  std::vector<MilestoneResult> milestones;
  std::vector<std::pair<std::int64_t, double>> curve;
  bool finished = false;
};

// Writes checkpoint.safetensors (weights, AdamW moments and the state, in one file so it can never
// disagree with itself) and model.safetensors (the weights for eval and sample, with the
// tokenizer's spec and content hash as metadata "tokenizer" and "tokenizer_hash"), atomically.
void save_checkpoint(const RunFiles& files, const TrainConfig& config, const ParamLayout& layout,
                     const HostTrainState& host, const TrainState& state, const std::string& config_toml,
                     const data::Tokenizer& tokenizer);

struct RunStart {
  TrainState state;      // step 0 for a new run
  bool resumed = false;  // the state, weights and moments came from the checkpoint
};

// Called by every rank. A new run (no checkpoint yet) writes config.toml and an empty
// metrics.jsonl and initialises the weights from config.seed. An existing run needs `resume`:
// rank 0 reads the checkpoint, refuses one written with another configuration, and hands weights,
// moments and state to the other ranks (so only rank 0 needs the run directory); metrics.jsonl
// is cut back to the checkpoint's length.
RunStart start_or_resume(const RunFiles& files, const TrainConfig& config, const std::string& config_toml,
                         bool resume, TrainBackend& backend, dist::Communicator& comm);

}  // namespace attnres
