#include "experiment/summary.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "experiment/stats.hpp"
#include "util/error.hpp"

namespace attnres::experiment {
namespace {

namespace fs = std::filesystem;

double mean_of(const std::vector<double>& v) {
  if (v.empty()) return results::kNotAvailable;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// The paired statistics as summary.json records them.
results::PairedSummary paired_summary(const PairedStats& p) {
  return {p.n, p.mean, p.sd, p.ci_low, p.ci_high, p.t, p.p_value, p.wins};
}

// For messages about one file.
std::string path_of(const ExperimentSummary& s, const RunResult& r) {
  return results::run_result_path(s.dir, r.arm, r.seed);
}

Comparison compare(const ExperimentSummary& s, const std::string& split, std::int64_t tokens,
                   double (*value_of)(const RunResult&, std::int64_t tokens)) {
  Comparison c;
  c.split = split;
  c.tokens = tokens;
  std::map<std::int64_t, double> baseline;
  for (const auto seed : s.spec.seeds)
    if (const RunResult* r = s.find_run(s.spec.baseline, seed)) baseline[seed] = value_of(*r, tokens);
  for (const auto& arm : s.spec.arms) {
    ArmComparison a;
    a.arm = arm;
    a.is_baseline = arm == s.spec.baseline;
    std::vector<double> values, deltas;
    for (const auto seed : s.spec.seeds) {
      const RunResult* r = s.find_run(arm, seed);
      if (!r) continue;
      const double v = value_of(*r, tokens);
      a.values.push_back({seed, v});
      values.push_back(v);
      const auto base = baseline.find(seed);
      if (!a.is_baseline && base != baseline.end()) {
        a.deltas.push_back({seed, v - base->second});
        deltas.push_back(v - base->second);
      }
    }
    a.mean = mean_of(values);
    a.stats = paired_summary(paired_stats(deltas));
    if (!a.is_baseline) {
      a.ppl_change = ppl_change(a.stats.mean);
      a.ppl_change_ci_low = ppl_change(a.stats.ci_low);
      a.ppl_change_ci_high = ppl_change(a.stats.ci_high);
    }
    c.arms.push_back(std::move(a));
  }
  return c;
}

double val_nll_at(const RunResult& r, std::int64_t tokens) {
  for (const auto& m : r.milestones)
    if (m.tokens == tokens) return m.val_nll;
  fail(r.arm, " seed ", r.seed, ": no validation NLL at ", tokens, " tokens");  // read_run_result guarantees it
}

double test_nll_of(const RunResult& r, std::int64_t) { return r.test_nll; }

std::vector<ArmRouting> summarize_routing(const ExperimentSummary& s) {
  std::vector<ArmRouting> out;
  for (const auto& arm : s.spec.arms) {
    std::vector<const RunResult*> runs;
    for (const auto seed : s.spec.seeds)
      if (const RunResult* r = s.find_run(arm, seed)) runs.push_back(r);
    const auto routed = std::count_if(runs.begin(), runs.end(), [](const RunResult* r) { return !r->routing.empty(); });
    if (routed == 0) continue;
    // Layer structure is fixed by the model config, so every seed must agree on it.
    const RunResult& first = **std::find_if(runs.begin(), runs.end(), [](auto* r) { return !r->routing.empty(); });
    for (const RunResult* r : runs) {
      require(!r->routing.empty(), path_of(s, *r), ": key 'routing' is missing but ", path_of(s, first),
              " has it (same arm)");
      require(r->routing.size() == first.routing.size(), path_of(s, *r), ": key 'routing.layers' has ",
              r->routing.size(), " layers but ", path_of(s, first), " has ", first.routing.size());
      for (std::size_t l = 0; l < first.routing.size(); ++l) {
        const LayerRouting &a = r->routing[l], &b = first.routing[l];
        require(a.layer == b.layer && a.sources == b.sources && a.v_mean.empty() == b.v_mean.empty(), path_of(s, *r),
                ": key 'routing.layers' entry for layer ", a.layer, " (", a.sources, " sources",
                a.v_mean.empty() ? "" : ", v_mean", ") does not match ", path_of(s, first), " (layer ", b.layer, ", ",
                b.sources, " sources", b.v_mean.empty() ? "" : ", v_mean", ")");
      }
    }

    ArmRouting ar;
    ar.arm = arm;
    ar.n_seeds = static_cast<int>(runs.size());
    ar.two_routes = !first.routing.front().v_mean.empty();
    ar.per_token_js = ar.two_routes;
    for (const RunResult* r : runs)
      for (const auto& l : r->routing)
        if (l.sources > 1 && std::isnan(l.js_nats)) ar.per_token_js = false;

    const double inv = 1.0 / static_cast<double>(runs.size());
    std::vector<double> all_js, multi_js;
    for (std::size_t l = 0; l < first.routing.size(); ++l) {
      LayerRoutingSummary ls;
      ls.layer = first.routing[l].layer;
      ls.sources = first.routing[l].sources;
      ls.qk_mean.assign(ls.sources, 0.0);
      if (ar.two_routes) ls.v_mean.assign(ls.sources, 0.0);
      double js_sum = 0;
      for (const RunResult* r : runs) {
        const LayerRouting& lr = r->routing[l];
        for (int i = 0; i < ls.sources; ++i) {
          ls.qk_mean[i] += lr.qk_mean[i] * inv;
          if (ar.two_routes) ls.v_mean[i] += lr.v_mean[i] * inv;
        }
        if (!std::isnan(lr.js_nats)) js_sum += lr.js_nats;
      }
      if (ar.two_routes) {
        ls.js_of_means_nats = js_divergence_nats(ls.qk_mean, ls.v_mean);
        // One source: both routes put all weight on it, so JS is exactly 0 whatever the runner wrote.
        if (ls.sources == 1) ls.js_nats = ls.js_of_means_nats = 0;
        else ls.js_nats = ar.per_token_js ? js_sum * inv : ls.js_of_means_nats;
        ls.js_bits = nats_to_bits(ls.js_nats);
        all_js.push_back(ls.js_nats);
        if (ls.sources > 1) multi_js.push_back(ls.js_nats);
      }
      ar.layers.push_back(std::move(ls));
    }
    if (ar.two_routes) {
      ar.all_layers = {mean_of(all_js), nats_to_bits(mean_of(all_js)), static_cast<int>(all_js.size())};
      ar.multi_source_layers = {mean_of(multi_js), nats_to_bits(mean_of(multi_js)),
                                static_cast<int>(multi_js.size())};
    }
    out.push_back(std::move(ar));
  }
  return out;
}

std::vector<ArmSystems> summarize_systems(const ExperimentSummary& s) {
  std::vector<ArmSystems> out;
  for (const auto& arm : s.spec.arms) {
    ArmSystems a;
    a.arm = arm;
    std::vector<double> tps, step, rss;
    const RunResult* first = nullptr;
    for (const auto seed : s.spec.seeds) {
      const RunResult* r = s.find_run(arm, seed);
      if (!r) continue;
      if (!first) first = r;
      // The parameter count follows from the model config alone; a difference means mixed configs.
      require(r->params == first->params, path_of(s, *r), ": key 'params' is ", r->params, " but ",
              path_of(s, *first), " has ", first->params, " (same arm)");
      tps.push_back(r->tokens_per_sec);
      step.push_back(r->step_time_ms);
      rss.push_back(static_cast<double>(r->peak_rss_bytes));
    }
    if (!first) continue;
    a.runs = static_cast<int>(tps.size());
    a.params = first->params;
    a.tokens_per_sec = mean_of(tps);
    a.step_time_ms = mean_of(step);
    a.peak_rss_bytes = mean_of(rss);
    out.push_back(a);
  }
  const auto base = std::find_if(out.begin(), out.end(), [&](const ArmSystems& a) { return a.arm == s.spec.baseline; });
  if (base != out.end()) {
    const ArmSystems b = *base;
    auto ratio = [](double x, double y) { return y > 0 ? x / y : results::kNotAvailable; };
    for (auto& a : out) {
      a.params_overhead = ratio(static_cast<double>(a.params - b.params), static_cast<double>(b.params));
      a.tokens_per_sec_ratio = ratio(a.tokens_per_sec, b.tokens_per_sec);
      a.step_time_ratio = ratio(a.step_time_ms, b.step_time_ms);
      a.peak_rss_ratio = ratio(a.peak_rss_bytes, b.peak_rss_bytes);
    }
  }
  return out;
}

}  // namespace

const RunResult* ExperimentSummary::find_run(const std::string& arm, std::int64_t seed) const {
  for (const auto& r : runs)
    if (r.arm == arm && r.seed == seed) return &r;
  return nullptr;
}

RunResult read_run_result(const std::string& path, const ExperimentSpec& spec, const std::string& arm,
                          std::int64_t seed) {
  RunResult r = results::read_run_result(path);
  const auto bad = [&](const char* key, const std::string& what) { fail(path, ": key '", key, "' ", what); };
  if (r.arm != arm) bad("arm", concat("is '", r.arm, "' but the file is in the directory of arm '", arm, "'"));
  if (r.seed != seed) bad("seed", concat("is ", r.seed, " but the file is in the directory of seed ", seed));
  for (const auto m : spec.milestones)
    if (std::none_of(r.milestones.begin(), r.milestones.end(), [&](const auto& p) { return p.tokens == m; }))
      bad("milestones", concat("has no entry at ", m, " tokens (an experiment.json milestone)"));
  return r;
}

ExperimentSummary compute_summary(const std::string& dir) {
  require(fs::is_directory(dir), "experiment directory '", dir, "' does not exist");
  ExperimentSummary s;
  s.dir = dir;
  s.spec = results::read_experiment_spec(results::experiment_spec_path(dir));
  for (const auto& arm : s.spec.arms) {
    for (const auto seed : s.spec.seeds) {
      const std::string path = results::run_result_path(dir, arm, seed);
      if (fs::exists(path)) s.runs.push_back(read_run_result(path, s.spec, arm, seed));
      else s.missing.push_back({arm, seed});
    }
  }
  for (const auto m : s.spec.milestones) s.milestones.push_back(compare(s, "val", m, val_nll_at));
  s.test = compare(s, "test", s.spec.tokens, test_nll_of);
  s.routing = summarize_routing(s);
  s.systems = summarize_systems(s);
  return s;
}

ExperimentSummary summarize(const std::string& dir) {
  ExperimentSummary s = compute_summary(dir);
  results::write_summary(results::summary_path(dir), summary_file(s));
  return s;
}

results::Summary summary_file(const ExperimentSummary& s) {
  results::Summary out;
  out.experiment = s.spec;
  for (const auto& r : s.runs) out.finished_runs.push_back({r.arm, r.seed});
  out.missing_runs = s.missing;
  out.validation = s.milestones;
  out.test = s.test;
  out.routing = s.routing;
  out.systems = s.systems;
  return out;
}

bool identical_to_baseline(const ArmComparison& a) {
  return !a.is_baseline && !a.deltas.empty() &&
         std::all_of(a.deltas.begin(), a.deltas.end(), [](const SeedValue& d) { return d.value == 0; });
}

}  // namespace attnres::experiment
