#include "experiment/pool.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "analysis/format.hpp"
#include "analysis/meta.hpp"
#include "analysis/stats.hpp"
#include "analysis/summary.hpp"
#include "model/arms.hpp"
#include "train/train_config.hpp"
#include "util/error.hpp"

namespace attnres::experiment {
namespace {

using analysis::ExperimentSummary;

bool has(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : sep) + x;
  return out;
}

std::int64_t model_int(const nlohmann::json& model, const char* key) {
  return model.is_object() && model.contains(key) && model.at(key).is_number_integer() ? model.at(key).get<std::int64_t>()
                                                                                      : 0;
}

// The CPU a run records (result.json's provenance); none yet: results written before provenance
// was recorded say nothing of their machine.
std::optional<std::string> run_cpu(const results::RunResult& r) {
  if (!r.provenance) return std::nullopt;
  return r.provenance->cpu_model;
}

// The paired ΔNLL of `arm` against `baseline` at the design's last validation milestone, with the
// design's settings. The seeds finished in both, paired as the summary pairs them.
results::PoolDesign estimate(const std::string& dir, const ExperimentSummary& s, const std::string& design,
                             const std::string& kind, const std::string& arm, const std::string& baseline) {
  results::PoolDesign d;
  d.dir = dir;
  d.design = design;
  d.kind = kind;
  d.width = model_int(s.spec.model, "d_model");
  d.depth = model_int(s.spec.model, "n_layers");
  const nlohmann::json& train = s.spec.train;
  if (train.is_object() && train.contains("config_toml") && train.at("config_toml").is_string()) {
    const TrainConfig config = parse_toml_config(train.at("config_toml").get<std::string>(),
                                                 concat(results::experiment_spec_path(dir), " (", design, ")"));
    d.lr = config.lr;
    const auto precision = [&](const std::string& a) {
      return is_bf16_arm(a) ? std::string("bf16") : std::string(kernels::to_string(config.precision));
    };
    d.precision = precision(arm) == precision(baseline) ? precision(arm) : precision(arm) + " vs " + precision(baseline);
  }
  const analysis::Comparison& last = s.milestones.back();
  d.tokens = last.tokens;
  const analysis::ArmComparison* a = last.find(arm);
  const analysis::ArmComparison* b = last.find(baseline);
  std::vector<double> deltas;
  for (const analysis::SeedValue& v : a->values)
    for (const analysis::SeedValue& w : b->values)
      if (v.seed == w.seed) deltas.push_back(v.value - w.value);
  const analysis::PairedStats p = analysis::paired_stats(deltas);
  d.n = p.n;
  d.mean = p.mean;
  if (p.n >= 2) {
    d.sd = p.sd;
    d.se = p.sd / std::sqrt(static_cast<double>(p.n));
    d.ci_low = p.ci_low;
    d.ci_high = p.ci_high;
  }
  for (const std::string& who : {arm, baseline})
    for (const results::RunResult* r : s.finished_runs(who))
      if (const auto cpu = run_cpu(*r); cpu && !has(d.cpus, *cpu)) d.cpus.push_back(*cpu);
  if (p.n < 2) d.not_pooled = concat("fewer than 2 paired seeds (", p.n, ")");
  else if (!(d.se > 0)) d.not_pooled = "every paired difference is the same: no within-study variance";
  else d.pooled = true;
  return d;
}

std::vector<results::PoolDesign> designs_of(const std::string& dir, const std::string& arm, const std::string& baseline) {
  const ExperimentSummary s = analysis::compute_summary(dir);
  require(!s.milestones.empty(), dir, ": the experiment has no validation milestones");
  std::vector<results::PoolDesign> out;
  bool arm_seen = has(s.spec.arms, arm);
  if (arm_seen && has(s.spec.arms, baseline)) out.push_back(estimate(dir, s, "main", "main", arm, baseline));
  for (const analysis::GroupResults& g : s.groups) {
    if (!has(g.spec.arms, arm)) continue;
    arm_seen = true;
    if (g.spec.baseline != baseline || g.summary.milestones.empty()) continue;
    out.push_back(estimate(dir, g.summary, g.spec.name, g.spec.kind, arm, baseline));
  }
  require(arm_seen, dir, ": no arm '", arm, "' in the experiment (its arms: ", join(s.spec.arms, ", "), ")");
  require(!out.empty(), dir, ": arm '", arm, "' is never compared with the baseline '", baseline,
          "' (main arms: ", join(s.spec.arms, ", "), "; a group counts when its baseline is '", baseline, "')");
  return out;
}

std::string pooled_line(const results::Pool& p, int designs, int studies) {
  using analysis::format_number;
  using analysis::format_p_value;
  using analysis::format_signed;
  const std::string what = concat(p.arm, " − ", p.baseline, " over ", designs, designs == 1 ? " design" : " designs",
                                  " from ", studies, studies == 1 ? " study" : " studies");
  if (!p.pooled) {
    const auto one = std::find_if(p.designs.begin(), p.designs.end(), [](const auto& d) { return d.pooled; });
    if (one == p.designs.end()) return what + ": nothing to pool (no design has a within-study variance)";
    return concat(what, ": k = 1, not a meta-analysis; the one design (", one->dir, ", ", one->design, "): ΔNLL ",
                  format_signed(one->mean, 4), " ± ", format_number(one->se, 4), " (s.e.), 95% CI [",
                  format_signed(one->ci_low, 4), ", ", format_signed(one->ci_high, 4), "] over ", one->n, " seeds");
  }
  const results::PoolEstimate& e = *p.pooled;
  return concat(what, ": pooled ΔNLL ", format_signed(e.mean, 4), " ± ", format_number(e.se, 4), " (s.e.), 95% CI [",
                format_signed(e.ci_low, 4), ", ", format_signed(e.ci_high, 4), "] (random effects, DerSimonian–Laird τ², ",
                "Hartung–Knapp–Sidik–Jonkman interval with its variance not below DL's, t with ", e.k - 1, " df), p = ",
                format_p_value(e.p_value), "; τ² = ", analysis::format_printf("%.3g", e.tau2_dl), " (REML ",
                analysis::format_printf("%.3g", e.tau2_reml), "), I² = ", format_number(100 * e.i2, 0), "%, Q = ",
                format_number(e.q, 2), " (df ", e.k - 1, ", p = ", format_p_value(e.q_p), ")");
}

std::string futility_line(const results::Pool& p, double low, const char* interval) {
  const std::string e = analysis::format_number(p.effect, 3);
  if (!std::isfinite(low)) return concat("no interval to judge a gain of ", e, " nats by");
  if (low > -p.effect)
    return concat("no gain as large as ", e, " nats at this scale: the ", interval, " lies above −", e);
  return concat("a gain as large as ", e, " nats is not excluded: the ", interval, " reaches below −", e);
}

}  // namespace

