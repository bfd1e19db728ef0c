// `attnres plan`: a pilot that measures the noise floor and plans a study from it (issue #27).
//
// The pilot file is the study's protocol file with a [pilot] table (experiment/protocol.hpp's
// PilotSpec). The pilot
//  1. measures each model shape's training throughput on this machine (tokens per core-second,
//     the study's thread count, as many runs at a time as workers), so that every shape gets the
//     same compute per run, run_core_seconds;
//  2. trains the baseline, the primary arm and both their twins with the pilot's seeds at every
//     (shape, learning rate) of the grid, at that per-run budget: the twins give the comparison's
//     noise floor at that setting (analysis::floor_test's pair sd);
//  3. picks the setting by the rule fixed in the file before any run: of the settings whose floor's
//     upper confidence limit at the final milestone is below floor_fraction · effect and whose runs
//     all finished, stable and not failed, the lowest learning rate whose baseline NLL is within
//     nll_tolerance of the best one's (the primary arm's NLL is never looked at to choose: only the
//     spread of its differences sizes the study);
//  5. sizes the sequential design from the one-sided upper confidence limit (chi-square) of the
//     larger of the two sds, for 80% power at the effect of interest, and checks the study's compute
//     against its budget;
//  6. writes the study's protocol file, with the pilot's tables in its header comment.
// Pilot runs are ordinary experiment directories under OUT (resumable, shared by workers).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/sequential.hpp"
#include "analysis/summary.hpp"
#include "experiment/protocol.hpp"

namespace attnres::experiment {

struct PlanOptions {
  std::string out_dir;  // the pilot's runs
  std::string write_to;  // the protocol file to write; "" = [pilot] out
  bool force = false;    // replace a protocol file of other contents there (else refused)
  int worker = 0, workers = 1;
  const std::atomic<bool>* stop = nullptr;
  bool progress = true;
};

struct ShapeThroughput {
  std::string label;                  // "shape0", or "probe-<name>"
  std::vector<std::string> settings;  // over the file's configuration
  double tokens_per_core_second = 0;
  std::int64_t tokens = 0;            // run_core_seconds' worth, in whole steps
};

struct PilotPoint {
  int shape = 0;
  double lr = 0;
  std::string label, dir;
  int seeds = 0;                          // finished in both the baseline and its twin
  std::vector<std::int64_t> milestones;   // validation milestones (tokens)
  std::vector<double> floor_sd, floor_mean;  // the baseline twin's ΔNLL per milestone
  std::vector<double> primary_floor_sd;      // the primary arm's twin's ΔNLL sd per milestone
  std::vector<double> pair_sd;               // the comparison's floor per milestone (analysis::floor_test)
  double pair_dof = 0;                       // its degrees of freedom at the final milestone
  double pair_ucl = 0;                       // its upper confidence limit there (sd_confidence)
  double primary_sd = 0;                     // sd of primary − baseline at the final milestone
  double baseline_nll = 0, baseline_sd = 0;  // final validation NLL of the baseline over the seeds
  int unstable_runs = 0;
  int failed_runs = 0;                       // by the failure rule of the pilot file, when it has one
  bool eligible = false;                     // meets the rule
};

struct PlanResult {
  std::vector<ShapeThroughput> shapes;  // the grid's shapes, then the probes'
  std::vector<PilotPoint> points;
  int chosen = -1;
  bool rule_met = false;  // a point was eligible (else the lowest floor was chosen, and the plan says so)
  int best = -1;           // the eligible point with the lowest baseline NLL (the choice is within tolerance of it)
  double sd_floor = 0, sd_primary = 0, sd_plan = 0;
  double sd_plan_without_failures = 0;   // the planning sd before the failure term
  analysis::SeedPlan plan;               // at the cap when the power target needs more seeds
  bool capped = false;
  bool shrunk = false;                   // cut to the seeds that fit the budget
  double power_without_failures = 0;     // the plan's power were no run to fail
  double core_seconds_per_seed = 0;
  double core_seconds_fixed = 0;         // the twins' runs on their first seeds (once)
  int seeds_that_fit = 0;
  std::string protocol_path;
  std::string protocol_text;
  bool protocol_unchanged = false;  // the file already held this protocol: not rewritten
};

// Runs (or resumes) this worker's share of the pilot and, once every worker's runs are done, plans
// and writes the protocol (every worker computes the same plan; the write is atomic). Returns the
// plan, or nothing when stopped by a signal (rerun to continue). Errors before any training: a
// grid whose runs need more than pilot_core_hours, a pilot file that is not one.
std::optional<PlanResult> run_pilot(const ProtocolFile& pilot, const PlanOptions& options);

// The primary comparison of a pilot or study: the first arm after the baseline that is not a twin.
std::string primary_arm(const ExperimentOptions& e);

// How a pilot summarises a grid point's experiment directory (its effect of interest).
analysis::SummaryOptions pilot_summary_options(const PilotSpec& pilot);

// A grid point's numbers from its experiment's summary (the floors of both twins and of the
// comparison at every milestone, the upper confidence limit, the comparison's sd, the baseline's NLL,
// unstable and failed runs) and whether it meets the pilot's rule (PilotPoint::eligible: the floor's
// sd_confidence upper limit at the final milestone below floor_fraction · effect, every seed
// finished, no run unstable or failed). `plan` and the tests that check a committed plan use it.
PilotPoint pilot_point(const analysis::ExperimentSummary& s, const PilotSpec& pilot, int shape, double lr,
                       const std::string& label, const std::string& primary);

// The rule's choice among the grid's points (fixed in advance, docs/experiments.md): of the eligible
// points (PilotPoint::eligible), the lowest learning rate whose baseline NLL is within nll_tolerance
// of the best eligible one's (ties: the lower NLL). -1 when none is eligible; *best (if given) is the
// best eligible point.
int choose_point(const std::vector<PilotPoint>& points, double nll_tolerance, int* best = nullptr);

// The pilot's tables and the chosen design, as the protocol's header comment and `plan` print them.
std::string plan_report(const ProtocolFile& pilot, const PlanResult& result);

}  // namespace attnres::experiment
