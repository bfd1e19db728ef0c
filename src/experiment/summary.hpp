// Reads a finished (or partly finished) paired experiment directory and computes its statistics:
// paired validation/test NLL differences against the baseline arm, depth-routing distributions and
// Jensen–Shannon divergence per layer, and systems costs. The files are those of src/results
// (docs/experiments.md):
//
//   DIR/experiment.json                     the protocol (results/experiment_spec.hpp)
//   DIR/runs/<arm>/seed-<seed>/result.json  one finished run (results/run_result.hpp); absent: missing
//   DIR/summary.json                        written by summarize() (results/summary.hpp)
//
// Rendering: experiment/tables.hpp (terminal, Markdown and HTML tables), experiment/report.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "results/experiment_spec.hpp"
#include "results/run_result.hpp"
#include "results/summary.hpp"

namespace attnres::experiment {

// The schema types the summary is made of, by their names in this namespace.
using results::ArmComparison;
using results::ArmRouting;
using results::ArmSystems;
using results::Comparison;
using results::ExperimentSpec;
using results::JsLayerMean;
using results::LayerRouting;
using results::LayerRoutingSummary;
using results::RunKey;
using results::RunResult;
using results::SeedValue;

struct ExperimentSummary {
  std::string dir;
  ExperimentSpec spec;
  std::vector<RunResult> runs;         // finished runs, in arm then seed order
  std::vector<RunKey> missing;         // runs without result.json
  std::vector<Comparison> milestones;  // validation NLL, one per experiment milestone
  Comparison test;                     // test-split NLL at the end of training
  std::vector<ArmRouting> routing;     // arms with depth routing and at least one finished run
  std::vector<ArmSystems> systems;     // every arm with at least one finished run

  const RunResult* find_run(const std::string& arm, std::int64_t seed) const;
};

// A run's result.json, read strictly and checked against its experiment: the arm and seed are
// those of its directory and it has every milestone of the spec. Errors name the file and key.
RunResult read_run_result(const std::string& path, const ExperimentSpec& spec, const std::string& arm,
                          std::int64_t seed);

// Reads DIR and computes the summary without writing anything.
ExperimentSummary compute_summary(const std::string& dir);

// compute_summary, then writes DIR/summary.json atomically.
ExperimentSummary summarize(const std::string& dir);

// What summary.json holds of a summary.
results::Summary summary_file(const ExperimentSummary& summary);

// True when every paired difference is exactly 0: the arm reproduced the baseline bit for bit
// (expected of rd-tied).
bool identical_to_baseline(const ArmComparison& a);

}  // namespace attnres::experiment
