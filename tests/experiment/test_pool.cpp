// Pooling studies (issue #46 item 6): the random-effects meta-analysis (analysis/meta.hpp) against
// published and hand-computed values and by simulation, the designs `attnres report --pool` reads
// from experiment directories (experiment/pool.hpp), pool.json's schema and the renderings.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "analysis/meta.hpp"
#include "analysis/pool_report.hpp"
#include "analysis/stats.hpp"
#include "experiment/pool.hpp"
#include "experiment/pool_fixture.hpp"
#include "results/pool.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"

namespace attnres {
namespace {

using analysis::MetaAnalysis;
using analysis::random_effects_meta;

// metafor's dat.bcg (Colditz et al. 1994, 13 BCG vaccine trials): tpos, tneg, cpos, cneg.
constexpr double kBcg[13][4] = {{4, 119, 11, 128},     {6, 300, 29, 274},       {3, 228, 11, 209},
                                {62, 13536, 248, 12619}, {33, 5036, 47, 5761},   {180, 1361, 372, 1079},
                                {8, 2537, 10, 619},     {505, 87886, 499, 87892}, {29, 7470, 45, 7232},
                                {17, 1699, 65, 1600},   {186, 50448, 141, 27197}, {5, 2493, 3, 2338},
                                {27, 16886, 29, 17825}};

// The log risk ratios and their variances (metafor's escalc(measure = "RR")).
void bcg(std::vector<double>& y, std::vector<double>& v) {
  for (const auto& t : kBcg) {
    y.push_back(std::log((t[0] / (t[0] + t[1])) / (t[2] / (t[2] + t[3]))));
    v.push_back(1 / t[0] - 1 / (t[0] + t[1]) + 1 / t[2] - 1 / (t[2] + t[3]));
  }
}

// metafor's documented results for dat.bcg: rma(yi, vi, method = "DL") gives τ² = 0.3088, Q(12) =
// 152.2330, I² = 92.12%, estimate −0.7141 (se 0.1787, CI −1.0644 to −0.3638); method = "REML" gives
// τ² = 0.3132; test = "knha" with REML gives se 0.1808, CI −1.1084 to −0.3206. The digits below
// (beyond those) are from an independent computation of the same formulas in Python's math
// module (DL, the REML fixed point, HKSJ with t(0.975, 12) = 2.178812829667228):
//   FE −0.430285, Q 152.233008, τ²_DL 0.308760, I² 0.921173, μ −0.714117, se_DL 0.178742,
//   z-CI [−1.064445, −0.363789], q 1.021990, se_HK 0.180697, HK CI [−1.107821, −0.320413],
//   τ²_REML 0.313243 (μ −0.714532, HKSJ se 0.180792, CI [−1.108444, −0.320621]).
TEST(Meta, BcgTrialsMatchMetafor) {
  std::vector<double> y, v;
  bcg(y, v);
  const MetaAnalysis m = random_effects_meta(y, v);
  EXPECT_EQ(m.k, 13);
  EXPECT_NEAR(m.fixed_mean, -0.430285, 1e-6);
  EXPECT_NEAR(m.q, 152.233008, 1e-5);
  EXPECT_EQ(m.q_df, 12);
  EXPECT_LT(m.q_p, 1e-20);
  EXPECT_NEAR(m.tau2_dl, 0.308760, 1e-6);
  EXPECT_NEAR(m.i2, 0.921173, 1e-6);
  EXPECT_NEAR(m.mean, -0.714117, 1e-6);
  EXPECT_NEAR(m.se_dl, 0.178742, 1e-6);
  EXPECT_NEAR(m.dl_ci_low, -1.064445, 1e-6);
  EXPECT_NEAR(m.dl_ci_high, -0.363789, 1e-6);
  EXPECT_NEAR(m.hk_q, 1.021990, 1e-6);
  EXPECT_NEAR(m.se_hk, 0.180697, 1e-6);
  EXPECT_NEAR(m.hk_ci_low, -1.107821, 1e-6);
  EXPECT_NEAR(m.hk_ci_high, -0.320413, 1e-6);
  // q > 1: the modified interval is the plain one.
  EXPECT_DOUBLE_EQ(m.se, m.se_hk);
  EXPECT_DOUBLE_EQ(m.ci_low, m.hk_ci_low);
  EXPECT_NEAR(m.t, -0.714117 / 0.180697, 1e-4);
  EXPECT_NEAR(m.p_value, analysis::student_t_two_sided_p(m.t, 12), 1e-15);
  EXPECT_NEAR(m.tau2_reml, 0.313243, 1e-6);
}

// Three homogeneous estimates, by hand: w = 100, 50, 100, ȳ = 35/250 = 0.14, Q = 0.16 + 0.18 + 0.01
// = 0.35 < df = 2, so τ² = 0 (DL and REML), I² = 0, p(Q) = exp(−0.35/2) = 0.839457 (χ² with 2 df);
// q = 0.175 < 1: plain HKSJ se √(0.175/250) = 0.0264575 (CI 0.14 ± 4.302653·0.0264575 =
// ±0.113837), modified se √(1/250) = 0.0632456 (±0.272124), the DL variance.
TEST(Meta, HomogeneousByHand) {
  const std::vector<double> y = {0.10, 0.20, 0.15}, v = {0.01, 0.02, 0.01};
  const MetaAnalysis m = random_effects_meta(y, v);
  EXPECT_NEAR(m.fixed_mean, 0.14, 1e-15);
  EXPECT_NEAR(m.q, 0.35, 1e-14);
  EXPECT_NEAR(m.q_p, 0.8394570207692074, 1e-12);
  EXPECT_EQ(m.tau2_dl, 0);
  EXPECT_EQ(m.tau2_reml, 0);
  EXPECT_EQ(m.i2, 0);
  EXPECT_NEAR(m.mean, 0.14, 1e-15);
  EXPECT_NEAR(m.hk_q, 0.175, 1e-14);
  EXPECT_NEAR(m.se_hk, 0.0264575131, 1e-9);
  EXPECT_NEAR(m.hk_ci_high - m.mean, 0.11383749100790282, 1e-9);
  EXPECT_NEAR(m.se, std::sqrt(1.0 / 250), 1e-15);
  EXPECT_NEAR(m.se, m.se_dl, 1e-15);
  EXPECT_NEAR(m.ci_high - m.mean, 0.27212365213498446, 1e-9);
  EXPECT_NEAR(m.ci_low, 0.14 - 0.27212365213498446, 1e-9);
  // χ² upper tail: the 95% point of χ² with 12 df is 21.02607.
  EXPECT_NEAR(analysis::chi_squared_upper_p(21.02607, 12), 0.05, 1e-6);
}

TEST(Meta, OneStudyIsNotAMetaAnalysis) {
  const std::vector<double> y = {-0.02}, v = {1e-4};
  const MetaAnalysis m = random_effects_meta(y, v);
  EXPECT_EQ(m.k, 1);
  EXPECT_EQ(m.mean, -0.02);
  EXPECT_TRUE(std::isnan(m.tau2_dl));
  EXPECT_TRUE(std::isnan(m.ci_low));
  EXPECT_TRUE(std::isnan(m.q));
}

TEST(Meta, RefusesBadInput) {
  const std::vector<double> y = {0.1, 0.2}, zero = {0.01, 0}, one = {0.01};
  EXPECT_THROW(random_effects_meta(y, zero), Error);
  EXPECT_THROW(random_effects_meta(y, one), Error);
  EXPECT_THROW(random_effects_meta({}, {}), Error);
}

struct Coverage {
  double headline = 0, plain_hk = 0, dl_normal = 0;
};

// k = 5…8 studies, each n ∈ {3, 5, 8, 13} seeds of per-seed sd U(0.01, 0.05) around its own true
// effect μ + τ·z; each study's variance is estimated from its seeds (s²/n), as in the real designs.
Coverage simulate_coverage(double tau, int reps, std::uint64_t seed) {
  Rng rng(seed, "pool-coverage");
  const double mu = 0.01;
  const int ns[] = {3, 5, 8, 13};
  int headline = 0, plain = 0, dl = 0;
  std::vector<double> y, v, d;
  for (int r = 0; r < reps; ++r) {
    const int k = 5 + static_cast<int>(rng.below(4));
    y.clear();
    v.clear();
    for (int i = 0; i < k; ++i) {
      const int n = ns[rng.below(4)];
      const double sd = 0.01 + 0.04 * rng.uniform();
      const double theta = mu + tau * rng.normal();
      d.clear();
      for (int j = 0; j < n; ++j) d.push_back(theta + sd * rng.normal());
      const analysis::PairedStats p = analysis::paired_stats(d);
      y.push_back(p.mean);
      v.push_back(p.sd * p.sd / n);
    }
    const MetaAnalysis m = random_effects_meta(y, v);
    headline += m.ci_low <= mu && mu <= m.ci_high;
    plain += m.hk_ci_low <= mu && mu <= m.hk_ci_high;
    dl += m.dl_ci_low <= mu && mu <= m.dl_ci_high;
  }
  return {double(headline) / reps, double(plain) / reps, double(dl) / reps};
}

// The headline interval (HKSJ, variance not below DL's) covers the true mean 95% of the time
// within 3 Monte-Carlo s.e. on heterogeneous studies of unequal size; the DL normal interval,
// which ignores the uncertainty of τ², does not (it is why HKSJ is used). Measured (10,000 each):
// τ = 0.04: headline 0.9547, plain HKSJ 0.9435, DL normal 0.8743. With τ = 0 the headline is
// conservative (0.9684); plain HKSJ covers 0.9267: with variances estimated from 3-13 seeds plain
// HKSJ covers less than its level, which is why the headline floors q at 1. 0.6 s of CPU.
TEST(Meta, SimulatedCoverageOfThePooledInterval) {
  constexpr int kReps = 10000;
  const double mc_se = std::sqrt(0.95 * 0.05 / kReps);
  const Coverage het = simulate_coverage(0.04, kReps, 46);
  std::printf("tau 0.04: headline %.4f, plain HKSJ %.4f, DL normal %.4f\n", het.headline, het.plain_hk, het.dl_normal);
  EXPECT_NEAR(het.headline, 0.95, 3 * mc_se);
  EXPECT_LT(het.dl_normal, 0.95 - 3 * mc_se);
  const Coverage hom = simulate_coverage(0.0, kReps, 47);
  std::printf("tau 0: headline %.4f, plain HKSJ %.4f, DL normal %.4f\n", hom.headline, hom.plain_hk, hom.dl_normal);
  EXPECT_GE(hom.headline, 0.95 - 3 * mc_se);
  EXPECT_LT(hom.plain_hk, 0.95 - 3 * mc_se);
}

// ---- the designs of experiment directories ----

namespace fs = std::filesystem;
using experiment::testing::PoolStudyDesign;
using experiment::testing::write_pool_study;

class PoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("attnres-pool-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string dir(const std::string& name) const { return (root_ / name).string(); }
  fs::path root_;
};

// Study a: main rd − block {−0.01, −0.03, −0.02} and probe depth-2 {0.01, 0.03} (seed 3's probe
// runs missing); study b: main baseline prenorm, rd − block {0.02, 0.04, 0.03, 0.05}.
TEST_F(PoolTest, PoolsEveryDesignComparingTheArmWithTheBaseline) {
  PoolStudyDesign a{{-0.01, -0.03, -0.02}, 64, 12, 0.004, 2000};
  PoolStudyDesign probe{{0.01, 0.03}, 64, 2, 0.004, 3000};
  PoolStudyDesign b{{0.02, 0.04, 0.03, 0.05}, 128, 4, 0.003, 4000};
  write_pool_study(dir("a"), a, &probe);
  write_pool_study(dir("b"), b, nullptr, true);
  experiment::PoolOptions options;
  options.arm = "rd";
  const results::Pool p = experiment::pool_studies({dir("a"), dir("b")}, options);
  EXPECT_EQ(p.baseline, "block");  // the first directory's
  ASSERT_EQ(p.designs.size(), 3u);
  const results::PoolDesign &main_a = p.designs[0], &probe_a = p.designs[1], &main_b = p.designs[2];
  EXPECT_EQ(main_a.design, "main");
  EXPECT_EQ(probe_a.design, "depth-2");
  EXPECT_EQ(probe_a.kind, "probe");
  EXPECT_EQ(main_b.dir, dir("b"));
  // The design's settings.
  EXPECT_EQ(main_a.width, 64);
  EXPECT_EQ(main_a.depth, 12);
  EXPECT_EQ(probe_a.depth, 2);
  EXPECT_DOUBLE_EQ(main_a.lr, 0.004);
  EXPECT_DOUBLE_EQ(main_b.lr, 0.003);
  EXPECT_EQ(main_a.precision, "fp32");
  EXPECT_EQ(main_a.tokens, 2000);
  EXPECT_EQ(probe_a.tokens, 3000);
  EXPECT_TRUE(main_a.cpus.empty());  // these result files record no provenance
  // The estimates: mean, sd/√n over the seeds finished in both.
  EXPECT_EQ(main_a.n, 3);
  EXPECT_NEAR(main_a.mean, -0.02, 1e-12);
  EXPECT_NEAR(main_a.se, 0.01 / std::sqrt(3.0), 1e-12);
  EXPECT_EQ(probe_a.n, 2);
  EXPECT_NEAR(probe_a.mean, 0.02, 1e-12);
  EXPECT_NEAR(probe_a.se, 0.01, 1e-12);
  EXPECT_EQ(main_b.n, 4);
  EXPECT_NEAR(main_b.mean, 0.035, 1e-12);  // rd − block, though b's main baseline is prenorm
  // The meta-analysis is random_effects_meta of those three.
  ASSERT_TRUE(p.pooled);
  std::vector<double> y, v;
  for (const auto& d : p.designs) y.push_back(d.mean), v.push_back(d.se * d.se);
  const MetaAnalysis m = random_effects_meta(y, v);
  EXPECT_EQ(p.pooled->k, 3);
  EXPECT_DOUBLE_EQ(p.pooled->mean, m.mean);
  EXPECT_DOUBLE_EQ(p.pooled->ci_low, m.ci_low);
  EXPECT_DOUBLE_EQ(p.pooled->tau2_dl, m.tau2_dl);
  EXPECT_GT(p.pooled->tau2_dl, 0);  // −0.02 against +0.035: heterogeneous
  double total = 0;
  for (const auto& d : p.designs) total += d.weight;
  EXPECT_NEAR(total, 1, 1e-12);
  EXPECT_NE(p.summary.find("rd − block over 3 designs from 2 studies: pooled ΔNLL"), std::string::npos) << p.summary;
}

// The futility statement at E: "no gain as large as E" only when the whole pooled CI lies above −E.
TEST_F(PoolTest, FutilityAtTheStatedEffect) {
  write_pool_study(dir("a"), {{0.010, 0.012, 0.011, 0.013}});
  write_pool_study(dir("b"), {{0.008, 0.011, 0.009}});
  experiment::PoolOptions options;
  options.arm = "rd";
  options.effect = 0.03;
  results::Pool p = experiment::pool_studies({dir("a"), dir("b")}, options);
  ASSERT_TRUE(p.pooled);
  EXPECT_GT(p.pooled->ci_low, -0.03);
  EXPECT_EQ(p.futility.rfind("no gain as large as 0.030 nats at this scale", 0), 0u) << p.futility;
  // The same interval against a smaller effect: with k = 2 (t with 1 df) it reaches below −0.001.
  options.effect = 0.001;
  const results::Pool small = experiment::pool_studies({dir("a"), dir("b")}, options);
  ASSERT_LT(small.pooled->ci_low, -0.001);
  EXPECT_EQ(small.futility.rfind("a gain as large as 0.001 nats is not excluded", 0), 0u) << small.futility;
  // Noisy designs: −0.030 lies inside the pooled interval.
  write_pool_study(dir("a"), {{0.01, -0.04, 0.03, -0.02}});
  write_pool_study(dir("b"), {{-0.05, 0.02, -0.01}});
  options.effect = 0.03;
  p = experiment::pool_studies({dir("a"), dir("b")}, options);
  ASSERT_TRUE(p.pooled);
  EXPECT_LT(p.pooled->ci_low, -0.03);
  EXPECT_EQ(p.futility.rfind("a gain as large as 0.030 nats is not excluded", 0), 0u) << p.futility;
}

TEST_F(PoolTest, OneDesignIsNotAMetaAnalysis) {
  write_pool_study(dir("a"), {{-0.01, -0.03, -0.02}});
  experiment::PoolOptions options;
  options.arm = "rd";
  const results::Pool p = experiment::pool_studies({dir("a")}, options);
  EXPECT_FALSE(p.pooled);
  EXPECT_NE(p.summary.find("k = 1, not a meta-analysis"), std::string::npos) << p.summary;
  EXPECT_NE(p.futility.find("one design's own 95% CI"), std::string::npos) << p.futility;
}

TEST_F(PoolTest, ErrorsNameTheDirectory) {
  write_pool_study(dir("a"), {{-0.01, -0.03, -0.02}});
  experiment::PoolOptions options;
  options.arm = "mudd";
  try {
    experiment::pool_studies({dir("a")}, options);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir("a") + ": no arm 'mudd'"), std::string::npos) << e.what();
  }
  options.arm = "rd";
  options.baseline = "prenorm";
  try {
    experiment::pool_studies({dir("a")}, options);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir("a") + ": arm 'rd' is never compared with the baseline 'prenorm'"),
              std::string::npos)
        << e.what();
  }
  options.baseline = "";
  EXPECT_THROW(experiment::pool_studies({dir("missing")}, options), Error);
}

