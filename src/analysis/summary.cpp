#include "analysis/summary.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "analysis/format.hpp"
#include "results/instability.hpp"
#include "analysis/sequential.hpp"
#include "model/arms.hpp"
#include "analysis/stats.hpp"
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

results::PowerSummary power_summary(const PowerEstimate& p) {
  return {p.available, p.reason, p.mde, p.seeds_for_paper, p.seeds_for_user};
}

// For messages about one file.
std::string path_of(const ExperimentSummary& s, const RunResult& r) { return s.run_path(r.arm, r.seed); }

// With the baseline's twin among the arms: its paired statistics are the comparison's noise floor,
// and every other arm says whether its 95% CI lies inside ±(the floor's sd).
void add_noise_floor(Comparison& c, const std::string& baseline) {
  const ArmComparison* twin = c.find(twin_of(baseline));
  if (twin == nullptr) return;
  c.noise_floor = results::NoiseFloor{twin->arm, twin->stats.n, twin->stats.mean, twin->stats.sd};
  const results::NoiseFloor& f = *c.noise_floor;
  for (ArmComparison& a : c.arms) {
    if (a.is_baseline || a.arm == twin->arm) continue;
    if (f.n >= 2 && a.stats.n >= 2 && std::isfinite(f.sd) && std::isfinite(a.stats.ci_low) && std::isfinite(a.stats.ci_high))
      a.within_noise_floor = std::max(std::abs(a.stats.ci_low), std::abs(a.stats.ci_high)) <= f.sd;
  }
}

