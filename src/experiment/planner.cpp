#include "experiment/planner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <thread>

#include "analysis/format.hpp"
#include "experiment/plan.hpp"
#include "experiment/runner.hpp"
#include "analysis/stats.hpp"
#include "analysis/summary.hpp"
#include "model/arms.hpp"
#include "results/instability.hpp"
#include "results/run_result.hpp"
#include "results/train_result.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/machine.hpp"
#include "util/status_line.hpp"

namespace attnres::experiment {
using namespace analysis;  // the statistics, summaries and number formats of the analysis module
namespace {

namespace fs = std::filesystem;

constexpr int kMinStudySeeds = 5;

std::string lr_text(double lr) { return format_printf("%g", lr); }

// The whole steps that `core_seconds` of one run buy at `tokens_per_core_second` (at least one).
std::int64_t tokens_for(const TrainConfig& c, double core_seconds, double tokens_per_core_second) {
  const auto steps = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(core_seconds * tokens_per_core_second / double(c.tokens_per_step())));
  return steps * c.tokens_per_step();
}

int threads_of(const TrainConfig& c) { return c.threads > 0 ? c.threads : online_cores(); }

TrainConfig with_settings(TrainConfig c, const std::vector<std::string>& settings, const std::string& where) {
  for (const auto& s : settings) apply_setting(c, s, where);
  c.validate();
  return c;
}

// Waits until every path exists; false when stopped first.
bool wait_for(const std::vector<std::string>& paths, const PlanOptions& o, StatusLine& status, const std::string& what) {
  bool said = false;
  for (;;) {
    const auto missing = std::count_if(paths.begin(), paths.end(), [](const std::string& p) { return !fs::exists(p); });
    if (missing == 0) return true;
    if (o.stop != nullptr && o.stop->load()) return false;
    if (!said) status.message(concat("plan: waiting for ", missing, " ", what, " of the other workers"));
    said = true;
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
}

// 1. Throughput: a short run per shape, this worker's share; then every shape's.
std::optional<std::vector<ShapeThroughput>> measure_throughput(const ProtocolFile& p, const PlanOptions& o,
                                                               StatusLine& status) {
  const PilotSpec& pilot = *p.pilot;
  const ExperimentOptions& e = p.options;
  std::vector<ShapeThroughput> shapes;
  if (pilot.shapes.empty()) shapes.push_back({"shape0", {}, 0, 0});
  for (std::size_t i = 0; i < pilot.shapes.size(); ++i) shapes.push_back({concat("shape", i), pilot.shapes[i], 0, 0});
  if (pilot.probes_at_equal_compute)
    for (const GroupOptions& g : e.groups)
      if (g.kind == "probe") shapes.push_back({"probe-" + g.name, g.settings, 0, 0});
  std::vector<std::string> results;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::string dir = (fs::path(o.out_dir) / "throughput" / shapes[i].label).string();
    results.push_back(results::train_result_path(dir));
    if (static_cast<int>(i % static_cast<std::size_t>(o.workers)) != o.worker || fs::exists(results.back())) continue;
    if (o.stop != nullptr && o.stop->load()) return std::nullopt;
    TrainConfig c = with_settings(e.base, shapes[i].settings, concat(p.path, ": ", shapes[i].label));
    c.model = apply_arm(c.model, e.arms.front());
    c.tokens = std::int64_t(pilot.throughput_steps) * c.tokens_per_step();
    c.milestones = {1.0};
    c.eval_tokens = c.seq_len + 1;
    c.checkpoint_every = pilot.throughput_steps;
    c.seed = c.data_seed = pilot.seeds.front();
    status.message(concat("plan: measuring the throughput of ", shapes[i].label, " (", pilot.throughput_steps, " steps)"));
    const int rc = train_child(c, e.data_dir, dir, "throughput " + shapes[i].label, o.stop);
    if (rc != 0 && !fs::exists(results.back())) return std::nullopt;  // stopped
  }
  if (!wait_for(results, o, status, "throughput measurements")) return std::nullopt;
  double core_seconds = pilot.run_core_seconds;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    TrainConfig c = with_settings(e.base, shapes[i].settings, p.path);
    const results::TrainResult r = results::read_train_result(results[i]);
    shapes[i].tokens_per_core_second = results::tokens_per_core_second(r.tokens_per_sec, r.step_time_ms,
                                                                       r.cpu_seconds_per_step, threads_of(c), r.processes);
    if (i == 0 && pilot.tokens > 0) {  // a fixed budget: the other shapes (probes) get its measured compute
      shapes[i].tokens = std::max<std::int64_t>(1, pilot.tokens / c.tokens_per_step()) * c.tokens_per_step();
      core_seconds = double(shapes[i].tokens) / shapes[i].tokens_per_core_second;
      continue;
    }
    shapes[i].tokens = tokens_for(c, core_seconds, shapes[i].tokens_per_core_second);
  }
  return shapes;
}

