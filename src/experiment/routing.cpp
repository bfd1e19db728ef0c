#include "experiment/routing.hpp"

#include <algorithm>
#include <cmath>

#include "experiment/stats.hpp"
#include "experiment/stream_mixing.hpp"
#include "kernels/dwa.hpp"
#include "model/topology.hpp"
#include "util/error.hpp"

namespace attnres::experiment {

namespace {

// Runs the model over the split's first windows (up to max_tokens), `batch` at a time, calling
// visit(n_tok) after each pass (the routing then holds that pass's weights); returns the tokens seen.
template <class Visit>
std::int64_t over_windows(InferenceBackend& model, const data::TokenDataset& split, int batch, int seq,
                          std::int64_t max_tokens, Visit visit) {
  const data::BatchLoader order(split, 1, seq, 0);
  std::int64_t windows = std::min<std::int64_t>(order.num_windows(), std::max<std::int64_t>(1, max_tokens / seq));
  require(windows >= 1, "split '", split.split(), "' is too small for routing diagnostics");
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch) * (seq + 1));
  std::int64_t counted = 0;
  for (std::int64_t w0 = 0; w0 < windows; w0 += batch) {
    const int nb = static_cast<int>(std::min<std::int64_t>(batch, windows - w0));
    for (int i = 0; i < nb; ++i)
      order.window(w0 + i, std::span<std::int32_t>(tokens).subspan(static_cast<std::size_t>(i) * (seq + 1), seq + 1));
    model.loss(std::span<const std::int32_t>(tokens.data(), static_cast<std::size_t>(nb) * (seq + 1)), nb, seq);
    const std::int64_t n_tok = std::int64_t(nb) * seq;
    visit(n_tok);
    counted += n_tok;
  }
  return counted;
}

const DepthRouting& routing_of(const InferenceBackend& model) {
  const DepthRouting* routing = model.routing();
  require(routing != nullptr, "routing diagnostics need the depth-read weights, which ", model.describe(),
          " does not keep");
  return *routing;
}

// MUDD's routing (routing_diagnostics): block b's routes are the Q, K and V ways of DA b-1.
std::vector<results::LayerRouting> mudd_routing(InferenceBackend& model, const data::TokenDataset& split, int batch,
                                                int seq, std::int64_t max_tokens) {
  std::vector<results::LayerRouting> layers;
  const ModelConfig& c = model.config();
  if (!c.mudd_multiway()) return layers;
  const DepthRouting& routing = routing_of(model);
  enum { kQ, kK, kV };  // the DA's way indices (kernels/mudd.hpp), R being the fourth
  for (int b = 0; b < c.n_layers; ++b) {
    results::LayerRouting s;
    s.layer = b;
    s.sources = b == 0 ? 1 : c.mudd_da_sources(b - 1);  // block 0 reads the embedding on every way
    const double single = s.sources == 1 ? 1.0 : 0.0;    // (the sums below start at 0)
    s.qk_mean.assign(static_cast<std::size_t>(s.sources), single);
    s.k_mean = s.v_mean = s.qk_mean;
    s.js_nats = s.js_k_nats = 0;
    layers.push_back(std::move(s));
  }
  const auto max_sources = static_cast<std::size_t>(c.n_layers);  // DA n_layers - 2, the last with Q, K, V
  std::vector<float> dw(max_sources), norms(max_sources);
  std::vector<double> p[3] = {std::vector<double>(max_sources), std::vector<double>(max_sources),
                              std::vector<double>(max_sources)};
  const std::int64_t counted = over_windows(model, split, batch, seq, max_tokens, [&](std::int64_t n_tok) {
    for (auto& s : layers) {
      if (s.sources == 1) continue;
      const int da = s.layer - 1;
      const auto n = static_cast<std::size_t>(s.sources);
      for (std::int64_t t = 0; t < n_tok; ++t) {
        routing.mudd_source_norms(da, t, std::span<float>(norms.data(), n));
        for (int way : {kQ, kK, kV}) {
          routing.mudd_weights(da, way, t, std::span<float>(dw.data(), n));
          mudd_way_distribution(std::span<const float>(dw.data(), n), std::span<const float>(norms.data(), n),
                                std::span<double>(p[way].data(), n));
        }
        for (std::size_t j = 0; j < n; ++j) {
          s.qk_mean[j] += p[kQ][j];
          s.k_mean[j] += p[kK][j];
          s.v_mean[j] += p[kV][j];
        }
        const std::span<const double> pv(p[kV].data(), n);
        s.js_nats += js_divergence_nats(std::span<const double>(p[kQ].data(), n), pv);
        s.js_k_nats += js_divergence_nats(std::span<const double>(p[kK].data(), n), pv);
      }
    }
  });
  for (auto& s : layers) {
    if (s.sources == 1) continue;
    for (auto* mean : {&s.qk_mean, &s.k_mean, &s.v_mean})
      for (double& x : *mean) x /= double(counted);
    s.js_nats /= double(counted);
    s.js_k_nats /= double(counted);
  }
  return layers;
}

}  // namespace

