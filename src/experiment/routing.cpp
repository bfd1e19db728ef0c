#include "experiment/routing.hpp"

#include <algorithm>

#include "experiment/stats.hpp"
#include "kernels/dwa.hpp"
#include "model/topology.hpp"
#include "util/error.hpp"

namespace attnres::experiment {

std::vector<results::LayerRouting> routing_diagnostics(InferenceBackend& model, const data::TokenDataset& split,
                                                       int batch, int seq, std::int64_t max_tokens) {
  std::vector<results::LayerRouting> layers;
  const ModelConfig& c = model.config();
  const Topology topology(c);
  if (!topology.has_reads()) return layers;
  const DepthRouting* routing = model.routing();
  require(routing != nullptr, "routing diagnostics need the depth-read weights, which ", model.describe(),
          " does not keep");
  for (int l = 0; l < c.n_layers; ++l) {
    const ReadPlan& plan = topology.read(2 * l);
    results::LayerRouting s;
    s.layer = l;
    s.sources = static_cast<int>(plan.sources.size());
    s.qk_mean.assign(plan.sources.size(), 0.0);
    if (plan.n_routes == 2) {
      s.v_mean.assign(plan.sources.size(), 0.0);
      s.js_nats = 0;
    }
    layers.push_back(std::move(s));
  }
  const data::BatchLoader order(split, 1, seq, 0);
  std::int64_t windows = std::min<std::int64_t>(order.num_windows(), std::max<std::int64_t>(1, max_tokens / seq));
  require(windows >= 1, "split '", split.split(), "' is too small for routing diagnostics");
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch) * (seq + 1));
  const auto max_sources = static_cast<std::size_t>(topology.max_sources());
  std::vector<float> a(max_sources), b(max_sources);
  std::vector<double> p(max_sources), q(max_sources);
  std::int64_t counted = 0;
  for (std::int64_t w0 = 0; w0 < windows; w0 += batch) {
    const int nb = static_cast<int>(std::min<std::int64_t>(batch, windows - w0));
    for (int i = 0; i < nb; ++i)
      order.window(w0 + i, std::span<std::int32_t>(tokens).subspan(static_cast<std::size_t>(i) * (seq + 1), seq + 1));
    model.loss(std::span<const std::int32_t>(tokens.data(), static_cast<std::size_t>(nb) * (seq + 1)), nb, seq);
    const std::int64_t n_tok = std::int64_t(nb) * seq;
    for (auto& s : layers) {
      const auto n = static_cast<std::size_t>(s.sources);
      for (std::int64_t t = 0; t < n_tok; ++t) {
        routing->read_weights(2 * s.layer, 0, t, std::span<float>(a.data(), n));
        for (std::size_t k = 0; k < n; ++k) s.qk_mean[k] += a[k];
        if (s.v_mean.empty()) continue;
        routing->read_weights(2 * s.layer, 1, t, std::span<float>(b.data(), n));
        for (std::size_t k = 0; k < n; ++k) {
          s.v_mean[k] += b[k];
          p[k] = a[k];
          q[k] = b[k];
        }
        s.js_nats += js_divergence_nats(std::span<const double>(p.data(), n), std::span<const double>(q.data(), n));
      }
    }
    counted += n_tok;
  }
  for (auto& s : layers) {
    for (auto& x : s.qk_mean) x /= double(counted);
    for (auto& x : s.v_mean) x /= double(counted);
    s.js_nats /= double(counted);  // stays NaN (not available) with one route
  }
  return layers;
}

std::vector<results::Connections> static_connections(const ModelConfig& config, const SafetensorsFile& weights,
                                                     const std::string& path) {
  std::vector<results::Connections> out;
  if (config.residual != ResidualMode::denseformer) return out;
  results::Connections dwa;
  dwa.name = "dwa";
  for (int block = 1; block <= config.n_layers; ++block) {
    const std::vector<int> sources = kernels::dwa_sources(block, config.dwa_dilation, config.dwa_period);
    if (sources.empty()) continue;
    const std::string name = "dwa." + std::to_string(block) + ".alpha";
    const std::vector<double> alpha = weights.at(name, path).values<double>();
    require(alpha.size() == sources.size(), path, ": tensor '", name, "' has ", alpha.size(), " values, expected ",
            sources.size());
    dwa.rows.push_back({block, sources, alpha});
  }
  out.push_back(std::move(dwa));
  return out;
}

}  // namespace attnres::experiment
