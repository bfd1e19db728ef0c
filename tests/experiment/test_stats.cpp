// JS divergence, Student t distribution and paired statistics against closed forms and tables.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "analysis/stats.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

using V = std::vector<double>;

TEST(JsDivergence, IdenticalIsZero) {
  const V p = {0.1, 0.2, 0.3, 0.4};
  EXPECT_DOUBLE_EQ(js_divergence_nats(p, p), 0.0);
  EXPECT_DOUBLE_EQ(js_divergence_nats(V{1.0}, V{1.0}), 0.0);
}

TEST(JsDivergence, DisjointIsLn2) {
  EXPECT_NEAR(js_divergence_nats(V{1, 0}, V{0, 1}), std::log(2.0), 1e-15);
  // Interleaved supports: GCC 12.2 with AVX-512 (-march=native) miscompiles constant lists like
  // {0.5, 0.5, 0, 0} (upper half zero) into a broadcast of 0.5.
  EXPECT_NEAR(js_divergence_nats(V{0.5, 0, 0.5, 0}, V{0, 0.25, 0, 0.75}), std::log(2.0), 1e-15);
  EXPECT_NEAR(nats_to_bits(js_divergence_nats(V{1, 0}, V{0, 1})), 1.0, 1e-15);
}

TEST(JsDivergence, HandComputed) {
  // M = [0.75, 0.25]; KL(P‖M) = ½ ln(4/3), KL(Q‖M) = ln(4/3): JS = ¾ ln(4/3).
  EXPECT_NEAR(js_divergence_nats(V{0.5, 0.5}, V{1, 0}), 0.75 * std::log(4.0 / 3.0), 1e-15);
  // Symmetric in its arguments.
  const V p = {0.2, 0.5, 0.3}, q = {0.6, 0.1, 0.3};
  EXPECT_DOUBLE_EQ(js_divergence_nats(p, q), js_divergence_nats(q, p));
  double expected = 0;
  for (int i = 0; i < 3; ++i) {
    const double m = (p[i] + q[i]) / 2;
    expected += 0.5 * p[i] * std::log(p[i] / m) + 0.5 * q[i] * std::log(q[i] / m);
  }
  EXPECT_NEAR(js_divergence_nats(p, q), expected, 1e-15);
}

TEST(JsDivergence, RejectsBadInput) {
  EXPECT_THROW(js_divergence_nats(V{0.5, 0.5}, V{1.0}), Error);
  EXPECT_THROW(js_divergence_nats(V{-0.5, 1.5}, V{0.5, 0.5}), Error);
}

TEST(IncompleteBeta, ClosedForms) {
  for (double x : {0.0, 0.1, 0.37, 0.5, 0.93, 1.0}) {
    EXPECT_NEAR(incomplete_beta(1, 1, x), x, 1e-14);
    EXPECT_NEAR(incomplete_beta(3, 1, x), x * x * x, 1e-14);
    EXPECT_NEAR(incomplete_beta(1, 2.5, x), 1 - std::pow(1 - x, 2.5), 1e-14);
  }
  for (double a : {0.5, 2.0, 7.5, 40.0}) EXPECT_NEAR(incomplete_beta(a, a, 0.5), 0.5, 1e-13);
}

TEST(StudentT, QuantilesMatchTables) {
  EXPECT_NEAR(student_t_quantile(0.975, 4), 2.776445, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.975, 2), 4.302653, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.975, 9), 2.262157, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.975, 1), 12.706205, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.995, 4), 4.604095, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.975, 1e6), 1.959966, 1e-5);  // tends to the normal quantile
  EXPECT_NEAR(student_t_quantile(0.025, 4), -2.776445, 1e-6);
  EXPECT_EQ(student_t_quantile(0.5, 3), 0.0);
  EXPECT_THROW(student_t_quantile(1.0, 3), Error);
  EXPECT_THROW(student_t_quantile(0.9, 0), Error);
}

