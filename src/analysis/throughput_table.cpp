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

// The baseline's training tokens at which its mean validation NLL (interpolated linearly in log
// tokens between milestones, extrapolated along the last or first segment beyond them) equals
// `nll`; `extrapolated` says whether it lies outside the milestones.
double baseline_tokens_for(const ExperimentSummary& s, double nll, bool& extrapolated) {
  std::vector<std::pair<double, double>> curve;  // (log tokens, mean NLL)
  for (const Comparison& c : s.milestones)
    if (const ArmComparison* b = c.find(s.spec.baseline); b && std::isfinite(b->mean))
      curve.emplace_back(std::log(double(c.tokens)), b->mean);
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

}  // namespace

std::optional<Table> throughput_table(const ExperimentSummary& s) {
  if (s.milestones.size() < 2 || s.systems.empty()) return std::nullopt;
  const Comparison& last = s.milestones.back();
  Table t;
  t.title = concat("Throughput-adjusted: what each arm's validation NLL at ", format_tokens(double(last.tokens)),
                   " tokens is worth against ", s.spec.baseline, " at equal compute and at equal wall-clock time");
  t.header = {"arm", "ΔNLL [95% CI]", "step-time ratio", "compute multiplier", "at equal wall-clock", "verdict"};
  bool any_extrapolated = false;
  for (const ArmComparison& a : last.arms) {
    if (a.is_baseline || is_twin(a.arm) || a.stats.n == 0) continue;
    const auto sys = std::find_if(s.systems.begin(), s.systems.end(), [&](const ArmSystems& x) { return x.arm == a.arm; });
    const double step_ratio = sys != s.systems.end() ? sys->step_time_ratio : results::kNotAvailable;
    bool extrapolated = false;
    const double tokens = baseline_tokens_for(s, a.mean, extrapolated);
    const double multiplier = std::isfinite(tokens) ? tokens / double(last.tokens) : results::kNotAvailable;
    any_extrapolated = any_extrapolated || extrapolated;
    const double wall = multiplier / step_ratio;
    std::string verdict = "n/a";
    if (std::isfinite(wall)) {
      const bool resolved = a.stats.n >= 2 && a.stats.p_value < kPowerAlpha;
      verdict = wall > 1 ? "ahead at equal time" : "behind at equal time";
      if (!resolved) verdict += " (ΔNLL not resolved)";
    }
    t.rows.push_back({a.arm,
                      concat(format_signed(a.stats.mean, 4), " [", format_signed(a.stats.ci_low, 4), ", ",
                             format_signed(a.stats.ci_high, 4), "]"),
                      format_number(step_ratio, 3),
                      std::isfinite(multiplier) ? format_number(multiplier, 3) + (extrapolated ? "*" : "") : "n/a",
                      std::isfinite(wall) ? format_number(wall, 3) : "n/a", verdict});
  }
  if (t.rows.empty()) return std::nullopt;
  t.notes = {concat("Compute multiplier: the training tokens ", s.spec.baseline,
                    " would need to reach the arm's mean validation NLL, over the arm's own tokens (the baseline's mean "
                    "NLL at the milestones, interpolated linearly in log tokens) — the equal-compute multiplier in the "
                    "spirit of Marin's (marin-community/marin #9290). Above 1: the arm is worth that much more training "
                    "of the baseline."),
             "At equal wall-clock: the multiplier over the step-time ratio (arm / baseline, as the study's runs "
             "measured it, two at a time on the study machine): above 1, the arm's gain outweighs its cost in time.",
             "Verdict: from the point estimates; it carries the ΔNLL's own uncertainty (its interval) and the step "
             "time's (a few percent between runs)."};
  if (any_extrapolated)
    t.notes.push_back("*: beyond the baseline's milestones, extrapolated along its first or last segment.");
  return t;
}

}  // namespace attnres::analysis
