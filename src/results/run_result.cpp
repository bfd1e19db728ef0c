#include "results/run_result.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <set>

#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::results {
namespace {

using nlohmann::json;

// A depth distribution over `sources` sources.
std::vector<double> distribution(const JsonValue& v, int sources) {
  if (!v.raw().is_array()) v.bad("must be an array of numbers");
  if (static_cast<int>(v.raw().size()) != sources)
    v.bad(concat("has ", v.raw().size(), " entries but 'sources' is ", sources));
  std::vector<double> out;
  double sum = 0;
  for (const JsonValue& e : v.array()) {
    const double p = e.number();
    if (p < 0) e.bad("must not be negative");
    out.push_back(p);
    sum += p;
  }
  // Token-averaged softmax weights sum to 1; the slack absorbs float32 accumulation in the runner,
  // while a wrong array (logits, another layer's counts) still fails.
  if (std::abs(sum - 1) > 1e-2) v.bad(concat("must sum to 1 (a distribution over sources), sums to ", sum));
  return out;
}

// A JS divergence in nats between a route's distribution (read as `key`) and the V route's.
double read_js_nats(const JsonValue& v, const std::vector<double>& route, const char* key) {
  const double js = v.number();
  if (js < -1e-9 || js > std::numbers::ln2 + 1e-6) v.bad("must lie in [0, ln 2]");
  if (route.empty()) v.bad(concat("is given without '", key, "'"));
  return js;
}

}  // namespace

json to_json(const LayerRouting& l) {
  json j = {{"layer", l.layer}, {"sources", l.sources}, {"qk_mean", l.qk_mean}};
  if (!l.v_mean.empty()) j["v_mean"] = l.v_mean;
  if (std::isfinite(l.js_nats)) j["js_nats"] = l.js_nats;
  if (!l.k_mean.empty()) j["k_mean"] = l.k_mean;
  if (std::isfinite(l.js_k_nats)) j["js_k_nats"] = l.js_k_nats;
  return j;
}

void from_json(JsonObject& in, LayerRouting& l) {
  const JsonValue layer = in.get("layer");
  l.layer = static_cast<int>(layer.integer());
  if (l.layer < 0) layer.bad("must not be negative");
  const JsonValue sources = in.get("sources");
  l.sources = static_cast<int>(sources.integer());
  if (l.sources < 1) sources.bad("must be at least 1");
  l.qk_mean = distribution(in.get("qk_mean"), l.sources);
  if (const auto v = in.find("v_mean"); v && !v->is_null()) l.v_mean = distribution(*v, l.sources);
  if (const auto js = in.find("js_nats"); js && !js->is_null()) l.js_nats = read_js_nats(*js, l.v_mean, "v_mean");
  if (const auto k = in.find("k_mean"); k && !k->is_null()) l.k_mean = distribution(*k, l.sources);
  if (const auto js = in.find("js_k_nats"); js && !js->is_null()) l.js_k_nats = read_js_nats(*js, l.k_mean, "k_mean");
}

json to_json(const Connections& c) {
  json rows = json::array();
  for (const auto& r : c.rows) rows.push_back({{"target", r.target}, {"sources", r.sources}, {"weights", r.weights}});
  return {{"name", c.name}, {"rows", std::move(rows)}};
}

void from_json(JsonObject& in, Connections& c) {
  const JsonValue name = in.get("name");
  c.name = name.string();
  if (c.name.empty()) name.bad("must not be empty");
  for (const JsonValue& entry : in.get("rows").array()) {
    JsonObject row = entry.object();
    ConnectionRow r;
    const JsonValue target = row.get("target");
    r.target = static_cast<int>(target.integer());
    if (r.target < 0) target.bad("must not be negative");
    if (!c.rows.empty() && r.target <= c.rows.back().target) target.bad("must be larger than the row before's");
    const JsonValue sources = row.get("sources");
    for (const JsonValue& s : sources.array()) {
      const auto source = s.integer();
      if (source < 0) s.bad("must not be negative");
      if (!r.sources.empty() && source <= r.sources.back()) s.bad("must be larger than the source before");
      r.sources.push_back(static_cast<int>(source));
    }
    if (r.sources.empty()) sources.bad("must name at least one source");
    const JsonValue weights = row.get("weights");
    for (const JsonValue& w : weights.array()) r.weights.push_back(w.number());
    if (r.weights.size() != r.sources.size())
      weights.bad(concat("has ", r.weights.size(), " entries but 'sources' has ", r.sources.size()));
    row.finish();
    c.rows.push_back(std::move(r));
  }
}