TEST(StudentT, PValuesMatchClosedForms) {
  EXPECT_NEAR(student_t_two_sided_p(2.5, 4), 0.06677, 1e-5);
  EXPECT_NEAR(student_t_two_sided_p(-2.5, 4), 0.06677, 1e-5);
  for (double t : {0.0, 0.3, 1.0, 2.0, 5.0, 40.0}) {
    // dof 1 (Cauchy): p = 1 − (2/π) atan|t|; dof 2: p = 1 − |t| / sqrt(t² + 2).
    EXPECT_NEAR(student_t_two_sided_p(t, 1), 1 - 2 / std::numbers::pi * std::atan(t), 1e-13) << t;
    EXPECT_NEAR(student_t_two_sided_p(t, 2), 1 - t / std::sqrt(t * t + 2), 1e-13) << t;
    EXPECT_NEAR(student_t_cdf(t, 2) + student_t_cdf(-t, 2), 1.0, 1e-14);
  }
  EXPECT_EQ(student_t_two_sided_p(INFINITY, 3), 0.0);
  EXPECT_TRUE(std::isnan(student_t_two_sided_p(NAN, 3)));
  // Quantile and CDF are inverse to each other.
  for (double dof : {1.0, 3.0, 9.0, 30.0})
    for (double p : {0.6, 0.9, 0.975, 0.999}) EXPECT_NEAR(student_t_cdf(student_t_quantile(p, dof), dof), p, 1e-12);
}

TEST(PairedStats, HandComputedFiveSeeds) {
  const V d = {-0.03, -0.02, -0.04, -0.01, -0.05};
  const PairedStats s = paired_stats(d);
  EXPECT_EQ(s.n, 5);
  EXPECT_EQ(s.wins, 5);
  EXPECT_NEAR(s.mean, -0.03, 1e-15);
  EXPECT_NEAR(s.sd, std::sqrt(0.001 / 4), 1e-15);
  EXPECT_NEAR(s.t, -4.242640687, 1e-8);
  EXPECT_NEAR(s.ci_low, -0.0496324316, 1e-8);
  EXPECT_NEAR(s.ci_high, -0.0103675684, 1e-8);
  EXPECT_NEAR(s.p_value, 0.0132355996, 1e-9);  // closed form of the dof-4 CDF
}

TEST(PairedStats, MixedSignsAndWins) {
  const PairedStats s = paired_stats(V{0.02, -0.01, 0.0, -0.03});
  EXPECT_EQ(s.wins, 2);  // strictly negative only; a tie is not a win
  EXPECT_NEAR(s.mean, -0.005, 1e-15);
}

TEST(PairedStats, SmallAndDegenerateSamples) {
  const PairedStats none = paired_stats(V{});
  EXPECT_EQ(none.n, 0);
  EXPECT_TRUE(std::isnan(none.mean));
  const PairedStats one = paired_stats(V{-0.02});
  EXPECT_EQ(one.n, 1);
  EXPECT_EQ(one.wins, 1);
  EXPECT_DOUBLE_EQ(one.mean, -0.02);
  EXPECT_TRUE(std::isnan(one.sd) && std::isnan(one.ci_low) && std::isnan(one.ci_high) && std::isnan(one.p_value));
  // A control that reproduces the baseline bit for bit.
  const PairedStats tied = paired_stats(V{0, 0, 0});
  EXPECT_EQ(tied.t, 0);
  EXPECT_EQ(tied.p_value, 1);
  EXPECT_EQ(tied.ci_low, 0);
  EXPECT_EQ(tied.ci_high, 0);
  const PairedStats constant = paired_stats(V{-0.01, -0.01});
  EXPECT_EQ(constant.p_value, 0);
  EXPECT_TRUE(std::isinf(constant.t) && constant.t < 0);
}

// Reference values: statsmodels 0.13.5 TTestPower (scipy 1.10's non-central t), and independently
// of any non-central t code by integrating the normal CDF (math.erf) over the closed-form
// chi-square density of the t statistic's denominator (scipy.integrate.quad); both agree to 1e-9.
TEST(Power, PairedTPowerMatchesStatsmodels) {
  EXPECT_NEAR(paired_t_power(1.0, 1.0, 5), 0.4013899174, 1e-9);
  EXPECT_NEAR(paired_t_power(2.0, 1.0, 3), 0.4707494313, 1e-9);
  EXPECT_NEAR(paired_t_power(0.5, 1.0, 10), 0.2931756065, 1e-9);
  EXPECT_NEAR(paired_t_power(3.0, 1.0, 2), 0.2607707142, 1e-9);
  // Only the standardised effect |effect| / sd matters.
  EXPECT_NEAR(paired_t_power(-0.02, 0.02, 5), paired_t_power(1.0, 1.0, 5), 1e-12);
  EXPECT_NEAR(paired_t_power(0.0, 1.0, 8), 0.05, 1e-12);  // no effect: the test's level
  EXPECT_THROW(paired_t_power(1.0, 1.0, 1), Error);
  EXPECT_THROW(paired_t_power(1.0, 0.0, 5), Error);
}

