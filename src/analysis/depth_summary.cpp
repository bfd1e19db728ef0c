#include "analysis/depth_summary.hpp"

#include <algorithm>
#include <cmath>

#include "analysis/stats.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

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

}  // namespace

// Per arm and connection name, the mean of each weight over the arm's runs. The rows and sources
// are fixed by the model config, so every seed must agree on them.
std::vector<ArmConnections> summarize_connections(const ExperimentSummary& s) {
  std::vector<ArmConnections> out;
  for (const auto& arm : s.spec.arms) {
    const std::vector<const RunResult*> runs = s.finished_runs(arm);
    if (runs.empty()) continue;
    const RunResult& first = *runs.front();
    for (const RunResult* r : runs)
      require(r->connections.size() == first.connections.size(), s.path_of(*r), ": key 'connections' has ",
              r->connections.size(), " entries but ", s.path_of(first), " has ", first.connections.size(),
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
        require(same_shape(), s.path_of(*r), ": key 'connections' entry '", rc.name, "' does not have the rows and ",
                "sources of ", s.path_of(first), "'s '", first.connections[c].name, "'");
        for (std::size_t i = 0; i < rc.rows.size(); ++i)
          for (std::size_t k = 0; k < rc.rows[i].weights.size(); ++k)
            ac.connections.rows[i].weights[k] += rc.rows[i].weights[k] / static_cast<double>(runs.size());
      }
      out.push_back(std::move(ac));
    }
  }
  return out;
}

// Per arm, the Amax gains over its runs: the composite's means averaged, every max the max. A
// mode records them for every run or none, so a seed without them is an error.
std::vector<ArmGain> summarize_gain(const ExperimentSummary& s) {
  std::vector<ArmGain> out;
  for (const auto& arm : s.spec.arms) {
    const std::vector<const RunResult*> runs = s.finished_runs(arm);
    const auto with = std::find_if(runs.begin(), runs.end(), [](const RunResult* r) { return r->amax_gain.has_value(); });
    if (with == runs.end()) continue;
    ArmGain a;
    a.arm = arm;
    a.n_seeds = static_cast<int>(runs.size());
    results::AmaxGain& g = a.gain;
    for (const RunResult* r : runs) {
      require(r->amax_gain.has_value(), s.path_of(*r), ": key 'amax_gain' is missing but ", s.path_of(**with),
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
    const std::vector<const RunResult*> runs = s.finished_runs(arm);
    const auto routed = std::count_if(runs.begin(), runs.end(), [](const RunResult* r) { return !r->routing.empty(); });
    if (routed == 0) continue;
    // Layer structure is fixed by the model config, so every seed must agree on it.
    const RunResult& first = **std::find_if(runs.begin(), runs.end(), [](auto* r) { return !r->routing.empty(); });
    const auto routes = [](const LayerRouting& l) {
      return std::string(l.v_mean.empty() ? "" : ", v_mean") + (l.k_mean.empty() ? "" : ", k_mean");
    };
    for (const RunResult* r : runs) {
      require(!r->routing.empty(), s.path_of(*r), ": key 'routing' is missing but ", s.path_of(first),
              " has it (same arm)");
      require(r->routing.size() == first.routing.size(), s.path_of(*r), ": key 'routing.layers' has ",
              r->routing.size(), " layers but ", s.path_of(first), " has ", first.routing.size());
      for (std::size_t l = 0; l < first.routing.size(); ++l) {
        const LayerRouting &a = r->routing[l], &b = first.routing[l];
        require(a.layer == b.layer && a.sources == b.sources && routes(a) == routes(b), s.path_of(*r),
                ": key 'routing.layers' entry for layer ", a.layer, " (", a.sources, " sources", routes(a),
                ") does not match ", s.path_of(first), " (layer ", b.layer, ", ", b.sources, " sources", routes(b),
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

}  // namespace attnres::analysis