TEST_F(PoolTest, PoolJsonRoundTripsAndTheReportDrawsTheForest) {
  PoolStudyDesign probe{{0.01, 0.03, 0.02}, 64, 2, 0.004, 3000};
  write_pool_study(dir("a"), {{-0.01, -0.03, -0.02}}, &probe);
  write_pool_study(dir("b"), {{0.02, 0.04, 0.03, 0.05}});
  experiment::PoolOptions options;
  options.arm = "rd";
  const results::Pool p = experiment::pool_studies({dir("a"), dir("b")}, options);
  const analysis::PoolFiles files = analysis::write_pool_report(p, dir("out"));
  const results::Pool back = results::read_pool(files.json);
  EXPECT_EQ(results::to_json(back).dump(), results::to_json(p).dump());
  // Strict: a key the format does not have is an error naming it.
  nlohmann::json j = results::to_json(p);
  j["designs"][0]["weigth"] = 0.5;
  experiment::testing::write_json(dir("bad.json"), j);
  try {
    results::read_pool(dir("bad.json"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("designs[0].weigth"), std::string::npos) << e.what();
  }
  const std::string svg = analysis::plot_forest(p);
  EXPECT_NE(svg.find("<polygon"), std::string::npos);          // the pooled diamond
  EXPECT_NE(svg.find("−E = −0.030"), std::string::npos);       // the −E line's label
  EXPECT_NE(svg.find("a · depth-2 (3)"), std::string::npos);  // a design's label with its seeds
  const std::string text = analysis::format_pool_text(p);
  EXPECT_NE(text.find("not recorded"), std::string::npos);  // the CPU
  EXPECT_NE(text.find("Futility: "), std::string::npos);
  EXPECT_TRUE(fs::exists(files.markdown));
  EXPECT_TRUE(fs::exists(files.html));
}

}  // namespace
}  // namespace attnres