// One grid point's experiment: the baseline and its twin (and, for the chosen point, the primary
// arm) at the shape's budget and the point's learning rate.
ExperimentOptions point_options(const ProtocolFile& p, const PlanOptions& o, const ShapeThroughput& shape, double lr,
                                const std::string& label, const std::string& primary) {
  const ExperimentOptions& e = p.options;
  ExperimentOptions x;
  x.base = with_settings(e.base, shape.settings, concat(p.path, ": ", label));
  x.base.lr = lr;
  x.base.tokens = shape.tokens;
  x.base.validate();
  x.preset = e.preset;
  // The floor of every arm of the primary comparison: the baseline, the primary arm and their twins.
  x.arms = {e.arms.front(), twin_of(e.arms.front()), primary, twin_of(primary)};
  for (std::uint64_t s : p.pilot->seeds) x.seeds.push_back(s);
  x.twin_perturbation = e.twin_perturbation;
  x.failure = e.failure;
  x.floor_margin = e.floor_margin;
  x.name = "pilot-" + label;
  x.description = concat("pilot of ", e.name, ": ", label);
  x.data_dir = e.data_dir;
  x.out_dir = (fs::path(o.out_dir) / "grid" / label).string();
  x.worker = o.worker;
  x.workers = o.workers;
  x.stop = o.stop;
  x.progress = o.progress;
  return x;
}

}  // namespace

std::string primary_arm(const ExperimentOptions& e) {
  for (const std::string& a : e.arms)
    if (a != e.arms.front() && !is_twin(a)) return a;
  fail("the study has no compared arm besides the baseline and its twin");
}

SummaryOptions pilot_summary_options(const PilotSpec& pilot) {
  SummaryOptions so;
  so.effect = pilot.effect;
  return so;
}

PilotPoint pilot_point(const ExperimentSummary& s, const PilotSpec& pilot, int shape, double lr,
                       const std::string& label, const std::string& primary) {
  PilotPoint pt;
  pt.shape = shape;
  pt.lr = lr;
  pt.label = label;
  pt.dir = s.dir;
  for (const Comparison& c : s.milestones) {
    pt.milestones.push_back(c.tokens);
    pt.floor_sd.push_back(c.noise_floor ? c.noise_floor->sd : results::kNotAvailable);
    pt.floor_mean.push_back(c.noise_floor ? c.noise_floor->mean : results::kNotAvailable);
    if (c.noise_floor) pt.seeds = c.noise_floor->n;
    double own = results::kNotAvailable;
    for (const results::NoiseFloor& f : c.arm_floors)
      if (f.twin == twin_of(primary)) own = f.sd;
    pt.primary_floor_sd.push_back(own);
    const ArmComparison* a = c.find(primary);
    const bool tested = a != nullptr && a->floor.has_value();
    pt.pair_sd.push_back(tested ? a->floor->pair_sd : results::kNotAvailable);
    if (tested) pt.pair_dof = a->floor->dof;
  }
  const ArmComparison* base = s.milestones.back().find(s.spec.baseline);
  std::vector<double> v;
  for (const SeedValue& x : base->values) v.push_back(x.value);
  const PairedStats stats = paired_stats(v);  // of the values themselves: their mean and sd
  pt.baseline_nll = stats.mean;
  pt.baseline_sd = stats.sd;
  const ArmComparison* p = s.milestones.back().find(primary);
  pt.primary_sd = p != nullptr ? p->stats.sd : results::kNotAvailable;
  pt.pair_ucl = std::isfinite(pt.pair_sd.back()) && pt.pair_dof > 0
                    ? sd_upper_confidence_limit_dof(pt.pair_sd.back(), pt.pair_dof, pilot.sd_confidence)
                    : results::kNotAvailable;
  for (const RunResult& r : s.runs)
    if (const auto inst = results::run_instability(r); inst && inst->unstable) ++pt.unstable_runs;
  for (const results::RunFailure& f : s.failures) pt.failed_runs += f.failed ? 1 : 0;
  // The rule: the comparison's floor (both twins) has its upper confidence limit below the
  // threshold, every seed finished, no run unstable or failed.
  pt.eligible = pt.seeds == static_cast<int>(pilot.seeds.size()) && pt.unstable_runs == 0 && pt.failed_runs == 0 &&
                std::isfinite(pt.pair_ucl) && pt.pair_ucl < pilot.floor_fraction * pilot.effect;
  return pt;
}

