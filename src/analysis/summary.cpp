#include "analysis/summary.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "analysis/depth_summary.hpp"
#include "analysis/floor.hpp"
#include "analysis/format.hpp"
#include "analysis/sequential.hpp"
#include "analysis/stats.hpp"
#include "model/arms.hpp"
#include "results/instability.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

namespace fs = std::filesystem;

// The paired statistics as summary.json records them.
results::PairedSummary paired_summary(const PairedStats& p) {
  return {p.n, p.mean, p.sd, p.ci_low, p.ci_high, p.t, p.p_value, p.wins};
}

results::PowerSummary power_summary(const PowerEstimate& p) {
  return {p.available, p.reason, p.mde, p.seeds_for_paper, p.seeds_for_user};
}

// The floors of the comparison: each twin "<arm>~" against its arm, per seed finished in both.
void add_noise_floors(Comparison& c, const std::string& baseline) {
  for (const ArmComparison& t : c.arms) {
    if (!is_twin(t.arm)) continue;
    const ArmComparison* original = c.find(twin_original(t.arm));
    if (original == nullptr) continue;
    std::vector<double> d;
    for (const SeedValue& v : t.values)
      for (const SeedValue& o : original->values)
        if (o.seed == v.seed) d.push_back(v.value - o.value);
    const PairedStats p = paired_stats(d);
    const results::NoiseFloor f{t.arm, p.n, p.n > 0 ? p.mean : results::kNotAvailable,
                                p.n >= 2 ? p.sd : results::kNotAvailable};
    if (original->arm == baseline) c.noise_floor = f;
    else c.arm_floors.push_back(f);
  }
}

// The floors that bear on `arm`'s comparison: the baseline's twin's and the arm's own twin's.
std::vector<results::NoiseFloor> floors_of(const Comparison& c, const std::string& arm) {
  std::vector<results::NoiseFloor> twins;
  if (c.noise_floor) twins.push_back(*c.noise_floor);
  for (const results::NoiseFloor& f : c.arm_floors)
    if (twin_original(f.twin) == arm) twins.push_back(f);
  return twins;
}

// Every compared arm (not the baseline, not a twin) against the floors of the baseline's twin and
// its own, with its fixed-sample intervals (a sequential primary's are replaced after the looks).
void add_floor_tests(Comparison& c, double margin) {
  for (ArmComparison& a : c.arms) {
    if (a.is_baseline || is_twin(a.arm) || a.stats.n < 2) continue;
    a.floor = floor_test(a.stats, floors_of(c, a.arm), margin, fixed_sample_interval(a.stats));
  }
}

// with_baseline false: the baseline's values are left out (a reused baseline has no test NLL at
// this group's budget), so nothing is paired.
Comparison compare(const ExperimentSummary& s, const std::string& split, std::int64_t tokens,
                   double (*value_of)(const RunResult&, std::int64_t tokens), bool with_baseline = true) {
  Comparison c;
  c.split = split;
  c.tokens = tokens;
  std::map<std::int64_t, double> baseline;
  for (const auto seed : s.spec.seeds)
    if (const RunResult* r = s.find_run(s.spec.baseline, seed); r && with_baseline)
      baseline[seed] = value_of(*r, tokens);
  for (const auto& arm : s.spec.arms) {
    ArmComparison a;
    a.arm = arm;
    a.is_baseline = arm == s.spec.baseline;
    std::vector<double> values, deltas;
    for (const auto seed : s.spec.seeds) {
      const RunResult* r = s.find_run(arm, seed);
      if (!r || (a.is_baseline && !with_baseline)) continue;
      const double v = value_of(*r, tokens);
      a.values.push_back({seed, v});
      values.push_back(v);
      const auto base = baseline.find(seed);
      if (!a.is_baseline && base != baseline.end()) {
        a.deltas.push_back({seed, v - base->second});
        deltas.push_back(v - base->second);
      }
    }
    a.mean = mean_of(values);
    const PairedStats stats = paired_stats(deltas);
    a.stats = paired_summary(stats);
    if (!a.is_baseline) {
      a.power = power_summary(power_estimate(stats, s.user_effect));
      a.ppl_change = ppl_change(a.stats.mean);
      a.ppl_change_ci_low = ppl_change(a.stats.ci_low);
      a.ppl_change_ci_high = ppl_change(a.stats.ci_high);
    }
    c.arms.push_back(std::move(a));
  }
  add_noise_floors(c, s.spec.baseline);
  add_floor_tests(c, floor_margin(s.spec, s.user_effect));
  return c;
}

