#include "analysis/sequential.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>

#include <boost/math/distributions/chi_squared.hpp>
#include <boost/math/distributions/non_central_t.hpp>
#include <boost/math/distributions/normal.hpp>
#include <boost/math/distributions/students_t.hpp>
#include <boost/math/tools/roots.hpp>

#include "analysis/stats.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

namespace bm = boost::math;
// Errors are reported by our own checks; Boost must neither throw nor print.
using Policy = bm::policies::policy<bm::policies::domain_error<bm::policies::ignore_error>,
                                    bm::policies::overflow_error<bm::policies::ignore_error>,
                                    bm::policies::evaluation_error<bm::policies::ignore_error>>;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// A z boundary this large is never crossed in practice (P(|Z| >= 40) < 1e-300): "infinite".
constexpr double kZMax = 40;

// Normal tails through erfc, so that 1e-300 stays 1e-300 rather than becoming 1 − 1 = 0.
double upper_tail(double x) { return 0.5 * std::erfc(x / std::numbers::sqrt2); }   // P(Z >= x)
double lower_tail(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }  // P(Z <= x)
double density(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi); }

// z with P(Z >= z) = q, accurate for tiny q (the complement form of the quantile).
double upper_quantile(double q) {
  if (q <= 0) return kInf;
  if (q >= 1) return -kInf;
  return bm::quantile(bm::complement(bm::normal_distribution<double, Policy>(), q));
}

// The sub-density of Z_k on the paths still running after look k (|Z_j| inside the continuation
// region at every look j <= k), on a Simpson grid over that region: g[i] = Simpson weight × density
// at z[i], so Σ g[i] h(z[i]) ≈ ∫ f_k(z) h(z) dz. sqrt_info = √I_k with I_k = n_k (information in units
// of 1/σ² per pair: Z_k = S_k / √I_k with S_k the sum of the standardised differences).
struct Grid {
  std::vector<double> z, g;
  double sqrt_info = 0;
};

// Simpson nodes and weights over [lo, hi]: an even number of intervals, with step at most max_step
// and at least kMinIntervals intervals (a region that has shrunk to a sliver still gets a grid).
constexpr int kMinIntervals = 32;
void simpson(double lo, double hi, double max_step, std::vector<double>& z, std::vector<double>& w) {
  int intervals = std::max(kMinIntervals, static_cast<int>(std::ceil((hi - lo) / max_step)));
  intervals += intervals % 2;
  const double h = (hi - lo) / intervals;
  z.resize(intervals + 1);
  w.resize(intervals + 1);
  for (int i = 0; i <= intervals; ++i) {
    z[i] = lo + h * i;
    w[i] = h / 3 * (i == 0 || i == intervals ? 1 : (i % 2 == 1 ? 4 : 2));
  }
}

// Grid step: ≤ 0.02 on the z-scale, and ≤ 1/16 of the conditional sd of Z between this look and its
// neighbours (√(Δ/I) in the z units of either look), so Simpson's error, O((step/sd)^4), stays near
// 1e-8 for the Gaussian kernels involved, whatever the spacing of the looks.
constexpr double kMaxStep = 0.02, kStepsPerSd = 16, kGridHalfWidth = 12;
double grid_step(std::span<const double> info, std::size_t k) {
  double step = kMaxStep;
  if (k > 0) step = std::min(step, std::sqrt((info[k] - info[k - 1]) / info[k]) / kStepsPerSd);
  if (k + 1 < info.size()) step = std::min(step, std::sqrt((info[k + 1] - info[k]) / info[k]) / kStepsPerSd);
  return step;
}

// The recursion of J&T ch. 19 for Z_k = S_k/√I_k, S_k = S_{k−1} + N(θΔ_k, Δ_k), Δ_k = I_k − I_{k−1}:
// given the grid of look k−1 (or none for k = 0), the probability of crossing look k's upper boundary
// `hi` (Z_k >= hi) and lower boundary `lo` (Z_k <= lo) without having stopped before.
struct Crossing {
  double upper = 0, lower = 0;
};