int choose_point(const std::vector<PilotPoint>& points, double nll_tolerance, int* best_out) {
  int best = -1;
  for (std::size_t i = 0; i < points.size(); ++i)
    if (points[i].eligible && (best < 0 || points[i].baseline_nll < points[static_cast<std::size_t>(best)].baseline_nll))
      best = static_cast<int>(i);
  if (best_out != nullptr) *best_out = best;
  if (best < 0) return -1;
  const double within = points[static_cast<std::size_t>(best)].baseline_nll + nll_tolerance;
  int chosen = -1;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const PilotPoint& pt = points[i];
    if (!pt.eligible || pt.baseline_nll > within) continue;
    if (chosen < 0) { chosen = static_cast<int>(i); continue; }
    const PilotPoint& c = points[static_cast<std::size_t>(chosen)];
    if (pt.lr < c.lr || (pt.lr == c.lr && pt.baseline_nll < c.baseline_nll)) chosen = static_cast<int>(i);
  }
  return chosen;
}

namespace {

// A TOML basic string.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string quoted_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + quoted(items[i]);
  return out + "]";
}

// The keys of `config` that differ from its preset, as TOML lines of one section ("model" or "train").
std::string section_lines(const TrainConfig& preset_config, const TrainConfig& config, const std::string& section) {
  std::string out;
  for (const ConfigDifference& d : config_differences(train_config_keys(), preset_config, config))
    if (d.key.rfind(section + ".", 0) == 0) out += d.key.substr(section.size() + 1) + " = " + d.b + "\n";
  return out;
}

