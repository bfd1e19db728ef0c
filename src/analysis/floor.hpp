// The noise floor as a test that can fail, and failed runs declared before the runs (issue #46;
// docs/experiments.md, "The noise floor" and "Failed runs"). Pure functions: no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "results/experiment_spec.hpp"
#include "results/summary.hpp"
#include "results/train_result.hpp"

namespace attnres::analysis {

// The interval an arm's comparison is judged with: the fixed-sample 95% CI (mean test) and 90% CI
// (equivalence), or for the primary arm of a sequential design the repeated CI of its current look
// for both.
struct FloorInterval {
  double beyond_low, beyond_high;            // excludes 0: a mean difference beyond rounding
  double equivalence_low, equivalence_high;  // inside ±margin: any difference is smaller than it
  std::string name;                          // "90% CI" or "repeated 95% CI"
};

// The paired statistics' own intervals: 95% for the mean test, 90% (two one-sided tests at 5%) for
// the equivalence test. Needs n >= 2.
FloorInterval fixed_sample_interval(const results::PairedSummary& differences);

// The arm's ΔNLL against the baseline (`differences`: its paired statistics) judged against the
// floors of the twins measured (the baseline's and/or the arm's own; each with n >= 2): the state
// of results::FloorTest. None when no twin has two seeds or the arm fewer than two. `alpha` is the
// spread test's level.
std::optional<results::FloorTest> floor_test(const results::PairedSummary& differences,
                                             std::span<const results::NoiseFloor> twins, double margin,
                                             const FloorInterval& interval, double alpha = 0.05);

// The equivalence margin of an experiment: spec.floor_margin, else a third of the effect of interest
// (the sequential design's, else `user_effect`, else the paper's 0.030).
double floor_margin(const results::ExperimentSpec& spec, double user_effect);

// Fisher's exact test of a 2x2 table [[a, b], [c, d]] (rows: two arms; columns: failed, not), two-sided:
// the probability, with the margins fixed, of a table as likely as the observed one or less (R's
// fisher.test, a relative tolerance of 1e-7 for ties).
double fisher_exact_two_sided(int a, int b, int c, int d);

// The step-wise median of several curves' training losses (all of one length; empty input: empty).
std::vector<double> median_curve(std::span<const std::vector<double>> curves);

// A run against the failure rule: clipped more than rule.clipped_fraction of its steps (as its
// instability recorded them), or stalled: the mean over rule.stall_steps consecutive steps of its
// training loss minus `reference` (the same steps) above rule.stall_nats. `reference` empty: no
// stall test (its length must otherwise be the curve's).
results::RunFailure run_failure(const std::string& arm, std::int64_t seed, std::span<const results::LossPoint> curve,
                                double clipped_fraction, std::span<const double> reference,
                                const results::FailureRule& rule);

}  // namespace attnres::analysis
