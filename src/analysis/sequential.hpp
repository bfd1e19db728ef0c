// Sequential seeds (issue #27): a group-sequential design for the paired comparison of an arm with
// its baseline, where seeds are added in batches and the comparison is looked at after each batch.
// Looking repeatedly at a fixed-level test inflates its type-I error (five looks at α = 0.05 reject
// a true null about 14% of the time), so each look uses a stricter boundary. The boundaries come
// from an error-spending function (Lan & DeMets 1983): look k may spend α(t_k) − α(t_{k−1}) of the
// type-I error, t_k = n_k / n_K the fraction of the maximum number of seeds. Every look reports a
// repeated confidence interval (RCI; Jennison & Turnbull 2000, ch. 9), which covers the true mean
// at all looks simultaneously with probability ≥ 1 − α, so a decision can be taken at any look.
//
// Pure functions, value types, no I/O. Normal, t, χ² and non-central t come from Boost.Math.
// References: K. K. G. Lan and D. L. DeMets (1983), Discrete sequential boundaries for clinical
// trials, Biometrika 70:659–663. C. Jennison and B. W. Turnbull (2000), Group Sequential Methods
// with Applications to Clinical Trials, Chapman & Hall/CRC (J&T below).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace attnres::analysis {

// The two Lan–DeMets spending functions. α is the two-sided level, split equally between the
// two sides (the convention of ldbounds, SAS PROC SEQDESIGN, gsDesign and rpact). Each side
// spends α_s(t) with α_s(1) = α/2, and the design spends α(t) = 2 α_s(t) in all:
//  - obrien_fleming: α_s(t) = 2 − 2Φ(z_{1−α_s/2} / √t), α_s = α/2, i.e. α(t) = 4 − 4Φ(z_{1−α/4} / √t).
//    Spends almost nothing early (first of 4 equal looks at α = 0.05: c = 4.333) and keeps the last
//    boundary close to the fixed-sample 1.960 (2.014). Lan & DeMets (1983) wrote the two-sided
//    function as 2 − 2Φ(z_{1−α/2} / √t) instead, which spends more early (c_1 = 3.920).
//  - pocock: α(t) = α ln(1 + (e − 1) t) (linear in α, so per side or in all is the same): nearly
//    equal boundaries (2.368, 2.368, 2.358, 2.350 for 4 equal looks at α = 0.05), more likely to stop
//    early, a higher last boundary.
enum class Spending { obrien_fleming, pocock };

// "obrien-fleming" or "pocock"; anything else is an Error naming the choices.
Spending parse_spending(std::string_view name);
std::string spending_name(Spending spending);

// The cumulative two-sided type-I error spent by information fraction t ∈ [0, 1]: α(0) = 0, α(1) = α.
double spent_alpha(Spending spending, double alpha, double t);

// A design: the seed counts n_1 < n_2 < … < n_K at which the comparison is looked at (n_1 >= 2; the
// last is the maximum), the two-sided level and the spending function. Information fractions are
// t_k = n_k / n_K: the information about the mean of the paired differences grows with n.
struct SequentialDesign {
  std::vector<int> looks;
  double alpha = 0.05;
  Spending spending = Spending::obrien_fleming;
};

// Throws an Error unless looks are strictly increasing with n_1 >= 2 and 0 < alpha < 1.
void validate(const SequentialDesign& design);

// The boundaries of a design.
//  z[k]: c_k on the z-scale, such that under H0 P(|Z_1| < c_1, …, |Z_{k−1}| < c_{k−1}, |Z_k| >= c_k)
//        = α(t_k) − α(t_{k−1}), for the canonical joint distribution of Z_k = mean_k √n_k / σ:
//        normal, corr(Z_j, Z_k) = √(t_j / t_k) (J&T). Found by the recursive numerical
//        integration of Armitage, McPherson & Rowe (1969), J&T ch. 19: the sub-density of Z_k on the
//        paths still running is carried on a Simpson grid from look to look, and each c_k is the root
//        of the crossing probability at look k minus the increment it may spend. Accuracy about 1e-7
//        in c (grid step ≤ 0.02 and ≤ 1/16 of the conditional sd between looks).
//  nominal_p[k]: 2(1 − Φ(c_k)), the two-sided level that look k tests at.
//  t[k]: t_{1 − p_k/2, n_k − 1}, the boundary on the scale of the paired t statistic (the per-seed sd
//        is estimated): the t boundary with the same nominal level as c_k. Each look is then exactly
//        at level p_k, but the t statistics of different looks are less dependent than the Z's, so
//        the overall type-I error is a little above α at small n (0.052 for looks at 5, 8, 12, 16
//        seeds with O'Brien–Fleming, 0.054 with Pocock; calibrate_t_looks corrects it).
//        +inf when c_k is so large that p_k underflows.
//  spent[k]: α(t_k), cumulative.
struct SequentialBoundaries {
  std::vector<double> fraction, spent, z, nominal_p, t;
};