// A tiny sd (a twin that barely moved) makes the non-centrality huge; the power is then 1, not a
// Boost rounding error (the pilot of `attnres plan` met it at lr 2e-3).
TEST(Power, AHugeNonCentralityIsPowerOne) {
  EXPECT_NEAR(paired_t_power(0.05, 1e-7, 3), 1.0, 1e-8);
  EXPECT_NEAR(paired_t_power(0.05, 1e-9, 16), 1.0, 1e-12);
  EXPECT_EQ(pairs_needed(0.05, 1e-9), 2);
}

TEST(Power, MinimalDetectableEffectMatchesIndependentIntegration) {
  // Bisection on the integrated power to 1e-10 (statsmodels' solve_power(effect_size=None, nobs=n,
  // alpha=0.05, power=0.8) agrees to 2e-6: its root finder stops earlier).
  EXPECT_NEAR(minimal_detectable_effect(1.0, 3), 3.2640435497, 1e-8);
  EXPECT_NEAR(minimal_detectable_effect(1.0, 4), 2.1279493433, 1e-8);
  EXPECT_NEAR(minimal_detectable_effect(1.0, 5), 1.6819969660, 1e-8);
  EXPECT_NEAR(minimal_detectable_effect(1.0, 8), 1.1560346780, 1e-8);
  EXPECT_NEAR(minimal_detectable_effect(1.0, 10), 0.9960013715, 1e-8);
  EXPECT_NEAR(minimal_detectable_effect(1.0, 20), 0.6604416546, 1e-8);
  // In the data's units: sd 0.01 nats over 5 seeds detects 0.0168 nats.
  EXPECT_NEAR(minimal_detectable_effect(0.01, 5), 0.016819969660, 1e-10);
}

TEST(Power, PairsNeededMatchesStatsmodels) {
  // solve_power(effect_size=d, nobs=None, ...) gives 89.15, 33.37, 9.94, 5.69, 4.22, 3.14 pairs;
  // the fewest whole pairs reaching 80% are their ceilings.
  EXPECT_EQ(pairs_needed(0.3, 1.0), 90);
  EXPECT_EQ(pairs_needed(0.5, 1.0), 34);
  EXPECT_EQ(pairs_needed(1.0, 1.0), 10);
  EXPECT_EQ(pairs_needed(1.5, 1.0), 6);
  EXPECT_EQ(pairs_needed(2.0, 1.0), 5);
  EXPECT_EQ(pairs_needed(3.0, 1.0), 4);
  EXPECT_EQ(pairs_needed(-0.03, 0.01), 4);  // the sign of the effect does not matter
  EXPECT_EQ(pairs_needed(0.0, 1.0), 0);
  EXPECT_EQ(pairs_needed(1e-4, 1.0, 0.05, 0.8, 1000), 0);  // beyond the cap
}

TEST(Power, EstimateFromPairedStats) {
  const PairedStats s = paired_stats(V{-0.03, -0.02, -0.04, -0.01, -0.05});  // sd = 0.0158
  const PowerEstimate p = power_estimate(s, 0.01);
  ASSERT_TRUE(p.available) << p.reason;
  EXPECT_EQ(p.n, 5);
  EXPECT_NEAR(p.mde, 1.6819969660 * std::sqrt(0.001 / 4), 1e-9);
  EXPECT_EQ(p.seeds_for_paper, pairs_needed(kPaperEffectNats, s.sd));
  EXPECT_EQ(p.seeds_for_paper, 5);  // d = 0.03 / 0.0158 = 1.90
  EXPECT_EQ(p.seeds_for_user, pairs_needed(0.01, s.sd));
  EXPECT_EQ(p.seeds_for_user, 22);  // d = 0.632: statsmodels 21.7
  EXPECT_EQ(power_estimate(s).seeds_for_user, 0);  // no user effect asked for

  const PowerEstimate two = power_estimate(paired_stats(V{-0.01, -0.02}));
  EXPECT_FALSE(two.available);
  EXPECT_NE(two.reason.find("at least 3 paired seeds"), std::string::npos) << two.reason;
  EXPECT_TRUE(std::isnan(two.mde));
  const PowerEstimate tied = power_estimate(paired_stats(V{0, 0, 0}));
  EXPECT_FALSE(tied.available);
  EXPECT_NE(tied.reason.find("sd = 0"), std::string::npos) << tied.reason;
}

