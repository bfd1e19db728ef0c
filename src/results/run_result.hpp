// result.json: one finished run of a paired experiment, DIR/runs/<arm>/seed-<seed>/result.json.
// The experiment runner writes it once the run has trained and been evaluated (its existence
// marks the run finished); the summary reads it. Format: docs/experiments.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "results/strict_json.hpp"
#include "results/train_result.hpp"

namespace attnres::results {

// One attention sublayer's routing, averaged over evaluation tokens by the runner. The routes are
// the depth distributions its attention's inputs are read with: one (Q/K/V), two (Q/K and V: rd)
// or three (Q, K and V: MUDD, whose distributions are p_c(j) ∝ |dw[c,j]|·‖X_j‖, baselines-spec
// §6.5). Per-token JS is always taken against the V route.
struct LayerRouting {
  int layer = 0;
  int sources = 0;
  // The mean depth distribution (sources entries) of the route that forms the queries, and the keys
  // too unless k_mean is given.
  std::vector<double> qk_mean;
  std::vector<double> v_mean;        // the V route's; empty for single-route arms
  double js_nats = kNotAvailable;    // JS(qk, V) per token, averaged over tokens; NaN when the runner gave none
  std::vector<double> k_mean;        // the K route's own (MUDD); empty where qk_mean forms the keys
  double js_k_nats = kNotAvailable;  // JS(K, V) as js_nats; NaN without k_mean
};

// The depth connections of a baseline mode (baselines-spec §6.5): mixing weights that are signed
// and not normalised, so they are not depth distributions. One row per consumer, one weight per
// stream source it reads: source 0 is the embedding X_0, source s block s's output X_s.
// DenseFormer ("dwa"): row i is the DWA after block i, its static alpha.
struct ConnectionRow {
  int target = 0;
  std::vector<int> sources;     // increasing
  std::vector<double> weights;  // one per source
};

struct Connections {
  std::string name;
  std::vector<ConnectionRow> rows;  // increasing targets
};

// The "Amax gain" of an n-stream mode's residual mixing (hc, mhc; MHC-P §3.1, baselines-spec
// §6.5). Per token, every sublayer's write maps the n streams by its H_res (HC: A_r^T), and the
// composite P = H_res(last sublayer) ... H_res(first) maps the embedding's copies to the streams
// the exit reads. A matrix's forward gain is its largest absolute row sum max_i |sum_j P_ij| (how
// much a signal common to all streams can grow on the way up), its backward gain its largest
// absolute column sum max_j |sum_i P_ij| (the same for a gradient on the way down); 1 is neutral.
// Over evaluation tokens (in the summary also over seeds): the composite's mean and max, and the
// max over sublayers of a single H_res's.
struct AmaxGain {
  double composite_forward_mean = 0, composite_forward_max = 0;
  double composite_backward_mean = 0, composite_backward_max = 0;
  double layer_forward_max = 0, layer_backward_max = 0;
};

// The newest result.json schema version this build writes and reads (results/strict_json.hpp).
inline constexpr int kRunResultVersion = 1;

struct RunResult {
  int version = kRunResultVersion;  // kUnversioned: read from a file of an earlier build
  std::string arm;
  std::int64_t seed = 0;
  std::int64_t params = 0;
  std::vector<Milestone> milestones;  // increasing tokens (the runner copies train_result.json's)
  double test_nll = 0;
  double tokens_per_sec = 0;
  double step_time_ms = 0;
  std::int64_t peak_rss_bytes = 0;
  std::vector<LossPoint> curve;       // may be empty
  // The runner copies train_result.json's; none in earlier files (run_instability computes it
  // from the curve). No "instability" key when none.
  std::optional<Instability> instability;
  std::vector<LayerRouting> routing;  // by layer; empty: no depth routing (prenorm), no "routing" key
  std::vector<Connections> connections;  // empty: none, no "connections" key
  std::optional<AmaxGain> amax_gain;     // hc, mhc; none: no "amax_gain" key
};

// Reading checks what one file can show: types, ranges, distributions summing to 1, a V (or K)
// route given for all layers or none (a single-source layer may leave it out: it is {1}), a K route
// only beside a V route. Whether the file fits its experiment (arm, seed, milestones) is the
// summary's check.
nlohmann::json to_json(const LayerRouting& l);
void from_json(JsonObject& in, LayerRouting& l);
nlohmann::json to_json(const Connections& c);
void from_json(JsonObject& in, Connections& c);
// Every value a finite number >= 0, each mean at most its max.
nlohmann::json to_json(const AmaxGain& g);
void from_json(JsonObject& in, AmaxGain& g);
nlohmann::json to_json(const RunResult& r);
void from_json(JsonObject& in, RunResult& r);

// DIR/runs/<arm>/seed-<seed>/result.json, or for a run of group G (experiment_spec.hpp's GroupSpec)
// DIR/runs/<G>/<arm>/seed-<seed>/result.json; group "" is the main arms.
std::string run_result_path(const std::string& dir, const std::string& arm, std::int64_t seed);
std::string run_result_path(const std::string& dir, const std::string& group, const std::string& arm,
                            std::int64_t seed);
void write_run_result(const std::string& path, const RunResult& r);  // atomically
RunResult read_run_result(const std::string& path);

}  // namespace attnres::results
