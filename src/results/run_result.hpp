// result.json: one finished run of a paired experiment, DIR/runs/<arm>/seed-<seed>/result.json.
// The experiment runner writes it once the run has trained and been evaluated (its existence
// marks the run finished); the summary reads it. Format: docs/experiments.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/diagnostics.hpp"
#include "results/strict_json.hpp"
#include "results/train_result.hpp"

namespace attnres::results {

// A run's depth diagnostics, as the model reports them (model/diagnostics.hpp defines them where
// they are computed; the runner averages them over evaluation tokens): the routing of an attention
// sublayer (its routes' mean depth distributions and JS divergences), a baseline mode's signed
// depth connections, an n-stream mode's Amax gains.
using attnres::AmaxGain;
using attnres::ConnectionRow;
using attnres::Connections;
using attnres::LayerRouting;

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
  double cpu_seconds_per_step = 0;  // the runner copies train_result.json's (0: not recorded)
  std::int64_t peak_rss_bytes = 0;
  std::vector<LossPoint> curve;       // may be empty
  // The runner copies train_result.json's; none in earlier files (run_instability computes it
  // from the curve). No "instability" key when none.
  std::optional<Instability> instability;
  // What produced the run (results/provenance.hpp): the runner copies train_result.json's; none in
  // earlier files, no "provenance" key.
  std::optional<Provenance> provenance;
  std::vector<LayerRouting> routing;  // by layer; empty: no depth routing (prenorm), no "routing" key
  std::vector<Connections> connections;  // empty: none, no "connections" key
  std::optional<AmaxGain> amax_gain;     // hc, mhc; none: no "amax_gain" key
  // delta, delta_block: the routing-collapse statistic (model/diagnostics.hpp); none: no key
  std::optional<double> routing_max_weight;
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