SequentialBoundaries sequential_boundaries(const SequentialDesign& design);

// One look at the first n_k paired differences (arm − baseline, seed order):
// mean, sd (n − 1), se = sd / √n, t = mean / se; the RCI mean ± t[k] · se; crossed when the RCI
// excludes 0 (equivalently |t| >= t[k]: the two-sided sequential test rejects "no difference").
// sd = 0 (identical differences): the RCI is [mean, mean], t = 0 or ±inf (as paired_stats).
struct LookResult {
  int look = 0;  // index k (0-based)
  int n = 0;
  double mean = 0, sd = 0, se = 0, t = 0;
  double t_boundary = 0, nominal_p = 0;
  double ci_low = 0, ci_high = 0;  // the repeated confidence interval at level 1 − α
  bool crossed = false;
};

// `differences` must hold at least n_k values; only the first n_k are used.
LookResult analyse_look(const SequentialDesign& design, const SequentialBoundaries& bounds, int look,
                        std::span<const double> differences);

// The repeated p-value at look k (J&T ch. 9): the smallest α' for which the RCI at look k, with the
// boundaries of the same design at level α', excludes 0. It is ≤ α exactly when the RCI at level α
// excludes 0; with one look it is the paired t-test's p. Found by bisection on log α' (relative
// accuracy 1e-4; values below 1e-10 are returned as 1e-10), each step recomputing the boundaries
// up to look k (tens of milliseconds: for reports, not simulations). t_statistic is the look's t.
double repeated_p_value(const SequentialDesign& design, int look, double t_statistic);

// The decision after the seeds available so far, for the effect of interest δ > 0 (nats):
//  resolved:     the first look whose RCI excludes 0: the arm differs from the baseline (sign of the mean);
//  futile:       the first look whose RCI lies strictly inside (−δ, +δ): no effect as large as δ;
//                non-binding (the boundaries are computed as if the study never stops for futility,
//                so stopping or not keeps the type-I error ≤ α);
//  not_resolved: the last look (n_K seeds) decided neither: the design's power at δ was what it was
//                (sequential_power with the planning sd), and the study ends;
//  continuing:   fewer seeds than the next look needs, or a look before the last decided nothing.
// Looks are taken in order on the first n_k differences while n_k <= differences.size(), stopping at
// the first that decides; at each look "resolved" is checked before "futile".
enum class Outcome { continuing, resolved, futile, not_resolved };
std::string outcome_name(Outcome outcome);

struct Decision {
  Outcome outcome = Outcome::continuing;
  int look = -1;                  // the deciding (or last analysed) look; −1: none yet
  int next_seeds = 0;             // continuing: the seed count of the next look; else 0
  std::vector<LookResult> looks;  // every look analysed, in order
};

Decision decide(const SequentialDesign& design, const SequentialBoundaries& bounds,
                std::span<const double> differences_in_seed_order, double effect_of_interest);
Decision decide(const SequentialDesign& design, std::span<const double> differences_in_seed_order,
                double effect_of_interest);

