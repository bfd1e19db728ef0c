// A protocol file: one reviewable TOML file that fixes a whole paired study — data, model and
// training settings, seeds, the main arms with their budget and milestones, controls at their own
// (earlier) budget, and probes with some settings changed — for `attnres experiment --protocol`.
// The format is in docs/experiments.md ("Protocol files"); studies/ has the shipped ones.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "experiment/runner.hpp"
#include "results/strict_json.hpp"

namespace attnres::experiment {

// How to make the protocol's data directory when it is missing ([experiment.prepare]): the corpus
// and an sp tokenizer trained on its training split, as `attnres prepare` does.
struct PrepareSpec {
  std::vector<std::string> inputs;
  int vocab_size = 4096;
  double val_fraction = 0.01;
  double test_fraction = 0.01;
};

// A pilot that plans the study ([pilot], `attnres plan`; experiment/planner.hpp): the study's
// baseline and its twin, with these seeds, over a grid of learning rates and model shapes at equal
// compute; the design is chosen by a rule fixed here, before any run.
struct PilotSpec {
  std::vector<std::uint64_t> seeds;                  // >= 3, not study seeds (1 .. max)
  std::vector<double> lrs;                           // the learning-rate grid
  std::vector<std::vector<std::string>> shapes;      // model settings per shape; empty: the file's model
  double run_core_seconds = 0;   // one run's compute at the main budget, equal for every shape
  // A fixed budget per run of the file's model (no `shapes`), instead of run_core_seconds' worth on
  // this machine: a study comparable token for token with an earlier one. run_core_seconds is then
  // the estimate the pilot's cap is checked with; probes get the main runs' measured compute.
  std::int64_t tokens = 0;
  double budget_core_hours = 0;  // the whole study's compute, to check the plan fits
  double pilot_core_hours = 0;   // the pilot's own cap: a grid that needs more is refused
  double effect = 0;             // the effect of interest (nats, > 0)
  // The rule: the lowest mean validation NLL of the baseline among the settings whose noise floor
  // (the twin's sd of ΔNLL at the final milestone) is below floor_fraction · effect and whose runs
  // are all stable; the seeds from the sd's upper confidence limit at sd_confidence.
  // Since issue #46: the floor is the comparison's (the twins of the baseline and the primary arm),
  // its upper confidence limit at sd_confidence is what must lie below floor_fraction · effect, and
  // among the settings that meet the rule the lowest learning rate whose baseline NLL is within
  // nll_tolerance of the best is chosen (stability before the last bit of NLL).
  double floor_fraction = 1.0 / 3.0;
  double sd_confidence = 0.8;
  double nll_tolerance = 0.01;
  // Seeds are sized for failed runs too: a planned rate of failed seeds, each moving the comparison by
  // about failure_nats, adds failure_rate·(1 − failure_rate)·failure_nats² to the planning variance.
  double failure_rate = 0;
  double failure_nats = 0.25;
  std::string spending = "obrien-fleming";
  int max_seeds = 24;              // the plan's cap
  bool probes_at_equal_compute = true;  // probes' budgets from their shapes' measured throughput
  int throughput_steps = 40;       // steps of the throughput measurement per shape
  std::string out;                 // the protocol file the plan writes
};

struct ProtocolFile {
  std::string path;
  ExperimentOptions options;  // base config, arms, seeds, groups, data; out_dir/worker/device left unset
  std::optional<PrepareSpec> prepare;
  double effect = results::kNotAvailable;  // the power analysis' user effect, when the file gives one
  std::optional<PilotSpec> pilot;           // a pilot file's [pilot] (then 'seeds' may be left out)
  // [experiment] planned_tokens_per_core_second: the throughput `attnres plan` measured for the main
  // model, which `experiment --dry-run` prices the runs with until runs here have measured their own.
  double planned_tokens_per_core_second = 0;
};

// Reads and checks a protocol file. Errors name the file, the line and the key.
ProtocolFile read_protocol(const std::string& path);

// Prepares the protocol's data directory when it has no manifest and the protocol says how
// (progress on stderr); otherwise does nothing.
void prepare_protocol_data(const ProtocolFile& protocol, bool progress);

}  // namespace attnres::experiment
