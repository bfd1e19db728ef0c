#include "analysis/floor.hpp"

#include <algorithm>
#include <boost/math/distributions/fisher_f.hpp>
#include <cmath>
#include <limits>

#include "analysis/format.hpp"
#include "analysis/stats.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

using results::kNotAvailable;

double log_choose(int n, int k) { return std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0); }

}  // namespace

FloorInterval fixed_sample_interval(const results::PairedSummary& d) {
  require(d.n >= 2, "a floor interval needs at least two paired seeds");
  const double se = d.sd / std::sqrt(double(d.n));
  const double t90 = student_t_quantile(0.95, d.n - 1);
  return {d.ci_low, d.ci_high, d.mean - t90 * se, d.mean + t90 * se, "90% CI"};
}

std::optional<results::FloorTest> floor_test(const results::PairedSummary& d,
                                             std::span<const results::NoiseFloor> twins, double margin,
                                             const FloorInterval& interval, double alpha) {
  if (d.n < 2 || !std::isfinite(d.sd)) return std::nullopt;
  results::FloorTest f;
  // Rounding's variance of one pair of runs of two arms: each run carries its arm's rounding
  // variance, half its twin pair's; with one twin measured, both arms are taken to have it.
  double variance = 0, dof_denominator = 0;
  int used = 0;
  for (const results::NoiseFloor& t : twins) {
    if (t.n < 2 || !std::isfinite(t.sd)) continue;
    f.twins.push_back(t.twin);
    ++used;
  }
  if (used == 0) return std::nullopt;
  for (const results::NoiseFloor& t : twins) {
    if (t.n < 2 || !std::isfinite(t.sd)) continue;
    const double share = t.sd * t.sd / used;  // its part of the mean variance
    variance += share;
    dof_denominator += share * share / (t.n - 1);
  }
  f.pair_sd = std::sqrt(variance);
  f.dof = dof_denominator > 0 ? variance * variance / dof_denominator : kNotAvailable;
  f.mean_sd = f.pair_sd / std::sqrt(double(d.n));
  f.margin = margin;
  f.interval = interval.name;
  f.interval_low = interval.equivalence_low;
  f.interval_high = interval.equivalence_high;
  f.mean_beyond = interval.beyond_low > 0 || interval.beyond_high < 0;
  // The spread: under the null the differences' variance is rounding's; F = s² / pair_sd².
  if (variance > 0 && std::isfinite(f.dof)) {
    f.spread_ratio = d.sd / f.pair_sd;
    const double F = d.sd * d.sd / variance;
    const boost::math::fisher_f_distribution<double> dist(d.n - 1, f.dof);
    f.spread_p = boost::math::cdf(boost::math::complement(dist, F));
  } else {  // the twins reproduced their arms exactly: any spread at all is beyond them
    f.spread_ratio = d.sd > 0 ? std::numeric_limits<double>::infinity() : kNotAvailable;
    f.spread_p = d.sd > 0 ? 0.0 : 1.0;
  }
  f.spread_beyond = f.spread_p < alpha;
  const bool equivalent = f.interval_low > -margin && f.interval_high < margin;
  f.state = f.mean_beyond || f.spread_beyond ? "beyond" : equivalent ? "inside" : "undetermined";
  return f;
}

double floor_margin(const results::ExperimentSpec& spec, double user_effect) {
  if (spec.floor_margin > 0) return spec.floor_margin;
  const double effect = spec.sequential                                    ? spec.sequential->effect
                        : std::isfinite(user_effect) && user_effect > 0 ? user_effect
                                                                           : kPaperEffectNats;
  return effect / 3.0;
}

double fisher_exact_two_sided(int a, int b, int c, int d) {
  require(a >= 0 && b >= 0 && c >= 0 && d >= 0, "Fisher's exact test needs counts >= 0");
  const int r1 = a + b, r2 = c + d, c1 = a + c, n = r1 + r2;
  if (n == 0) return 1.0;
  const double log_total = log_choose(n, c1);
  const auto log_p = [&](int x) { return log_choose(r1, x) + log_choose(r2, c1 - x) - log_total; };
  const double observed = log_p(a);
  double p = 0;
  for (int x = std::max(0, c1 - r2); x <= std::min(r1, c1); ++x) {
    const double lp = log_p(x);
    if (lp <= observed + 1e-7 * std::abs(observed) + 1e-12) p += std::exp(lp);
  }
  return std::min(1.0, p);
}

std::vector<double> median_curve(std::span<const std::vector<double>> curves) {
  if (curves.empty()) return {};
  const std::size_t steps = curves.front().size();
  std::vector<double> out(steps), column(curves.size());
  for (std::size_t i = 0; i < steps; ++i) {
    for (std::size_t k = 0; k < curves.size(); ++k) {
      require(curves[k].size() == steps, "median_curve: curves of different lengths");
      column[k] = curves[k][i];
    }
    std::sort(column.begin(), column.end());
    const std::size_t m = column.size() / 2;
    out[i] = column.size() % 2 == 1 ? column[m] : 0.5 * (column[m - 1] + column[m]);
  }
  return out;
}

results::RunFailure run_failure(const std::string& arm, std::int64_t seed, std::span<const results::LossPoint> curve,
                                double clipped_fraction, std::span<const double> reference,
                                const results::FailureRule& rule) {
  results::RunFailure f;
  f.arm = arm;
  f.seed = seed;
  f.clipped_fraction = clipped_fraction;
  std::string why;
  if (std::isfinite(clipped_fraction) && clipped_fraction > rule.clipped_fraction)
    why = concat("clipped ", std::lround(100 * clipped_fraction), "% of its steps (rule: > ",
                 std::lround(100 * rule.clipped_fraction), "%)");
  const auto window = static_cast<std::size_t>(rule.stall_steps);
  if (!reference.empty() && curve.size() == reference.size() && curve.size() >= window) {
    double sum = 0;
    f.stall_excess = -std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < curve.size(); ++i) {
      sum += curve[i].train_loss - reference[i];
      if (i >= window) sum -= curve[i - window].train_loss - reference[i - window];
      if (i + 1 >= window && sum / double(window) > f.stall_excess) {
        f.stall_excess = sum / double(window);
        f.stall_step = static_cast<std::int64_t>(i + 1);
      }
    }
    if (f.stall_excess > rule.stall_nats)
      why += concat(why.empty() ? "" : "; ", "stalled: its loss sat ", format_number(f.stall_excess, 2),
                    " nats above its reference over steps ", f.stall_step - rule.stall_steps + 1, "-", f.stall_step,
                    " (rule: > ", format_number(rule.stall_nats, 2), " over ", rule.stall_steps, " steps)");
  }
  f.failed = !why.empty();
  f.reason = why;
  return f;
}

}  // namespace attnres::analysis
