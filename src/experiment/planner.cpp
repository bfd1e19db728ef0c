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

// The share of the seconds a run spends evaluating rather than training: every milestone scores
// eval_tokens (a forward pass, about a third of a training step's work per token), and the end a
// test evaluation of as many tokens.
double evaluation_overhead(const TrainConfig& c) {
  const double evaluated = double(c.eval_tokens) * double(c.milestone_steps().size() + 1);
  return evaluated / (3.0 * double(c.total_steps() * c.tokens_per_step()));
}

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
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    TrainConfig c = with_settings(e.base, shapes[i].settings, p.path);
    const results::TrainResult r = results::read_train_result(results[i]);
    shapes[i].tokens_per_core_second = r.tokens_per_sec / double(threads_of(c));
    shapes[i].tokens = tokens_for(c, pilot.run_core_seconds, shapes[i].tokens_per_core_second);
  }
  return shapes;
}

// One grid point's experiment: the baseline and its twin (and, for the chosen point, the primary
// arm) at the shape's budget and the point's learning rate.
ExperimentOptions point_options(const ProtocolFile& p, const PlanOptions& o, const ShapeThroughput& shape, double lr,
                                const std::string& label, bool with_primary, const std::string& primary) {
  const ExperimentOptions& e = p.options;
  ExperimentOptions x;
  x.base = with_settings(e.base, shape.settings, concat(p.path, ": ", label));
  x.base.lr = lr;
  x.base.tokens = shape.tokens;
  x.base.validate();
  x.preset = e.preset;
  x.arms = {e.arms.front(), twin_of(e.arms.front())};
  if (with_primary) x.arms.push_back(primary);
  for (std::uint64_t s : p.pilot->seeds) x.seeds.push_back(s);
  x.twin_perturbation = e.twin_perturbation;
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

// The primary comparison: the first arm after the baseline that is not its twin.
std::string primary_arm(const ExperimentOptions& e) {
  for (const std::string& a : e.arms)
    if (a != e.arms.front() && !is_twin(a)) return a;
  fail("the study has no compared arm besides the baseline and its twin");
}

// A grid point's numbers from its summary.
PilotPoint read_point(const ExperimentSummary& s, int shape, double lr, const std::string& label) {
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
  }
  const ArmComparison* base = s.milestones.back().find(s.spec.baseline);
  std::vector<double> v;
  for (const SeedValue& x : base->values) v.push_back(x.value);
  const PairedStats stats = paired_stats(v);  // of the values themselves: their mean and sd
  pt.baseline_nll = stats.mean;
  pt.baseline_sd = stats.sd;
  for (const RunResult& r : s.runs)
    if (const auto inst = results::run_instability(r); inst && inst->unstable) ++pt.unstable_runs;
  return pt;
}


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
  if (p.prepare) {
    out += "\n[experiment.prepare]\ninput = " + quoted_list(p.prepare->inputs) + "\n";
    out += concat("vocab_size = ", p.prepare->vocab_size, "\n");
    out += "val_fraction = " + format_printf("%g", p.prepare->val_fraction) + "\n";
    out += "test_fraction = " + format_printf("%g", p.prepare->test_fraction) + "\n";
  }
  out += "\n[experiment.noise]\nperturbation = " + format_printf("%g", e.twin_perturbation) + "\n";
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
    if (g.kind == "probe" && pilot.probes_at_equal_compute) {
      const auto it = std::find_if(r.shapes.begin(), r.shapes.end(),
                                   [&](const ShapeThroughput& t) { return t.label == "probe-" + g.name; });
      out += concat("tokens = ", it->tokens, "   # ", format_number(pilot.run_core_seconds, 0),
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
  const double grid_runs = double(n_shapes * pilot.lrs.size() * pilot.seeds.size() * 2 + pilot.seeds.size());
  const double pilot_core_seconds = grid_runs * pilot.run_core_seconds;
  require(pilot_core_seconds <= pilot.pilot_core_hours * 3600.0, p.path, ": [pilot] the grid (", n_shapes,
          n_shapes == 1 ? " shape" : " shapes", " x ", pilot.lrs.size(), " learning rates x ", pilot.seeds.size(),
          " seeds x the baseline and its twin, and the primary arm at the chosen setting: ", grid_runs,
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

  // 2. The grid: the baseline and its twin at every (shape, lr).
  std::vector<ExperimentOptions> grid;
  std::vector<std::pair<int, double>> where;
  for (std::size_t s = 0; s < n_shapes; ++s)
    for (double lr : pilot.lrs) {
      const std::string label = concat(result.shapes[s].label, "-lr", lr_text(lr));
      grid.push_back(point_options(p, o, result.shapes[s], lr, label, false, primary));
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

  // 3. The rule.
  const double floor_limit = pilot.floor_fraction * pilot.effect;
  for (std::size_t i = 0; i < grid.size(); ++i) {
    PilotPoint pt = read_point(compute_summary(grid[i].out_dir), where[i].first, where[i].second,
                               grid[i].name.substr(6));
    pt.eligible = pt.seeds == static_cast<int>(pilot.seeds.size()) && pt.unstable_runs == 0 &&
                  std::isfinite(pt.floor_sd.back()) && pt.floor_sd.back() < floor_limit;
    result.points.push_back(std::move(pt));
  }
  const auto better = [](const PilotPoint& a, const PilotPoint& b) { return a.baseline_nll < b.baseline_nll; };
  for (std::size_t i = 0; i < result.points.size(); ++i)
    if (result.points[i].eligible && (result.chosen < 0 || better(result.points[i], result.points[result.chosen])))
      result.chosen = static_cast<int>(i);
  result.rule_met = result.chosen >= 0;
  if (!result.rule_met)  // none meets the rule: the quietest setting, said plainly in the plan
    for (std::size_t i = 0; i < result.points.size(); ++i)
      if (result.chosen < 0 || result.points[i].floor_sd.back() < result.points[result.chosen].floor_sd.back())
        result.chosen = static_cast<int>(i);

  // 4. The primary arm at the chosen setting (the experiment grows by one arm).
  const PilotPoint& chosen = result.points[static_cast<std::size_t>(result.chosen)];
  ExperimentOptions with_primary = point_options(p, o, result.shapes[static_cast<std::size_t>(chosen.shape)], chosen.lr,
                                                 chosen.label, true, primary);
  if (!run_experiment(with_primary) && o.stop != nullptr && o.stop->load()) return std::nullopt;
  std::vector<std::string> primary_results;
  for (std::uint64_t seed : with_primary.seeds)
    primary_results.push_back(results::run_result_path(with_primary.out_dir, primary, static_cast<std::int64_t>(seed)));
  if (!wait_for(primary_results, o, status, "runs of the primary arm")) return std::nullopt;
  const ExperimentSummary at_chosen = compute_summary(with_primary.out_dir);
  const ArmComparison* primary_cmp = at_chosen.milestones.back().find(primary);
  result.sd_floor = chosen.floor_sd.back();
  result.sd_primary = primary_cmp->stats.sd;

  // 5. Seeds from the upper confidence limit of the larger sd, and the study's compute.
  const int n = static_cast<int>(pilot.seeds.size());
  result.sd_plan = sd_upper_confidence_limit(std::max(result.sd_floor, result.sd_primary), n, pilot.sd_confidence);
  const Spending spending = parse_spending(pilot.spending);
  result.plan = max_seeds_for_power(pilot.effect, result.sd_plan, spending);
  // At least kMinStudySeeds (a design that resolves in 3 seeds would rest on an sd of 2 degrees of
  // freedom), at most the cap.
  result.capped = result.plan.max_seeds == 0 || result.plan.max_seeds > pilot.max_seeds;
  if (result.capped || result.plan.max_seeds < kMinStudySeeds) {
    SeedPlan capped;
    capped.max_seeds = result.capped ? pilot.max_seeds : kMinStudySeeds;
    capped.design = {looks_at_fractions(capped.max_seeds, kDefaultLookFractions), 0.05, spending};
    const SequentialPower power = sequential_power(capped.design, sequential_boundaries(capped.design), pilot.effect,
                                                   result.sd_plan);
    capped.power = power.power;
    capped.expected_seeds = power.expected_seeds;
    capped.fixed_seeds = pairs_needed(pilot.effect, result.sd_plan);
    capped.inflation = capped.fixed_seeds > 0 ? double(capped.max_seeds) / capped.fixed_seeds : 0;
    result.plan = capped;
  }
  // Per seed: every main arm at run_core_seconds, each group's arms at theirs (controls: their
  // fraction of the main budget; probes: run_core_seconds at equal compute), plus evaluations.
  const ShapeThroughput& shape = result.shapes[static_cast<std::size_t>(chosen.shape)];
  TrainConfig main = with_settings(e.base, shape.settings, p.path);
  main.tokens = shape.tokens;
  double per_seed = double(e.arms.size()) * pilot.run_core_seconds * (1 + evaluation_overhead(main));
  // (At most: a group whose baseline runs are the main's trains one arm fewer.)
  for (const GroupOptions& g : e.groups) {
    const double fraction = g.kind == "probe" && pilot.probes_at_equal_compute ? 1.0 : (g.budget > 0 ? g.budget : 1.0);
    per_seed += double(g.arms.size()) * pilot.run_core_seconds * fraction * (1 + evaluation_overhead(main));
  }
  result.core_seconds_per_seed = per_seed;
  result.seeds_that_fit = static_cast<int>(pilot.budget_core_hours * 3600.0 / per_seed);

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