// with_baseline false: the baseline's values are left out (a reused baseline has no test NLL at
// this group's budget), so nothing is paired.
Comparison compare(const ExperimentSummary& s, const std::string& split, std::int64_t tokens,
                   double (*value_of)(const RunResult&, std::int64_t tokens), bool with_baseline = true) {
  Comparison c;
  c.split = split;
  c.tokens = tokens;
  std::map<std::int64_t, double> baseline;
  for (const auto seed : s.spec.seeds)
    if (const RunResult* r = s.find_run(s.spec.baseline, seed); r && with_baseline)
      baseline[seed] = value_of(*r, tokens);
  for (const auto& arm : s.spec.arms) {
    ArmComparison a;
    a.arm = arm;
    a.is_baseline = arm == s.spec.baseline;
    std::vector<double> values, deltas;
    for (const auto seed : s.spec.seeds) {
      const RunResult* r = s.find_run(arm, seed);
      if (!r || (a.is_baseline && !with_baseline)) continue;
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
    const PairedStats stats = paired_stats(deltas);
    a.stats = paired_summary(stats);
    if (!a.is_baseline) {
      a.power = power_summary(power_estimate(stats, s.user_effect));
      a.ppl_change = ppl_change(a.stats.mean);
      a.ppl_change_ci_low = ppl_change(a.stats.ci_low);
      a.ppl_change_ci_high = ppl_change(a.stats.ci_high);
    }
    c.arms.push_back(std::move(a));
  }
  add_noise_floor(c, s.spec.baseline);
  return c;
}

double val_nll_at(const RunResult& r, std::int64_t tokens) {
  for (const auto& m : r.milestones)
    if (m.tokens == tokens) return m.val_nll;
  fail(r.arm, " seed ", r.seed, ": no validation NLL at ", tokens, " tokens");  // read_run_result guarantees it
}

double test_nll_of(const RunResult& r, std::int64_t) { return r.test_nll; }

// An arm's finished runs, in seed order.
std::vector<const RunResult*> finished_runs(const ExperimentSummary& s, const std::string& arm) {
  std::vector<const RunResult*> runs;
  for (const auto seed : s.spec.seeds)
    if (const RunResult* r = s.find_run(arm, seed)) runs.push_back(r);
  return runs;
}

// Per arm and connection name, the mean of each weight over the arm's runs. The rows and sources
// are fixed by the model config, so every seed must agree on them.
std::vector<ArmConnections> summarize_connections(const ExperimentSummary& s) {
  std::vector<ArmConnections> out;
  for (const auto& arm : s.spec.arms) {
    const std::vector<const RunResult*> runs = finished_runs(s, arm);
    if (runs.empty()) continue;
    const RunResult& first = *runs.front();
    for (const RunResult* r : runs)
      require(r->connections.size() == first.connections.size(), path_of(s, *r), ": key 'connections' has ",
              r->connections.size(), " entries but ", path_of(s, first), " has ", first.connections.size(),
              " (same arm)");
    for (std::size_t c = 0; c < first.connections.size(); ++c) {
      ArmConnections ac;
      ac.arm = arm;
      ac.n_seeds = static_cast<int>(runs.size());
      ac.connections = first.connections[c];
      for (auto& row : ac.connections.rows) std::fill(row.weights.begin(), row.weights.end(), 0.0);
      for (const RunResult* r : runs) {
        const results::Connections& rc = r->connections[c];
        const auto same_shape = [&] {
          if (rc.name != ac.connections.name || rc.rows.size() != ac.connections.rows.size()) return false;
          for (std::size_t i = 0; i < rc.rows.size(); ++i)
            if (rc.rows[i].target != ac.connections.rows[i].target ||
                rc.rows[i].sources != ac.connections.rows[i].sources)
              return false;
          return true;
        };
        require(same_shape(), path_of(s, *r), ": key 'connections' entry '", rc.name, "' does not have the rows and ",
                "sources of ", path_of(s, first), "'s '", first.connections[c].name, "'");
        for (std::size_t i = 0; i < rc.rows.size(); ++i)
          for (std::size_t k = 0; k < rc.rows[i].weights.size(); ++k)
            ac.connections.rows[i].weights[k] += rc.rows[i].weights[k] / static_cast<double>(runs.size());
      }
      out.push_back(std::move(ac));
    }
  }
  return out;
}

// The layer mean of per-layer JS values (nats), with bits and the count.
JsLayerMean js_layer_mean(const std::vector<double>& js) {
  const double nats = mean_of(js);
  return {nats, nats_to_bits(nats), static_cast<int>(js.size())};
}

// One layer's JS between a route (its seed-mean distribution `route`) and the V route: the runs'
// per-token average (`per_token_mean`, mean over seeds) when every run gave it, else the JS of the
// seed-mean distributions. Sets nats, bits and of_means.
void layer_js(const LayerRoutingSummary& l, const std::vector<double>& route, bool per_token, double per_token_mean,
              double& nats, double& bits, double& of_means) {
  of_means = js_divergence_nats(route, l.v_mean);
  // One source: every route puts all weight on it, so JS is exactly 0 whatever the runner wrote.
  if (l.sources == 1) nats = of_means = 0;
  else nats = per_token ? per_token_mean : of_means;
  bits = nats_to_bits(nats);
}

// Per arm, the Amax gains over its runs: the composite's means averaged, every max the max. A
// mode records them for every run or none, so a seed without them is an error.
std::vector<ArmGain> summarize_gain(const ExperimentSummary& s) {
  std::vector<ArmGain> out;
  for (const auto& arm : s.spec.arms) {
    const std::vector<const RunResult*> runs = finished_runs(s, arm);
    const auto with = std::find_if(runs.begin(), runs.end(), [](const RunResult* r) { return r->amax_gain.has_value(); });
    if (with == runs.end()) continue;
    ArmGain a;
    a.arm = arm;
    a.n_seeds = static_cast<int>(runs.size());
    results::AmaxGain& g = a.gain;
    for (const RunResult* r : runs) {
      require(r->amax_gain.has_value(), path_of(s, *r), ": key 'amax_gain' is missing but ", path_of(s, **with),
              " has it (same arm)");
      const results::AmaxGain& x = *r->amax_gain;
      const double w = 1.0 / static_cast<double>(runs.size());
      g.composite_forward_mean += x.composite_forward_mean * w;
      g.composite_backward_mean += x.composite_backward_mean * w;
      g.composite_forward_max = std::max(g.composite_forward_max, x.composite_forward_max);
      g.composite_backward_max = std::max(g.composite_backward_max, x.composite_backward_max);
      g.layer_forward_max = std::max(g.layer_forward_max, x.layer_forward_max);
      g.layer_backward_max = std::max(g.layer_backward_max, x.layer_backward_max);
    }
    // Equal seeds' means can sum to a hair above their max: a mean never exceeds it.
    g.composite_forward_mean = std::min(g.composite_forward_mean, g.composite_forward_max);
    g.composite_backward_mean = std::min(g.composite_backward_mean, g.composite_backward_max);
    out.push_back(std::move(a));
  }
  return out;
}

std::vector<ArmRouting> summarize_routing(const ExperimentSummary& s) {
  std::vector<ArmRouting> out;
  for (const auto& arm : s.spec.arms) {
    const std::vector<const RunResult*> runs = finished_runs(s, arm);
    const auto routed = std::count_if(runs.begin(), runs.end(), [](const RunResult* r) { return !r->routing.empty(); });
    if (routed == 0) continue;
    // Layer structure is fixed by the model config, so every seed must agree on it.
    const RunResult& first = **std::find_if(runs.begin(), runs.end(), [](auto* r) { return !r->routing.empty(); });
    const auto routes = [](const LayerRouting& l) {
      return std::string(l.v_mean.empty() ? "" : ", v_mean") + (l.k_mean.empty() ? "" : ", k_mean");
    };
    for (const RunResult* r : runs) {
      require(!r->routing.empty(), path_of(s, *r), ": key 'routing' is missing but ", path_of(s, first),
              " has it (same arm)");
      require(r->routing.size() == first.routing.size(), path_of(s, *r), ": key 'routing.layers' has ",
              r->routing.size(), " layers but ", path_of(s, first), " has ", first.routing.size());
      for (std::size_t l = 0; l < first.routing.size(); ++l) {
        const LayerRouting &a = r->routing[l], &b = first.routing[l];
        require(a.layer == b.layer && a.sources == b.sources && routes(a) == routes(b), path_of(s, *r),
                ": key 'routing.layers' entry for layer ", a.layer, " (", a.sources, " sources", routes(a),
                ") does not match ", path_of(s, first), " (layer ", b.layer, ", ", b.sources, " sources", routes(b),
                ")");
      }
    }

    ArmRouting ar;
    ar.arm = arm;
    ar.n_seeds = static_cast<int>(runs.size());
    ar.two_routes = !first.routing.front().v_mean.empty();
    ar.k_route = !first.routing.front().k_mean.empty();  // run_result.cpp: only beside a V route
    ar.per_token_js = ar.two_routes;
    for (const RunResult* r : runs)
      for (const auto& l : r->routing)
        if (l.sources > 1 && (std::isnan(l.js_nats) || (ar.k_route && std::isnan(l.js_k_nats))))
          ar.per_token_js = false;

    const double inv = 1.0 / static_cast<double>(runs.size());
    std::vector<double> all_js, multi_js, all_js_k, multi_js_k;
    for (std::size_t l = 0; l < first.routing.size(); ++l) {
      LayerRoutingSummary ls;
      ls.layer = first.routing[l].layer;
      ls.sources = first.routing[l].sources;
      ls.qk_mean.assign(ls.sources, 0.0);
      if (ar.two_routes) ls.v_mean.assign(ls.sources, 0.0);
      if (ar.k_route) ls.k_mean.assign(ls.sources, 0.0);
      double js_sum = 0, js_k_sum = 0;
      for (const RunResult* r : runs) {
        const LayerRouting& lr = r->routing[l];
        for (int i = 0; i < ls.sources; ++i) {
          ls.qk_mean[i] += lr.qk_mean[i] * inv;
          if (ar.two_routes) ls.v_mean[i] += lr.v_mean[i] * inv;
          if (ar.k_route) ls.k_mean[i] += lr.k_mean[i] * inv;
        }
        if (!std::isnan(lr.js_nats)) js_sum += lr.js_nats;
        if (!std::isnan(lr.js_k_nats)) js_k_sum += lr.js_k_nats;
      }
      if (ar.two_routes) {
        layer_js(ls, ls.qk_mean, ar.per_token_js, js_sum * inv, ls.js_nats, ls.js_bits, ls.js_of_means_nats);
        all_js.push_back(ls.js_nats);
        if (ls.sources > 1) multi_js.push_back(ls.js_nats);
      }
      if (ar.k_route) {
        layer_js(ls, ls.k_mean, ar.per_token_js, js_k_sum * inv, ls.js_k_nats, ls.js_k_bits, ls.js_k_of_means_nats);
        all_js_k.push_back(ls.js_k_nats);
        if (ls.sources > 1) multi_js_k.push_back(ls.js_k_nats);
      }
      ar.layers.push_back(std::move(ls));
    }
    if (ar.two_routes) {
      ar.all_layers = js_layer_mean(all_js);
      ar.multi_source_layers = js_layer_mean(multi_js);
    }
    if (ar.k_route) {
      ar.k_all_layers = js_layer_mean(all_js_k);
      ar.k_multi_source_layers = js_layer_mean(multi_js_k);
    }
    // Delta AttnRes's routing-collapse statistic: the seeds' mean, when every seed has it.
    if (std::all_of(runs.begin(), runs.end(), [](const RunResult* r) { return r->routing_max_weight.has_value(); })) {
      ar.max_weight = 0;
      for (const RunResult* r : runs) ar.max_weight += *r->routing_max_weight * inv;
    }
    out.push_back(std::move(ar));
  }
  return out;
}

// Per seed with both curves, how far the baseline and its twin drifted apart (results::TwinDrift).
std::vector<results::TwinDrift> summarize_twin_drift(const ExperimentSummary& s) {
  std::vector<results::TwinDrift> out;
  const std::string twin = twin_of(s.spec.baseline);
  if (std::find(s.spec.arms.begin(), s.spec.arms.end(), twin) == s.spec.arms.end()) return out;
  for (const auto seed : s.spec.seeds) {
    const RunResult* a = s.find_run(s.spec.baseline, seed);
    const RunResult* b = s.find_run(twin, seed);
    if (a == nullptr || b == nullptr || a->curve.empty() || b->curve.empty()) continue;
    require(a->curve.size() == b->curve.size(), path_of(s, *b), ": key 'curve' has ", b->curve.size(),
            " steps but its baseline ", path_of(s, *a), " has ", a->curve.size());
    out.push_back(twin_drift(seed, a->curve, b->curve));
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

std::vector<std::int64_t> ExperimentSummary::unstable_seeds(const std::string& arm) const {
  std::vector<std::int64_t> out;
  for (const auto& r : instability)
    if (r.arm == arm && r.instability.unstable) out.push_back(r.seed);
  return out;
}

std::string ExperimentSummary::run_path(const std::string& arm, std::int64_t seed) const {
  const bool reused = !group.empty() && arm == spec.baseline && reused_baseline;
  return results::run_result_path(dir, reused ? "" : group, arm, seed);
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

namespace {

// Reads the runs of s (its spec and group set) and computes its statistics.
void summarize_arms(ExperimentSummary& s, const ExperimentSummary* main) {
  for (const auto& arm : s.spec.arms) {
    for (const auto seed : s.spec.seeds) {
      if (main != nullptr && s.reused_baseline && arm == s.spec.baseline) {
        if (const RunResult* r = main->find_run(arm, seed)) s.runs.push_back(*r);
        else s.missing.push_back({arm, seed});
        continue;
      }
      const std::string path = s.run_path(arm, seed);
      if (fs::exists(path)) s.runs.push_back(read_run_result(path, s.spec, arm, seed));
      else s.missing.push_back({arm, seed});
    }
  }
  for (const auto m : s.spec.milestones) s.milestones.push_back(compare(s, "val", m, val_nll_at));
  s.test = compare(s, "test", s.spec.tokens, test_nll_of, !s.reused_baseline);
  s.routing = summarize_routing(s);
  s.connections = summarize_connections(s);
  s.amax_gain = summarize_gain(s);
  s.systems = summarize_systems(s);
  s.twin_drift = summarize_twin_drift(s);
  for (const RunResult& r : s.runs)
    if (const auto inst = results::run_instability(r)) s.instability.push_back({r.arm, r.seed, *inst});
}

}  // namespace

ExperimentSummary compute_summary(const std::string& dir, const SummaryOptions& options) {
  require(fs::is_directory(dir), "experiment directory '", dir, "' does not exist");
  ExperimentSummary s;
  s.dir = dir;
  s.user_effect = options.effect;
  s.spec = results::read_experiment_spec(results::experiment_spec_path(dir));
  summarize_arms(s, nullptr);
  s.sequential = sequential_summary(s);
  for (const results::GroupSpec& g : s.spec.groups) {
    GroupResults out;
    out.spec = g;
    ExperimentSummary& gs = out.summary;
    gs.dir = dir;
    gs.group = g.name;
    gs.user_effect = options.effect;
    gs.reused_baseline = g.baseline_from_main;
    gs.spec.arms = g.arms;
    gs.spec.baseline = g.baseline;
    gs.spec.seeds = s.spec.seeds;
    gs.spec.tokens = g.tokens;
    gs.spec.milestones = g.milestones;
    gs.spec.preset = s.spec.preset;
    gs.spec.version = s.spec.version;
    gs.spec.name = s.spec.name;
    gs.spec.data = s.spec.data;
    gs.spec.model = g.model;
    gs.spec.train = g.train;
    summarize_arms(gs, &s);
    s.groups.push_back(std::move(out));
  }
  return s;
}

ExperimentSummary summarize(const std::string& dir, const SummaryOptions& options) {
  ExperimentSummary s = compute_summary(dir, options);
  results::write_summary(results::summary_path(dir), summary_file(s));
  return s;
}

namespace {

void fill_arms_results(results::ArmsResults& out, const ExperimentSummary& s) {
  for (const auto& r : s.runs) out.finished_runs.push_back({r.arm, r.seed});
  out.missing_runs = s.missing;
  out.validation = s.milestones;
  out.test = s.test;
  out.routing = s.routing;
  out.connections = s.connections;
  out.amax_gain = s.amax_gain;
  out.systems = s.systems;
  out.twin_drift = s.twin_drift;
  out.instability = s.instability;
}

}  // namespace

results::Summary summary_file(const ExperimentSummary& s) {
  results::Summary out;
  out.experiment = s.spec;
  out.power_alpha = kPowerAlpha;
  out.power_target = kPowerTarget;
  out.paper_effect = kPaperEffectNats;
  out.user_effect = s.user_effect;
  fill_arms_results(out, s);
  out.sequential = s.sequential;
  for (const GroupResults& g : s.groups) {
    results::GroupSummary gs;
    gs.name = g.spec.name;
    gs.kind = g.spec.kind;
    gs.baseline = g.spec.baseline;
    gs.baseline_from_main = g.spec.baseline_from_main;
    gs.tokens = g.spec.tokens;
    gs.settings = g.spec.settings;
    fill_arms_results(gs, g.summary);
    out.groups.push_back(std::move(gs));
  }
  return out;
}

std::optional<results::SequentialSummary> sequential_summary(const ExperimentSummary& s) {
  if (!s.spec.sequential || s.milestones.empty()) return std::nullopt;
  results::SequentialSummary out;
  out.design = *s.spec.sequential;
  const results::SequentialSpec& q = out.design;
  SequentialDesign design{q.looks, q.alpha, parse_spending(q.spending)};
  const TCalibration calibration = calibrate_t_looks(design);
  out.nominal_alpha = calibration.nominal_alpha;
  out.type_one_error = calibration.type_one_error;
  SequentialDesign looks = design;
  looks.alpha = calibration.nominal_alpha;
  const SequentialBoundaries bounds = sequential_boundaries(looks);
  // The primary comparison's differences in seed order, up to the first seed not finished in both.
  std::vector<double> differences;
  const ArmComparison* a = s.milestones.back().find(q.primary);
  require(a != nullptr, "experiment.json: the sequential design's primary arm '", q.primary, "' is not an arm");
  for (const auto seed : s.spec.seeds) {
    const auto d = std::find_if(a->deltas.begin(), a->deltas.end(), [&](const SeedValue& v) { return v.seed == seed; });
    if (d == a->deltas.end()) break;
    differences.push_back(d->value);
  }
  const Decision decision = decide(looks, bounds, differences, q.effect);
  out.outcome = outcome_name(decision.outcome);
  out.look = decision.look;
  out.next_seeds = decision.next_seeds;
  for (const LookResult& l : decision.looks) {
    results::SequentialLook r;
    r.n = l.n;
    r.mean = l.mean;
    r.sd = l.sd;
    r.ci_low = l.ci_low;
    r.ci_high = l.ci_high;
    r.t = l.t;
    r.t_boundary = l.t_boundary;
    r.nominal_p = l.nominal_p;
    r.crossed = l.crossed;
    // On the design's own (uncalibrated) scale: the smallest level whose interval excludes 0.
    r.p_adjusted = std::isfinite(l.t) ? repeated_p_value(design, l.look, l.t) : (l.mean == 0 ? 1.0 : 0.0);
    out.looks.push_back(r);
  }
  if (!decision.looks.empty() && decision.looks.back().sd > 0)
    out.power = sequential_power(looks, bounds, q.effect, decision.looks.back().sd).power;
  return out;
}

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

results::TwinDrift twin_drift(std::int64_t seed, std::span<const results::LossPoint> baseline,
                              std::span<const results::LossPoint> twin) {
  results::TwinDrift d;
  d.seed = seed;
  d.steps = static_cast<std::int64_t>(std::min(baseline.size(), twin.size()));
  const std::int64_t tail = std::max<std::int64_t>(1, d.steps / 10);
  double tail_sum = 0;
  for (std::int64_t i = 0; i < d.steps; ++i) {
    const double delta = std::abs(twin[i].train_loss - baseline[i].train_loss);
    d.max_abs_delta = std::max(d.max_abs_delta, delta);
    if (!d.part_step && delta >= results::kTwinPartNats) d.part_step = i + 1;
    if (i >= d.steps - tail) tail_sum += delta;
  }
  d.final_abs_delta = d.steps > 0 ? tail_sum / static_cast<double>(tail) : 0.0;
  return d;
}

bool identical_to_baseline(const ArmComparison& a) {
  return !a.is_baseline && !a.deltas.empty() &&
         std::all_of(a.deltas.begin(), a.deltas.end(), [](const SeedValue& d) { return d.value == 0; });
}

}  // namespace attnres::experiment