std::string plan_protocol_text(const ProtocolFile& p, const PlanResult& r, const std::string& primary) {
  const ExperimentOptions& e = p.options;
  const PilotSpec& pilot = *p.pilot;
  const PilotPoint& chosen = r.points[static_cast<std::size_t>(r.chosen)];
  const ShapeThroughput& shape = r.shapes[static_cast<std::size_t>(chosen.shape)];
  std::string out;
  std::string report = plan_report(p, r);
  std::size_t start = 0;
  while (start < report.size()) {
    const std::size_t end = report.find('\n', start);
    const std::string line = report.substr(start, end == std::string::npos ? std::string::npos : end - start);
    out += line.empty() ? "#\n" : "# " + line + "\n";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  out += "\n[experiment]\n";
  out += "name = " + quoted(e.name) + "\n";
  if (!e.description.empty()) out += "description = " + quoted(e.description) + "\n";
  out += "data = " + quoted(e.data_dir) + "\n";
  out += "preset = " + quoted(e.preset) + "\n";
  out += "arms = " + quoted_list(e.arms) + "\n";
  out += "effect = " + format_printf("%g", pilot.effect) + "\n";
  out += "planned_tokens_per_core_second = " + format_printf("%.0f", shape.tokens_per_core_second) +
         "   # measured by the pilot; experiment --dry-run prices the runs with it\n";
  if (p.prepare) {
    out += "\n[experiment.prepare]\ninput = " + quoted_list(p.prepare->inputs) + "\n";
    out += concat("vocab_size = ", p.prepare->vocab_size, "\n");
    out += "val_fraction = " + format_printf("%g", p.prepare->val_fraction) + "\n";
    out += "test_fraction = " + format_printf("%g", p.prepare->test_fraction) + "\n";
  }
  out += "\n[experiment.noise]\nperturbation = " + format_printf("%g", e.twin_perturbation) + "\n";
  if (e.twin_seeds > 0) out += concat("seeds = ", e.twin_seeds, "\n");
  out += "margin = " + format_printf("%.10g", e.floor_margin > 0 ? e.floor_margin : pilot.floor_fraction * pilot.effect) + "\n";
  if (e.failure) {
    out += "\n[experiment.failure]\nclipped_fraction = " + format_printf("%g", e.failure->clipped_fraction) + "\n";
    out += "stall_nats = " + format_printf("%g", e.failure->stall_nats) + "\n";
    out += concat("stall_steps = ", e.failure->stall_steps, "\n");
  }
  out += "\n[experiment.sequential]\nlooks = [";
  for (std::size_t i = 0; i < r.plan.design.looks.size(); ++i) out += concat(i ? ", " : "", r.plan.design.looks[i]);
  out += "]\nalpha = " + format_printf("%g", r.plan.design.alpha) + "\n";
  out += "spending = " + quoted(spending_name(r.plan.design.spending)) + "\n";
  out += "effect = " + format_printf("%g", pilot.effect) + "\n";
  out += "primary = " + quoted(primary) + "\n";

  const TrainConfig preset_config = preset(e.preset);
  TrainConfig main = with_settings(e.base, shape.settings, p.path);
  main.lr = chosen.lr;
  main.tokens = shape.tokens;
  out += "\n[model]\n" + section_lines(preset_config, main, "model");
  out += "\n[train]\n" + section_lines(preset_config, main, "train");
  for (const GroupOptions& g : e.groups) {
    out += g.kind == "controls" ? "\n[[controls]]\n" : "\n[[probe]]\n";
    out += "name = " + quoted(g.name) + "\n";
    if (g.arms.front() != e.arms.front()) out += "baseline = " + quoted(g.arms.front()) + "\n";
    out += "arms = " + quoted_list(std::vector<std::string>(g.arms.begin() + 1, g.arms.end())) + "\n";
    if (!g.settings.empty()) out += "set = " + quoted_list(g.settings) + "\n";
    if (g.seed_count > 0) out += concat("seeds = ", g.seed_count, "\n");
    if (g.kind == "probe" && pilot.probes_at_equal_compute) {
      const auto it = std::find_if(r.shapes.begin(), r.shapes.end(),
                                   [&](const ShapeThroughput& t) { return t.label == "probe-" + g.name; });
      out += concat("tokens = ", it->tokens, "   # ",
                    format_number(double(r.shapes.front().tokens) / r.shapes.front().tokens_per_core_second, 0),
                    " core-seconds at its measured throughput: equal compute\n");
    } else if (g.budget > 0) {
      out += "budget = " + format_printf("%g", g.budget) + "\n";
    } else if (g.tokens > 0) {
      out += concat("tokens = ", g.tokens, "\n");
    }
  }
  return out;
}

}  // namespace