class Recursion {
 public:
  Recursion(std::span<const double> info, double theta) : info_(info.begin(), info.end()), theta_(theta) {}

  // Crossing probabilities at look k for boundaries lo < hi, given the grid of look k − 1.
  Crossing crossing(std::size_t k, double lo, double hi) const {
    const double mean_shift = theta_ * std::sqrt(info_[k]);  // E Z_k
    if (k == 0) return {upper_tail(hi - mean_shift), lower_tail(lo - mean_shift)};
    const double delta = info_[k] - info_[k - 1], sd = std::sqrt(delta), sqrt_info = std::sqrt(info_[k]);
    Crossing c;
    for (std::size_t j = 0; j < prev_.z.size(); ++j) {
      // S_k − S_{k−1} ~ N(θΔ, Δ) given Z_{k−1} = z_j, i.e. S_{k−1} = z_j √I_{k−1}.
      const double s = prev_.z[j] * prev_.sqrt_info + theta_ * delta;
      c.upper += prev_.g[j] * upper_tail((hi * sqrt_info - s) / sd);
      c.lower += prev_.g[j] * lower_tail((lo * sqrt_info - s) / sd);
    }
    return c;
  }

  // Moves to look k with continuation region (lo, hi): the sub-density of Z_k on the grid.
  void advance(std::size_t k, double lo, double hi) {
    Grid next;
    next.sqrt_info = std::sqrt(info_[k]);
    // Z_k ~ N(θ√I_k, 1) marginally and the sub-density is below the marginal one, so beyond 12 sd of
    // the mean it holds less than 1e-32: the grid stops there (an "infinite" boundary of 40 would
    // otherwise cost a 4000-point grid).
    const double mean = theta_ * next.sqrt_info;
    lo = std::max(lo, mean - kGridHalfWidth);
    hi = std::min(hi, mean + kGridHalfWidth);
    std::vector<double> w;
    if (hi > lo) simpson(lo, hi, grid_step(info_, k), next.z, w);
    next.g.assign(next.z.size(), 0.0);
    if (k == 0) {
      for (std::size_t i = 0; i < next.z.size(); ++i) next.g[i] = w[i] * density(next.z[i] - mean);
    } else {
      // f_k(z) = ∫ f_{k−1}(u) √I_k/√Δ φ((z√I_k − u√I_{k−1} − θΔ)/√Δ) du (change of variables S → Z).
      const double delta = info_[k] - info_[k - 1], sd = std::sqrt(delta), jacobian = next.sqrt_info / sd;
      for (std::size_t i = 0; i < next.z.size(); ++i) {
        double f = 0;
        for (std::size_t j = 0; j < prev_.z.size(); ++j)
          f += prev_.g[j] * density((next.z[i] * next.sqrt_info - prev_.z[j] * prev_.sqrt_info - theta_ * delta) / sd);
        next.g[i] = w[i] * jacobian * f;
      }
    }
    prev_ = std::move(next);
  }

 private:
  std::vector<double> info_;
  double theta_;
  Grid prev_;
};

// Solves for the symmetric z boundaries of looks 0..last under H0 (θ = 0).
std::vector<double> z_boundaries(std::span<const double> info, std::span<const double> spent, std::size_t last) {
  Recursion rec(info, 0.0);
  std::vector<double> c(last + 1);
  double previous = 0;
  for (std::size_t k = 0; k <= last; ++k) {
    const double target = spent[k] - previous;
    previous = spent[k];
    const auto cross = [&](double x) {
      const Crossing p = rec.crossing(k, -x, x);
      return p.upper + p.lower;
    };
    if (target <= 0 || cross(kZMax) >= target) {
      c[k] = kZMax;  // nothing (or less than the far tail) to spend: never stop here
    } else if (cross(0.0) <= target) {
      c[k] = 0;  // the increment is at least all that is still running: every path stops
    } else {
      // cross(x) falls from > target at 0 to < target at kZMax; bisect-like TOMS 748 to ~1e-12.
      const auto gap = [&](double x) { return cross(x) - target; };
      bm::tools::eps_tolerance<double> tolerance(40);
      std::uintmax_t iterations = 200;
      const auto [a, b] = bm::tools::toms748_solve(gap, 0.0, kZMax, tolerance, iterations);
      c[k] = 0.5 * (a + b);
    }
    if (k < last) rec.advance(k, -c[k], c[k]);
  }
  return c;
}