TEST(PerplexityChange, MatchesThePaper) {
  // RD: mean NLL reduction 0.0301 is a perplexity reduction of 2.97%.
  EXPECT_NEAR(ppl_change(-0.0301), -0.029651506, 1e-9);
  EXPECT_NEAR(ppl_change(0.0), 0.0, 0.0);
}

}  // namespace
}  // namespace attnres::analysis

namespace ex = attnres::analysis;

TEST(MedianInterval, OrderStatisticsOfTheBinomialTable) {
  // 95%: n = 10 -> ranks 2 and 9; n = 40 -> ranks 14 and 27 (standard tables); given unsorted.
  std::vector<double> ten = {10, 3, 7, 1, 9, 2, 8, 4, 6, 5};
  const ex::MedianInterval a = ex::median_interval(ten);
  EXPECT_DOUBLE_EQ(a.median, 5.5);
  EXPECT_DOUBLE_EQ(a.low, 2);
  EXPECT_DOUBLE_EQ(a.high, 9);
  std::vector<double> forty;
  for (int i = 40; i >= 1; --i) forty.push_back(i);
  const ex::MedianInterval b = ex::median_interval(forty);
  EXPECT_DOUBLE_EQ(b.median, 20.5);
  EXPECT_DOUBLE_EQ(b.low, 14);
  EXPECT_DOUBLE_EQ(b.high, 27);
  // A lower level gives a narrower interval.
  const ex::MedianInterval c = ex::median_interval(forty, 0.90);
  EXPECT_GT(c.low, b.low);
  EXPECT_LT(c.high, b.high);
}

TEST(MedianInterval, FewValuesGiveTheRangeAndNoneGiveNaN) {
  std::vector<double> five = {3, 1, 2, 5, 4};
  const ex::MedianInterval a = ex::median_interval(five);
  EXPECT_DOUBLE_EQ(a.median, 3);
  EXPECT_DOUBLE_EQ(a.low, 1);
  EXPECT_DOUBLE_EQ(a.high, 5);
  const ex::MedianInterval e = ex::median_interval(std::vector<double>{});
  EXPECT_TRUE(std::isnan(e.median) && std::isnan(e.low) && std::isnan(e.high));
  EXPECT_THROW(ex::median_interval(five, 1.0), std::exception);
}

// By hand from the definition (R's p.adjust(method = "holm") gives the same): sorted 0.005, 0.01,
// 0.03, 0.04 times 4, 3, 2, 1 are 0.02, 0.03, 0.06, 0.04, and the step-down maximum lifts the last
// to 0.06.
TEST(HolmAdjusted, StepDownByHand) {
  const std::vector<double> p = {0.01, 0.04, 0.03, 0.005};
  const std::vector<double> a = ex::holm_adjusted(p);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_NEAR(a[0], 0.03, 1e-15);
  EXPECT_NEAR(a[1], 0.06, 1e-15);
  EXPECT_NEAR(a[2], 0.06, 1e-15);
  EXPECT_NEAR(a[3], 0.02, 1e-15);
}

TEST(HolmAdjusted, NaNIsNoTestAndValuesStopAtOne) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> with_nan = ex::holm_adjusted(std::vector<double>{nan, 0.5, 0.2});
  EXPECT_TRUE(std::isnan(with_nan[0]));
  EXPECT_NEAR(with_nan[1], 0.5, 1e-15);  // m = 2: 0.2 x 2 = 0.4, then max(0.4, 0.5 x 1)
  EXPECT_NEAR(with_nan[2], 0.4, 1e-15);
  EXPECT_EQ(ex::holm_adjusted(std::vector<double>{0.6, 0.7}), (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(ex::holm_adjusted(std::vector<double>{0.02}), (std::vector<double>{0.02}));  // one test: as it is
  EXPECT_TRUE(ex::holm_adjusted(std::vector<double>{}).empty());
  EXPECT_THROW(ex::holm_adjusted(std::vector<double>{1.5}), attnres::Error);
}

