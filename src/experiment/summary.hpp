// Reads a finished (or partly finished) paired experiment directory and computes its statistics:
// paired validation/test NLL differences against the baseline arm, depth-routing distributions and
// Jensen–Shannon divergence per layer, and systems costs. See docs/experiments.md for the layout.
//
//   DIR/experiment.json                     the protocol: arms, baseline, seeds, tokens, milestones
//   DIR/runs/<arm>/seed-<seed>/result.json  one finished run (absent: the run is reported missing)
//   DIR/summary.json                        written by summarize()
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experiment/stats.hpp"

namespace attnres::experiment {

inline constexpr double kNotAvailable = std::numeric_limits<double>::quiet_NaN();

struct ExperimentSpec {
  int version = 1;
  std::vector<std::string> arms;  // in display order; contains the baseline
  std::string baseline;
  std::vector<std::int64_t> seeds;
  std::int64_t tokens = 0;                // training budget per run
  std::vector<std::int64_t> milestones;   // strictly increasing token counts of validation evaluations
  std::string preset;                     // "" when absent
  nlohmann::json model = nlohmann::json::object();  // passed through unchanged
  nlohmann::json train = nlohmann::json::object();
};

struct NllPoint {
  std::int64_t tokens = 0;
  double val_nll = 0;
};

struct LossPoint {
  std::int64_t tokens = 0;
  double train_loss = 0;
};

// One attention sublayer's routing, averaged over evaluation tokens by the runner.
struct LayerRouting {
  int layer = 0;
  int sources = 0;
  std::vector<double> qk_mean;  // Q/K route's mean depth distribution (sources entries)
  std::vector<double> v_mean;   // V route's; empty for single-route arms
  double js_nats = kNotAvailable;  // per-token JS averaged over tokens; NaN when the runner gave none
};

struct RunResult {
  std::string path;  // result.json, for messages
  std::string arm;
  std::int64_t seed = 0;
  std::int64_t params = 0;
  std::vector<NllPoint> milestones;  // sorted by tokens; includes every experiment milestone
  double test_nll = 0;
  double tokens_per_sec = 0;
  double peak_rss_bytes = 0;
  double step_time_ms = 0;
  std::vector<LossPoint> curve;       // may be empty
  std::vector<LayerRouting> routing;  // sorted by layer; empty: no depth routing (prenorm)
};

struct SeedValue {
  std::int64_t seed = 0;
  double value = 0;
};

// One arm against the baseline for one quantity (a milestone's validation NLL, or the test NLL).
struct ArmComparison {
  std::string arm;
  bool is_baseline = false;
  std::vector<SeedValue> values;  // this arm's NLL for every finished seed
  double mean = kNotAvailable;    // mean of `values`
  std::vector<SeedValue> deltas;  // arm − baseline for seeds finished in both; empty for the baseline
  PairedStats stats;              // over `deltas`
  double ppl_change = kNotAvailable;  // exp(mean Δ) − 1; negative = lower perplexity than the baseline
  double ppl_change_ci_low = kNotAvailable, ppl_change_ci_high = kNotAvailable;  // the CI mapped through exp
};

struct Comparison {
  std::string split;  // "val" or "test"
  std::int64_t tokens = 0;
  std::vector<ArmComparison> arms;  // every arm, in experiment order, the baseline included
  const ArmComparison* find(const std::string& arm) const;
};

struct LayerRoutingSummary {
  int layer = 0;
  int sources = 0;
  std::vector<double> qk_mean;  // mean over seeds
  std::vector<double> v_mean;   // mean over seeds; empty for single-route arms
  // Headline JS: the runs' per-token average (mean over seeds) when every run gave it, else
  // js_of_means_nats. 0 for single-source layers; NaN for single-route arms.
  double js_nats = kNotAvailable;
  // JS between the seed-mean distributions above: a lower bound of the per-token average (convexity).
  double js_of_means_nats = kNotAvailable;
};

struct JsLayerMean {
  double nats = kNotAvailable;
  double bits = kNotAvailable;
  int layers = 0;  // layers averaged
};

struct ArmRouting {
  std::string arm;
  int n_seeds = 0;
  bool two_routes = false;    // has a separate V route (rd, rd-average, rd-frozen)
  bool per_token_js = false;  // js_nats is the runs' per-token average (else the JS of mean distributions)
  std::vector<LayerRoutingSummary> layers;
  JsLayerMean all_layers;           // mean over every attention sublayer (single-source ones count as 0)
  JsLayerMean multi_source_layers;  // mean over layers with more than one source
};

struct ArmSystems {
  std::string arm;
  int runs = 0;                        // finished seeds averaged
  std::int64_t params = 0;
  double params_overhead = kNotAvailable;  // (params − baseline) / baseline
  double tokens_per_sec = kNotAvailable;   // means over finished seeds
  double step_time_ms = kNotAvailable;
  double peak_rss_bytes = kNotAvailable;
  double tokens_per_sec_ratio = kNotAvailable;  // arm / baseline
  double step_time_ratio = kNotAvailable;
  double peak_rss_ratio = kNotAvailable;
};

struct MissingRun {
  std::string arm;
  std::int64_t seed = 0;
};

struct ExperimentSummary {
  std::string dir;
  ExperimentSpec spec;
  std::vector<RunResult> runs;     // finished runs, in arm then seed order
  std::vector<MissingRun> missing;  // runs without result.json
  std::vector<Comparison> milestones;  // validation NLL, one per experiment milestone
  Comparison test;                     // test-split NLL at the end of training
  std::vector<ArmRouting> routing;     // arms with depth routing and at least one finished run
  std::vector<ArmSystems> systems;     // every arm with at least one finished run

  const RunResult* find_run(const std::string& arm, std::int64_t seed) const;
};

// DIR/runs/<arm>/seed-<seed>/result.json
std::string run_result_path(const std::string& dir, const std::string& arm, std::int64_t seed);

// Strict readers: an Error names the file and the key at fault.
ExperimentSpec read_experiment_spec(const std::string& path);
RunResult read_run_result(const std::string& path, const ExperimentSpec& spec, const std::string& arm,
                          std::int64_t seed);

// Reads DIR and computes the summary without writing anything.
ExperimentSummary compute_summary(const std::string& dir);

// compute_summary, then writes DIR/summary.json atomically.
ExperimentSummary summarize(const std::string& dir);

nlohmann::json summary_to_json(const ExperimentSummary& summary);

// A rendering-neutral table shared by the terminal, Markdown and HTML outputs.
struct Table {
  std::string title;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> notes;  // short lines printed under the table
  int left_columns = 1;            // leading text columns; the rest are numbers, right-aligned
};

// Headline tables: validation NLL per milestone, test NLL, routing JS means, systems.
// `detailed` adds per-layer JS.
std::vector<Table> summary_tables(const ExperimentSummary& summary, bool detailed);

// The headline tables as aligned plain text for a terminal.
std::string format_summary_table(const ExperimentSummary& summary);

// Formatting shared by the renderers; NaN prints as "n/a".
std::string format_number(double value, int decimals);
std::string format_signed(double value, int decimals);
std::string format_p_value(double p);
std::string format_percent(double fraction, int decimals);  // signed, e.g. "-2.97%"
std::string format_tokens(double tokens);                   // 1.5K, 250M, 2B
std::string format_count(std::int64_t n);                   // 9,812,736

// True when every paired difference is exactly 0: the arm reproduced the baseline bit for bit
// (expected of rd-tied).
bool identical_to_baseline(const ArmComparison& a);

}  // namespace attnres::experiment
