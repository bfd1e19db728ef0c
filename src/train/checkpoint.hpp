// The run directory of `attnres train` (docs/training.md, "Files of a run"): checkpoints and the
// training state they carry, and how a run starts or resumes from them.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/loader.hpp"
#include "dist/communicator.hpp"
#include "model/param_layout.hpp"
#include "model/safetensors.hpp"
#include "train/backend.hpp"
#include "train/train_config.hpp"
#include "train/trainer.hpp"
#include "util/dir_lock.hpp"

namespace attnres {

// A checkpoint in a run directory: checkpoint-STEP.safetensors, STEP zero-padded to at least six
// digits so that `ls` lists them in order, e.g. checkpoint-000120.safetensors.
struct CheckpointFile {
  // kLegacyStep: "checkpoint.safetensors", the one checkpoint of a run written before
  // train.keep_checkpoints (its step is in its state); it is older than any numbered one.
  static constexpr std::int64_t kLegacyStep = -1;
  std::int64_t step = 0;
  std::string path;
};

// The file name of the checkpoint of `step`, and the pattern for messages and docs.
std::string checkpoint_file_name(std::int64_t step);
inline constexpr const char* kCheckpointPattern = "checkpoint-STEP.safetensors";

// The checkpoints directly in `dir` (none if it does not exist), newest first.
std::vector<CheckpointFile> list_checkpoints(const std::string& dir);

// The paths of a run directory's files.
struct RunFiles {
  explicit RunFiles(const std::string& out_dir);
  std::string dir;
  std::string config;   // config.toml
  std::string metrics;  // metrics.jsonl
  std::string weights;  // model.safetensors
  std::string result;   // train_result.json (results/train_result.hpp)

  std::string checkpoint(std::int64_t step) const;     // DIR/checkpoint-STEP.safetensors
  std::vector<CheckpointFile> checkpoints() const;     // list_checkpoints(dir)
  std::string checkpoint_pattern() const;              // DIR/checkpoint-STEP.safetensors, for messages
};

// A run directory as the --out of `attnres train` (util/dir_lock.hpp): one process at a time writes
// it, holding DIR/.lock (rank 0 under MPI; an experiment's runs included, each trained by its own
// `attnres train`). A directory of this kind holds a file of a training run: one of RunFiles', a
// checkpoint, or the run.toml that `attnres experiment` writes into a run's directory before it
// trains it there.
OutputKind run_directory_kind();

// The training state that is not in the weights: everything resume needs.
struct TrainState {
  std::int64_t step = 0;
  data::LoaderPosition loader;
  std::int64_t metrics_bytes = 0;  // metrics.jsonl is truncated to this on resume
  std::vector<MilestoneResult> milestones;
  // One point per step taken: tokens, training loss and gradient norm before clipping (unknown,
  // kNotAvailable, for the steps before a resume from a checkpoint written before norms were kept).
  std::vector<results::LossPoint> curve;
  bool finished = false;
};

// The data a run trains on: --data, for messages, and its identity (data/dataset_identity.hpp),
// which every checkpoint records so that a resume on other data is refused.
struct RunDataset {
  std::string dir;
  nlohmann::json identity;
};

// Writes checkpoint-STEP.safetensors (weights, AdamW moments and the state, in one file so it can
// never disagree with itself) and model.safetensors (the weights for eval and sample), each
// atomically and each with the tokenizer's spec and content hash as metadata "tokenizer" and
// "tokenizer_hash"; then, the new checkpoint being durable, removes the checkpoints beyond the
// newest train.keep_checkpoints, and any of a later step than this one (those a resume skipped
// because they did not verify: this run is recomputing their steps).
void save_checkpoint(const RunFiles& files, const TrainConfig& config, const ParamLayout& layout,
                     const HostTrainState& host, const TrainState& state, const std::string& config_toml,
                     const RunDataset& dataset, const data::Tokenizer& tokenizer);

struct RunStart {
  TrainState state;      // step 0 for a new run
  bool resumed = false;  // the state, weights and moments came from a checkpoint
  std::string checkpoint;  // the one resumed from
};

// Called by every rank. A new run (no checkpoint yet) writes config.toml and an empty
// metrics.jsonl and initialises the weights from config.seed. An existing run needs `resume`:
// rank 0 takes the newest checkpoint that verifies (digests, finite values, a readable state),
// saying on stderr which newer ones it skipped and why (an error listing them all when none
// does), refuses one written with another tokenizer than `tokenizer` (that of the data in
// `dataset.dir`, tokenizer_mismatch), on other data (dataset.identity; a checkpoint of an attnres
// that did not record its data yet is resumed, with a note) or with another configuration, and
// hands weights, moments and state to the other ranks (so only rank 0 needs the run directory);
// metrics.jsonl is cut back to the checkpoint's length.
RunStart start_or_resume(const RunFiles& files, const TrainConfig& config, const std::string& config_toml,
                         const data::Tokenizer& tokenizer, const RunDataset& dataset, bool resume,
                         TrainBackend& backend, dist::Communicator& comm);

// Why weights or a checkpoint (their safetensors `metadata`, read from `path`) do not go with data
// prepared in `data_dir` with `tokenizer`: "'PATH' was trained with a tokenizer of hash H (SPEC)
// but 'DIR' was prepared with one of hash H2 (SPEC2)". Empty when the content hashes match, or
// when the file records none (written before attnres recorded it). Checked before anything that
// depends on the vocabulary, whose mismatch would only be a consequence.
std::string tokenizer_mismatch(const std::map<std::string, std::string>& metadata, const std::string& path,
                               const data::Tokenizer& tokenizer, const std::string& data_dir);

// A training checkpoint read as a weights file (what model.safetensors holds for its step): one
// tensor per parameter from its flat `params`, and its model config, step, tokenizer and the
// tokenizer's content hash. Empty
// for a checkpoint written before checkpoints recorded the tokenizer (its run's
// model.safetensors holds the same step's weights).
std::optional<SafetensorsFile> checkpoint_as_weights(const SafetensorsFile& checkpoint, const std::string& path);

}  // namespace attnres
