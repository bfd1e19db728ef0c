// The pilot's plan in words (experiment/planner.hpp): what `attnres plan` prints and writes at the
// top of the protocol it plans: the machine, the throughput per shape, the noise floor of every
// setting, the chosen one and why, the seeds and the compute.
#include <cmath>
#include <cstdint>
#include <string>

#include "analysis/format.hpp"
#include "experiment/planner.hpp"
#include "model/arms.hpp"
#include "util/error.hpp"
#include "util/text.hpp"
#include "util/machine.hpp"

namespace attnres::experiment {
using namespace analysis;  // the number formats of the analysis module
namespace {

std::string settings_text(const std::vector<std::string>& settings) {
  std::string out;
  for (const auto& s : settings) out += (out.empty() ? "" : ", ") + s;
  return out.empty() ? "the file's model" : out;
}

}  // namespace

std::string plan_report(const ProtocolFile& p, const PlanResult& r) {
  const ExperimentOptions& e = p.options;
  const PilotSpec& pilot = *p.pilot;
  const std::string base = e.arms.front(), twin = twin_of(base);
  std::string primary;
  for (const std::string& a : e.arms)
    if (a != base && !is_twin(a) && primary.empty()) primary = a;
  std::string out = concat(e.name, ": planned by `attnres plan --protocol ", shell_quote(p.path), "` on ", cpu_model(), " (",
                           online_cores(), " cores, OpenBLAS ", openblas_core(), ").\n");
  std::string seeds;
  for (std::uint64_t s : pilot.seeds) seeds += (seeds.empty() ? "" : ", ") + std::to_string(s);
  out += concat("Pilot: ", base, ", ", primary, " and their twins ", twin, ", ", twin_of(primary),
                " (initial weights perturbed at a relative ", format_printf("%g", e.twin_perturbation), "), seeds ", seeds,
                pilot.tokens > 0 ? concat(", every run ", format_count(r.shapes.front().tokens), " tokens (fixed in the file)")
                                 : concat(", every run ", format_number(pilot.run_core_seconds, 0), " core-seconds of training"),
                ".\n\n");
  out += "Throughput (tokens per core-second, from the run's CPU time; one measurement per shape):\n";
  for (const ShapeThroughput& t : r.shapes)
    out += concat("  ", t.label, " (", settings_text(t.settings), "): ", format_count(std::llround(t.tokens_per_core_second)),
                  " -> ", format_count(t.tokens), " tokens per run\n");
  out += concat("\nNoise floor of the comparison ", primary, " - ", base, ": rounding's sd of one pair, from the sds of ",
                twin, " - ", base, " and ", twin_of(primary), " - ", primary,
                " over the seeds (sqrt of their mean variance), at each milestone; at the final milestone its ",
                format_number(100 * pilot.sd_confidence, 0), "% upper confidence limit (Satterthwaite degrees of freedom), "
                "the sd of ", primary, " - ", base, ", and ", base, "'s mean final validation NLL (sd over seeds):\n\n");
  std::string header = "| setting | lr | tokens |";
  std::string rule = "| --- | ---: | ---: |";
  const PilotPoint& first = r.points.front();
  for (std::int64_t m : first.milestones) {
    header += " floor @ " + format_tokens(double(m)) + " |";
    rule += " ---: |";
  }
  header += " " + twin + " | " + twin_of(primary) + " | floor UCL | " + primary + " - " + base + " sd | " + base +
            " NLL | unstable / failed runs | meets the rule |";
  rule += " ---: | ---: | ---: | ---: | ---: | ---: | --- |";
  out += header + "\n" + rule + "\n";
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    const PilotPoint& pt = r.points[i];
    std::string line = concat("| ", r.shapes[static_cast<std::size_t>(pt.shape)].label, " | ", format_printf("%g", pt.lr), " | ",
                              format_tokens(double(r.shapes[static_cast<std::size_t>(pt.shape)].tokens)), " |");
    for (double f : pt.pair_sd) line += " " + format_printf("%.3g", f) + " |";
    line += concat(" ", format_printf("%.3g", pt.floor_sd.back()), " | ", format_printf("%.3g", pt.primary_floor_sd.back()),
                   " | ", format_printf("%.3g", pt.pair_ucl), " | ", format_printf("%.3g", pt.primary_sd), " | ",
                   format_number(pt.baseline_nll, 4), " (", format_number(pt.baseline_sd, 4), ") | ", pt.unstable_runs,
                   " / ", pt.failed_runs, " | ", pt.eligible ? "yes" : "no",
                   static_cast<int>(i) == r.chosen ? " (chosen)" : "", static_cast<int>(i) == r.best ? " (best NLL)" : "",
                   " |");
    out += line + "\n";
  }
  const PilotPoint& chosen = r.points[static_cast<std::size_t>(r.chosen)];
  const double limit = pilot.floor_fraction * pilot.effect;
  out += concat("\nRule (fixed in ", p.path, " before any run): a setting is eligible when the ",
                format_number(100 * pilot.sd_confidence, 0), "% upper confidence limit of the comparison's floor at the "
                "final milestone is below ", format_number(pilot.floor_fraction, 3), " x ", format_number(pilot.effect, 4),
                " = ", format_number(limit, 4), " nats, every seed finished and no run is unstable",
                e.failure ? " or failed (the [experiment.failure] rule)" : "",
                "; of those, the lowest learning rate whose ", base, " NLL is within ",
                format_number(pilot.nll_tolerance, 4), " nats of the best eligible one's.\n");
  for (std::size_t i = 0; i < r.points.size(); ++i) {  // the floor at the milestones before the last
    const PilotPoint& pt = r.points[i];
    for (std::size_t m = 0; m + 1 < pt.pair_sd.size(); ++m)
      if (static_cast<int>(i) == r.chosen && pt.pair_sd[m] > limit)
        out += concat("Note: at ", format_tokens(double(pt.milestones[m])), " tokens the chosen setting's floor is ",
                      format_printf("%.3g", pt.pair_sd[m]), ", above the threshold: its runs part early.\n");
  }
  out += r.rule_met ? concat("Chosen: ", chosen.label, ".\n")
                    : concat("No setting meets the rule; chosen: the lowest floor, ", chosen.label,
                             ". The study cannot resolve effects near ", format_number(pilot.effect, 4),
                             " at this compute: its floor's upper limit is ", format_number(chosen.pair_ucl, 4), ".\n");
  out += concat("\nSeeds: at ", chosen.label, ", the comparison's floor is ", format_printf("%.3g", r.sd_floor),
                " (upper limit ", format_printf("%.3g", chosen.pair_ucl), ") and the sd of ", primary, " - ", base, " is ",
                format_printf("%.3g", r.sd_primary), " over ", pilot.seeds.size(), " seeds; planning sd = the larger of "
                "their ", format_number(100 * pilot.sd_confidence, 0), "% upper confidence limits, ",
                format_number(r.sd_plan_without_failures, 4), ", with a planned failure rate of ",
                format_number(pilot.failure_rate, 3), " seeds moving the comparison by ", format_number(pilot.failure_nats, 3),
                " nats: ", format_number(r.sd_plan, 4), ".\n");
  std::string looks;
  for (int n : r.plan.design.looks) looks += (looks.empty() ? "" : ", ") + std::to_string(n);
  out += concat("Sequential seeds: ", spending_name(r.plan.design.spending), " looks at ", looks, " seeds: power ",
                format_number(r.plan.power, 3), " to resolve |dNLL| = ", format_number(pilot.effect, 4),
                " (", format_number(r.power_without_failures, 3), " were no run to fail; expected ",
                format_number(r.plan.expected_seeds, 1), " seeds at that effect; a fixed-sample t-test would need ",
                r.plan.fixed_seeds > 0 ? std::to_string(r.plan.fixed_seeds) : "n/a", ")",
                // The cap is max_seeds, or fewer when the budget pays for fewer (the design's last look).
                r.capped ? (r.plan.max_seeds < pilot.max_seeds
                                ? concat("; capped at the ", r.plan.max_seeds, " seeds the budget pays for (max_seeds = ",
                                         pilot.max_seeds, "): 80% power would need more")
                                : concat("; capped at max_seeds = ", pilot.max_seeds, ": 80% power would need more"))
                         : "",
                r.shrunk ? concat("; shrunk to the ", r.seeds_that_fit, " seeds the budget pays for: 80% power would need more")
                         : "",
                ".\n");
  const double study_hours = (r.core_seconds_fixed + r.core_seconds_per_seed * r.plan.max_seeds) / 3600.0;
  const double expected_hours = (r.core_seconds_fixed + r.core_seconds_per_seed * r.plan.expected_seeds) / 3600.0;
  out += concat("Compute: about ", format_number(r.core_seconds_per_seed, 0),
                " core-seconds per seed (every arm and group, evaluations included) and ",
                format_number(r.core_seconds_fixed, 0), " once for the twins' and groups' first seeds: ",
                format_number(study_hours, 2), " core-hours if every look is taken, about ", format_number(expected_hours, 2),
                " expected; budget ", format_number(pilot.budget_core_hours, 2), " core-hours: fits (",
                r.seeds_that_fit, " seeds would).\n");
  return out;
}

}  // namespace attnres::experiment