// The t-based looks' type-I error, measured by simulating `simulations` sequences of normal paired
// differences under H0 (the t statistics are scale-free, so this depends on the looks, the spending
// function and α only), and the nominal level that brings it back to the design's α:
//  uncalibrated_type_one_error: the fraction of the sequences that cross some t boundary of the design;
//  nominal_alpha: the largest level α* (to 1e-6 α) whose design crosses in at most a fraction α of
//                 the same sequences; design.alpha itself when the design is not above α;
//  type_one_error: that fraction at α*.
// Use a copy of the design with alpha = nominal_alpha for the looks: its RCIs then cover the mean at
// every look simultaneously with probability about 1 − design.alpha (Monte Carlo s.e. of the level
// √(α(1 − α)/simulations), 0.0005 at the default). Deterministic: a fixed seed, mt19937_64 and
// Box–Muller (no std::normal_distribution, whose algorithm varies between standard libraries).
// About 0.2 s for 4 looks at the default size. The repeated p-value stays on the nominal scale.
struct TCalibration {
  double nominal_alpha = 0, type_one_error = 0, uncalibrated_type_one_error = 0;
  int simulations = 0;
};

TCalibration calibrate_t_looks(const SequentialDesign& design, int simulations = 200000, std::uint64_t seed = 20240527);

// ---- Planning ----

// The one-sided upper confidence limit for σ from a sample sd over n values (n >= 2):
// sd · √((n − 1) / χ²_{1 − level, n − 1}), χ²_q the q-quantile, so that P(σ <= limit) = level
// for normal data. Planning with it (level 0.8 or 0.9) guards against a pilot sd that came out low.
double sd_upper_confidence_limit(double sd, int n, double level);
// The same from an sd with `dof` degrees of freedom (not necessarily whole: Satterthwaite's).
double sd_upper_confidence_limit_dof(double sd, double dof, double level);

// How the sequential power treats the per-seed sd:
//  known_sd:     the z-approximation: the looks test Z_k against c_k as if σ were known (optimistic
//                at small n: the t boundaries are wider than the z ones);
//  estimated_sd: the t-correction: each look's z boundaries under the alternative are moved so that
//                its marginal crossing probabilities P(T_k >= t_k), P(T_k <= −t_k) are the exact
//                non-central t ones (T_k ~ t'(n_k − 1, θ√n_k)); the joint law across looks stays the
//                canonical normal one. Under H0 it is the z design itself. Checked against
//                simulation of the t-based looks in tests/experiment/test_sequential.cpp.
enum class PowerModel { known_sd, estimated_sd };

// The operating characteristics at a true mean `effect` with per-seed sd `sd` (θ = |effect| / sd):
// power = P(some look crosses, on either side), crossing[k] = P(the study stops by crossing at look
// k), expected_seeds = Σ n_k P(stop at k) + n_K P(no crossing) (futility stops not counted).
struct SequentialPower {
  double power = 0;
  std::vector<double> crossing;
  double expected_seeds = 0;
};

SequentialPower sequential_power(const SequentialDesign& design, const SequentialBoundaries& bounds, double effect,
                                 double sd, PowerModel model = PowerModel::estimated_sd);
double sequential_power(const SequentialDesign& design, double effect, double sd,
                        PowerModel model = PowerModel::estimated_sd);

// Looks at fractions of a maximum seed count: n_k = round(f_k · max_seeds), at least 3 (an sd with
// two degrees of freedom), duplicates dropped; the last look is max_seeds. fractions increasing in
// (0, 1], the last 1.
std::vector<int> looks_at_fractions(int max_seeds, std::span<const double> fractions);
// The default: looks at 5/16, 8/16, 12/16 and all of the maximum (5, 8, 12, 16 seeds of 16).
inline constexpr double kDefaultLookFractions[] = {5.0 / 16, 8.0 / 16, 12.0 / 16, 1.0};

// The fewest maximum seeds whose design (looks_at_fractions of it) has at least `power` to resolve
// |effect| with per-seed sd `sd` (PowerModel::estimated_sd), beside the fixed-sample paired t-test's
// pairs_needed; inflation = max_seeds / fixed_seeds. max_seeds = 0 when more than max_n would be
// needed. The power is not exactly monotone in max_seeds (the looks are rounded), so after the
// bisection the search steps down while the smaller maximum still reaches the target.
struct SeedPlan {
  int max_seeds = 0;
  SequentialDesign design;
  double power = 0;
  double expected_seeds = 0;  // at the effect, without futility stops
  int fixed_seeds = 0;
  double inflation = 0;
};

SeedPlan max_seeds_for_power(double effect, double sd, Spending spending,
                             std::span<const double> fractions = kDefaultLookFractions, double alpha = 0.05,
                             double power = 0.8, int max_n = 2000);

}  // namespace attnres::analysis