void mudd_way_distribution(std::span<const float> dw, std::span<const float> norms, std::span<double> p) {
  require(dw.size() == p.size() && norms.size() == p.size() && !p.empty(), "mudd_way_distribution: ", dw.size(),
          " weights, ", norms.size(), " norms and ", p.size(), " outputs");
  double sum = 0;
  for (std::size_t j = 0; j < p.size(); ++j) {
    p[j] = std::abs(double(dw[j])) * double(norms[j]);
    sum += p[j];
  }
  if (sum == 0) {  // the way mixes nothing in: see routing.hpp
    std::fill(p.begin(), p.end(), 0.0);
    p.back() = 1;
    return;
  }
  for (double& x : p) x /= sum;  // (NaN weights stay NaN, as a diverged model's softmax would)
}

std::vector<results::LayerRouting> routing_diagnostics(InferenceBackend& model, const data::TokenDataset& split,
                                                       int batch, int seq, std::int64_t max_tokens) {
  std::vector<results::LayerRouting> layers;
  const ModelConfig& c = model.config();
  if (c.residual == ResidualMode::mudd) return mudd_routing(model, split, batch, seq, max_tokens);
  const Topology topology(c);
  if (!topology.has_reads()) return layers;
  const DepthRouting* routing = &routing_of(model);
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
  const auto max_sources = static_cast<std::size_t>(topology.max_sources());
  std::vector<float> a(max_sources), b(max_sources);
  std::vector<double> p(max_sources), q(max_sources);
  const std::int64_t counted = over_windows(model, split, batch, seq, max_tokens, [&](std::int64_t n_tok) {
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
  });
  for (auto& s : layers) {
    for (auto& x : s.qk_mean) x /= double(counted);
    for (auto& x : s.v_mean) x /= double(counted);
    s.js_nats /= double(counted);  // stays NaN (not available) with one route
  }
  return layers;
}

namespace {

// Static HC's unfolded dense connections (baselines-spec §6.5, HC-P eq. 27) from its coefficients
// A and B, exactly: they are every token's, so one token's unfolding is their mean.
results::Connections hc_connections(const ModelConfig& config, const SafetensorsFile& weights,
                                    const std::string& path) {
  const int n = config.hc_n, L = config.n_sublayers();
  const auto N = static_cast<std::size_t>(n);
  auto tensor = [&](const std::string& name, std::size_t size) {
    std::vector<double> v = weights.at(name, path).values<double>();
    require(v.size() == size, path, ": tensor '", name, "' has ", v.size(), " values, expected ", size);
    return v;
  };
  std::vector<double> coefficients;  // per sublayer A [n, n+1], then B: the model's layout
  for (int j = 0; j < L; ++j) {
    const std::string p = "hc." + std::to_string(j) + ".";
    for (const auto& [name, size] : {std::pair{p + "A", N * (N + 1)}, std::pair{p + "B", N}}) {
      const std::vector<double> v = tensor(name, size);
      coefficients.insert(coefficients.end(), v.begin(), v.end());
    }
  }
  UnfoldedConnections unfolded(n, L, config.hc_reduce == StreamReadout::mean ? 1.0 / n : 1.0);
  unfolded.add(coefficients);
  return unfolded.mean("hc");
}

}  // namespace

