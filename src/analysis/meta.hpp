// Random-effects meta-analysis of independent estimates (docs/experiments.md, "Pooling studies"):
// DerSimonian–Laird's between-study variance τ², REML's as a check, Cochran's Q with its p-value,
// Higgins' I², and the pooled mean with the Hartung–Knapp–Sidik–Jonkman interval. Pure functions.
#pragma once

#include <limits>
#include <span>

namespace attnres::analysis {

// Study i: estimate y_i with within-study variance v_i > 0 (its squared standard error).
//   fixed-effect weights w_i = 1/v_i, ȳ_FE = Σ w_i y_i / Σ w_i
//   Q = Σ w_i (y_i − ȳ_FE)², df = k − 1, p = P(χ²_df ≥ Q)
//   DL: τ² = max(0, (Q − df) / (Σ w_i − Σ w_i² / Σ w_i))
//   I² = max(0, (Q − df) / Q)  (0 when Q = 0)
//   random-effects weights w*_i = 1/(v_i + τ²), μ = Σ w*_i y_i / Σ w*_i, se_DL = 1/√Σ w*_i
//   HKSJ: q = Σ w*_i (y_i − μ)² / df, se_HK = √(q / Σ w*_i), CI μ ± t_{0.975, df} · se_HK
//   The headline uses the modified HKSJ variance max(q, 1) / Σ w*_i, never below the DL one
//   (Knapp & Hartung 2003's ad hoc correction; Röver, Knapp & Friede 2015): with within-study
//   variances estimated from a few seeds the plain HKSJ interval covers less than its level, the
//   modified one keeps it (tests/experiment/test_pool.cpp simulates both).
//   REML: τ² the fixed point of τ² = Σ w*_i² ((y_i − μ)² − v_i) / Σ w*_i² + 1/Σ w*_i, truncated at 0.
// k = 1 is not a meta-analysis: τ², Q, I² and the intervals are NaN, μ is y_1.
struct MetaAnalysis {
  static constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  int k = 0;
  double fixed_mean = kNan, fixed_se = kNan;
  double q = kNan, q_df = kNan, q_p = kNan, i2 = kNan;
  double tau2_dl = kNan, tau2_reml = kNan;
  double mean = kNan;  // the DL random-effects mean
  double se_dl = kNan, dl_ci_low = kNan, dl_ci_high = kNan;  // normal (z) interval: for comparison only
  double hk_q = kNan;                                       // q above: the HKSJ variance scale
  double se_hk = kNan, hk_ci_low = kNan, hk_ci_high = kNan;  // plain HKSJ
  // The headline: the modified HKSJ (variance scale max(q, 1)), t with k − 1 df, and its p-value.
  double se = kNan, ci_low = kNan, ci_high = kNan, t = kNan, p_value = kNan;
};

// y and v of the same length ≥ 1, every v_i > 0 and finite (an Error otherwise); level e.g. 0.95.
MetaAnalysis random_effects_meta(std::span<const double> y, std::span<const double> v, double level = 0.95);

// P(χ²_df ≥ x), df > 0.
double chi_squared_upper_p(double x, double df);

}  // namespace attnres::analysis
