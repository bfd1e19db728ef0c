#include "experiment/diagnostics.hpp"

#include <algorithm>
#include <memory>
#include <vector>

#include "analysis/stats.hpp"
#include "model/arms.hpp"
#include "model/model.hpp"
#include "util/error.hpp"

namespace attnres::experiment {
using namespace analysis;  // the statistics, summaries and number formats of the analysis module

namespace {

// Runs the model over the split's first windows (up to max_tokens), `batch` at a time, calling
// visit() after each pass (the model's depth view then shows that pass); returns the tokens seen.
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
    visit();
    counted += std::int64_t(nb) * seq;
  }
  return counted;
}

// The routing of the routed inputs, summed over tokens: each route's distribution, and JS against
// the V route (the last of two or three).
class RoutingSum {
 public:
  explicit RoutingSum(const std::vector<RoutedInput>& inputs) : inputs_(inputs) {
    std::size_t most = 0;
    for (const RoutedInput& in : inputs) {
      LayerRouting s;
      s.layer = in.layer;
      s.sources = in.sources;
      const auto n = static_cast<std::size_t>(in.sources);
      s.qk_mean.assign(n, 0.0);
      if (in.routes >= 2) {
        s.v_mean.assign(n, 0.0);
        s.js_nats = 0;
      }
      if (in.routes == 3) {
        s.k_mean.assign(n, 0.0);
        s.js_k_nats = 0;
      }
      layers_.push_back(std::move(s));
      most = std::max(most, static_cast<std::size_t>(in.routes) * n);
    }
    p_.resize(most);
  }

  void add_pass(const DepthView& view) {
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      const RoutedInput& in = inputs_[i];
      LayerRouting& s = layers_[i];
      const auto n = static_cast<std::size_t>(in.sources);
      const std::span<double> p(p_.data(), static_cast<std::size_t>(in.routes) * n);
      const auto route = [&](int r) { return std::span<const double>(p.subspan(static_cast<std::size_t>(r) * n, n)); };
      for (std::int64_t t = 0; t < view.tokens(); ++t) {
        view.route_distributions(static_cast<int>(i), t, p);
        add(s.qk_mean, route(0));
        if (in.routes == 2) {
          add(s.v_mean, route(1));
          s.js_nats += js_divergence_nats(route(0), route(1));
        } else if (in.routes == 3) {
          add(s.k_mean, route(1));
          add(s.v_mean, route(2));
          s.js_nats += js_divergence_nats(route(0), route(2));
          s.js_k_nats += js_divergence_nats(route(1), route(2));
        }
      }
    }
  }

  std::vector<LayerRouting> means(std::int64_t tokens) const {
    std::vector<LayerRouting> out = layers_;
    for (LayerRouting& s : out) {
      for (auto* mean : {&s.qk_mean, &s.k_mean, &s.v_mean})
        for (double& x : *mean) x /= double(tokens);
      s.js_nats /= double(tokens);  // stays NaN (not available) with one route
      s.js_k_nats /= double(tokens);
    }
    return out;
  }

 private:
  static void add(std::vector<double>& sum, std::span<const double> p) {
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += p[k];
  }

  std::vector<RoutedInput> inputs_;
  std::vector<LayerRouting> layers_;
  std::vector<double> p_;  // one token's routes
};

}  // namespace

DepthDiagnostics diagnose(InferenceBackend& backend, const data::TokenDataset& split, int batch, int seq,
                          std::int64_t max_tokens) {
  DepthDiagnostics out;
  const DiagnosticsOffered offered = residual_mode_info(backend.config().residual).diagnostics;
  if (!offered.routing && !offered.connections && !offered.amax_gain) return out;
  const Model<float>* model = backend.host_model();
  require(model != nullptr, "depth diagnostics need the model's depth mixing, which ", backend.describe(),
          " does not keep on the host");
  const DepthView& view = model->depth_view();
  const std::vector<RoutedInput> inputs = view.routed_inputs();
  const std::unique_ptr<MixingSum> mixing = view.mixing_sum();
  ATTNRES_CHECK(offered.routing || inputs.empty(), "a mode without routing has routed inputs");
  ATTNRES_CHECK((offered.connections || offered.amax_gain) || mixing == nullptr,
                "a mode without connections has a mixing sum");
  RoutingSum routing(inputs);
  const std::vector<int> max_reads = view.max_weight_reads();
  std::vector<double> max_sums(max_reads.size(), 0.0);  // per read: its largest weight, summed over tokens
  std::int64_t tokens = 0;
  if (!inputs.empty() || !max_reads.empty() || (mixing != nullptr && mixing->needs_passes()))
    tokens = over_windows(backend, split, batch, seq, max_tokens, [&] {
      routing.add_pass(view);
      for (std::size_t i = 0; i < max_reads.size(); ++i)
        for (std::int64_t t = 0; t < view.tokens(); ++t) max_sums[i] += view.max_weight(max_reads[i], t);
      if (mixing != nullptr) mixing->add_pass();
    });
  if (!inputs.empty()) out.routing = routing.means(tokens);
  if (!max_reads.empty()) {
    double mean = 0;
    for (double sum : max_sums) mean += sum / double(tokens);
    out.routing_max_weight = mean / double(max_reads.size());
  }
  if (mixing != nullptr) {
    out.connections = mixing->connections();
    out.amax_gain = mixing->amax_gain();
  }
  return out;
}

}  // namespace attnres::experiment