double val_nll_at(const RunResult& r, std::int64_t tokens) {
  for (const auto& m : r.milestones)
    if (m.tokens == tokens) return m.val_nll;
  fail(r.arm, " seed ", r.seed, ": no validation NLL at ", tokens, " tokens");  // read_run_result guarantees it
}

double test_nll_of(const RunResult& r, std::int64_t) { return r.test_nll; }

// Per seed with both curves, how far the baseline and its twin drifted apart (results::TwinDrift).
std::vector<results::TwinDrift> summarize_twin_drift(const ExperimentSummary& s) {
  std::vector<results::TwinDrift> out;
  const std::string twin = twin_of(s.spec.baseline);
  if (std::find(s.spec.arms.begin(), s.spec.arms.end(), twin) == s.spec.arms.end()) return out;
  for (const auto seed : s.spec.seeds) {
    const RunResult* a = s.find_run(s.spec.baseline, seed);
    const RunResult* b = s.find_run(twin, seed);
    if (a == nullptr || b == nullptr || a->curve.empty() || b->curve.empty()) continue;
    require(a->curve.size() == b->curve.size(), s.path_of(*b), ": key 'curve' has ", b->curve.size(),
            " steps but its baseline ", s.path_of(*a), " has ", a->curve.size());
    out.push_back(twin_drift(seed, a->curve, b->curve));
  }
  return out;
}

std::vector<ArmSystems> summarize_systems(const ExperimentSummary& s) {
  std::vector<ArmSystems> out;
  for (const auto& arm : s.spec.arms) {
    ArmSystems a;
    a.arm = arm;
    std::vector<double> tps, step, rss;
    const RunResult* first = nullptr;
    for (const auto seed : s.spec.seeds) {
      const RunResult* r = s.find_run(arm, seed);
      if (!r) continue;
      if (!first) first = r;
      // The parameter count follows from the model config alone; a difference means mixed configs.
      require(r->params == first->params, s.path_of(*r), ": key 'params' is ", r->params, " but ",
              s.path_of(*first), " has ", first->params, " (same arm)");
      tps.push_back(r->tokens_per_sec);
      step.push_back(r->step_time_ms);
      rss.push_back(static_cast<double>(r->peak_rss_bytes));
    }
    if (!first) continue;
    a.runs = static_cast<int>(tps.size());
    a.params = first->params;
    a.tokens_per_sec = mean_of(tps);
    a.step_time_ms = mean_of(step);
    a.peak_rss_bytes = mean_of(rss);
    out.push_back(a);
  }
  const auto base = std::find_if(out.begin(), out.end(), [&](const ArmSystems& a) { return a.arm == s.spec.baseline; });
  if (base != out.end()) {
    const ArmSystems b = *base;
    auto ratio = [](double x, double y) { return y > 0 ? x / y : results::kNotAvailable; };
    for (auto& a : out) {
      a.params_overhead = ratio(static_cast<double>(a.params - b.params), static_cast<double>(b.params));
      a.tokens_per_sec_ratio = ratio(a.tokens_per_sec, b.tokens_per_sec);
      a.step_time_ratio = ratio(a.step_time_ms, b.step_time_ms);
      a.peak_rss_ratio = ratio(a.peak_rss_bytes, b.peak_rss_bytes);
    }
  }
  return out;
}

}  // namespace

const RunResult* ExperimentSummary::find_run(const std::string& arm, std::int64_t seed) const {
  for (const auto& r : runs)
    if (r.arm == arm && r.seed == seed) return &r;
  return nullptr;
}

std::vector<std::int64_t> ExperimentSummary::unstable_seeds(const std::string& arm) const {
  std::vector<std::int64_t> out;
  for (const auto& r : instability)
    if (r.arm == arm && r.instability.unstable) out.push_back(r.seed);
  return out;
}

std::vector<const RunResult*> ExperimentSummary::finished_runs(const std::string& arm) const {
  std::vector<const RunResult*> out;
  for (const auto seed : spec.seeds)
    if (const RunResult* r = find_run(arm, seed)) out.push_back(r);
  return out;
}

std::string ExperimentSummary::run_path(const std::string& arm, std::int64_t seed) const {
  const bool reused = !group.empty() && arm == spec.baseline && reused_baseline;
  return results::run_result_path(dir, reused ? "" : group, arm, seed);
}