std::vector<results::Connections> mudd_connections(InferenceBackend& model, const data::TokenDataset& split,
                                                   int batch, int seq, std::int64_t max_tokens) {
  std::vector<results::Connections> out;
  const ModelConfig& c = model.config();
  if (c.residual != ResidualMode::mudd) return out;
  const DepthRouting& routing = routing_of(model);
  const int L = c.n_layers, max_ways = c.mudd_da_ways(0);
  static constexpr const char* kWayNames[] = {"mudd.q", "mudd.k", "mudd.v", "mudd.r"};
  // out[w] is way w of the 4-way DAs; R is the last way of every DA (and the only one of the last).
  for (int w = 0; w < max_ways; ++w) out.push_back({max_ways == 1 ? "mudd.r" : kWayNames[w], {}});
  for (int i = 0; i < L; ++i) {
    const int C = c.mudd_da_ways(i), S = c.mudd_da_sources(i);
    for (int w = 0; w < C; ++w) {
      results::ConnectionRow row;
      row.target = i + 1;
      for (int j = 0; j < S; ++j) row.sources.push_back(j);
      row.weights.assign(static_cast<std::size_t>(S), 0.0);
      out[static_cast<std::size_t>(C == max_ways ? w : max_ways - 1)].rows.push_back(std::move(row));
    }
  }
  std::vector<float> dw(static_cast<std::size_t>(L + 1));
  const std::int64_t counted = over_windows(model, split, batch, seq, max_tokens, [&](std::int64_t n_tok) {
    for (int i = 0; i < L; ++i) {
      const int C = c.mudd_da_ways(i), S = c.mudd_da_sources(i);
      for (int w = 0; w < C; ++w) {
        std::vector<double>& sum = out[static_cast<std::size_t>(C == max_ways ? w : max_ways - 1)]
                                       .rows[static_cast<std::size_t>(i)].weights;
        for (std::int64_t t = 0; t < n_tok; ++t) {
          routing.mudd_weights(i, w, t, std::span<float>(dw.data(), static_cast<std::size_t>(S)));
          for (int j = 0; j < S; ++j) sum[static_cast<std::size_t>(j)] += dw[static_cast<std::size_t>(j)];
        }
      }
    }
  });
  for (auto& way : out)
    for (auto& row : way.rows)
      for (double& x : row.weights) x /= double(counted);
  return out;
}

std::optional<StreamDiagnostics> stream_diagnostics(InferenceBackend& model, const data::TokenDataset& split,
                                                    int batch, int seq, std::int64_t max_tokens) {
  const ModelConfig& c = model.config();
  if (!c.uses_streams()) return std::nullopt;
  const DepthRouting& routing = routing_of(model);
  const int n = c.n_streams(), L = c.n_sublayers();
  const auto m = static_cast<std::size_t>(n) * (n + 2);
  UnfoldedConnections unfolded(n, L, c.stream_readout() == StreamReadout::mean ? 1.0 / n : 1.0);
  AmaxGainSum gain(n, L);
  std::vector<float> coef(m);
  std::vector<double> token(m * static_cast<std::size_t>(L));  // one token's, every sublayer's
  over_windows(model, split, batch, seq, max_tokens, [&](std::int64_t n_tok) {
    for (std::int64_t t = 0; t < n_tok; ++t) {
      for (int j = 0; j < L; ++j) {
        routing.stream_weights(j, t, coef);
        std::copy(coef.begin(), coef.end(), token.begin() + static_cast<std::ptrdiff_t>(m * j));
      }
      unfolded.add(token);
      gain.add(token);
    }
  });
  return StreamDiagnostics{unfolded.mean(c.residual == ResidualMode::mhc ? "mhc" : "hc"), gain.result()};
}

std::vector<results::Connections> static_connections(const ModelConfig& config, const SafetensorsFile& weights,
                                                     const std::string& path) {
  std::vector<results::Connections> out;
  if (config.residual == ResidualMode::hc && !config.hc_dynamic) out.push_back(hc_connections(config, weights, path));
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
