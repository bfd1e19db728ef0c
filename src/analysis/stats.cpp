#include "analysis/stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <boost/math/distributions/non_central_t.hpp>
#include <boost/math/distributions/students_t.hpp>
#include <boost/math/special_functions/beta.hpp>
#include <boost/math/tools/roots.hpp>

#include "util/error.hpp"

namespace attnres::analysis {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

namespace bm = boost::math;
// Errors are reported by the callers' own checks; Boost must neither throw nor print.
using Policy = bm::policies::policy<bm::policies::domain_error<bm::policies::ignore_error>,
                                    bm::policies::overflow_error<bm::policies::ignore_error>,
                                    bm::policies::evaluation_error<bm::policies::ignore_error>>;

// P(T >= t) for t >= 0 (the complement, not 1 − cdf, keeps precision in the far tail).
double upper_tail(double t, double dof) {
  if (std::isinf(t)) return 0;
  return bm::cdf(bm::complement(bm::students_t_distribution<double, Policy>(dof), t));
}

}  // namespace

double js_divergence_nats(std::span<const double> p, std::span<const double> q) {
  require(p.size() == q.size(), "JS divergence: distributions of different lengths (", p.size(), " and ", q.size(),
          ")");
  double js = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    require(p[i] >= 0 && q[i] >= 0, "JS divergence: negative or NaN probability at index ", i);
    const double m = 0.5 * (p[i] + q[i]);
    // 0·log 0 = 0; when m > 0 at least one term is a proper log.
    if (p[i] > 0) js += 0.5 * p[i] * std::log(p[i] / m);
    if (q[i] > 0) js += 0.5 * q[i] * std::log(q[i] / m);
  }
  return js;
}

double incomplete_beta(double a, double b, double x) {
  require(a > 0 && b > 0, "incomplete beta: a and b must be positive (a=", a, ", b=", b, ")");
  if (std::isnan(x)) return kNaN;
  require(x >= 0 && x <= 1, "incomplete beta: x must lie in [0, 1] (x=", x, ")");
  return bm::ibeta(a, b, x, Policy());
}

double student_t_cdf(double t, double dof) {
  require(dof > 0, "Student t: degrees of freedom must be positive (", dof, ")");
  if (std::isnan(t)) return kNaN;
  const double tail = upper_tail(std::abs(t), dof);
  return t >= 0 ? 1 - tail : tail;
}

double student_t_two_sided_p(double t, double dof) {
  require(dof > 0, "Student t: degrees of freedom must be positive (", dof, ")");
  if (std::isnan(t)) return kNaN;
  return std::min(1.0, 2 * upper_tail(std::abs(t), dof));
}

double student_t_quantile(double prob, double dof) {
  require(dof > 0, "Student t: degrees of freedom must be positive (", dof, ")");
  require(prob > 0 && prob < 1, "Student t quantile: probability must lie in (0, 1) (", prob, ")");
  if (prob == 0.5) return 0;
  return bm::quantile(bm::students_t_distribution<double, Policy>(dof), prob);
}

double mean_of(std::span<const double> values) {
  if (values.empty()) return kNaN;
  double sum = 0;
  for (double x : values) sum += x;
  return sum / static_cast<double>(values.size());
}

PairedStats paired_stats(std::span<const double> differences) {
  PairedStats s;
  s.n = static_cast<int>(differences.size());
  s.mean = s.sd = s.ci_low = s.ci_high = s.t = s.p_value = kNaN;
  if (s.n == 0) return s;
  double sum = 0;
  for (double d : differences) {
    sum += d;
    if (d < 0) ++s.wins;
  }
  s.mean = sum / s.n;
  if (s.n < 2) return s;
  double ss = 0;
  for (double d : differences) ss += (d - s.mean) * (d - s.mean);
  s.sd = std::sqrt(ss / (s.n - 1));
  const double dof = s.n - 1;
  const double se = s.sd / std::sqrt(static_cast<double>(s.n));
  const double half = student_t_quantile(0.975, dof) * se;
  s.ci_low = s.mean - half;
  s.ci_high = s.mean + half;
  if (se == 0) {
    // Identical differences: no sampling spread, so the test is degenerate; see the header.
    s.t = s.mean == 0 ? 0 : std::copysign(kInf, s.mean);
    s.p_value = s.mean == 0 ? 1 : 0;
  } else {
    s.t = s.mean / se;
    s.p_value = student_t_two_sided_p(s.t, dof);
  }
  return s;
}

double paired_t_power(double effect, double sd, int n, double alpha) {
  require(n >= 2, "power: needs at least 2 pairs (got ", n, ")");
  require(sd > 0 && std::isfinite(sd), "power: the standard deviation must be positive and finite (got ", sd, ")");
  require(alpha > 0 && alpha < 1, "power: alpha must lie in (0, 1) (got ", alpha, ")");
  const double dof = n - 1;
  const double critical = student_t_quantile(1 - alpha / 2, dof);
  // Boost's series starts at an index near shift²/2, an int: a shift beyond ~6.5e4 (a tiny sd, e.g.
  // a twin that barely moved) overflows it. At 1e4 the power is 1 to within (critical/1e4)^dof,
  // below 1e-8 for every level and dof here.
  const double shift = std::min(std::abs(effect) * std::sqrt(static_cast<double>(n)) / sd, 1e4);
  const bm::non_central_t_distribution<double, Policy> t(dof, shift);
  return bm::cdf(bm::complement(t, critical)) + bm::cdf(t, -critical);
}

