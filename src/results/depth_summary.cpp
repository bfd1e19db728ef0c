// summary.json's depth-diagnostic records (results/summary.hpp): the routing of each arm with its
// JS between routes, the connections and the Amax gains, each averaged over the arm's seeds.
#include <cmath>

#include "results/summary.hpp"
#include "util/error.hpp"

namespace attnres::results {

using nlohmann::json;

namespace {

constexpr const char* kPerTokenMean = "per_token_mean";
constexpr const char* kJsOfMeans = "js_of_mean_distributions";

}  // namespace

json to_json(const JsLayerMean& m) {
  return {{"nats", number_or_null(m.nats)}, {"bits", number_or_null(m.bits)}, {"layers", m.layers}};
}

void from_json(JsonObject& in, JsLayerMean& m) {
  m.nats = in.get("nats").number_or_null();
  m.bits = in.get("bits").number_or_null();
  m.layers = static_cast<int>(in.get("layers").integer());
}

json to_json(const ArmConnections& a) {
  json j = to_json(a.connections);
  j["arm"] = a.arm;
  j["seeds"] = a.n_seeds;
  return j;
}

void from_json(JsonObject& in, ArmConnections& a) {
  a.arm = in.get("arm").string();
  a.n_seeds = static_cast<int>(in.get("seeds").integer());
  from_json(in, a.connections);
}

json to_json(const ArmGain& a) {
  json j = to_json(a.gain);
  j["arm"] = a.arm;
  j["seeds"] = a.n_seeds;
  return j;
}

void from_json(JsonObject& in, ArmGain& a) {
  a.arm = in.get("arm").string();
  a.n_seeds = static_cast<int>(in.get("seeds").integer());
  from_json(in, a.gain);
}

json to_json(const ArmRouting& a) {
  json layers = json::array();
  for (const auto& l : a.layers) {
    json lj = {{"layer", l.layer}, {"sources", l.sources}, {"qk_mean", numbers_or_null(l.qk_mean)}};
    if (a.two_routes) {
      lj["v_mean"] = numbers_or_null(l.v_mean);
      lj["js_nats"] = number_or_null(l.js_nats);
      lj["js_bits"] = number_or_null(l.js_bits);
      lj["js_of_means_nats"] = number_or_null(l.js_of_means_nats);
    }
    if (a.k_route) {
      lj["k_mean"] = numbers_or_null(l.k_mean);
      lj["js_k_nats"] = number_or_null(l.js_k_nats);
      lj["js_k_bits"] = number_or_null(l.js_k_bits);
      lj["js_k_of_means_nats"] = number_or_null(l.js_k_of_means_nats);
    }
    layers.push_back(std::move(lj));
  }
  json j = {{"arm", a.arm}, {"seeds", a.n_seeds}, {"two_routes", a.two_routes}, {"layers", std::move(layers)}};
  if (a.two_routes) {
    j["js_estimate"] = a.per_token_js ? kPerTokenMean : kJsOfMeans;
    j["js_mean_all_layers"] = to_json(a.all_layers);
    j["js_mean_multi_source_layers"] = to_json(a.multi_source_layers);
  }
  if (a.k_route) {
    j["k_route"] = true;
    j["js_k_mean_all_layers"] = to_json(a.k_all_layers);
    j["js_k_mean_multi_source_layers"] = to_json(a.k_multi_source_layers);
  }
  if (!std::isnan(a.max_weight)) j["routing_max_weight"] = a.max_weight;
  return j;
}

void from_json(JsonObject& in, ArmRouting& a) {
  a.arm = in.get("arm").string();
  a.n_seeds = static_cast<int>(in.get("seeds").integer());
  a.two_routes = in.get("two_routes").boolean();
  // Absent in summaries without a K route (and in those written before attnres recorded one).
  if (const auto k = in.find("k_route")) {
    a.k_route = k->boolean();
    if (!a.k_route) k->bad("must be true or left out");
    if (!a.two_routes) k->bad("is true but 'two_routes' is false (a K route is compared with the V route)");
  }
  // Absent for arms without the statistic (and in summaries written before it).
  if (const auto w = in.find("routing_max_weight")) a.max_weight = w->non_negative();
  for (const JsonValue& entry : in.get("layers").array()) {
    JsonObject lj = entry.object();
    LayerRoutingSummary l;
    l.layer = static_cast<int>(lj.get("layer").integer());
    l.sources = static_cast<int>(lj.get("sources").integer());
    l.qk_mean = lj.get("qk_mean").numbers_or_null();
    if (a.two_routes) {
      l.v_mean = lj.get("v_mean").numbers_or_null();
      l.js_nats = lj.get("js_nats").number_or_null();
      l.js_bits = lj.get("js_bits").number_or_null();
      l.js_of_means_nats = lj.get("js_of_means_nats").number_or_null();
    }
    if (a.k_route) {
      l.k_mean = lj.get("k_mean").numbers_or_null();
      l.js_k_nats = lj.get("js_k_nats").number_or_null();
      l.js_k_bits = lj.get("js_k_bits").number_or_null();
      l.js_k_of_means_nats = lj.get("js_k_of_means_nats").number_or_null();
    }
    lj.finish();
    a.layers.push_back(std::move(l));
  }
  if (!a.two_routes) return;
  const JsonValue estimate = in.get("js_estimate");
  const std::string e = estimate.string();
  if (e != kPerTokenMean && e != kJsOfMeans)
    estimate.bad(concat("must be '", kPerTokenMean, "' or '", kJsOfMeans, "'"));
  a.per_token_js = e == kPerTokenMean;
  a.all_layers = read_object<JsLayerMean>(in.get("js_mean_all_layers"));
  a.multi_source_layers = read_object<JsLayerMean>(in.get("js_mean_multi_source_layers"));
  if (!a.k_route) return;
  a.k_all_layers = read_object<JsLayerMean>(in.get("js_k_mean_all_layers"));
  a.k_multi_source_layers = read_object<JsLayerMean>(in.get("js_k_mean_multi_source_layers"));
}

}  // namespace attnres::results
