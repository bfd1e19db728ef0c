#include "experiment/summary.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::experiment {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Strict JSON access: every error names the file and the key path ("milestones[2].val_nll").

struct JsonFile {
  std::string path;

  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    fail(path, ": key '", key, "' ", what);
  }

  static std::string join(const std::string& prefix, const std::string& key) {
    return prefix.empty() ? key : prefix + "." + key;
  }

  const json* find(const json& obj, const std::string& prefix, const std::string& key) const {
    if (!obj.is_object()) bad(prefix.empty() ? "(top level)" : prefix, "must be an object");
    const auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }

  const json& get(const json& obj, const std::string& prefix, const std::string& key) const {
    const json* v = find(obj, prefix, key);
    if (!v) bad(join(prefix, key), "is missing");
    return *v;
  }

  double number(const json& v, const std::string& key) const {
    if (!v.is_number()) bad(key, "must be a number");
    const double d = v.get<double>();
    if (!std::isfinite(d)) bad(key, "must be finite");
    return d;
  }

  double number(const json& obj, const std::string& prefix, const std::string& key) const {
    return number(get(obj, prefix, key), join(prefix, key));
  }

  double non_negative(const json& obj, const std::string& prefix, const std::string& key) const {
    const double d = number(obj, prefix, key);
    if (d < 0) bad(join(prefix, key), "must not be negative");
    return d;
  }

  // Integers written as floats (2e9) are accepted when integral.
  std::int64_t integer(const json& v, const std::string& key) const {
    if (v.is_number_integer()) return v.get<std::int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e18) return static_cast<std::int64_t>(d);
    }
    bad(key, "must be an integer");
  }

  std::int64_t integer(const json& obj, const std::string& prefix, const std::string& key) const {
    return integer(get(obj, prefix, key), join(prefix, key));
  }

  std::string string(const json& obj, const std::string& prefix, const std::string& key) const {
    const json& v = get(obj, prefix, key);
    if (!v.is_string()) bad(join(prefix, key), "must be a string");
    return v.get<std::string>();
  }

  const json& array(const json& obj, const std::string& prefix, const std::string& key) const {
    const json& v = get(obj, prefix, key);
    if (!v.is_array()) bad(join(prefix, key), "must be an array");
    return v;
  }

  std::vector<double> probabilities(const json& v, const std::string& key, int expected) const {
    if (!v.is_array()) bad(key, "must be an array of numbers");
    if (static_cast<int>(v.size()) != expected)
      bad(key, concat("has ", v.size(), " entries but 'sources' is ", expected));
    std::vector<double> out;
    double sum = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double p = number(v[i], concat(key, "[", i, "]"));
      if (p < 0) bad(concat(key, "[", i, "]"), "must not be negative");
      out.push_back(p);
      sum += p;
    }
    // Token-averaged softmax weights sum to 1; the slack absorbs float32 accumulation in the runner,
    // while a wrong array (logits, another layer's counts) still fails.
    if (std::abs(sum - 1) > 1e-2) bad(key, concat("must sum to 1 (a distribution over sources), sums to ", sum));
    return out;
  }
};

json parse_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
}

