// pool.json: what every study given to `attnres report --pool` says about one comparison (an arm
// against a baseline), written by that command into --out beside pool.md and pool.html. One entry
// per design (a study's main arms, or one of its groups, that compares the arm with the baseline),
// and the random-effects meta-analysis of their paired ΔNLL (analysis/meta.hpp). Nothing in attnres
// reads it back; from_json is the exact statement of its format (tested by a round trip). Values
// that are not available are null. Format: docs/experiments.md, "Pooling studies".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "results/strict_json.hpp"

namespace attnres::results {

inline constexpr int kPoolVersion = 1;

// One design's estimate: the paired ΔNLL (arm − baseline) in validation NLL at its last milestone.
struct PoolDesign {
  std::string dir;     // the experiment directory as given
  std::string design;  // "main" or the group's name
  std::string kind;    // "main", "controls" or "probe"
  // The design: model.d_model, model.n_layers (0: not recorded), train.lr (NaN: not recorded),
  // the arm's and the baseline's matmul precision ("" not recorded), the tokens compared at.
  std::int64_t width = 0, depth = 0;
  double lr = kNotAvailable;
  std::string precision;
  std::int64_t tokens = 0;
  std::vector<std::string> cpus;  // the CPU models the runs record (provenance); empty: not recorded
  int n = 0;                      // paired seeds
  double mean = kNotAvailable, sd = kNotAvailable, se = kNotAvailable;  // se = sd / √n
  double ci_low = kNotAvailable, ci_high = kNotAvailable;  // its own 95% t interval (n − 1 df)
  bool pooled = false;         // entered the meta-analysis
  std::string not_pooled;      // why not, when not
  double weight = kNotAvailable;  // its share of the random-effects weights Σ w*_i (pooled only)
};

// The meta-analysis (analysis::MetaAnalysis) as written: DL τ², the modified HKSJ interval.
struct PoolEstimate {
  int k = 0;  // designs pooled (>= 2)
  double mean = kNotAvailable, se = kNotAvailable, ci_low = kNotAvailable, ci_high = kNotAvailable;
  double df = kNotAvailable, t = kNotAvailable, p_value = kNotAvailable;
  double hk_ci_low = kNotAvailable, hk_ci_high = kNotAvailable;  // plain HKSJ (variance scale q)
  double hk_q = kNotAvailable;
  double dl_ci_low = kNotAvailable, dl_ci_high = kNotAvailable;  // DL with a normal interval
  double tau2_dl = kNotAvailable, tau2_reml = kNotAvailable;
  double q = kNotAvailable, q_p = kNotAvailable, i2 = kNotAvailable;
  double fixed_mean = kNotAvailable, fixed_se = kNotAvailable;
};

struct Pool {
  int version = kPoolVersion;
  std::string arm, baseline;
  std::string metric;  // what each estimate is ("validation NLL at the design's last milestone")
  std::string method;  // the interval's method, in words
  double effect = kNotAvailable;  // the futility effect E (nats, > 0)
  std::vector<PoolDesign> designs;
  std::optional<PoolEstimate> pooled;  // none with fewer than two pooled designs
  std::string futility;  // the futility statement at `effect`
  std::string summary;   // the pooled line as printed
};

nlohmann::json to_json(const PoolDesign& d);
void from_json(JsonObject& in, PoolDesign& d);
nlohmann::json to_json(const PoolEstimate& e);
void from_json(JsonObject& in, PoolEstimate& e);
nlohmann::json to_json(const Pool& p);
void from_json(JsonObject& in, Pool& p);

std::string pool_path(const std::string& dir);  // DIR/pool.json
void write_pool(const std::string& path, const Pool& p);  // atomically
Pool read_pool(const std::string& path);

}  // namespace attnres::results