RunResult read_run_result(const std::string& path, const ExperimentSpec& spec, const std::string& arm,
                          std::int64_t seed) {
  RunResult r = results::read_run_result(path);
  const auto bad = [&](const char* key, const std::string& what) { fail(path, ": key '", key, "' ", what); };
  if (r.arm != arm) bad("arm", concat("is '", r.arm, "' but the file is in the directory of arm '", arm, "'"));
  if (r.seed != seed) bad("seed", concat("is ", r.seed, " but the file is in the directory of seed ", seed));
  for (const auto m : spec.milestones)
    if (std::none_of(r.milestones.begin(), r.milestones.end(), [&](const auto& p) { return p.tokens == m; }))
      bad("milestones", concat("has no entry at ", m, " tokens (an experiment.json milestone)"));
  return r;
}

namespace {

std::vector<double> losses_of(const RunResult& r) {
  std::vector<double> out;
  out.reserve(r.curve.size());
  for (const auto& p : r.curve) out.push_back(p.train_loss);
  return out;
}

// The failure rule over every finished run with a curve (results::FailureRule): each run's verdict,
// the counts per arm with Fisher's exact test against the baseline, and the last validation
// milestone compared again without the seeds in which an arm or the baseline failed.
void summarize_failures(ExperimentSummary& s) {
  if (!s.spec.failure) return;
  const results::FailureRule& rule = *s.spec.failure;
  // The baseline's reference: the step-wise median of its runs' curves (those of the common length).
  std::vector<std::vector<double>> baseline_curves;
  for (const RunResult* r : s.finished_runs(s.spec.baseline))
    if (!r->curve.empty()) baseline_curves.push_back(losses_of(*r));
  std::erase_if(baseline_curves, [&](const std::vector<double>& c) { return c.size() != baseline_curves.front().size(); });
  const std::vector<double> median = median_curve(baseline_curves);
  for (const RunResult& r : s.runs) {
    if (r.curve.empty()) continue;
    std::vector<double> reference;
    const bool is_baseline = r.arm == s.spec.baseline || r.arm == twin_of(s.spec.baseline);
    if (is_baseline) {
      if (baseline_curves.size() >= 3) reference = median;  // a median of fewer is no reference
    } else if (const RunResult* b = s.find_run(s.spec.baseline, r.seed); b && b->curve.size() == r.curve.size()) {
      reference = losses_of(*b);
    }
    const auto inst = results::run_instability(r);
    const double clipped = inst ? inst->clipped_fraction : results::kNotAvailable;
    s.failures.push_back(run_failure(r.arm, r.seed, r.curve, clipped,
                                     reference.size() == r.curve.size() ? reference : std::vector<double>{}, rule));
  }
  const auto count = [&](const std::string& arm) {
    results::ArmFailures c;
    c.arm = arm;
    for (const auto& f : s.failures)
      if (f.arm == arm) {
        ++c.runs;
        c.failed += f.failed ? 1 : 0;
      }
    return c;
  };
  const results::ArmFailures base = count(s.spec.baseline);
  for (const auto& arm : s.spec.arms) {
    results::ArmFailures c = count(arm);
    if (arm != s.spec.baseline)
      c.fisher_p = fisher_exact_two_sided(c.failed, c.runs - c.failed, base.failed, base.runs - base.failed);
    s.failure_counts.push_back(c);
  }
  // The secondary analysis: the failed runs left out, and with the baseline's every arm's run of that seed.
  if (s.milestones.empty() || std::none_of(s.failures.begin(), s.failures.end(), [](const auto& f) { return f.failed; }))
    return;
  ExperimentSummary kept = s;
  kept.runs.clear();
  for (const RunResult& r : s.runs) {
    if (!s.failed(r.arm, r.seed) && !s.failed(s.spec.baseline, r.seed)) kept.runs.push_back(r);
  }
  s.without_failures = compare(kept, "val", s.spec.milestones.back(), val_nll_at);
}

// Reads the runs of s (its spec and group set) and computes its statistics.
void summarize_arms(ExperimentSummary& s, const ExperimentSummary* main) {
  for (const auto& arm : s.spec.arms) {
    for (const auto seed : s.spec.seeds_of("", arm)) {
      if (main != nullptr && s.reused_baseline && arm == s.spec.baseline) {
        if (const RunResult* r = main->find_run(arm, seed)) s.runs.push_back(*r);
        else s.missing.push_back({arm, seed});
        continue;
      }
      const std::string path = s.run_path(arm, seed);
      if (fs::exists(path)) s.runs.push_back(read_run_result(path, s.spec, arm, seed));
      else s.missing.push_back({arm, seed});
    }
  }
  for (const auto m : s.spec.milestones) s.milestones.push_back(compare(s, "val", m, val_nll_at));
  s.test = compare(s, "test", s.spec.tokens, test_nll_of, !s.reused_baseline);
  s.routing = summarize_routing(s);
  s.connections = summarize_connections(s);
  s.amax_gain = summarize_gain(s);
  s.systems = summarize_systems(s);
  s.twin_drift = summarize_twin_drift(s);
  for (const RunResult& r : s.runs)
    if (const auto inst = results::run_instability(r)) s.instability.push_back({r.arm, r.seed, *inst});
  summarize_failures(s);
}

}  // namespace

