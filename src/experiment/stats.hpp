// Statistics for the paired protocol (spec §7–§8): Jensen–Shannon divergence between depth-routing
// distributions, Student-t distribution, and paired statistics over per-seed differences.
// Pure functions; no dependencies beyond the standard library.
#pragma once

#include <span>

namespace attnres::experiment {

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

// The median of x and a distribution-free confidence interval for it: order statistics
// x_(j) and x_(n+1-j) with j the largest rank where P(Binomial(n, 1/2) < j) <= (1 - level)/2
// (coverage >= level for any continuous distribution). With few values (n <= 8 at 95%) that
// is the whole range [min, max]. Empty x: all NaN.
struct MedianInterval {
  double median = 0, low = 0, high = 0;
};

MedianInterval median_interval(std::span<const double> x, double level = 0.95);

// Relative perplexity change for an NLL difference (arm − baseline): exp(ΔNLL) − 1.
// Negative is a reduction; the paper's "perplexity reduction" is 1 − exp(−reduction) = −ppl_change(Δ).
double ppl_change(double delta_nll);

}  // namespace attnres::experiment
