#include "experiment/stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "util/error.hpp"

namespace attnres::experiment {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Continued fraction for I_x(a, b), evaluated with the modified Lentz method; converges quickly
// for x < (a + 1) / (a + b + 2), which the caller guarantees by symmetry.
double beta_continued_fraction(double a, double b, double x) {
  constexpr int kMaxIterations = 10000;
  constexpr double kEps = 1e-16;
  constexpr double kTiny = 1e-300;  // keeps Lentz's denominators away from zero
  const double qab = a + b, qap = a + 1, qam = a - 1;
  double c = 1;
  double d = 1 - qab * x / qap;
  if (std::abs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= kMaxIterations; ++m) {
    const int m2 = 2 * m;
    // Even step of the fraction.
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1 + aa * d;
    if (std::abs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::abs(c) < kTiny) c = kTiny;
    d = 1 / d;
    h *= d * c;
    // Odd step.
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1 + aa * d;
    if (std::abs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::abs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double step = d * c;
    h *= step;
    if (std::abs(step - 1) < kEps) return h;
  }
  fail("incomplete beta: continued fraction did not converge for a=", a, ", b=", b, ", x=", x);
}

// P(T >= t) for t >= 0, computed directly (not as 1 − cdf) to keep precision in the far tail.
double upper_tail(double t, double dof) {
  if (std::isinf(t)) return 0;
  return 0.5 * incomplete_beta(dof / 2, 0.5, dof / (dof + t * t));
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
  if (x == 0 || x == 1) return x;
  const double log_front = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  const double front = std::exp(log_front);
  // Use the symmetry I_x(a,b) = 1 − I_{1−x}(b,a) where the fraction converges fast.
  if (x < (a + 1) / (a + b + 2)) return front * beta_continued_fraction(a, b, x) / a;
  return 1 - front * beta_continued_fraction(b, a, 1 - x) / b;
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
  if (prob < 0.5) return -student_t_quantile(1 - prob, dof);
  // Solve upper_tail(t) = 1 − prob by bisection: the tail is monotone in t, and bisection cannot diverge.
  const double target = 1 - prob;
  double lo = 0, hi = 1;
  while (upper_tail(hi, dof) > target) {
    lo = hi;
    hi *= 2;
    require(hi < 1e300, "Student t quantile: no bracket for p=", prob, ", dof=", dof);
  }
  for (int i = 0; i < 400 && hi - lo > 1e-15 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (upper_tail(mid, dof) > target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
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

double ppl_change(double delta_nll) { return std::expm1(delta_nll); }

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

}  // namespace attnres::experiment
