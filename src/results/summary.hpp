// summary.json: every number of a paired experiment's summary, DIR/summary.json. `attnres report`
// (analysis/summary.hpp computes it) writes it; nothing in attnres reads it back, it is for
// people and scripts, and from_json is the exact statement of its format (tested by a round trip).
// Values that are not available are null. Format: docs/experiments.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "results/experiment_spec.hpp"
#include "results/instability.hpp"
#include "results/provenance.hpp"
#include "results/run_result.hpp"
#include "results/strict_json.hpp"

namespace attnres::results {

struct SeedValue {
  std::int64_t seed = 0;
  double value = 0;
};

// summary.json's "paired": the paired statistics of one arm against the baseline, as
// analysis::paired_stats computes them (see analysis/stats.hpp for the definitions).
struct PairedSummary {
  int n = 0;
  double mean = kNotAvailable, sd = kNotAvailable, ci_low = kNotAvailable, ci_high = kNotAvailable;
  double t = kNotAvailable, p_value = kNotAvailable;
  int wins = 0;  // differences < 0: seeds where the arm's NLL is below the baseline's
};

// summary.json's "power": the power analysis of one paired comparison (analysis::power_estimate:
// 80% power, two-sided α = 0.05, paired t, from the observed per-seed sd).
struct PowerSummary {
  bool available = false;
  std::string reason;           // why not, when not available
  double mde = kNotAvailable;   // the minimal detectable |ΔNLL| with the seeds finished
  int seeds_for_paper = 0;      // seeds to detect the paper's effect; 0: not available or beyond the cap
  int seeds_for_user = 0;       // seeds to detect the user's effect (Summary::user_effect); 0: none asked
};

// A compared arm against the floor (docs/experiments.md, "The noise floor"): is its ΔNLL against the
// baseline what rounding alone would give? Under that null the per-seed differences have mean 0 and
// the variance `pair_sd²` that the twins measure (the mean of the baseline's and the arm's twin
// variances, whichever were measured).
//   beyond:       the comparison's interval excludes 0 (a mean difference), or the differences vary
//                 more than rounding makes them (one-sided F test at α: a seed-by-arm difference);
//   inside:       neither, and the equivalence interval (90% CI: two one-sided tests at 5%; the
//                 repeated CI for a sequential primary) lies inside ±margin;
//   undetermined: neither: the interval is wider than the margin.
struct FloorTest {
  std::string state;                 // "inside", "beyond" or "undetermined"
  std::vector<std::string> twins;    // the twins whose floors were used
  double pair_sd = kNotAvailable;    // rounding's sd of one pair's ΔNLL
  double dof = kNotAvailable;        // its degrees of freedom (Satterthwaite with two twins)
  double mean_sd = kNotAvailable;    // pair_sd / sqrt(n): rounding's noise of the mean ΔNLL
  double margin = kNotAvailable;     // the equivalence margin, nats
  double interval_low = kNotAvailable, interval_high = kNotAvailable;  // the equivalence interval
  std::string interval;              // "90% CI" or "repeated 95% CI"
  bool mean_beyond = false;          // the comparison's interval (95% CI or repeated CI) excludes 0
  double spread_ratio = kNotAvailable;  // sd of ΔNLL / pair_sd
  double spread_p = kNotAvailable;      // the F test's p (ΔNLL varies more than rounding)
  bool spread_beyond = false;
};

// One arm against the baseline for one quantity (a milestone's validation NLL, or the test NLL).
struct ArmComparison {
  std::string arm;
  bool is_baseline = false;
  std::vector<SeedValue> values;  // this arm's NLL for every finished seed
  double mean = kNotAvailable;    // mean of `values`
  // The rest is not written for the baseline.
  std::vector<SeedValue> deltas;  // arm − baseline for seeds finished in both
  PairedSummary stats;            // over `deltas`
  double ppl_change = kNotAvailable;  // exp(mean Δ) − 1; negative = lower perplexity than the baseline
  double ppl_change_ci_low = kNotAvailable, ppl_change_ci_high = kNotAvailable;  // the CI mapped through exp
  PowerSummary power;
  // The arm against its noise floor (analysis/floor.hpp), not for the baseline or a twin: written
  // when the comparison has a twin of the baseline or of the arm with at least two seeds.
  std::optional<FloorTest> floor;
};

// The noise floor of one arm: its twin "<arm>~" (the same model, seed and data order, initial weights
// perturbed as rounding would) against it, the per-seed ΔNLL that rounding alone produces.
struct NoiseFloor {
  std::string twin;  // the twin arm, "<arm>~"
  int n = 0;         // paired seeds
  double mean = kNotAvailable, sd = kNotAvailable;  // of twin − arm over those seeds
};


struct Comparison {
  std::string split;  // "val" or "test"
  std::int64_t tokens = 0;
  std::vector<ArmComparison> arms;  // every arm, in experiment order, the baseline included
  std::optional<NoiseFloor> noise_floor;  // when the arm list has the baseline's twin
  std::vector<NoiseFloor> arm_floors;     // the twins of the other arms, in arm order
  const ArmComparison* find(const std::string& arm) const;
};

// How far a baseline run and its twin drift apart in training (same batches, so the per-step
// training losses differ only by the weights): the largest |Δ loss| and the first step at which
// |Δ loss| reached kTwinPartNats (none: they never parted that far).
inline constexpr double kTwinPartNats = 1e-3;
// One run's instability (results/instability.hpp): as its result.json records it, or computed from
// its curve for a run recorded before that.
struct RunInstability {
  std::string arm;
  std::int64_t seed = 0;
  Instability instability;
};

struct TwinDrift {
  std::int64_t seed = 0;
  std::optional<std::int64_t> part_step;  // 1-based optimiser step
  std::int64_t steps = 0;                 // steps compared
  double max_abs_delta = 0;               // nats
  double final_abs_delta = 0;             // mean |Δ loss| over the last 10% of the steps
};

struct LayerRoutingSummary {
  int layer = 0;
  int sources = 0;
  std::vector<double> qk_mean;  // mean over seeds
  std::vector<double> v_mean;   // mean over seeds; empty for single-route arms
  // The rest is written for arms with two routes only.
  // Headline JS: the runs' per-token average (mean over seeds) when every run gave it, else
  // js_of_means_nats. 0 for single-source layers.
  double js_nats = kNotAvailable;
  double js_bits = kNotAvailable;
  // JS between the seed-mean distributions above: a lower bound of the per-token average (convexity).
  double js_of_means_nats = kNotAvailable;
  // Arms with a K route of its own (ArmRouting::k_route) only: its mean distribution over seeds and
  // the JS between it and the V route, as the three above for the qk route.
  std::vector<double> k_mean;
  double js_k_nats = kNotAvailable;
  double js_k_bits = kNotAvailable;
  double js_k_of_means_nats = kNotAvailable;
};

struct JsLayerMean {
  double nats = kNotAvailable;
  double bits = kNotAvailable;
  int layers = 0;  // layers averaged
};

struct ArmRouting {
  std::string arm;
  int n_seeds = 0;
  bool two_routes = false;  // has a separate V route (rd, rd-average, rd-frozen, mudd)
  // Has a K route of its own besides the Q and V routes: MUDD, whose routes are the distributions
  // p_c(j) ∝ |dw[c,j]|·‖X_j‖ of the DA feeding each block (baselines-spec §6.5); qk_mean is then the Q
  // route. Written only when true (summaries of other arms are as before).
  bool k_route = false;
  // The rest is written for arms with two routes only.
  bool per_token_js = false;  // js_nats (and js_k_nats) are the runs' per-token averages, else JS of means
  std::vector<LayerRoutingSummary> layers;
  JsLayerMean all_layers;           // JS(qk, V): mean over every attention sublayer (single-source ones count as 0)
  JsLayerMean multi_source_layers;  // mean over layers with more than one source
  JsLayerMean k_all_layers, k_multi_source_layers;  // JS(K, V), the same two ways (k_route only)
  // Delta AttnRes's routing_max_weight (run_result.hpp), the mean over the seeds; NaN (and no key)
  // for the arms that do not record it.
  double max_weight = kNotAvailable;
};

// An arm's depth connections (run_result.hpp's Connections), each weight the mean over the seeds.
struct ArmConnections {
  std::string arm;
  int n_seeds = 0;
  Connections connections;
};

// An arm's Amax gains (run_result.hpp's AmaxGain) over its seeds: each composite mean the mean of
// the seeds' means, each max the max over the seeds.
struct ArmGain {
  std::string arm;
  int n_seeds = 0;
  AmaxGain gain;
};

struct ArmSystems {
  std::string arm;
  int runs = 0;  // finished seeds averaged
  std::int64_t params = 0;
  double params_overhead = kNotAvailable;  // (params − baseline) / baseline
  double tokens_per_sec = kNotAvailable;   // means over finished seeds
  double step_time_ms = kNotAvailable;
  double peak_rss_bytes = kNotAvailable;
  double tokens_per_sec_ratio = kNotAvailable;  // arm / baseline
  double step_time_ratio = kNotAvailable;
  double peak_rss_ratio = kNotAvailable;
};

struct RunKey {
  std::string arm;
  std::int64_t seed = 0;
};

// The results of one set of paired arms: the main arms, or one group's (results/experiment_spec.hpp).
// A run against the experiment's failure rule (ExperimentSpec::failure), decided from its curve.
struct RunFailure {
  std::string arm;
  std::int64_t seed = 0;
  bool failed = false;
  std::string reason;                        // "" or why, e.g. "clipped 22% of its steps"
  double clipped_fraction = kNotAvailable;   // as the run recorded it
  double stall_excess = kNotAvailable;       // the largest window mean of loss − reference, nats
  std::int64_t stall_step = 0;               // the last step of that window (0: none)
};

// An arm's failed runs, and Fisher's exact test (two-sided) of its failure rate against the baseline's.
struct ArmFailures {
  std::string arm;
  int runs = 0, failed = 0;
  double fisher_p = kNotAvailable;  // not for the baseline
};

struct ArmsResults {
  std::vector<RunKey> finished_runs;
  std::vector<RunKey> missing_runs;    // no result.json yet
  // Runs a sequential study that stopped (resolved or futile) no longer needs: not missing.
  std::vector<RunKey> not_needed_runs;
  // With a failure rule: every finished run's verdict, the counts per arm, and the secondary
  // analysis of the last validation milestone without the seeds in which the arm or the baseline failed.
  std::vector<RunFailure> failures;
  std::vector<ArmFailures> failure_counts;
  std::optional<Comparison> without_failures;
  std::vector<Comparison> validation;  // one per milestone
  Comparison test;                     // the test split after training (no baseline values when reused)
  std::vector<ArmRouting> routing;     // arms with depth routing and a finished run
  std::vector<ArmConnections> connections;  // per arm and connection name, arms that record them
  std::vector<ArmGain> amax_gain;      // arms whose runs record it (hc, mhc)
  std::vector<ArmSystems> systems;     // arms with a finished run
  std::vector<TwinDrift> twin_drift;   // per seed with both the baseline and its twin finished
  std::vector<RunInstability> instability;  // per finished run with a curve, in arm then seed order
  std::vector<ProvenanceCount> provenance;  // the distinct origins of the finished runs that record one
};

struct GroupSummary : ArmsResults {
  std::string name, kind, baseline;
  bool baseline_from_main = false;
  std::int64_t tokens = 0;
  std::vector<std::string> settings;
};

// Sequential seeds (analysis/sequential.hpp): every look analysed, and the decision.
struct SequentialLook {
  int n = 0;  // seeds
  double mean = kNotAvailable, sd = kNotAvailable;
  double ci_low = kNotAvailable, ci_high = kNotAvailable;  // the repeated confidence interval
  double t = kNotAvailable, t_boundary = kNotAvailable, nominal_p = kNotAvailable;
  double p_adjusted = kNotAvailable;  // the repeated p-value
  bool crossed = false;               // the interval excludes 0
};

struct SequentialSummary {
  SequentialSpec design;
  // The level the looks test at, calibrated so that the t-based looks' overall type-I error is
  // design.alpha (analysis::calibrate_t_looks), and that error as simulated.
  double nominal_alpha = kNotAvailable, type_one_error = kNotAvailable;
  std::string outcome;  // "continuing", "resolved", "futile" or "not resolved"
  int look = -1;        // the deciding (or last analysed) look, 0-based; -1: none yet
  int next_seeds = 0;   // continuing: the next look's seed count
  std::vector<SequentialLook> looks;
  // The design's power to resolve |ΔNLL| = design.effect at the last look's sd (NaN before a look).
  double power = kNotAvailable;
};

struct Summary : ArmsResults {
  Protocol experiment;
  // The power analysis' settings (analysis/stats.hpp): level, target power, the paper's effect.
  double power_alpha = 0, power_target = 0;
  double paper_effect = 0;
  double user_effect = kNotAvailable;   // `--effect`; NaN: none
  std::vector<GroupSummary> groups;     // in experiment.json order
  std::optional<SequentialSummary> sequential;  // with sequential seeds only
};

nlohmann::json to_json(const SeedValue& v);
void from_json(JsonObject& in, SeedValue& v);
nlohmann::json to_json(const PowerSummary& p);
void from_json(JsonObject& in, PowerSummary& p);
nlohmann::json to_json(const PairedSummary& p);
void from_json(JsonObject& in, PairedSummary& p);
nlohmann::json to_json(const ArmComparison& a);
void from_json(JsonObject& in, ArmComparison& a);
nlohmann::json to_json(const NoiseFloor& f);
void from_json(JsonObject& in, NoiseFloor& f);
nlohmann::json to_json(const FloorTest& f);
void from_json(JsonObject& in, FloorTest& f);
nlohmann::json to_json(const RunFailure& f);
void from_json(JsonObject& in, RunFailure& f);
nlohmann::json to_json(const ArmFailures& f);
void from_json(JsonObject& in, ArmFailures& f);
nlohmann::json to_json(const RunInstability& r);
void from_json(JsonObject& in, RunInstability& r);
nlohmann::json to_json(const TwinDrift& d);
void from_json(JsonObject& in, TwinDrift& d);
nlohmann::json to_json(const Comparison& c);
void from_json(JsonObject& in, Comparison& c);
nlohmann::json to_json(const ArmConnections& a);
void from_json(JsonObject& in, ArmConnections& a);
nlohmann::json to_json(const ArmGain& a);
void from_json(JsonObject& in, ArmGain& a);
nlohmann::json to_json(const JsLayerMean& m);
void from_json(JsonObject& in, JsLayerMean& m);
nlohmann::json to_json(const ArmRouting& a);  // with its layers
void from_json(JsonObject& in, ArmRouting& a);
nlohmann::json to_json(const ArmSystems& a);
void from_json(JsonObject& in, ArmSystems& a);
nlohmann::json to_json(const RunKey& k);
void from_json(JsonObject& in, RunKey& k);
nlohmann::json to_json(const GroupSummary& g);
void from_json(JsonObject& in, GroupSummary& g);
nlohmann::json to_json(const SequentialLook& l);
void from_json(JsonObject& in, SequentialLook& l);
nlohmann::json to_json(const SequentialSummary& s);
void from_json(JsonObject& in, SequentialSummary& s);
nlohmann::json to_json(const Summary& s);
void from_json(JsonObject& in, Summary& s);

// DIR/summary.json
std::string summary_path(const std::string& dir);
void write_summary(const std::string& path, const Summary& s);  // atomically
Summary read_summary(const std::string& path);

}  // namespace attnres::results