namespace {

// A sequential study's look, where it matters beyond the sequential table: the primary arm's floor
// test at the last milestone uses the look's repeated CI, and once the study stopped (resolved or
// futile) the runs of the seeds after that look are not needed rather than missing.
void apply_sequential_outcome(ExperimentSummary& s) {
  if (!s.sequential || s.sequential->look < 0 || s.milestones.empty()) return;
  const results::SequentialSummary& q = *s.sequential;
  const results::SequentialLook& look = q.looks[static_cast<std::size_t>(q.look)];
  Comparison& last = s.milestones.back();
  for (ArmComparison& a : last.arms)
    if (a.arm == q.design.primary && a.floor) {
      const std::string level = format_number(100 * (1 - q.design.alpha), 0);
      const FloorInterval rci{look.ci_low, look.ci_high, look.ci_low, look.ci_high, "repeated " + level + "% CI"};
      a.floor = floor_test(a.stats, floors_of(last, a.arm), a.floor->margin, rci);
    }
  if (q.outcome != "resolved" && q.outcome != "futile") return;
  std::vector<std::int64_t> needed(s.spec.seeds.begin(),
                                   s.spec.seeds.begin() + std::min<std::size_t>(s.spec.seeds.size(), look.n));
  const auto move_unneeded = [&](ExperimentSummary& x) {
    std::erase_if(x.missing, [&](const RunKey& k) {
      if (std::find(needed.begin(), needed.end(), k.seed) != needed.end()) return false;
      x.not_needed.push_back(k);
      return true;
    });
  };
  move_unneeded(s);
  for (GroupResults& g : s.groups) move_unneeded(g.summary);
}

}  // namespace

bool ExperimentSummary::failed(const std::string& arm, std::int64_t seed) const {
  return std::any_of(failures.begin(), failures.end(),
                     [&](const results::RunFailure& f) { return f.failed && f.arm == arm && f.seed == seed; });
}

ExperimentSummary compute_summary(const std::string& dir, const SummaryOptions& options) {
  require(fs::is_directory(dir), "experiment directory '", dir, "' does not exist");
  ExperimentSummary s;
  s.dir = dir;
  s.user_effect = options.effect;
  s.spec = results::read_experiment_spec(results::experiment_spec_path(dir));
  summarize_arms(s, nullptr);
  s.sequential = sequential_summary(s);
  for (const results::GroupSpec& g : s.spec.groups) {
    GroupResults out;
    out.spec = g;
    ExperimentSummary& gs = out.summary;
    gs.dir = dir;
    gs.group = g.name;
    gs.user_effect = options.effect;
    gs.reused_baseline = g.baseline_from_main;
    gs.spec.arms = g.arms;
    gs.spec.baseline = g.baseline;
    gs.spec.seeds = s.spec.seeds_of(g.name, "");
    gs.spec.failure = s.spec.failure;
    gs.spec.floor_margin = floor_margin(s.spec, options.effect);
    gs.spec.tokens = g.tokens;
    gs.spec.milestones = g.milestones;
    gs.spec.preset = s.spec.preset;
    gs.spec.version = s.spec.version;
    gs.spec.name = s.spec.name;
    gs.spec.data = s.spec.data;
    gs.spec.model = g.model;
    gs.spec.train = g.train;
    summarize_arms(gs, &s);
    // A group that reads the main baseline's runs at main milestones is measured against the main
    // twins' floor there (the same runs, the same budget).
    if (g.baseline_from_main)
      for (Comparison& c : gs.milestones)
        for (const Comparison& m : s.milestones)
          if (m.tokens == c.tokens && m.noise_floor && !c.noise_floor) {
            c.noise_floor = m.noise_floor;
            add_floor_tests(c, gs.spec.floor_margin);
          }
    s.groups.push_back(std::move(out));
  }
  apply_sequential_outcome(s);
  return s;
}

ExperimentSummary summarize(const std::string& dir, const SummaryOptions& options) {
  ExperimentSummary s = compute_summary(dir, options);
  results::write_summary(results::summary_path(dir), summary_file(s));
  return s;
}