std::vector<double> information(const SequentialDesign& design) { return {design.looks.begin(), design.looks.end()}; }

std::vector<double> spending_at_looks(const SequentialDesign& design, double alpha) {
  std::vector<double> spent;
  const double max_n = design.looks.back();
  for (int n : design.looks) spent.push_back(spent_alpha(design.spending, alpha, n / max_n));
  spent.back() = alpha;  // exactly, whatever the rounding of the formula at t = 1
  return spent;
}

// The t boundary with the nominal level of z boundary c: t_{1 − p/2, dof}, p/2 = P(Z >= c).
double t_boundary(double c, double dof) {
  const double half_p = upper_tail(c);
  if (c >= kZMax || half_p <= 0) return kInf;
  if (half_p >= 0.5) return 0;
  return bm::quantile(bm::complement(bm::students_t_distribution<double, Policy>(dof), half_p));
}

}  // namespace

Spending parse_spending(std::string_view name) {
  if (name == "obrien-fleming") return Spending::obrien_fleming;
  if (name == "pocock") return Spending::pocock;
  fail("unknown spending function '", name, "' (choose obrien-fleming or pocock)");
}

std::string spending_name(Spending spending) {
  return spending == Spending::obrien_fleming ? "obrien-fleming" : "pocock";
}

double spent_alpha(Spending spending, double alpha, double t) {
  require(alpha > 0 && alpha <= 1, "spending: alpha must lie in (0, 1] (got ", alpha, ")");
  require(t >= 0 && t <= 1, "spending: the information fraction must lie in [0, 1] (got ", t, ")");
  if (t == 0) return 0;
  if (spending == Spending::pocock) return alpha * std::log1p((std::numbers::e - 1) * t);
  // O'Brien–Fleming type, per side at α/2: 2 − 2Φ(z_{1−α/4}/√t) each, so 4 P(Z >= z_{1−α/4}/√t) in all.
  return 4 * upper_tail(upper_quantile(alpha / 4) / std::sqrt(t));
}

void validate(const SequentialDesign& d) {
  require(!d.looks.empty(), "sequential design: no looks");
  require(d.looks.front() >= 2, "sequential design: the first look needs at least 2 seeds (got ", d.looks.front(), ")");
  for (std::size_t k = 1; k < d.looks.size(); ++k)
    require(d.looks[k] > d.looks[k - 1], "sequential design: looks must be strictly increasing (", d.looks[k - 1],
            " then ", d.looks[k], ")");
  require(d.alpha > 0 && d.alpha < 1, "sequential design: alpha must lie in (0, 1) (got ", d.alpha, ")");
}

SequentialBoundaries sequential_boundaries(const SequentialDesign& design) {
  validate(design);
  SequentialBoundaries b;
  const double max_n = design.looks.back();
  for (int n : design.looks) b.fraction.push_back(n / max_n);
  b.spent = spending_at_looks(design, design.alpha);
  const std::vector<double> info = information(design);
  b.z = z_boundaries(info, b.spent, design.looks.size() - 1);
  for (std::size_t k = 0; k < b.z.size(); ++k) {
    b.nominal_p.push_back(2 * upper_tail(b.z[k]));
    b.t.push_back(t_boundary(b.z[k], design.looks[k] - 1));
  }
  return b;
}