std::optional<PlanResult> run_pilot(const ProtocolFile& p, const PlanOptions& o) {
  require(p.pilot.has_value(), p.path, ": not a pilot file: it has no [pilot] table (see docs/experiments.md, "
          "\"Designing a study that can answer\")");
  const PilotSpec& pilot = *p.pilot;
  const ExperimentOptions& e = p.options;
  require(o.workers >= 1 && o.worker >= 0 && o.worker < o.workers, "--worker K/N needs 0 <= K < N");
  const std::string primary = primary_arm(e);
  const std::size_t n_shapes = std::max<std::size_t>(1, pilot.shapes.size());
  // The pilot's compute, known before any run: every run gets run_core_seconds.
  const double grid_runs = double(n_shapes * pilot.lrs.size() * pilot.seeds.size() * 4);
  const double pilot_core_seconds = grid_runs * pilot.run_core_seconds;
  require(pilot_core_seconds <= pilot.pilot_core_hours * 3600.0, p.path, ": [pilot] the grid (", n_shapes,
          n_shapes == 1 ? " shape" : " shapes", " x ", pilot.lrs.size(), " learning rates x ", pilot.seeds.size(),
          " seeds x the baseline, the primary arm and their twins: ", grid_runs,
          " runs of run_core_seconds = ", pilot.run_core_seconds, ") needs ",
          format_number(pilot_core_seconds / 3600.0, 2), " core-hours, over pilot_core_hours = ",
          pilot.pilot_core_hours, "; shrink the grid or the runs, or raise the cap");
  StatusLine status(o.progress);
  status.message(concat("plan: ", grid_runs, " pilot runs of ", pilot.run_core_seconds, " core-seconds (",
                        format_number(pilot_core_seconds / 3600.0, 2), " core-hours)"));

  PlanResult result;
  const auto shapes = measure_throughput(p, o, status);
  if (!shapes) return std::nullopt;
  result.shapes = *shapes;

  // 2. The grid: the baseline, the primary arm and both twins at every (shape, lr).
  std::vector<ExperimentOptions> grid;
  std::vector<std::pair<int, double>> where;
  for (std::size_t s = 0; s < n_shapes; ++s)
    for (double lr : pilot.lrs) {
      const std::string label = concat(result.shapes[s].label, "-lr", lr_text(lr));
      grid.push_back(point_options(p, o, result.shapes[s], lr, label, primary));
      where.emplace_back(static_cast<int>(s), lr);
    }
  std::vector<std::string> grid_results;
  for (const ExperimentOptions& x : grid) {
    if (!run_experiment(x)) {
      if (o.stop != nullptr && o.stop->load()) return std::nullopt;
    }
    for (const std::string& arm : x.arms)
      for (std::uint64_t seed : x.seeds)
        grid_results.push_back(results::run_result_path(x.out_dir, arm, static_cast<std::int64_t>(seed)));
  }
  if (!wait_for(grid_results, o, status, "pilot runs")) return std::nullopt;

  // 3. The rule: the comparison's floor (both twins) has its upper confidence limit below the
  // threshold, every run finished, none unstable or failed; among those, the lowest learning rate
  // whose baseline NLL is within nll_tolerance of the best one's.
  for (std::size_t i = 0; i < grid.size(); ++i)
    result.points.push_back(pilot_point(compute_summary(grid[i].out_dir, pilot_summary_options(pilot)), pilot,
                                        where[i].first, where[i].second, grid[i].name.substr(6), primary));
  result.chosen = choose_point(result.points, pilot.nll_tolerance, &result.best);
  result.rule_met = result.chosen >= 0;
  if (!result.rule_met)  // none meets the rule: the quietest setting, said plainly in the plan
    for (std::size_t i = 0; i < result.points.size(); ++i)
      if (std::isfinite(result.points[i].pair_ucl) &&
          (result.chosen < 0 || result.points[i].pair_ucl < result.points[result.chosen].pair_ucl))
        result.chosen = static_cast<int>(i);
  require(result.chosen >= 0, "plan: no pilot setting has a measured floor (every setting needs two finished seeds)");
  const PilotPoint& chosen = result.points[static_cast<std::size_t>(result.chosen)];
  result.sd_floor = chosen.pair_sd.back();
  result.sd_primary = chosen.primary_sd;

  // 4. Seeds from the upper confidence limits (the same standard as the rule) of the floor and the
  // primary comparison's sd, the larger, with the planned failures' variance on top.
  const int n = static_cast<int>(pilot.seeds.size());
  const double primary_ucl = sd_upper_confidence_limit(std::isfinite(result.sd_primary) ? result.sd_primary : 0, n,
                                                       pilot.sd_confidence);
  result.sd_plan_without_failures = std::max(chosen.pair_ucl, primary_ucl);
  result.sd_plan = std::sqrt(result.sd_plan_without_failures * result.sd_plan_without_failures +
                             pilot.failure_rate * (1 - pilot.failure_rate) * pilot.failure_nats * pilot.failure_nats);
  const Spending spending = parse_spending(pilot.spending);
  // Per seed: every main arm that is not a twin at run_core_seconds, each group's arms at theirs
  // (controls: their fraction of the main budget; probes: run_core_seconds at equal compute), plus
  // evaluations; the twins only on their first seeds, once.
  const ShapeThroughput& shape = result.shapes[static_cast<std::size_t>(chosen.shape)];
  TrainConfig main = with_settings(e.base, shape.settings, p.path);
  main.tokens = shape.tokens;
  // One run's measured compute (run_core_seconds, or a fixed budget's worth at its measured speed).
  const double run_cost = double(shape.tokens) / shape.tokens_per_core_second * (1 + evaluation_overhead(main));
  double per_seed = 0, fixed = 0;
  const int twin_seeds = e.twin_seeds;
  for (const std::string& arm : e.arms)
    if (is_twin(arm) && twin_seeds > 0) fixed += run_cost * twin_seeds;
    else per_seed += run_cost;
  for (const GroupOptions& g : e.groups) {
    const double fraction = g.kind == "probe" && pilot.probes_at_equal_compute ? 1.0 : (g.budget > 0 ? g.budget : 1.0);
    const double cost = double(g.arms.size()) * run_cost * fraction;  // at most: a reused baseline trains one fewer
    if (g.seed_count > 0) fixed += cost * g.seed_count;
    else per_seed += cost;
  }
  result.core_seconds_per_seed = per_seed;
  result.core_seconds_fixed = fixed;
  const double budget = pilot.budget_core_hours * 3600.0;
  result.seeds_that_fit = per_seed > 0 ? static_cast<int>((budget - fixed) / per_seed) : 0;
  result.plan = max_seeds_for_power(pilot.effect, result.sd_plan, spending);
  // At least kMinStudySeeds (a design that resolves in 3 seeds would rest on an sd of 2 degrees of
  // freedom), at most the cap and what the budget pays for; a design that cannot fit kMinStudySeeds
  // is refused.
  require(result.seeds_that_fit >= kMinStudySeeds, p.path, ": [pilot] budget_core_hours = ", pilot.budget_core_hours,
          " pays for ", std::max(result.seeds_that_fit, 0), " seeds of this study (", format_number(per_seed, 0),
          " core-seconds per seed, ", format_number(fixed, 0), " for the twins' and groups' first seeds); at least ",
          kMinStudySeeds, " are needed: raise the budget or cut arms, groups or the run length. Nothing was written.");
  const int cap = std::min(pilot.max_seeds, result.seeds_that_fit);
  result.capped = result.plan.max_seeds == 0 || result.plan.max_seeds > pilot.max_seeds;
  result.shrunk = !result.capped && result.plan.max_seeds > result.seeds_that_fit;
  if (result.capped || result.shrunk || result.plan.max_seeds < kMinStudySeeds) {
    SeedPlan fitted;
    fitted.max_seeds = result.plan.max_seeds < kMinStudySeeds && !result.capped && !result.shrunk ? kMinStudySeeds : cap;
    fitted.design = {looks_at_fractions(fitted.max_seeds, kDefaultLookFractions), 0.05, spending};
    const SequentialPower power = sequential_power(fitted.design, sequential_boundaries(fitted.design), pilot.effect,
                                                   result.sd_plan);
    fitted.power = power.power;
    fitted.expected_seeds = power.expected_seeds;
    fitted.fixed_seeds = pairs_needed(pilot.effect, result.sd_plan);
    fitted.inflation = fitted.fixed_seeds > 0 ? double(fitted.max_seeds) / fitted.fixed_seeds : 0;
    result.plan = fitted;
  }
  result.power_without_failures =
      sequential_power(result.plan.design, sequential_boundaries(result.plan.design), pilot.effect,
                       result.sd_plan_without_failures)
          .power;

  // 6. The protocol.
  result.protocol_path = o.write_to.empty() ? pilot.out : o.write_to;
  result.protocol_text = plan_protocol_text(p, result, primary);
  // Not over a protocol of other contents (a committed study, a hand-edited plan) unless asked.
  result.protocol_unchanged =
      write_text_guarded(result.protocol_path, result.protocol_text, o.force,
                         "the pilot's runs are kept, so rerun with --force to replace it, or with --write PATH to "
                         "write the plan elsewhere") == GuardedWrite::kUnchanged;
  read_protocol(result.protocol_path);  // it reads back as a protocol
  return result;
}

}  // namespace attnres::experiment
