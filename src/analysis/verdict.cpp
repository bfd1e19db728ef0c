#include "analysis/verdict.hpp"

#include <algorithm>
#include <cmath>

#include "analysis/format.hpp"
#include "analysis/stats.hpp"
#include "model/arms.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

std::string comparison_subject(const ExperimentSummary& s, const Comparison& c, const std::string& arm) {
  return concat(arm, " vs ", s.spec.baseline, ", ", c.split == "test" ? "test" : "validation", " NLL at ",
                format_tokens(static_cast<double>(c.tokens)), " tokens");
}

std::string noise_floor_clause(const Comparison& c, const ArmComparison& a) {
  if (!c.noise_floor || a.arm == c.noise_floor->twin) return "";
  const results::NoiseFloor& f = *c.noise_floor;
  if (f.n < 2) return concat("; noise floor: n/a (", f.twin, " finished in ", f.n, f.n == 1 ? " seed" : " seeds", ")");
  std::string out = concat("; noise floor ±", format_number(f.sd, 4), " (the sd of ", f.twin, " vs ",
                           twin_original(f.twin), " over ", f.n, " seeds; mean ", format_signed(f.mean, 4), ")");
  if (a.within_noise_floor.value_or(false))
    out += concat("; the 95% CI [", format_signed(a.stats.ci_low, 4), ", ", format_signed(a.stats.ci_high, 4),
                  "] lies inside the floor: any difference is smaller than rounding alone makes one pair of runs differ");
  return out;
}

}  // namespace

std::string verdict_sentence(const ExperimentSummary& s, const Comparison& c, const ArmComparison& a) {
  const std::string what = comparison_subject(s, c, a.arm);
  const PairedSummary& p = a.stats;
  if (p.n == 0) return concat(what, ": no seed finished in both arms yet");
  if (identical_to_baseline(a)) return concat(what, ": identical to the baseline in all ", p.n, " seeds");
  const std::string floor = noise_floor_clause(c, a);
  const std::string measured =
      p.n >= 2 ? concat("ΔNLL ", format_signed(p.mean, 4), " ± ", format_number(p.sd / std::sqrt(double(p.n)), 4),
                        " (s.e.) over ", p.n, " seeds, p = ", format_p_value(p.p_value))
               : concat("ΔNLL ", format_signed(p.mean, 4), " from one seed");
  if (p.n >= 2 && p.p_value < kPowerAlpha)
    return concat(what, ": ", measured, " (95% CI ", format_signed(p.ci_low, 4), " to ", format_signed(p.ci_high, 4),
                  "; ", a.arm, p.mean < 0 ? " better" : " worse", " in ", p.mean < 0 ? p.wins : p.n - p.wins, "/", p.n,
                  " seeds)", floor);
  std::string need;
  if (!a.power.available) {
    need = "no power estimate: " + a.power.reason;
  } else {
    const int for_observed = pairs_needed(p.mean, p.sd, kPowerAlpha, kPowerTarget);
    need = for_observed > 0 ? concat("about ", for_observed, " seeds would be needed to detect a difference of this size")
                            : std::string("more than 100,000 seeds would be needed to detect a difference this small");
    need += concat(" with 80% power (", a.power.seeds_for_paper > 0 ? std::to_string(a.power.seeds_for_paper) : "n/a",
                   " for the paper's ", format_number(kPaperEffectNats, 3), ")");
  }
  return concat(what, ": not resolved at this size: ", measured, "; ", need, floor);
}

std::string sequential_clause(const results::SequentialSummary& q) {
  const std::string level = format_number(100 * (1 - q.design.alpha), 0);
  if (q.look < 0)
    return concat("sequential seeds: no look yet (the first at ", q.design.looks.front(), " seeds)");
  const results::SequentialLook& l = q.looks[static_cast<std::size_t>(q.look)];
  const std::string interval = concat("repeated ", level, "% CI [", format_signed(l.ci_low, 4), ", ",
                                      format_signed(l.ci_high, 4), "]");
  const std::string effect = format_number(q.design.effect, 4);
  if (q.outcome == "resolved")
    return concat("sequential seeds: resolved at the look at ", l.n, " seeds (", interval, ", adjusted p = ",
                  format_p_value(l.p_adjusted), ")");
  if (q.outcome == "futile")
    return concat("sequential seeds: futile at the look at ", l.n, " seeds: the ", interval,
                  " lies inside ±", effect, ": no effect as large as ", effect);
  if (q.outcome == "not resolved")
    return concat("sequential seeds: not resolved at max_seeds = ", l.n, " (", interval,
                  "); the design had power ", format_number(q.power, 2), " to resolve ", effect);
  return concat("sequential seeds: continuing after the look at ", l.n, " seeds (", interval, "); next look at ",
                q.next_seeds, " seeds");
}

std::string answer_line(const ExperimentSummary& s, const std::string& arm) {
  require(!s.milestones.empty(), "the experiment has no validation milestones");
  const Comparison& last = s.milestones.back();
  const ArmComparison* a = last.find(arm);
  require(a != nullptr && !a->is_baseline, "'", arm, "' is not a compared arm of the experiment (baseline ",
          s.spec.baseline, ")");
  std::string line = verdict_sentence(s, last, *a);
  if (s.sequential && s.sequential->design.primary == arm) line += "; " + sequential_clause(*s.sequential);
  const std::vector<std::int64_t> unstable = s.unstable_seeds(arm), base = s.unstable_seeds(s.spec.baseline);
  if (!unstable.empty() || !base.empty()) {
    std::string which;
    for (const auto seed : unstable) which += concat(which.empty() ? "" : ", ", arm, " seed ", seed);
    for (const auto seed : base) which += concat(which.empty() ? "" : ", ", s.spec.baseline, " seed ", seed);
    line += "; unstable runs (a sustained loss spike): " + which;
  }
  return line;
}

bool identical_to_baseline(const ArmComparison& a) {
  return !a.is_baseline && !a.deltas.empty() &&
         std::all_of(a.deltas.begin(), a.deltas.end(), [](const SeedValue& d) { return d.value == 0; });
}
}  // namespace attnres::analysis