LookResult analyse_look(const SequentialDesign& design, const SequentialBoundaries& bounds, int look,
                        std::span<const double> differences) {
  require(look >= 0 && look < static_cast<int>(design.looks.size()), "sequential look ", look, " out of range");
  require(bounds.t.size() == design.looks.size(), "sequential look: boundaries of another design");
  LookResult r;
  r.look = look;
  r.n = design.looks[look];
  require(static_cast<int>(differences.size()) >= r.n, "sequential look ", look, " needs ", r.n, " differences (have ",
          differences.size(), ")");
  // The paired statistics of the first n differences (as paired_stats, without its 95% CI and p).
  double sum = 0;
  for (int i = 0; i < r.n; ++i) {
    require(std::isfinite(differences[i]), "sequential look: difference ", i, " is not finite (", differences[i], ")");
    sum += differences[i];
  }
  r.mean = sum / r.n;
  double ss = 0;
  for (int i = 0; i < r.n; ++i) ss += (differences[i] - r.mean) * (differences[i] - r.mean);
  r.sd = std::sqrt(ss / (r.n - 1));
  r.se = r.sd / std::sqrt(static_cast<double>(r.n));
  r.t = r.se > 0 ? r.mean / r.se : (r.mean == 0 ? 0.0 : std::copysign(kInf, r.mean));
  r.t_boundary = bounds.t[look];
  r.nominal_p = bounds.nominal_p[look];
  if (r.se == 0) {
    // No spread: the interval is the mean itself (an infinite boundary does not widen it).
    r.ci_low = r.ci_high = r.mean;
  } else {
    r.ci_low = r.mean - r.t_boundary * r.se;
    r.ci_high = r.mean + r.t_boundary * r.se;
  }
  r.crossed = r.ci_low > 0 || r.ci_high < 0;
  return r;
}

double repeated_p_value(const SequentialDesign& design, int look, double t_statistic) {
  validate(design);
  require(look >= 0 && look < static_cast<int>(design.looks.size()), "sequential look ", look, " out of range");
  if (std::isnan(t_statistic)) return kNaN;
  const double dof = design.looks[look] - 1;
  // The RCI at level α' excludes 0 iff |t| >= t_{1 − p_k(α')/2} iff the observed two-sided t p-value
  // is <= p_k(α') iff z_obs >= c_k(α'), z_obs the normal quantile of the same tail probability.
  const double half_p =
      std::isinf(t_statistic)
          ? 0.0
          : bm::cdf(bm::complement(bm::students_t_distribution<double, Policy>(dof), std::abs(t_statistic)));
  const double z_obs = upper_quantile(half_p);
  const std::vector<double> info = information(design);
  const auto boundary = [&](double alpha) {
    return z_boundaries(info, spending_at_looks(design, alpha), static_cast<std::size_t>(look))[look];
  };
  // c_k(α') falls as α' grows; bisect on log α' for the α' where it reaches z_obs.
  constexpr double kFloor = 1e-10;
  if (boundary(1.0) > z_obs) return 1.0;
  if (boundary(kFloor) <= z_obs) return kFloor;
  double lo = std::log(kFloor), hi = 0;  // boundary(e^lo) > z_obs >= boundary(e^hi)
  while (hi - lo > 1e-4) {
    const double mid = 0.5 * (lo + hi);
    (boundary(std::exp(mid)) > z_obs ? lo : hi) = mid;
  }
  return std::exp(hi);
}

std::string outcome_name(Outcome outcome) {
  switch (outcome) {
    case Outcome::continuing:
      return "continuing";
    case Outcome::resolved:
      return "resolved";
    case Outcome::futile:
      return "futile";
    case Outcome::not_resolved:
      return "not resolved";
  }
  return "?";
}

Decision decide(const SequentialDesign& design, const SequentialBoundaries& bounds, std::span<const double> differences,
                double effect_of_interest) {
  require(effect_of_interest > 0 && std::isfinite(effect_of_interest),
          "sequential decision: the effect of interest must be positive (got ", effect_of_interest, ")");
  Decision d;
  const int looks = static_cast<int>(design.looks.size());
  for (int k = 0; k < looks; ++k) {
    if (design.looks[k] > static_cast<int>(differences.size())) {
      d.next_seeds = design.looks[k];
      return d;  // continuing: waiting for the seeds of look k
    }
    d.looks.push_back(analyse_look(design, bounds, k, differences));
    const LookResult& r = d.looks.back();
    d.look = k;
    if (r.crossed) {
      d.outcome = Outcome::resolved;
      return d;
    }
    if (r.ci_low > -effect_of_interest && r.ci_high < effect_of_interest) {
      d.outcome = Outcome::futile;
      return d;
    }
  }
  d.outcome = Outcome::not_resolved;
  return d;
}