double mean_of(const std::vector<double>& v) {
  if (v.empty()) return kNotAvailable;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// ---------------------------------------------------------------------------------------------
// Statistics.

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
    a.stats = paired_stats(deltas);
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
  fail(r.path, ": no validation NLL at ", tokens, " tokens");  // read_run_result guarantees it
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
      require(!r->routing.empty(), r->path, ": key 'routing' is missing but ", first.path, " has it (same arm)");
      require(r->routing.size() == first.routing.size(), r->path, ": key 'routing.layers' has ", r->routing.size(),
              " layers but ", first.path, " has ", first.routing.size());
      for (std::size_t l = 0; l < first.routing.size(); ++l) {
        const LayerRouting &a = r->routing[l], &b = first.routing[l];
        require(a.layer == b.layer && a.sources == b.sources && a.v_mean.empty() == b.v_mean.empty(), r->path,
                ": key 'routing.layers' entry for layer ", a.layer, " (", a.sources, " sources",
                a.v_mean.empty() ? "" : ", v_mean", ") does not match ", first.path, " (layer ", b.layer, ", ",
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
      require(r->params == first->params, r->path, ": key 'params' is ", r->params, " but ", first->path, " has ",
              first->params, " (same arm)");
      tps.push_back(r->tokens_per_sec);
      step.push_back(r->step_time_ms);
      rss.push_back(r->peak_rss_bytes);
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
    auto ratio = [](double x, double y) { return y > 0 ? x / y : kNotAvailable; };
    for (auto& a : out) {
      a.params_overhead = ratio(static_cast<double>(a.params - b.params), static_cast<double>(b.params));
      a.tokens_per_sec_ratio = ratio(a.tokens_per_sec, b.tokens_per_sec);
      a.step_time_ratio = ratio(a.step_time_ms, b.step_time_ms);
      a.peak_rss_ratio = ratio(a.peak_rss_bytes, b.peak_rss_bytes);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// JSON output. NaN becomes null ("not available").

json num(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

json stats_json(const PairedStats& p) {
  return {{"n", p.n},   {"mean", num(p.mean)}, {"sd", num(p.sd)},           {"ci95_low", num(p.ci_low)},
          {"ci95_high", num(p.ci_high)},       {"t", num(p.t)},             {"p_value", num(p.p_value)},
          {"wins", p.wins}};
}

json seed_values_json(const std::vector<SeedValue>& v) {
  json out = json::array();
  for (const auto& x : v) out.push_back({{"seed", x.seed}, {"value", num(x.value)}});
  return out;
}

json comparison_json(const Comparison& c) {
  json arms = json::array();
  for (const auto& a : c.arms) {
    json j = {{"arm", a.arm}, {"baseline", a.is_baseline}, {"nll", seed_values_json(a.values)},
              {"mean_nll", num(a.mean)}};
    if (!a.is_baseline) {
      j["delta_nll"] = seed_values_json(a.deltas);
      j["paired"] = stats_json(a.stats);
      j["ppl_change"] = num(a.ppl_change);
      j["ppl_reduction"] = num(-a.ppl_change);
      j["ppl_change_ci95"] = {num(a.ppl_change_ci_low), num(a.ppl_change_ci_high)};
    }
    arms.push_back(std::move(j));
  }
  return {{"split", c.split}, {"tokens", c.tokens}, {"arms", std::move(arms)}};
}

json vector_json(const std::vector<double>& v) {
  json out = json::array();
  for (double x : v) out.push_back(num(x));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Text.

std::string printf_string(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

std::size_t display_width(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // count UTF-8 code points, not bytes
  return n;
}

std::string pad(const std::string& s, std::size_t width, bool left) {
  const std::string fill(width > display_width(s) ? width - display_width(s) : 0, ' ');
  return left ? s + fill : fill + s;
}

std::string delta_cell(const ArmComparison& a) {
  if (a.is_baseline) return "baseline";
  if (a.stats.n == 0) return "n/a";
  if (identical_to_baseline(a)) return "0 (identical)";
  std::string s = format_signed(a.stats.mean, 4);
  if (a.stats.n > 1) s += " ± " + format_number(a.stats.sd, 4);
  return s;
}

std::string ci_cell(const ArmComparison& a) {
  if (a.is_baseline) return "";
  if (std::isnan(a.stats.ci_low)) return "n/a";
  return "[" + format_signed(a.stats.ci_low, 4) + ", " + format_signed(a.stats.ci_high, 4) + "]";
}

Table comparison_table(const ExperimentSummary& s, const std::vector<const Comparison*>& rows, const std::string& title,
                       bool tokens_column) {
  Table t;
  t.title = title;
  if (tokens_column) t.header.push_back("tokens");
  for (const char* h : {"arm", "seeds", "mean NLL", "ΔNLL ± sd", "95% CI", "p", "wins", "ppl change"})
    t.header.push_back(h);
  t.left_columns = tokens_column ? 2 : 1;
  for (const Comparison* c : rows) {
    for (const auto& a : c->arms) {
      std::vector<std::string> row;
      // The milestone is named once, on its first row, so the groups stand out.
      if (tokens_column) row.push_back(&a == &c->arms.front() ? format_tokens(static_cast<double>(c->tokens)) : "");
      row.push_back(a.arm);
      row.push_back(std::to_string(a.values.size()));
      row.push_back(format_number(a.mean, 4));
      row.push_back(delta_cell(a));
      row.push_back(ci_cell(a));
      row.push_back(a.is_baseline ? "" : format_p_value(a.stats.p_value));
      row.push_back(a.is_baseline ? "" : concat(a.stats.wins, "/", a.stats.n));
      row.push_back(a.is_baseline ? "" : format_percent(a.ppl_change, 2));
      t.rows.push_back(std::move(row));
    }
  }
  t.notes = {
      concat("ΔNLL = arm − ", s.spec.baseline,
             " per seed finished in both (negative: the arm is better); mean ± sample sd over those seeds."),
      "95% CI: mean ± t(0.975, n−1)·sd/√n; p: two-sided paired t-test; wins: seeds where the arm's NLL is lower.",
      "ppl change = exp(mean ΔNLL) − 1 (negative: lower perplexity). n/a: fewer than two paired seeds."};
  return t;
}

std::string mib(double bytes) { return std::isfinite(bytes) ? printf_string("%.1f MiB", bytes / 1048576.0) : "n/a"; }

std::string ratio_cell(double r) { return std::isfinite(r) ? printf_string("%.3f×", r) : "n/a"; }

}  // namespace

// ---------------------------------------------------------------------------------------------

const ArmComparison* Comparison::find(const std::string& arm) const {
  for (const auto& a : arms)
    if (a.arm == arm) return &a;
  return nullptr;
}

const RunResult* ExperimentSummary::find_run(const std::string& arm, std::int64_t seed) const {
  for (const auto& r : runs)
    if (r.arm == arm && r.seed == seed) return &r;
  return nullptr;
}

std::string run_result_path(const std::string& dir, const std::string& arm, std::int64_t seed) {
  return (fs::path(dir) / "runs" / arm / ("seed-" + std::to_string(seed)) / "result.json").string();
}

ExperimentSpec read_experiment_spec(const std::string& path) {
  require(fs::exists(path), path, ": not found (is this an experiment directory?)");
  const json j = parse_json_file(path);
  const JsonFile f{path};
  ExperimentSpec spec;
  spec.version = static_cast<int>(f.integer(j, "", "version"));
  if (spec.version != 1) f.bad("version", concat("is ", spec.version, "; this build reads version 1"));

  const json& arms = f.array(j, "", "arms");
  std::set<std::string> seen_arms;
  for (std::size_t i = 0; i < arms.size(); ++i) {
    const std::string key = concat("arms[", i, "]");
    if (!arms[i].is_string() || arms[i].get<std::string>().empty()) f.bad(key, "must be a non-empty string");
    const std::string arm = arms[i].get<std::string>();
    // Arm names become directory names and HTML ids.
    if (arm.find_first_of("/\\<>&\"' ") != std::string::npos || arm == "." || arm == "..")
      f.bad(key, concat("'", arm, "' is not a valid arm name"));
    if (!seen_arms.insert(arm).second) f.bad(key, concat("repeats arm '", arm, "'"));
    spec.arms.push_back(arm);
  }
  if (spec.arms.empty()) f.bad("arms", "must not be empty");
  spec.baseline = f.string(j, "", "baseline");
  if (!seen_arms.count(spec.baseline)) f.bad("baseline", concat("'", spec.baseline, "' is not one of 'arms'"));

  const json& seeds = f.array(j, "", "seeds");
  std::set<std::int64_t> seen_seeds;
  for (std::size_t i = 0; i < seeds.size(); ++i) {
    const std::int64_t seed = f.integer(seeds[i], concat("seeds[", i, "]"));
    if (!seen_seeds.insert(seed).second) f.bad(concat("seeds[", i, "]"), concat("repeats seed ", seed));
    spec.seeds.push_back(seed);
  }
  if (spec.seeds.empty()) f.bad("seeds", "must not be empty");

  spec.tokens = f.integer(j, "", "tokens");
  if (spec.tokens <= 0) f.bad("tokens", "must be positive");
  const json& milestones = f.array(j, "", "milestones");
  for (std::size_t i = 0; i < milestones.size(); ++i) {
    const std::string key = concat("milestones[", i, "]");
    const std::int64_t m = f.integer(milestones[i], key);
    if (m <= 0) f.bad(key, "must be positive");
    if (!spec.milestones.empty() && m <= spec.milestones.back()) f.bad(key, "must be larger than the one before");
    spec.milestones.push_back(m);
  }
  if (spec.milestones.empty()) f.bad("milestones", "must not be empty");

  if (const json* v = f.find(j, "", "preset")) {
    if (!v->is_string()) f.bad("preset", "must be a string");
    spec.preset = v->get<std::string>();
  }
  for (auto [key, target] : {std::pair{"model", &spec.model}, std::pair{"train", &spec.train}}) {
    if (const json* v = f.find(j, "", key)) {
      if (!v->is_object()) f.bad(key, "must be an object");
      *target = *v;
    }
  }
  return spec;
}

RunResult read_run_result(const std::string& path, const ExperimentSpec& spec, const std::string& arm,
                          std::int64_t seed) {
  const json j = parse_json_file(path);
  const JsonFile f{path};
  RunResult r;
  r.path = path;
  r.arm = f.string(j, "", "arm");
  if (r.arm != arm) f.bad("arm", concat("is '", r.arm, "' but the file is in the directory of arm '", arm, "'"));
  r.seed = f.integer(j, "", "seed");
  if (r.seed != seed) f.bad("seed", concat("is ", r.seed, " but the file is in the directory of seed ", seed));
  r.params = f.integer(j, "", "params");
  if (r.params <= 0) f.bad("params", "must be positive");

  const json& ms = f.array(j, "", "milestones");
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const std::string prefix = concat("milestones[", i, "]");
    NllPoint p{f.integer(ms[i], prefix, "tokens"), f.number(ms[i], prefix, "val_nll")};
    if (!r.milestones.empty() && p.tokens <= r.milestones.back().tokens)
      f.bad(prefix + ".tokens", "must be larger than the one before");
    r.milestones.push_back(p);
  }
  for (const auto m : spec.milestones)
    if (std::none_of(r.milestones.begin(), r.milestones.end(), [&](const NllPoint& p) { return p.tokens == m; }))
      f.bad("milestones", concat("has no entry at ", m, " tokens (an experiment.json milestone)"));

  r.test_nll = f.number(j, "", "test_nll");
  r.tokens_per_sec = f.non_negative(j, "", "tokens_per_sec");
  r.peak_rss_bytes = f.non_negative(j, "", "peak_rss_bytes");
  r.step_time_ms = f.non_negative(j, "", "step_time_ms");

  if (const json* curve = f.find(j, "", "curve")) {
    if (!curve->is_array()) f.bad("curve", "must be an array");
    for (std::size_t i = 0; i < curve->size(); ++i) {
      const std::string prefix = concat("curve[", i, "]");
      r.curve.push_back({f.integer((*curve)[i], prefix, "tokens"), f.number((*curve)[i], prefix, "train_loss")});
    }
  }

  if (const json* routing = f.find(j, "", "routing"); routing && !routing->is_null()) {
    const json& layers = f.array(*routing, "routing", "layers");
    std::set<int> seen;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const std::string prefix = concat("routing.layers[", i, "]");
      LayerRouting l;
      l.layer = static_cast<int>(f.integer(layers[i], prefix, "layer"));
      if (l.layer < 0) f.bad(prefix + ".layer", "must not be negative");
      if (!seen.insert(l.layer).second) f.bad(prefix + ".layer", concat("repeats layer ", l.layer));
      l.sources = static_cast<int>(f.integer(layers[i], prefix, "sources"));
      if (l.sources < 1) f.bad(prefix + ".sources", "must be at least 1");
      l.qk_mean = f.probabilities(f.get(layers[i], prefix, "qk_mean"), prefix + ".qk_mean", l.sources);
      if (const json* v = f.find(layers[i], prefix, "v_mean"); v && !v->is_null())
        l.v_mean = f.probabilities(*v, prefix + ".v_mean", l.sources);
      if (const json* js = f.find(layers[i], prefix, "js_nats"); js && !js->is_null()) {
        l.js_nats = f.number(*js, prefix + ".js_nats");
        if (l.js_nats < -1e-9 || l.js_nats > kLn2 + 1e-6) f.bad(prefix + ".js_nats", "must lie in [0, ln 2]");
        if (l.v_mean.empty()) f.bad(prefix + ".js_nats", "is given without 'v_mean'");
      }
      r.routing.push_back(std::move(l));
    }
    const bool two = std::any_of(r.routing.begin(), r.routing.end(), [](const auto& l) { return !l.v_mean.empty(); });
    for (auto& l : r.routing) {
      if (!two || !l.v_mean.empty()) continue;
      // A single source gets all the weight on either route, so its V distribution may be left out.
      if (l.sources == 1) l.v_mean = {1.0};
      else f.bad("routing.layers", concat("gives 'v_mean' for some layers but not for layer ", l.layer));
    }
    std::sort(r.routing.begin(), r.routing.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  }
  return r;
}

ExperimentSummary compute_summary(const std::string& dir) {
  require(fs::is_directory(dir), "experiment directory '", dir, "' does not exist");
  ExperimentSummary s;
  s.dir = dir;
  s.spec = read_experiment_spec((fs::path(dir) / "experiment.json").string());
  for (const auto& arm : s.spec.arms) {
    for (const auto seed : s.spec.seeds) {
      const std::string path = run_result_path(dir, arm, seed);
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
  write_text_atomically((fs::path(dir) / "summary.json").string(), summary_to_json(s).dump(2) + "\n");
  return s;
}

json summary_to_json(const ExperimentSummary& s) {
  json j;
  j["version"] = 1;
  j["experiment"] = {{"arms", s.spec.arms},     {"baseline", s.spec.baseline},     {"seeds", s.spec.seeds},
                     {"tokens", s.spec.tokens}, {"milestones", s.spec.milestones}, {"preset", s.spec.preset}};
  json finished = json::array(), missing = json::array();
  for (const auto& r : s.runs) finished.push_back({{"arm", r.arm}, {"seed", r.seed}});
  for (const auto& m : s.missing) missing.push_back({{"arm", m.arm}, {"seed", m.seed}});
  j["finished_runs"] = std::move(finished);
  j["missing_runs"] = std::move(missing);

  json ms = json::array();
  for (const auto& c : s.milestones) ms.push_back(comparison_json(c));
  j["validation"] = std::move(ms);
  j["test"] = comparison_json(s.test);

  json routing = json::array();
  for (const auto& a : s.routing) {
    json layers = json::array();
    for (const auto& l : a.layers) {
      json lj = {{"layer", l.layer}, {"sources", l.sources}, {"qk_mean", vector_json(l.qk_mean)}};
      if (a.two_routes) {
        lj["v_mean"] = vector_json(l.v_mean);
        lj["js_nats"] = num(l.js_nats);
        lj["js_bits"] = num(nats_to_bits(l.js_nats));
        lj["js_of_means_nats"] = num(l.js_of_means_nats);
      }
      layers.push_back(std::move(lj));
    }
    json aj = {{"arm", a.arm}, {"seeds", a.n_seeds}, {"two_routes", a.two_routes}, {"layers", std::move(layers)}};
    if (a.two_routes) {
      aj["js_estimate"] = a.per_token_js ? "per_token_mean" : "js_of_mean_distributions";
      aj["js_mean_all_layers"] = {
          {"nats", num(a.all_layers.nats)}, {"bits", num(a.all_layers.bits)}, {"layers", a.all_layers.layers}};
      aj["js_mean_multi_source_layers"] = {{"nats", num(a.multi_source_layers.nats)},
                                           {"bits", num(a.multi_source_layers.bits)},
                                           {"layers", a.multi_source_layers.layers}};
    }
    routing.push_back(std::move(aj));
  }
  j["routing"] = std::move(routing);

  json systems = json::array();
  for (const auto& a : s.systems)
    systems.push_back({{"arm", a.arm},
                       {"runs", a.runs},
                       {"params", a.params},
                       {"params_overhead", num(a.params_overhead)},
                       {"tokens_per_sec", num(a.tokens_per_sec)},
                       {"tokens_per_sec_ratio", num(a.tokens_per_sec_ratio)},
                       {"step_time_ms", num(a.step_time_ms)},
                       {"step_time_ratio", num(a.step_time_ratio)},
                       {"peak_rss_bytes", num(a.peak_rss_bytes)},
                       {"peak_rss_ratio", num(a.peak_rss_ratio)}});
  j["systems"] = std::move(systems);
  return j;
}

// ---------------------------------------------------------------------------------------------

std::string format_number(double value, int decimals) {
  if (std::isnan(value)) return "n/a";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string format_signed(double value, int decimals) {
  if (std::isnan(value)) return "n/a";
  if (std::isinf(value)) return value > 0 ? "+inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%+.*f", decimals, value);
  return buf;
}

std::string format_p_value(double p) {
  if (std::isnan(p)) return "n/a";
  if (p >= 0.01) return printf_string("%.3f", p);
  if (p >= 0.001) return printf_string("%.4f", p);
  return p == 0 ? "0" : printf_string("%.1e", p);
}

std::string format_percent(double fraction, int decimals) {
  if (std::isnan(fraction)) return "n/a";
  return format_signed(100 * fraction, decimals) + "%";
}

bool identical_to_baseline(const ArmComparison& a) {
  return !a.is_baseline && !a.deltas.empty() &&
         std::all_of(a.deltas.begin(), a.deltas.end(), [](const SeedValue& d) { return d.value == 0; });
}

std::string format_count(std::int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string format_tokens(double tokens) {
  if (std::isnan(tokens)) return "n/a";
  const double a = std::abs(tokens);
  if (a < 1e3) return printf_string("%.0f", tokens);
  if (a < 1e6) return printf_string("%.3gK", tokens / 1e3);
  if (a < 1e9) return printf_string("%.3gM", tokens / 1e6);
  return printf_string("%.3gB", tokens / 1e9);
}

std::vector<Table> summary_tables(const ExperimentSummary& s, bool detailed) {
  std::vector<Table> tables;
  std::vector<const Comparison*> val;
  for (const auto& c : s.milestones) val.push_back(&c);
  tables.push_back(comparison_table(s, val, "Validation NLL at each milestone, paired against " + s.spec.baseline, true));
  tables.push_back(comparison_table(s, {&s.test},
                                    "Test NLL after " + format_tokens(static_cast<double>(s.spec.tokens)) +
                                        " tokens, paired against " + s.spec.baseline,
                                    false));

  if (!s.routing.empty()) {
    Table t;
    t.title = "Depth routing: Jensen–Shannon divergence between the Q/K and V routes (mean over layers)";
    t.header = {"arm", "routes", "seeds", "JS all layers (nats)", "(bits)", "JS multi-source layers (nats)", "(bits)",
                "estimate"};
    t.left_columns = 2;
    for (const auto& a : s.routing) {
      if (!a.two_routes) {
        t.rows.push_back({a.arm, "Q/K only", std::to_string(a.n_seeds), "", "", "", "", ""});
        continue;
      }
      t.rows.push_back({a.arm, "Q/K + V", std::to_string(a.n_seeds),
                        concat(format_number(a.all_layers.nats, 4), " (", a.all_layers.layers, ")"),
                        format_number(a.all_layers.bits, 4),
                        concat(format_number(a.multi_source_layers.nats, 4), " (", a.multi_source_layers.layers, ")"),
                        format_number(a.multi_source_layers.bits, 4),
                        a.per_token_js ? "per-token" : "of means"});
    }
    t.notes = {
        "Per attention sublayer, JS between the two routes' depth weights, averaged over evaluation tokens, then over "
        "layers (count in brackets).",
        "'all layers' counts single-source sublayers (JS = 0); 'multi-source' leaves them out. Max: ln 2 nats = 1 bit.",
        "estimate 'per-token': the runs' per-token average (the headline); 'of means': JS of the token-averaged "
        "distributions, a lower bound."};
    tables.push_back(std::move(t));

    if (detailed) {
      std::vector<const ArmRouting*> two;
      for (const auto& a : s.routing)
        if (a.two_routes) two.push_back(&a);
      if (!two.empty()) {
        Table d;
        d.title = "Jensen–Shannon divergence per attention sublayer (nats)";
        d.header = {"layer", "sources"};
        for (const auto* a : two) d.header.push_back(a->arm);
        std::map<int, std::vector<std::string>> rows;
        for (std::size_t k = 0; k < two.size(); ++k) {
          for (const auto& l : two[k]->layers) {
            auto& row = rows[l.layer];
            if (row.empty()) row = std::vector<std::string>(2 + two.size(), "");
            row[0] = std::to_string(l.layer);
            row[1] = std::to_string(l.sources);
            row[2 + k] = format_number(l.js_nats, 4);
          }
        }
        for (auto& [layer, row] : rows) d.rows.push_back(std::move(row));
        tables.push_back(std::move(d));
      }
      Table m;
      m.title = "Depth routing: mean distribution over sources per attention sublayer (mean over tokens and seeds)";
      m.header = {"arm", "layer", "sources", "Q/K route", "V route"};
      m.left_columns = 1;
      auto list = [](const std::vector<double>& v) {
        std::string out;
        for (double x : v) out += (out.empty() ? "" : " ") + format_number(x, 3);
        return out;
      };
      for (const auto& a : s.routing)
        for (const auto& l : a.layers)
          m.rows.push_back({a.arm, std::to_string(l.layer), std::to_string(l.sources), list(l.qk_mean),
                            a.two_routes ? list(l.v_mean) : "(one route)"});
      m.notes = {"Sources in order: the token embedding, the completed blocks, then the current block's partial sum "
                 "where the sublayer has one."};
      tables.push_back(std::move(m));
    }
  }

  if (!s.systems.empty()) {
    Table t;
    t.title = "Systems (mean over finished seeds; ratios against " + s.spec.baseline + ")";
    t.header = {"arm", "runs", "params", "Δparams", "tokens/s", "ratio", "step ms", "ratio", "peak RSS", "ratio"};
    for (const auto& a : s.systems) {
      t.rows.push_back({a.arm, std::to_string(a.runs), format_count(a.params),
                        std::isfinite(a.params_overhead) ? format_percent(a.params_overhead, 3) : "n/a",
                        format_number(a.tokens_per_sec, 0), ratio_cell(a.tokens_per_sec_ratio),
                        format_number(a.step_time_ms, 1), ratio_cell(a.step_time_ratio), mib(a.peak_rss_bytes),
                        ratio_cell(a.peak_rss_ratio)});
    }
    t.notes = {"Measured on whatever machine ran each arm; compare ratios only between runs on the same machine."};
    tables.push_back(std::move(t));
  }
  return tables;
}

std::string format_summary_table(const ExperimentSummary& s) {
  std::string out = concat("Experiment ", s.dir, ": ", s.spec.arms.size(), " arms, ", s.spec.seeds.size(), " seeds, ",
                           format_tokens(static_cast<double>(s.spec.tokens)), " tokens per run",
                           s.spec.preset.empty() ? "" : ", preset " + s.spec.preset, "; baseline ", s.spec.baseline,
                           "\n");
  out += concat("Finished runs: ", s.runs.size(), " of ", s.runs.size() + s.missing.size());
  if (!s.missing.empty()) {
    out += "; missing:";
    for (const auto& m : s.missing) out += concat(" ", m.arm, "/seed-", m.seed);
  }
  out += "\n";
  for (const Table& t : summary_tables(s, false)) {
    std::vector<std::size_t> width(t.header.size(), 0);
    for (std::size_t c = 0; c < t.header.size(); ++c) width[c] = display_width(t.header[c]);
    for (const auto& row : t.rows)
      for (std::size_t c = 0; c < row.size() && c < width.size(); ++c)
        width[c] = std::max(width[c], display_width(row[c]));
    auto line = [&](const std::vector<std::string>& cells) {
      std::string l = " ";
      for (std::size_t c = 0; c < width.size(); ++c) {
        const std::string cell = c < cells.size() ? cells[c] : "";
        l += " " + pad(cell, width[c], static_cast<int>(c) < t.left_columns);
      }
      while (!l.empty() && l.back() == ' ') l.pop_back();
      return l + "\n";
    };
    out += "\n" + t.title + "\n" + line(t.header);
    std::size_t total = 1;
    for (auto w : width) total += w + 1;
    out += "  " + std::string(total - 2, '-') + "\n";
    for (const auto& row : t.rows) out += line(row);
    for (const auto& n : t.notes) out += "  " + n + "\n";
  }
  return out;
}

}  // namespace attnres::experiment