namespace {

void fill_arms_results(results::ArmsResults& out, const ExperimentSummary& s) {
  for (const auto& r : s.runs) out.finished_runs.push_back({r.arm, r.seed});
  out.missing_runs = s.missing;
  out.validation = s.milestones;
  out.test = s.test;
  out.routing = s.routing;
  out.connections = s.connections;
  out.amax_gain = s.amax_gain;
  out.systems = s.systems;
  out.twin_drift = s.twin_drift;
  out.instability = s.instability;
  out.not_needed_runs = s.not_needed;
  out.failures = s.failures;
  out.failure_counts = s.failure_counts;
  out.without_failures = s.without_failures;
  out.provenance = results::provenance_counts(s.runs);
}

}  // namespace

results::Summary summary_file(const ExperimentSummary& s) {
  results::Summary out;
  out.experiment = s.spec;
  out.power_alpha = kPowerAlpha;
  out.power_target = kPowerTarget;
  out.paper_effect = kPaperEffectNats;
  out.user_effect = s.user_effect;
  fill_arms_results(out, s);
  out.sequential = s.sequential;
  for (const GroupResults& g : s.groups) {
    results::GroupSummary gs;
    gs.name = g.spec.name;
    gs.kind = g.spec.kind;
    gs.baseline = g.spec.baseline;
    gs.baseline_from_main = g.spec.baseline_from_main;
    gs.tokens = g.spec.tokens;
    gs.settings = g.spec.settings;
    fill_arms_results(gs, g.summary);
    out.groups.push_back(std::move(gs));
  }
  return out;
}

std::optional<results::SequentialSummary> sequential_summary(const ExperimentSummary& s) {
  if (!s.spec.sequential || s.milestones.empty()) return std::nullopt;
  results::SequentialSummary out;
  out.design = *s.spec.sequential;
  const results::SequentialSpec& q = out.design;
  SequentialDesign design{q.looks, q.alpha, parse_spending(q.spending)};
  const TCalibration calibration = calibrate_t_looks(design);
  out.nominal_alpha = calibration.nominal_alpha;
  out.type_one_error = calibration.type_one_error;
  SequentialDesign looks = design;
  looks.alpha = calibration.nominal_alpha;
  const SequentialBoundaries bounds = sequential_boundaries(looks);
  // The primary comparison's differences in seed order, up to the first seed not finished in both.
  std::vector<double> differences;
  const ArmComparison* a = s.milestones.back().find(q.primary);
  require(a != nullptr, "experiment.json: the sequential design's primary arm '", q.primary, "' is not an arm");
  for (const auto seed : s.spec.seeds) {
    const auto d = std::find_if(a->deltas.begin(), a->deltas.end(), [&](const SeedValue& v) { return v.seed == seed; });
    if (d == a->deltas.end()) break;
    differences.push_back(d->value);
  }
  const Decision decision = decide(looks, bounds, differences, q.effect);
  out.outcome = outcome_name(decision.outcome);
  out.look = decision.look;
  out.next_seeds = decision.next_seeds;
  for (const LookResult& l : decision.looks) {
    results::SequentialLook r;
    r.n = l.n;
    r.mean = l.mean;
    r.sd = l.sd;
    r.ci_low = l.ci_low;
    r.ci_high = l.ci_high;
    r.t = l.t;
    r.t_boundary = l.t_boundary;
    r.nominal_p = l.nominal_p;
    r.crossed = l.crossed;
    // On the design's own (uncalibrated) scale: the smallest level whose interval excludes 0.
    r.p_adjusted = std::isfinite(l.t) ? repeated_p_value(design, l.look, l.t) : (l.mean == 0 ? 1.0 : 0.0);
    out.looks.push_back(r);
  }
  if (!decision.looks.empty() && decision.looks.back().sd > 0)
    out.power = sequential_power(looks, bounds, q.effect, decision.looks.back().sd).power;
  return out;
}

results::TwinDrift twin_drift(std::int64_t seed, std::span<const results::LossPoint> baseline,
                              std::span<const results::LossPoint> twin) {
  results::TwinDrift d;
  d.seed = seed;
  d.steps = static_cast<std::int64_t>(std::min(baseline.size(), twin.size()));
  const std::int64_t tail = std::max<std::int64_t>(1, d.steps / 10);
  double tail_sum = 0;
  for (std::int64_t i = 0; i < d.steps; ++i) {
    const double delta = std::abs(twin[i].train_loss - baseline[i].train_loss);
    d.max_abs_delta = std::max(d.max_abs_delta, delta);
    if (!d.part_step && delta >= results::kTwinPartNats) d.part_step = i + 1;
    if (i >= d.steps - tail) tail_sum += delta;
  }
  d.final_abs_delta = d.steps > 0 ? tail_sum / static_cast<double>(tail) : 0.0;
  return d;
}


}  // namespace attnres::analysis