Decision decide(const SequentialDesign& design, std::span<const double> differences, double effect_of_interest) {
  return decide(design, sequential_boundaries(design), differences, effect_of_interest);
}

double sd_upper_confidence_limit(double sd, int n, double level) {
  require(n >= 2, "sd upper limit: needs at least 2 values (got ", n, ")");
  return sd_upper_confidence_limit_dof(sd, n - 1, level);
}

double sd_upper_confidence_limit_dof(double sd, double dof, double level) {
  require(dof > 0 && std::isfinite(dof), "sd upper limit: needs positive degrees of freedom (got ", dof, ")");
  require(sd >= 0 && std::isfinite(sd), "sd upper limit: the sd must be finite and non-negative (got ", sd, ")");
  require(level > 0 && level < 1, "sd upper limit: level must lie in (0, 1) (got ", level, ")");
  // dof s² / σ² ~ χ²_dof: P(σ <= s √(dof/χ²_{1−level})) = P(χ² >= χ²_{1−level}) = level.
  const double q = bm::quantile(bm::chi_squared_distribution<double, Policy>(dof), 1 - level);
  return sd * std::sqrt(dof / q);
}

SequentialPower sequential_power(const SequentialDesign& design, const SequentialBoundaries& bounds, double effect,
                                 double sd, PowerModel model) {
  validate(design);
  require(bounds.z.size() == design.looks.size(), "sequential power: boundaries of another design");
  require(sd > 0 && std::isfinite(sd), "sequential power: the sd must be positive and finite (got ", sd, ")");
  require(std::isfinite(effect), "sequential power: the effect must be finite");
  const double theta = std::abs(effect) / sd;
  const std::vector<double> info = information(design);
  Recursion rec(info, theta);
  SequentialPower p;
  double stopped = 0, expected = 0;
  for (std::size_t k = 0; k < design.looks.size(); ++k) {
    double lo = -bounds.z[k], hi = bounds.z[k];
    if (model == PowerModel::estimated_sd && theta > 0) {
      // Match the marginal crossing probabilities of look k to the non-central t ones:
      // P(Z_k >= hi) = P(T_k >= t_k), P(Z_k <= lo) = P(T_k <= −t_k), Z_k ~ N(θ√n_k, 1).
      const double shift = theta * std::sqrt(info[k]), b = bounds.t[k], dof = design.looks[k] - 1;
      if (std::isinf(b)) {
        lo = -kZMax, hi = kZMax;
      } else if (shift > 1e4) {
        // Boost's non-central t overflows an int beyond a shift of ~6.5e4 (stats.cpp); at 1e4 both
        // models cross at the first look with probability 1 to within 1e-8: keep the z boundaries.
      } else {
        const bm::non_central_t_distribution<double, Policy> t(dof, shift);
        hi = std::min(kZMax, shift + upper_quantile(bm::cdf(bm::complement(t, b))));
        lo = std::max(-kZMax, shift - upper_quantile(bm::cdf(t, -b)));
      }
    }
    const Crossing c = rec.crossing(k, lo, hi);
    p.crossing.push_back(c.upper + c.lower);
    stopped += p.crossing.back();
    expected += design.looks[k] * p.crossing.back();
    if (k + 1 < design.looks.size()) rec.advance(k, lo, hi);
  }
  p.power = std::min(1.0, stopped);
  p.expected_seeds = expected + design.looks.back() * std::max(0.0, 1 - stopped);
  return p;
}

double sequential_power(const SequentialDesign& design, double effect, double sd, PowerModel model) {
  return sequential_power(design, sequential_boundaries(design), effect, sd, model).power;
}

}  // namespace attnres::analysis