json to_json(const AmaxGain& g) {
  return {{"composite_forward_mean", g.composite_forward_mean}, {"composite_forward_max", g.composite_forward_max},
          {"composite_backward_mean", g.composite_backward_mean}, {"composite_backward_max", g.composite_backward_max},
          {"layer_forward_max", g.layer_forward_max}, {"layer_backward_max", g.layer_backward_max}};
}

void from_json(JsonObject& in, AmaxGain& g) {
  const auto mean_and_max = [&](const char* mean_key, const char* max_key, double& mean, double& max) {
    const JsonValue m = in.get(mean_key);
    mean = m.non_negative();
    max = in.get(max_key).non_negative();
    // A mean over tokens never exceeds their max; the slack absorbs the rounding of sum / count.
    if (mean > max * (1 + 1e-9)) m.bad(concat("is ", mean, ", larger than '", max_key, "' (", max, ")"));
  };
  mean_and_max("composite_forward_mean", "composite_forward_max", g.composite_forward_mean, g.composite_forward_max);
  mean_and_max("composite_backward_mean", "composite_backward_max", g.composite_backward_mean,
               g.composite_backward_max);
  g.layer_forward_max = in.get("layer_forward_max").non_negative();
  g.layer_backward_max = in.get("layer_backward_max").non_negative();
}

json to_json(const RunResult& r) {
  json milestones = json::array(), curve = json::array();
  for (const auto& m : r.milestones) milestones.push_back(to_json(m));
  for (const auto& p : r.curve) curve.push_back(to_json(p));
  json j = {{"arm", r.arm},
            {"seed", r.seed},
            {"params", r.params},
            {"milestones", std::move(milestones)},
            {"test_nll", r.test_nll},
            {"tokens_per_sec", r.tokens_per_sec},
            {"step_time_ms", r.step_time_ms},
            {"peak_rss_bytes", r.peak_rss_bytes},
            {"curve", std::move(curve)}};
  if (r.cpu_seconds_per_step > 0) j["cpu_seconds_per_step"] = r.cpu_seconds_per_step;
  if (!r.routing.empty()) {
    json layers = json::array();
    for (const auto& l : r.routing) layers.push_back(to_json(l));
    j["routing"] = {{"layers", std::move(layers)}};
  }
  if (!r.connections.empty()) {
    json connections = json::array();
    for (const auto& c : r.connections) connections.push_back(to_json(c));
    j["connections"] = std::move(connections);
  }
  if (r.amax_gain) j["amax_gain"] = to_json(*r.amax_gain);
  if (r.routing_max_weight) j["routing_max_weight"] = *r.routing_max_weight;
  if (r.instability) j["instability"] = to_json(*r.instability);
  if (r.provenance) j["provenance"] = to_json(*r.provenance);
  put_schema_version(j, r.version);
  return j;
}

