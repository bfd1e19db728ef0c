// The throughput-adjusted view: each arm's ΔNLL converted into the baseline's training tokens
// (the equal-compute multiplier) and set against its step time (what it is worth at equal
// wall-clock time).
#include <algorithm>
#include <cmath>

#include "analysis/format.hpp"
#include "analysis/stats.hpp"
#include "analysis/tables.hpp"
#include "model/arms.hpp"
#include "util/error.hpp"

namespace attnres::analysis {

namespace {

// The baseline's mean validation NLL at budgets it was trained to: the main runs' last milestone,
// and each group that trained the baseline again with no other setting (controls at a smaller
// budget). The main runs' earlier milestones are not such points: a cosine or WSD schedule anneals
// to each run's own end, so a mid-run point is higher than a run trained to that budget, and reading
// it as one would flatter every arm (issue #46).
std::vector<std::pair<double, double>> baseline_budget_curve(const ExperimentSummary& s) {
  std::vector<std::pair<double, double>> curve;  // (log tokens, mean NLL), by tokens
  const auto add = [&](const ExperimentSummary& x) {
    if (x.milestones.empty()) return;
    const Comparison& c = x.milestones.back();
    if (const ArmComparison* b = c.find(x.spec.baseline); b && std::isfinite(b->mean))
      curve.emplace_back(std::log(double(c.tokens)), b->mean);
  };
  add(s);
  for (const GroupResults& g : s.groups)
    if (!g.spec.baseline_from_main && g.spec.settings.empty() && g.spec.baseline == s.spec.baseline) add(g.summary);
  std::sort(curve.begin(), curve.end());
  return curve;
}

// The baseline's training tokens at which its NLL (interpolated linearly in log tokens between its
// budget points, extrapolated along the last or first segment beyond them) equals `nll`.
double baseline_tokens_for(const std::vector<std::pair<double, double>>& curve, double nll, bool& extrapolated) {
  extrapolated = false;
  if (curve.size() < 2 || !std::isfinite(nll)) return results::kNotAvailable;
  std::size_t k = 0;  // the segment [k, k + 1]
  if (nll < curve.back().second) {
    k = curve.size() - 2;
    extrapolated = true;
  } else if (nll > curve.front().second) {
    extrapolated = true;
  } else {
    while (k + 2 < curve.size() && nll < curve[k + 1].second) ++k;
  }
  const auto [x0, y0] = curve[k];
  const auto [x1, y1] = curve[k + 1];
  if (y1 == y0) return results::kNotAvailable;
  return std::exp(x0 + (nll - y0) * (x1 - x0) / (y1 - y0));
}

struct Ratio {
  double mean = results::kNotAvailable, low = results::kNotAvailable, high = results::kNotAvailable;
  int n = 0;
};

// The arm's step time over the baseline's, paired by seed: the geometric mean of the per-seed ratios
// with its 95% t interval (on the log scale).
Ratio step_time_ratio(const ExperimentSummary& s, const std::string& arm) {
  std::vector<double> logs;
  for (const auto seed : s.spec.seeds) {
    const RunResult* a = s.find_run(arm, seed);
    const RunResult* b = s.find_run(s.spec.baseline, seed);
    if (a && b && a->step_time_ms > 0 && b->step_time_ms > 0) logs.push_back(std::log(a->step_time_ms / b->step_time_ms));
  }
  Ratio r;
  r.n = static_cast<int>(logs.size());
  if (logs.empty()) return r;
  const PairedStats p = paired_stats(logs);
  r.mean = std::exp(p.mean);
  if (p.n >= 2) {
    r.low = std::exp(p.ci_low);
    r.high = std::exp(p.ci_high);
  }
  return r;
}

std::string ratio_text(const Ratio& r) {
  if (!std::isfinite(r.mean)) return "n/a";
  if (!std::isfinite(r.low)) return format_number(r.mean, 3);
  return concat(format_number(r.mean, 3), " [", format_number(r.low, 3), ", ", format_number(r.high, 3), "]");
}

}  // namespace

std::optional<Table> throughput_table(const ExperimentSummary& s) {
  if (s.milestones.empty() || s.systems.empty()) return std::nullopt;
  const Comparison& last = s.milestones.back();
  const std::vector<std::pair<double, double>> curve = baseline_budget_curve(s);
  Table t;
  t.title = concat("Throughput-adjusted: what each arm's validation NLL at ", format_tokens(double(last.tokens)),
                   " tokens is worth against ", s.spec.baseline, " at equal compute and at equal wall-clock time");
  t.header = {"arm", "ΔNLL [95% CI]", "step-time ratio [95% CI]", "compute multiplier", "at equal wall-clock", "verdict"};
  bool any_extrapolated = false;
  std::optional<Ratio> timing_floor;
  for (const ArmComparison& a : last.arms) {
    if (a.is_baseline || a.stats.n == 0) continue;
    const Ratio step = step_time_ratio(s, a.arm);
    if (a.arm == twin_of(s.spec.baseline)) {
      timing_floor = step;
      continue;
    }
    if (is_twin(a.arm)) continue;
    bool extrapolated = false;
    const double tokens = baseline_tokens_for(curve, a.mean, extrapolated);
    const double multiplier = std::isfinite(tokens) ? tokens / double(last.tokens) : results::kNotAvailable;
    any_extrapolated = any_extrapolated || extrapolated;
    const double wall = multiplier / step.mean;
    std::string verdict = "n/a";
    if (std::isfinite(wall)) {
      const bool resolved = a.stats.n >= 2 && a.stats.p_value < kPowerAlpha;
      verdict = wall > 1 ? "ahead at equal time" : "behind at equal time";
      if (!resolved) verdict += " (ΔNLL not resolved)";
    }
    t.rows.push_back({a.arm,
                      concat(format_signed(a.stats.mean, 4), " [", format_signed(a.stats.ci_low, 4), ", ",
                             format_signed(a.stats.ci_high, 4), "]"),
                      ratio_text(step),
                      std::isfinite(multiplier) ? format_number(multiplier, 3) + (extrapolated ? "*" : "") : "n/a",
                      std::isfinite(wall) ? format_number(wall, 3) : "n/a", verdict});
  }
  if (t.rows.empty()) return std::nullopt;
  t.notes = {concat("Compute multiplier: the training tokens ", s.spec.baseline,
                    " would need to reach the arm's mean validation NLL, over the arm's own tokens — the equal-compute "
                    "multiplier in the spirit of Marin's (marin-community/marin #9290) — read from ", s.spec.baseline,
                    " runs trained to their budget: the main runs' last milestone and groups that trained ",
                    s.spec.baseline, " again at a smaller budget with nothing else changed (",
                    curve.size(), curve.size() == 1 ? " point" : " points",
                    ", interpolated linearly in log tokens). The main runs' earlier milestones are not used: a cosine "
                    "or WSD schedule anneals to each run's own end, so a mid-run point lies above a run trained to that "
                    "budget and would flatter every arm."),
             "At equal wall-clock: the multiplier over the step-time ratio (arm / baseline per seed, geometric mean "
             "with its 95% interval, as the study's runs measured it on a shared machine): above 1, the arm's gain "
             "outweighs its cost in time.",
             "Verdict: from the point estimates; it carries the ΔNLL's own uncertainty (its interval) and the step "
             "time's."};
  if (curve.size() < 2)
    t.notes.push_back(concat("n/a: one budget point of ", s.spec.baseline,
                             " only: a controls group at a smaller budget (e.g. [controls] budget = 0.25 with a cosine "
                             "schedule, where ", s.spec.baseline, " is trained again to that budget) gives a second."));
  if (timing_floor && std::isfinite(timing_floor->mean))
    t.notes.push_back(concat(twin_of(s.spec.baseline), ", the same computation as ", s.spec.baseline, ", ran ",
                             ratio_text(*timing_floor), " its step time: the timing floor. A step-time ratio inside "
                             "that spread is no measured cost; use `attnres bench` (side by side in one process) for "
                             "the cost."));
  if (any_extrapolated)
    t.notes.push_back("*: beyond the baseline's budget points, extrapolated along its first or last segment.");
  t.notes.push_back(one_learning_rate_note(s));
  return t;
}

}  // namespace attnres::analysis
