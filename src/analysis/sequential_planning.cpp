// Planning sequential designs (analysis/sequential.hpp): the looks at fractions of a maximum, the
// maximum seed count that reaches a power target, and the calibration of the t-based looks by
// simulation under the null.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>

#include "analysis/sequential.hpp"
#include "analysis/stats.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

// A reproducible standard normal stream: mt19937_64, whose output the C++ standard fixes, and the
// Box–Muller transform (std::normal_distribution's algorithm differs between standard libraries).
class NormalStream {
 public:
  explicit NormalStream(std::uint64_t seed) : rng_(seed) {}
  double operator()() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = (static_cast<double>(rng_() >> 11) + 1) * 0x1p-53;  // (0, 1]: log(u1) is finite
    const double u2 = static_cast<double>(rng_() >> 11) * 0x1p-53;        // [0, 1)
    const double r = std::sqrt(-2 * std::log(u1)), angle = 2 * std::numbers::pi * u2;
    spare_ = r * std::sin(angle);
    has_spare_ = true;
    return r * std::cos(angle);
  }

 private:
  std::mt19937_64 rng_;
  double spare_ = 0;
  bool has_spare_ = false;
};

// |T_k| at every look for `simulations` sequences of N(0, 1) differences, K values per sequence
// (the t statistics are scale-free, so σ = 1 is no restriction). Running mean and sum of squares
// by Welford's update.
std::vector<double> null_t_paths(std::span<const int> looks, int simulations, std::uint64_t seed) {
  NormalStream normal(seed);
  std::vector<double> paths;
  paths.reserve(static_cast<std::size_t>(simulations) * looks.size());
  for (int s = 0; s < simulations; ++s) {
    double mean = 0, ss = 0;
    std::size_t k = 0;
    for (int n = 1; k < looks.size(); ++n) {
      const double x = normal(), d = x - mean;
      mean += d / n;
      ss += d * (x - mean);
      if (n == looks[k]) {
        paths.push_back(std::abs(mean) / std::sqrt(ss / (n - 1) / n));
        ++k;
      }
    }
  }
  return paths;
}

// The fraction of the paths whose |T_k| reaches t[k] at some look.
double crossing_fraction(std::span<const double> paths, std::span<const double> t) {
  const std::size_t looks = t.size(), simulations = paths.size() / looks;
  std::size_t crossed = 0;
  for (std::size_t s = 0; s < simulations; ++s)
    for (std::size_t k = 0; k < looks; ++k)
      if (paths[s * looks + k] >= t[k]) {
        ++crossed;
        break;
      }
  return static_cast<double>(crossed) / static_cast<double>(simulations);
}

}  // namespace

std::vector<int> looks_at_fractions(int max_seeds, std::span<const double> fractions) {
  require(max_seeds >= 3, "looks: the maximum seed count must be at least 3 (got ", max_seeds, ")");
  require(!fractions.empty() && fractions.back() == 1.0, "looks: the last fraction must be 1");
  std::vector<int> looks;
  double previous = 0;
  for (double f : fractions) {
    require(f > previous && f <= 1, "looks: fractions must increase within (0, 1] (", f, " after ", previous, ")");
    previous = f;
    const int n = std::max(3, static_cast<int>(std::lround(f * max_seeds)));
    if (looks.empty() || n > looks.back()) looks.push_back(n);
  }
  looks.back() = max_seeds;  // lround(1.0 · max) is max; kept explicit
  return looks;
}

SeedPlan max_seeds_for_power(double effect, double sd, Spending spending, std::span<const double> fractions,
                             double alpha, double power, int max_n) {
  require(effect != 0 && std::isfinite(effect), "seed plan: the effect must be non-zero and finite");
  require(power > alpha && power < 1, "seed plan: the target power must lie in (alpha, 1) (got ", power, ")");
  require(max_n >= 3, "seed plan: max_n must be at least 3");
  const auto design_for = [&](int n) { return SequentialDesign{looks_at_fractions(n, fractions), alpha, spending}; };
  const auto power_at = [&](int n) {
    const SequentialDesign d = design_for(n);
    return sequential_power(d, sequential_boundaries(d), effect, sd, PowerModel::estimated_sd);
  };
  SeedPlan plan;
  plan.fixed_seeds = pairs_needed(effect, sd, alpha, power, max_n);
  // Bracket: lo never enough, hi enough (doubling), then bisect, then step down past rounding bumps.
  int lo = 2, hi = 3;
  while (power_at(hi).power < power) {
    if (hi >= max_n) return plan;
    lo = hi;
    hi = std::min(2 * hi, max_n);
  }
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (power_at(mid).power >= power ? hi : lo) = mid;
  }
  while (hi > 3 && power_at(hi - 1).power >= power) --hi;
  const SequentialPower p = power_at(hi);
  plan.max_seeds = hi;
  plan.design = design_for(hi);
  plan.power = p.power;
  plan.expected_seeds = p.expected_seeds;
  plan.inflation = plan.fixed_seeds > 0 ? static_cast<double>(hi) / plan.fixed_seeds
                                      : std::numeric_limits<double>::quiet_NaN();
  return plan;
}

TCalibration calibrate_t_looks(const SequentialDesign& design, int simulations, std::uint64_t seed) {
  validate(design);
  require(simulations >= 1000, "t calibration: needs at least 1000 simulations (got ", simulations, ")");
  const std::vector<double> paths = null_t_paths(design.looks, simulations, seed);
  const auto error_at = [&](double alpha) {
    SequentialDesign d = design;
    d.alpha = alpha;
    return crossing_fraction(paths, sequential_boundaries(d).t);
  };
  TCalibration c;
  c.simulations = simulations;
  c.uncalibrated_type_one_error = error_at(design.alpha);
  c.nominal_alpha = design.alpha;
  c.type_one_error = c.uncalibrated_type_one_error;
  if (c.type_one_error <= design.alpha) return c;  // already at or below α: never raise the level
  // On a fixed sample of paths the error is a non-decreasing step function of the nominal level:
  // bisect for the largest level whose error is <= α (lo: <= α, hi: > α), to 1e-6 α.
  double lo = design.alpha / 2, hi = design.alpha;
  while (error_at(lo) > design.alpha) {
    hi = lo;
    lo /= 2;
    require(lo > 1e-6 * design.alpha, "t calibration: no level keeps the type-I error at ", design.alpha);
  }
  while (hi - lo > 1e-6 * design.alpha) {
    const double mid = 0.5 * (lo + hi);
    (error_at(mid) <= design.alpha ? lo : hi) = mid;
  }
  c.nominal_alpha = lo;
  c.type_one_error = error_at(lo);
  return c;
}

}  // namespace attnres::analysis