void from_json(JsonObject& in, RunResult& r) {
  r.version = read_schema_version(in, kRunResultVersion);
  r.arm = in.get("arm").string();
  r.seed = in.get("seed").integer();
  const JsonValue params = in.get("params");
  r.params = params.integer();
  if (r.params <= 0) params.bad("must be positive");

  for (const JsonValue& entry : in.get("milestones").array()) {
    JsonObject object = entry.object();
    Milestone m;
    from_json(object, m);
    object.finish();
    if (!r.milestones.empty() && m.tokens <= r.milestones.back().tokens)
      object.get("tokens").bad("must be larger than the one before");
    r.milestones.push_back(m);
  }

  r.test_nll = in.get("test_nll").number();
  r.tokens_per_sec = in.get("tokens_per_sec").non_negative();
  const JsonValue rss = in.get("peak_rss_bytes");
  r.peak_rss_bytes = rss.integer();
  if (r.peak_rss_bytes < 0) rss.bad("must not be negative");
  r.step_time_ms = in.get("step_time_ms").non_negative();
  // Optional: written since the CPU time was recorded.
  if (const auto c = in.find("cpu_seconds_per_step"); c && !c->is_null()) r.cpu_seconds_per_step = c->non_negative();

  if (const auto curve = in.find("curve"))
    for (const JsonValue& p : curve->array()) r.curve.push_back(read_object<LossPoint>(p));

  if (const auto routing = in.find("routing"); routing && !routing->is_null()) {
    JsonObject object = routing->object();
    const JsonValue layers = object.get("layers");
    std::set<int> seen;
    for (const JsonValue& entry : layers.array()) {
      JsonObject layer = entry.object();
      LayerRouting l;
      from_json(layer, l);
      layer.finish();
      if (!seen.insert(l.layer).second) layer.get("layer").bad(concat("repeats layer ", l.layer));
      r.routing.push_back(std::move(l));
    }
    object.finish();
    // A route is given for every layer or none. A single source gets all the weight on any route,
    // so a single-source layer may leave its V and K distributions out.
    auto complete = [&](std::vector<double> LayerRouting::*route, const char* key) {
      const bool given =
          std::any_of(r.routing.begin(), r.routing.end(), [&](const auto& l) { return !(l.*route).empty(); });
      for (auto& l : r.routing) {
        if (!given || !(l.*route).empty()) continue;
        if (l.sources == 1) l.*route = {1.0};
        else layers.bad(concat("gives '", key, "' for some layers but not for layer ", l.layer));
      }
      return given;
    };
    const bool v_route = complete(&LayerRouting::v_mean, "v_mean");
    // The K route's own distribution is compared with the V route's.
    if (complete(&LayerRouting::k_mean, "k_mean") && !v_route) layers.bad("gives 'k_mean' without 'v_mean'");
    std::sort(r.routing.begin(), r.routing.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  }

  if (const auto connections = in.find("connections"); connections && !connections->is_null()) {
    std::set<std::string> names;
    for (const JsonValue& entry : connections->array()) {
      Connections c = read_object<Connections>(entry);
      if (!names.insert(c.name).second) entry.bad(concat("repeats the connections '", c.name, "'"));
      r.connections.push_back(std::move(c));
    }
  }

  // Optional: written for the n-stream modes, and only by versions that compute it.
  if (const auto gain = in.find("amax_gain"); gain && !gain->is_null()) r.amax_gain = read_object<AmaxGain>(*gain);
  // Optional: written for Delta AttnRes, a mean of largest softmax weights, in (0, 1].
  if (const auto w = in.find("routing_max_weight"); w && !w->is_null()) {
    r.routing_max_weight = w->non_negative();
    if (*r.routing_max_weight > 1) w->bad("must be at most 1");
  }

  // Optional: written since the instability was recorded.
  if (const auto s = in.find("instability"); s && !s->is_null()) r.instability = read_object<Instability>(*s);
  // Optional: written since the provenance was recorded.
  if (const auto p = in.find("provenance"); p && !p->is_null()) r.provenance = read_object<Provenance>(*p);
}

std::string run_result_path(const std::string& dir, const std::string& arm, std::int64_t seed) {
  return run_result_path(dir, "", arm, seed);
}

std::string run_result_path(const std::string& dir, const std::string& group, const std::string& arm,
                            std::int64_t seed) {
  std::filesystem::path p = std::filesystem::path(dir) / "runs";
  if (!group.empty()) p /= group;
  return (p / arm / ("seed-" + std::to_string(seed)) / "result.json").string();
}

void write_run_result(const std::string& path, const RunResult& r) { write_text_atomically(path, to_json(r).dump(1)); }

RunResult read_run_result(const std::string& path) { return read_json_file<RunResult>(path); }

}  // namespace attnres::results