double minimal_detectable_effect(double sd, int n, double alpha, double power) {
  require(power > alpha && power < 1, "power: the target power must lie in (alpha, 1) (got ", power, ")");
  // The power grows with the effect; bracket the root, then bisect on the standardised effect.
  const auto gap = [&](double z) { return paired_t_power(z, 1.0, n, alpha) - power; };
  double lo = 0, hi = 1;
  while (gap(hi) < 0) {
    lo = hi;
    hi *= 2;
    require(hi < 1e12, "power: no minimal detectable effect found for n=", n);
  }
  bm::tools::eps_tolerance<double> tolerance(50);
  std::uintmax_t iterations = 200;
  const auto [a, b] = bm::tools::toms748_solve(gap, lo, hi, tolerance, iterations);
  return 0.5 * (a + b) * sd;
}

int pairs_needed(double effect, double sd, double alpha, double power, int max_n) {
  require(max_n >= 2, "power: max_n must be at least 2");
  if (effect == 0) return 0;
  const auto enough = [&](int n) { return paired_t_power(effect, sd, n, alpha) >= power; };
  if (enough(2)) return 2;
  // The power grows with n: double until enough, then bisect (lo never enough, hi enough).
  int lo = 2, hi = 4;
  while (!enough(hi)) {
    if (hi >= max_n) return 0;
    lo = hi;
    hi = std::min(2 * hi, max_n);
  }
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (enough(mid) ? hi : lo) = mid;
  }
  return hi;
}

PowerEstimate power_estimate(const PairedStats& s, double user_effect) {
  PowerEstimate p;
  p.n = s.n;
  p.sd = s.sd;
  p.user_effect = user_effect;
  if (s.n < kMinSeedsForPower) {
    p.reason = "needs at least " + std::to_string(kMinSeedsForPower) + " paired seeds for a usable spread (have " +
               std::to_string(s.n) + ")";
    return p;
  }
  if (!(s.sd > 0)) {
    p.reason = "the paired differences do not vary (sd = 0): the arm reproduces the baseline";
    return p;
  }
  p.available = true;
  p.mde = minimal_detectable_effect(s.sd, s.n, kPowerAlpha, kPowerTarget);
  p.seeds_for_paper = pairs_needed(kPaperEffectNats, s.sd, kPowerAlpha, kPowerTarget);
  if (std::isfinite(user_effect) && user_effect != 0)
    p.seeds_for_user = pairs_needed(user_effect, s.sd, kPowerAlpha, kPowerTarget);
  return p;
}

double ppl_change(double delta_nll) { return std::expm1(delta_nll); }

std::vector<double> holm_adjusted(std::span<const double> p) {
  std::vector<std::size_t> order;  // the tests, smallest p first
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (std::isnan(p[i])) continue;
    require(p[i] >= 0 && p[i] <= 1, "holm_adjusted: a p-value must be in [0, 1], got ", p[i]);
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return p[a] < p[b]; });
  std::vector<double> adjusted(p.begin(), p.end());
  const std::size_t m = order.size();
  double running = 0;  // the step-down maximum keeps the adjusted values in the order of the raw ones
  for (std::size_t k = 0; k < m; ++k) {
    running = std::max(running, std::min(1.0, static_cast<double>(m - k) * p[order[k]]));
    adjusted[order[k]] = running;
  }
  return adjusted;
}

MedianInterval median_interval(std::span<const double> x, double level) {
  require(level > 0 && level < 1, "median_interval: level must be in (0, 1), got ", level);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (x.empty()) return {nan, nan, nan};
  std::vector<double> v(x.begin(), x.end());
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  MedianInterval m;
  m.median = n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  // P(B < j) for B ~ Binomial(n, 1/2), accumulated term by term in log space (no overflow).
  const double tail = (1 - level) / 2, log_half_n = static_cast<double>(n) * std::log(0.5);
  std::size_t j = 0;  // the largest rank (1-based) with P(B < j) <= tail; 0: none
  double below = 0;   // P(B < j + 1) = P(B <= j)
  for (std::size_t i = 0; i <= n / 2; ++i) {
    const double log_choose = std::lgamma(double(n) + 1) - std::lgamma(double(i) + 1) - std::lgamma(double(n - i) + 1);
    below += std::exp(log_choose + log_half_n);  // now P(B <= i) = P(B < i + 1)
    if (below > tail) break;
    j = i + 1;
  }
  m.low = j == 0 ? v.front() : v[j - 1];
  m.high = j == 0 ? v.back() : v[n - j];
  return m;
}

}  // namespace attnres::analysis