results::Pool pool_studies(const std::vector<std::string>& dirs, const PoolOptions& options) {
  require(!dirs.empty(), "--pool needs at least one experiment directory");
  require(!options.arm.empty(), "--pool needs --answer ARM: the arm whose comparison is pooled");
  require(options.effect > 0, "--effect must be > 0 (got ", options.effect, ")");
  results::Pool p;
  p.arm = options.arm;
  p.baseline = options.baseline;
  if (p.baseline.empty()) {
    require(std::filesystem::is_directory(dirs.front()), "experiment directory '", dirs.front(), "' does not exist");
    p.baseline = results::read_experiment_spec(results::experiment_spec_path(dirs.front())).baseline;
  }
  require(p.arm != p.baseline, "--answer ", p.arm, " is the baseline itself");
  p.metric = "paired ΔNLL (arm − baseline), validation NLL at each design's last milestone";
  p.method = "random effects: DerSimonian–Laird τ²; Hartung–Knapp–Sidik–Jonkman interval, t with k − 1 df, "
             "its variance scale max(q, 1) (not below the DL variance)";
  p.effect = options.effect;
  for (const std::string& dir : dirs)
    for (results::PoolDesign& d : designs_of(dir, p.arm, p.baseline)) p.designs.push_back(std::move(d));

  std::vector<double> y, v;
  for (const results::PoolDesign& d : p.designs)
    if (d.pooled) {
      y.push_back(d.mean);
      v.push_back(d.se * d.se);
    }
  if (y.size() >= 2) {
    const analysis::MetaAnalysis m = analysis::random_effects_meta(y, v);
    results::PoolEstimate e;
    e.k = m.k;
    e.mean = m.mean;
    e.se = m.se;
    e.ci_low = m.ci_low;
    e.ci_high = m.ci_high;
    e.df = m.k - 1;
    e.t = m.t;
    e.p_value = m.p_value;
    e.hk_q = m.hk_q;
    e.hk_ci_low = m.hk_ci_low;
    e.hk_ci_high = m.hk_ci_high;
    e.dl_ci_low = m.dl_ci_low;
    e.dl_ci_high = m.dl_ci_high;
    e.tau2_dl = m.tau2_dl;
    e.tau2_reml = m.tau2_reml;
    e.q = m.q;
    e.q_p = m.q_p;
    e.i2 = m.i2;
    e.fixed_mean = m.fixed_mean;
    e.fixed_se = m.fixed_se;
    double sum_w = 0;
    for (double vi : v) sum_w += 1 / (vi + m.tau2_dl);
    for (results::PoolDesign& d : p.designs)
      if (d.pooled) d.weight = 1 / (d.se * d.se + m.tau2_dl) / sum_w;
    p.pooled = e;
  } else {
    for (results::PoolDesign& d : p.designs)
      if (d.pooled) d.weight = 1;
  }
  std::vector<std::string> studies;
  for (const auto& d : p.designs)
    if (!has(studies, d.dir)) studies.push_back(d.dir);
  p.summary = pooled_line(p, static_cast<int>(y.size()), static_cast<int>(studies.size()));
  if (p.pooled) {
    p.futility = futility_line(p, p.pooled->ci_low, "pooled 95% CI");
  } else {
    const auto one = std::find_if(p.designs.begin(), p.designs.end(), [](const auto& d) { return d.pooled; });
    p.futility = one == p.designs.end() ? futility_line(p, NAN, "")
                                        : futility_line(p, one->ci_low, "one design's own 95% CI (not pooled)");
  }
  return p;
}

}  // namespace attnres::experiment
