// train_result.json: what a finished training run measured. train() (src/train) writes it into
// its output directory after the last step; the experiment runner reads it and carries the
// milestones, the loss curve, the instability, the provenance and the systems figures into the run's
// result.json.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "results/instability.hpp"
#include "results/provenance.hpp"
#include "results/strict_json.hpp"

namespace attnres::results {

// A validation evaluation during training: {"step", "tokens", "val_nll"}.
struct Milestone {
  std::optional<std::int64_t> step;  // the optimiser step: train() records it; result.json may leave it out
  std::int64_t tokens = 0;           // training tokens seen
  double val_nll = 0;
};

// The training loss of one step and its gradient norm before clipping: {"tokens", "train_loss",
// "grad_norm"}. "grad_norm" is left out where it is not known (kNotAvailable): in files written
// before it was recorded, and for the steps before a resume from a checkpoint of that time.
struct LossPoint {
  std::int64_t tokens = 0;
  double train_loss = 0;
  double grad_norm = kNotAvailable;
};

// The newest train_result.json schema version this build writes and reads (results/strict_json.hpp).
inline constexpr int kTrainResultVersion = 1;

struct TrainResult {
  int version = kTrainResultVersion;  // kUnversioned: read from a file of an earlier build
  std::int64_t params = 0;
  std::int64_t steps = 0;
  std::vector<Milestone> milestones;
  std::vector<LossPoint> curve;  // one point per step
  std::optional<Instability> instability;  // of the curve (results/instability.hpp); none in earlier files
  double tokens_per_sec = 0;     // over the steps run in this process
  double step_time_ms = 0;
  // CPU seconds of one process per step (all its threads; 0: not recorded, files of earlier builds).
  // Unlike the wall clock it is not inflated when other work shares the cores: what a core-second
  // buys (tokens_per_core_second).
  double cpu_seconds_per_step = 0;
  std::int64_t peak_rss_bytes = 0;
  int processes = 1;           // ranks of the data-parallel job
  double reduce_fraction = 0;  // share of step time spent summing gradients across ranks
  int micro_batches = 1;       // over all ranks
  // What produced it (results/provenance.hpp): the process that trained it; none in earlier files.
  std::optional<Provenance> provenance;
};

// Tokens one core trains per second (what `plan` prices a study with, and `experiment --dry-run`):
// from the CPU time where it was recorded (cpu_seconds_per_step > 0), which other work sharing the
// cores does not inflate, else the wall-clock rate over the threads (files of earlier builds).
// tokens_per_sec and step_time_ms are over the same steps; `processes` ranks each spend the CPU time.
double tokens_per_core_second(double tokens_per_sec, double step_time_ms, double cpu_seconds_per_step, int threads,
                              int processes = 1);

nlohmann::json to_json(const Milestone& m);
void from_json(JsonObject& in, Milestone& m);
nlohmann::json to_json(const LossPoint& p);
void from_json(JsonObject& in, LossPoint& p);
nlohmann::json to_json(const TrainResult& r);
void from_json(JsonObject& in, TrainResult& r);

// RUN_DIR/train_result.json
std::string train_result_path(const std::string& run_dir);
void write_train_result(const std::string& path, const TrainResult& r);  // atomically
TrainResult read_train_result(const std::string& path);

}  // namespace attnres::results
