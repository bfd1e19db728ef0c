// Statistics for the paired protocol (spec §7–§8): Jensen–Shannon divergence between depth-routing
// distributions, Student-t distribution, paired statistics over per-seed differences and their
// power analysis. Pure functions; the distributions come from Boost.Math.
#pragma once

#include <limits>
#include <span>
#include <string>
#include <vector>

namespace attnres::analysis {

// JS(P, Q) = ½ KL(P‖M) + ½ KL(Q‖M), M = ½(P + Q), with 0·log 0 = 0, in nats (max ln 2).
// P and Q must have the same length and non-negative entries; they are used as given (not renormalised).
double js_divergence_nats(std::span<const double> p, std::span<const double> q);

inline constexpr double kLn2 = 0.69314718055994530942;
inline double nats_to_bits(double nats) { return nats / kLn2; }

// Regularised incomplete beta function I_x(a, b), a, b > 0, 0 <= x <= 1.
double incomplete_beta(double a, double b, double x);

// P(T <= t) for Student's t with `dof` > 0 degrees of freedom.
double student_t_cdf(double t, double dof);

// P(|T| >= |t|): the two-sided p-value of a t statistic.
double student_t_two_sided_p(double t, double dof);

// The t with P(T <= t) = prob, 0 < prob < 1 (e.g. prob = 0.975 for a two-sided 95% interval).
double student_t_quantile(double prob, double dof);

// The arithmetic mean; NaN (not available) for none.
double mean_of(std::span<const double> values);

// Paired statistics over per-seed differences d_i = arm − baseline (NLL: negative is better).
// sd is the sample standard deviation (n − 1); the CI is mean ± t_{0.975, n−1} · sd / sqrt(n);
// t and p_value are the two-sided one-sample t-test of mean = 0. With n < 2 sd, CI, t and p are NaN
// (printed "n/a"); with n = 0 the mean is NaN too. When every difference is identical (sd = 0) the
// interval collapses to the mean and t = 0, p = 1 if the mean is 0 (e.g. `rd-tied` reproducing
// `block` bit for bit), else t = ±inf, p = 0.
struct PairedStats {
  int n = 0;
  double mean = 0, sd = 0, ci_low = 0, ci_high = 0, t = 0, p_value = 0;
  int wins = 0;  // differences < 0: seeds where the arm's NLL is below the baseline's
};

PairedStats paired_stats(std::span<const double> differences);

// Holm's step-down adjustment of p-values for a family of tests (Holm 1979): the i-th smallest of
// m becomes max over j <= i of min(1, (m − j + 1)·p_(j)); rejecting where the adjusted p is below
// α keeps the chance of any false rejection in the family at most α, for any dependence between
// the tests. NaN entries are not tests: they stay NaN and do not count in m. Same order as `p`.
std::vector<double> holm_adjusted(std::span<const double> p);

// The median of x and a distribution-free confidence interval for it: order statistics
// x_(j) and x_(n+1-j) with j the largest rank where P(Binomial(n, 1/2) < j) <= (1 - level)/2
// (coverage >= level for any continuous distribution). With few values (n <= 8 at 95%) that
// is the whole range [min, max]. Empty x: all NaN.
struct MedianInterval {
  double median = 0, low = 0, high = 0;
};

MedianInterval median_interval(std::span<const double> x, double level = 0.95);

// Power analysis of the paired two-sided t-test at level alpha over n per-seed differences whose
// standard deviation is sd: a true mean difference `effect` is detected with probability
// P(|T| > t_{1−α/2, n−1}) for T ~ non-central t(n − 1, |effect|·√n / sd). n >= 2, sd > 0.
double paired_t_power(double effect, double sd, int n, double alpha = 0.05);

// The smallest |effect| the test detects with probability `power` (the minimal detectable effect).
double minimal_detectable_effect(double sd, int n, double alpha = 0.05, double power = 0.8);

// The fewest pairs (>= 2) that detect |effect| with probability `power`; 0 when more than max_n
// would be needed (or effect is 0).
int pairs_needed(double effect, double sd, double alpha = 0.05, double power = 0.8, int max_n = 100000);

// The effect the RD-AttnRes paper reports at 120M parameters (spec §8): mean ΔNLL −0.0301 nats.
inline constexpr double kPaperEffectNats = 0.030;
// Fewer seeds than this give no power estimate: the sd of 2 differences has one degree of freedom.
inline constexpr int kMinSeedsForPower = 3;
inline constexpr double kPowerTarget = 0.8;
inline constexpr double kPowerAlpha = 0.05;

// The power analysis of one paired comparison, from its observed per-seed sd, at 80% power and
// two-sided α = 0.05. Not available with fewer than kMinSeedsForPower seeds, or when the
// differences do not vary (sd = 0, e.g. a control that reproduces the baseline); `reason` says which.
struct PowerEstimate {
  bool available = false;
  std::string reason;
  int n = 0;
  double sd = std::numeric_limits<double>::quiet_NaN();
  double mde = std::numeric_limits<double>::quiet_NaN();  // minimal detectable |ΔNLL| with these n seeds
  int seeds_for_paper = 0;  // seeds to detect kPaperEffectNats (0: more than pairs_needed's cap)
  double user_effect = std::numeric_limits<double>::quiet_NaN();  // NaN: none asked for
  int seeds_for_user = 0;
};

PowerEstimate power_estimate(const PairedStats& stats, double user_effect = std::numeric_limits<double>::quiet_NaN());

// Relative perplexity change for an NLL difference (arm − baseline): exp(ΔNLL) − 1.
// Negative is a reduction; the paper's "perplexity reduction" is 1 − exp(−reduction) = −ppl_change(Δ).
double ppl_change(double delta_nll);

}  // namespace attnres::analysis
