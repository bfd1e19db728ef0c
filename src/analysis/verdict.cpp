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

// One pair's floor, the twins it came from, and the state of the arm against it.
std::string floor_clause(const Comparison& c, const ArmComparison& a) {
  if (is_twin(a.arm)) return "";
  if (!a.floor) {
    if (!c.noise_floor) return "";
    const results::NoiseFloor& f = *c.noise_floor;
    return concat("; noise floor: n/a (", f.twin, " finished in ", f.n, f.n == 1 ? " seed" : " seeds", ")");
  }
  const results::FloorTest& f = *a.floor;
  // Each twin with its own floor (the sd of one twin pair of its arm), so the answer names every arm's floor.
  const auto twin_sd = [&c](const std::string& twin) -> double {
    if (c.noise_floor && c.noise_floor->twin == twin) return c.noise_floor->sd;
    for (const auto& t : c.arm_floors)
      if (t.twin == twin) return t.sd;
    return results::kNotAvailable;
  };
  std::string twins;
  for (const auto& t : f.twins) {
    twins += concat(twins.empty() ? "" : " and ", t);
    if (const double sd = twin_sd(t); std::isfinite(sd)) twins += concat(" ±", format_nats(sd));
  }
  std::string out = concat("; noise floor ±", format_nats(f.mean_sd), " (rounding's s.e. of the ", a.stats.n,
                           "-seed mean; one pair ±", format_nats(f.pair_sd), ", from ", twins, "): ");
  const std::string interval = concat(f.interval, " [", format_signed_nats(f.interval_low), ", ",
                                      format_signed_nats(f.interval_high), "]");
  if (f.state == "inside")
    return out + concat("inside the floor, indistinguishable from rounding (the ", interval, " lies within the margin ±",
                        format_number(f.margin, 4), " and the seeds vary as rounding makes them, ",
                        format_number(f.spread_ratio, 2), "x, F test p = ", format_p_value(f.spread_p), ")");
  if (f.state == "beyond") {
    std::string why;
    if (f.mean_beyond) why = "the mean differs from 0";
    if (f.spread_beyond)
      why += concat(why.empty() ? "" : ", and ", "the seeds' differences vary ", format_number(f.spread_ratio, 2),
                    "x as much as rounding makes them (F test p = ", format_p_value(f.spread_p), ")");
    return out + concat("beyond the floor, a difference rounding does not make (", why, ")");
  }
  return out + concat("undetermined (the ", interval, " is wider than the margin ±", format_number(f.margin, 4),
                      "; spread ", format_number(f.spread_ratio, 2), "x rounding's, F test p = ",
                      format_p_value(f.spread_p), ")");
}

// The failure rule's counts for the arm and the baseline, and the secondary analysis.
std::string failure_clause(const ExperimentSummary& s, const std::string& arm) {
  if (s.failure_counts.empty()) return "";
  const auto counts = [&](const std::string& name) -> const results::ArmFailures* {
    for (const auto& c : s.failure_counts)
      if (c.arm == name) return &c;
    return nullptr;
  };
  const results::ArmFailures* a = counts(arm);
  const results::ArmFailures* b = counts(s.spec.baseline);
  if (a == nullptr || b == nullptr) return "";
  std::string out = concat("; failed runs (rule fixed before the runs): ", arm, " ", a->failed, "/", a->runs, ", ",
                           s.spec.baseline, " ", b->failed, "/", b->runs, " (Fisher's exact p = ",
                           format_p_value(a->fisher_p), ")");
  if (s.without_failures)
    if (const ArmComparison* w = s.without_failures->find(arm); w && w->stats.n >= 2)
      out += concat("; secondary, without the failed seeds: ΔNLL ", format_signed(w->stats.mean, 4), " ± ",
                    format_number(w->stats.sd / std::sqrt(double(w->stats.n)), 4), " (s.e.) over ", w->stats.n,
                    " seeds, p = ", format_p_value(w->stats.p_value));
  return out;
}

}  // namespace

std::string verdict_sentence(const ExperimentSummary& s, const Comparison& c, const ArmComparison& a) {
  const std::string what = comparison_subject(s, c, a.arm);
  const PairedSummary& p = a.stats;
  if (p.n == 0) return concat(what, ": no seed finished in both arms yet");
  if (identical_to_baseline(a)) return concat(what, ": identical to the baseline in all ", p.n, " seeds");
  const std::string floor = floor_clause(c, a);
  const std::string measured =
      p.n >= 2 ? concat("ΔNLL ", format_signed_nats(p.mean), " ± ", format_nats(p.sd / std::sqrt(double(p.n))),
                        " (s.e.) over ", p.n, " seeds, p = ", format_p_value(p.p_value))
               : concat("ΔNLL ", format_signed_nats(p.mean), " from one seed");
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
  const std::string interval =
      concat("repeated ", level, "% CI [", format_signed(l.ci_low, 4), ", ", format_signed(l.ci_high, 4),
             "], repeated p = ", format_p_value(l.p_adjusted), "; the looks test at the calibrated α* = ",
             format_number(q.nominal_alpha, 4), " for a ", format_number(q.design.alpha, 2), " overall error");
  const std::string effect = format_number(q.design.effect, 4);
  if (q.outcome == "resolved")
    return concat("resolved at ", l.n, " seeds: ", l.mean < 0 ? "better" : "worse", " (", interval, ")");
  if (q.outcome == "futile")
    return concat("futile at ", l.n, " seeds: no effect as large as ", effect, " (", interval, ")");
  if (q.outcome == "not resolved")
    return concat("not resolved at max_seeds = ", l.n, " (", interval, "); the design had power ",
                  format_number(q.power, 2), " to resolve ", effect, " at the observed sd");
  return concat("continuing after the look at ", l.n, " seeds (", interval, "); next look at ", q.next_seeds, " seeds");
}

std::string answer_line(const ExperimentSummary& s, const std::string& arm) {
  require(!s.milestones.empty(), "the experiment has no validation milestones");
  const Comparison& last = s.milestones.back();
  const ArmComparison* a = last.find(arm);
  require(a != nullptr && !a->is_baseline, "'", arm, "' is not a compared arm of the experiment (baseline ",
          s.spec.baseline, ")");
  std::string line;
  const bool primary = s.sequential && s.sequential->design.primary == arm;
  if (primary && s.sequential->look >= 0) {
    // A sequential study's outcome leads; the fixed-sample numbers follow, named as such, without
    // fixed-sample advice on seeds once the design has answered.
    const PairedSummary& p = a->stats;
    line = concat(comparison_subject(s, last, arm), ": ", sequential_clause(*s.sequential), "; fixed-sample view: ΔNLL ",
                  format_signed_nats(p.mean), " ± ", format_nats(p.sd / std::sqrt(double(std::max(p.n, 1)))),
                  " (s.e.) over ", p.n, " seeds, naive p = ", format_p_value(p.p_value), floor_clause(last, *a));
  } else {
    line = verdict_sentence(s, last, *a);
    if (primary) line += "; sequential seeds: " + sequential_clause(*s.sequential);
  }
  line += failure_clause(s, arm);
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
