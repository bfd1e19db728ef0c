// The arms ranked by their validation ΔNLL against the baseline, with the family of comparisons
// adjusted for multiplicity: a study of ten arms against one baseline at α = 0.05 finds a
// "significant" arm by chance alone far more often than one time in twenty.
#include <algorithm>
#include <cmath>

#include "analysis/format.hpp"
#include "analysis/stats.hpp"
#include "analysis/tables.hpp"
#include "analysis/verdict.hpp"
#include "model/arms.hpp"
#include "util/error.hpp"

namespace attnres::analysis {

namespace {

struct RankedArm {
  const ArmComparison* arm;
  double mean, p, holm;
  std::string verdict;  // against the baseline, after the adjustment
};

struct Ranking {
  std::int64_t tokens = 0;
  std::size_t compared = 0;  // the family: arms beside the baseline and its twin
  int resolved = 0;          // of those, the ones that differ after the adjustment
  std::vector<RankedArm> rows;  // the baseline among them, best first
};

std::optional<Ranking> rank_arms(const ExperimentSummary& s) {
  if (s.milestones.empty()) return std::nullopt;
  const Comparison& last = s.milestones.back();
  // The family: every arm compared with the baseline over at least two seeds, its twin left out
  // (the twin is the floor, not a question).
  std::vector<const ArmComparison*> family;
  const ArmComparison* baseline = nullptr;
  for (const ArmComparison& a : last.arms) {
    if (a.is_baseline) baseline = &a;
    else if (!is_twin(a.arm) && a.stats.n >= 2 && std::isfinite(a.stats.mean)) family.push_back(&a);
  }
  if (baseline == nullptr || family.size() < 2) return std::nullopt;
  std::vector<double> p;
  for (const ArmComparison* a : family) p.push_back(identical_to_baseline(*a) ? 1.0 : a->stats.p_value);
  const std::vector<double> adjusted = holm_adjusted(p);

  Ranking r;
  r.tokens = last.tokens;
  r.compared = family.size();
  r.rows.push_back({baseline, 0.0, results::kNotAvailable, results::kNotAvailable, ""});
  for (std::size_t i = 0; i < family.size(); ++i) {
    std::string verdict = "not resolved";
    if (adjusted[i] < kPowerAlpha) {
      verdict = family[i]->stats.mean < 0 ? "better" : "worse";
      ++r.resolved;
    } else if (p[i] < kPowerAlpha) {
      verdict += " (p < 0.05 alone)";
    }
    r.rows.push_back({family[i], family[i]->stats.mean, p[i], adjusted[i], verdict});
  }
  std::stable_sort(r.rows.begin(), r.rows.end(), [](const RankedArm& a, const RankedArm& b) { return a.mean < b.mean; });
  return r;
}

std::string resolved_clause(const Ranking& r, const std::string& baseline) {
  return concat(r.resolved, " of ", r.compared, " arms differ from ", baseline, " after the adjustment");
}

}  // namespace

std::optional<Table> ranking_table(const ExperimentSummary& s) {
  const std::optional<Ranking> ranking = rank_arms(s);
  if (!ranking) return std::nullopt;
  const Comparison& last = s.milestones.back();
  Table t;
  t.title = concat("Ranking by validation NLL at ", format_tokens(double(ranking->tokens)), " tokens, against ",
                   s.spec.baseline, " (", ranking->compared, " comparisons, Holm-adjusted)");
  t.header = {"rank", "arm", "ΔNLL [95% CI]", "wins", "p", "Holm p", "against " + s.spec.baseline, "step-time ratio"};
  t.left_columns = 2;
  for (std::size_t r = 0; r < ranking->rows.size(); ++r) {
    const RankedArm& row = ranking->rows[r];
    const ArmComparison& a = *row.arm;
    const auto sys = std::find_if(s.systems.begin(), s.systems.end(), [&](const ArmSystems& x) { return x.arm == a.arm; });
    const std::string step = sys != s.systems.end() ? format_number(sys->step_time_ratio, 3) : "n/a";
    if (a.is_baseline) {
      t.rows.push_back({std::to_string(r + 1), a.arm, "baseline", "", "", "", "", step});
      continue;
    }
    t.rows.push_back({std::to_string(r + 1), a.arm,
                      concat(format_signed(a.stats.mean, 4), " [", format_signed(a.stats.ci_low, 4), ", ",
                             format_signed(a.stats.ci_high, 4), "]"),
                      concat(a.stats.wins, "/", a.stats.n), format_p_value(row.p), format_p_value(row.holm),
                      row.verdict, step});
  }
  t.notes = {concat("Ranked by mean ΔNLL (arm − ", s.spec.baseline,
                    ", paired by seed; negative: better). Holm p: the paired t-test's p adjusted by Holm's step-down "
                    "method over the ",
                    ranking->compared,
                    " arms compared with the baseline, so that 'better' or 'worse' in any row is a false claim with "
                    "probability at most 0.05 for the whole table; '(p < 0.05 alone)': the arm's own test, unadjusted, "
                    "would have called it."),
             resolved_clause(*ranking, s.spec.baseline) + "."};
  if (last.noise_floor && std::isfinite(last.noise_floor->sd))
    t.notes.push_back(concat("Noise floor: ±", format_number(last.noise_floor->sd, 4), " (the sd of ",
                             last.noise_floor->twin, " − ", s.spec.baseline, " over ", last.noise_floor->n,
                             " seeds); the twin is left out of the ranking."));
  t.notes.push_back(one_learning_rate_note(s));
  return t;
}

std::string one_learning_rate_note(const ExperimentSummary& s) {
  // The arms of one comparison differ only in their residual mode (experiment/plan.hpp's
  // run_config): every arm ran the baseline's training settings, its learning rate included.
  std::string lr;
  if (const auto it = s.spec.train.find("config_toml"); it != s.spec.train.end() && it->is_string()) {
    const std::string text = it->get<std::string>();
    for (std::size_t at = text.find("lr = "); at != std::string::npos; at = text.find("lr = ", at + 1))
      if (at == 0 || text[at - 1] == '\n') {
        lr = text.substr(at + 5, text.find('\n', at) - at - 5);
        break;
      }
  }
  return concat("One learning rate for every arm (", lr.empty() ? std::string("the baseline's") : "lr " + lr,
                "), tuned for none of them: an arm whose best learning rate lies elsewhere is ranked at a "
                "disadvantage; this is a ranking at one setting, not of tuned arms.");
}

std::optional<std::string> ranking_sentence(const ExperimentSummary& s) {
  const std::optional<Ranking> ranking = rank_arms(s);
  if (!ranking) return std::nullopt;
  std::string order;
  for (const RankedArm& row : ranking->rows)
    order += (order.empty() ? "" : ", ") +
             (row.arm->is_baseline ? row.arm->arm : concat(row.arm->arm, " ", format_signed(row.mean, 3)));
  return concat("Ranking by validation NLL at ", format_tokens(double(ranking->tokens)), " tokens: ", order, "; ",
                resolved_clause(*ranking, s.spec.baseline), " (Holm's adjustment over the ", ranking->compared,
                " comparisons).");
}

}  // namespace attnres::analysis
