// Reads a finished (or partly finished) paired experiment directory and computes its statistics:
// paired validation/test NLL differences against the baseline arm, depth-routing distributions and
// Jensen–Shannon divergence per layer, and systems costs. The files are those of src/results
// (docs/experiments.md):
//
//   DIR/experiment.json                     the protocol (results/experiment_spec.hpp)
//   DIR/runs/<arm>/seed-<seed>/result.json  one finished run (results/run_result.hpp); absent: missing
//   DIR/summary.json                        written by summarize() (results/summary.hpp)
//
// Rendering: analysis/tables.hpp (terminal, Markdown and HTML tables), analysis/report.hpp.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "results/experiment_spec.hpp"
#include "results/run_result.hpp"
#include "results/summary.hpp"

namespace attnres::analysis {

// The schema types the summary is made of, by their names in this namespace.
using results::ArmComparison;
using results::ArmConnections;
using results::ArmGain;
using results::ArmRouting;
using results::ArmSystems;
using results::Comparison;
using results::ExperimentSpec;
using results::JsLayerMean;
using results::LayerRouting;
using results::LayerRoutingSummary;
using results::PairedSummary;
using results::RunKey;
using results::RunResult;
using results::SeedValue;

struct GroupResults;

// The summary of the main arms, with the summaries of the experiment's groups (controls, probes).
// A group's summary has the same shape: its `spec` holds the group's arms, baseline, budget and
// milestones (with the experiment's seeds), and `group` its name.
struct ExperimentSummary {
  std::string dir;
  std::string group;  // "" for the main arms
  bool reused_baseline = false;  // a group whose baseline runs are the main's (GroupSpec::baseline_from_main)
  ExperimentSpec spec;
  double user_effect = results::kNotAvailable;  // the power analysis' `--effect`; NaN: none
  std::vector<RunResult> runs;         // finished runs, in arm then seed order
  std::vector<RunKey> missing;         // runs without result.json
  std::vector<Comparison> milestones;  // validation NLL, one per experiment milestone
  Comparison test;                     // test-split NLL at the end of training
  std::vector<ArmRouting> routing;     // arms with depth routing and at least one finished run
  std::vector<ArmConnections> connections;  // per arm and name, arms whose runs record connections
  std::vector<ArmGain> amax_gain;      // arms whose runs record Amax gains (hc, mhc)
  std::vector<ArmSystems> systems;     // every arm with at least one finished run
  std::vector<results::TwinDrift> twin_drift;  // per seed, with the baseline's twin among the arms
  std::vector<results::RunInstability> instability;  // every finished run with a curve, in run order
  // The arm's seeds (of those finished) that the instability rule flags.
  std::vector<std::int64_t> unstable_seeds(const std::string& arm) const;
  // With a failure rule (ExperimentSpec::failure): every run's verdict, the counts per arm, and the
  // last validation milestone without the failed seeds (the secondary analysis).
  std::vector<results::RunFailure> failures;
  std::vector<results::ArmFailures> failure_counts;
  std::optional<Comparison> without_failures;
  // Runs a sequential study that stopped (resolved, futile) did not need: not missing.
  std::vector<RunKey> not_needed;
  bool failed(const std::string& arm, std::int64_t seed) const;
  std::vector<GroupResults> groups;    // main only: one per experiment.json group, in its order
  // Main only, with sequential seeds: the looks of the primary comparison and the decision.
  std::optional<results::SequentialSummary> sequential;

  const RunResult* find_run(const std::string& arm, std::int64_t seed) const;
  // The arm's finished runs, in seed order.
  std::vector<const RunResult*> finished_runs(const std::string& arm) const;
  // Where the result of (arm, seed) of this summary's group is (the main's for a reused baseline).
  std::string run_path(const std::string& arm, std::int64_t seed) const;
  std::string path_of(const RunResult& r) const { return run_path(r.arm, r.seed); }  // for messages
};

struct GroupResults {
  results::GroupSpec spec;
  ExperimentSummary summary;
};

struct SummaryOptions {
  double effect = results::kNotAvailable;  // also give the seeds needed to detect this |ΔNLL|
};

// A run's result.json, read strictly and checked against its experiment: the arm and seed are
// those of its directory and it has every milestone of the spec. Errors name the file and key.
RunResult read_run_result(const std::string& path, const ExperimentSpec& spec, const std::string& arm,
                          std::int64_t seed);

// Reads DIR and computes the summary without writing anything.
ExperimentSummary compute_summary(const std::string& dir, const SummaryOptions& options = {});

// compute_summary, then writes DIR/summary.json atomically.
ExperimentSummary summarize(const std::string& dir, const SummaryOptions& options = {});

// What summary.json holds of a summary.
results::Summary summary_file(const ExperimentSummary& summary);

// The sequential analysis of an experiment with [experiment.sequential]: the primary arm's paired
// ΔNLL against the baseline at the last validation milestone, over the seeds finished in both from
// the first seed on (a gap ends the sequence), looked at with the design's boundaries at the
// calibrated level (analysis/sequential.hpp). None without a sequential design.
std::optional<results::SequentialSummary> sequential_summary(const ExperimentSummary& summary);

// How far two runs of one seed drifted apart, from their per-step training losses (the same
// batches): results::TwinDrift.
results::TwinDrift twin_drift(std::int64_t seed, std::span<const results::LossPoint> baseline,
                              std::span<const results::LossPoint> twin);

}  // namespace attnres::analysis
