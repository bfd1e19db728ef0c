// What a model shows of its depth mixing, for a run's diagnostics (baselines-spec §6.5, spec §7):
// the records themselves (result.json keeps them: results/run_result.hpp names them in results::)
// and the view of the last forward pass that every trunk offers (Model::depth_view()). Averaging
// over evaluation tokens is experiment/diagnostics.hpp's; which mode offers what, its family's record (model/family.hpp).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace attnres {

struct SafetensorsFile;  // model/safetensors.hpp

// One attention sublayer's routing, averaged over evaluation tokens. The routes are the depth
// distributions its attention's inputs are read with: one (Q/K/V), two (Q/K and V: rd) or three
// (Q, K and V: MUDD, whose distributions are p_c(j) ∝ |dw[c,j]|·‖X_j‖, baselines-spec §6.5).
// Per-token JS is always taken against the V route.
struct LayerRouting {
  int layer = 0;
  int sources = 0;
  // The mean depth distribution (sources entries) of the route that forms the queries, and the keys
  // too unless k_mean is given.
  std::vector<double> qk_mean;
  std::vector<double> v_mean;  // the V route's; empty for single-route arms
  // JS(qk, V) per token, averaged over tokens; NaN (not available) without a V route.
  double js_nats = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> k_mean;  // the K route's own (MUDD); empty where qk_mean forms the keys
  double js_k_nats = std::numeric_limits<double>::quiet_NaN();  // JS(K, V) as js_nats; NaN without k_mean
};

// The depth connections of a baseline mode: mixing weights that are signed and not normalised, so
// they are not depth distributions. One row per consumer, one weight per stream source it reads:
// source 0 is the embedding X_0, source s block s's output X_s. DenseFormer ("dwa"): row i is the
// DWA after block i, its static alpha.
struct ConnectionRow {
  int target = 0;
  std::vector<int> sources;     // increasing
  std::vector<double> weights;  // one per source
};

struct Connections {
  std::string name;
  std::vector<ConnectionRow> rows;  // increasing targets
};

// The "Amax gain" of an n-stream mode's residual mixing (hc, mhc; MHC-P §3.1). Per token, every
// sublayer's write maps the n streams by its H_res (HC: A_r^T), and the composite P = H_res(last
// sublayer) ... H_res(first) maps the embedding's copies to the streams the exit reads. A matrix's
// forward gain is its largest absolute row sum max_i |sum_j P_ij| (how much a signal common to all
// streams can grow on the way up), its backward gain its largest absolute column sum max_j |sum_i
// P_ij| (the same for a gradient on the way down); 1 is neutral. Over evaluation tokens (in the
// summary also over seeds): the composite's mean and max, and the max over sublayers of a single
// H_res's.
struct AmaxGain {
  double composite_forward_mean = 0, composite_forward_max = 0;
  double composite_backward_mean = 0, composite_backward_max = 0;
  double layer_forward_max = 0, layer_backward_max = 0;
};

// A run's depth diagnostics, whichever its mode offers (empty or none where it offers nothing).
struct DepthDiagnostics {
  std::vector<LayerRouting> routing;      // by layer
  std::vector<Connections> connections;
  std::optional<AmaxGain> amax_gain;
  // Delta AttnRes's routing-collapse statistic (docs/delta-gated-spec.md §1.8): per read with more
  // than one source the mean over tokens of its largest weight, then the mean over those reads.
  std::optional<double> routing_max_weight;
};

// An attention input whose depth mixing reads as distributions over its sources: layer `layer`'s,
// with `routes` of them (1: Q, K and V read alike; 2: Q/K and V; 3: Q, K and V).
struct RoutedInput {
  int layer = 0;
  int sources = 0;
  int routes = 1;
};

// A family's connections and gains, summed over the forward passes shown to it.
class MixingSum {
 public:
  virtual ~MixingSum() = default;
  // False when they come from the weights alone (DenseFormer's DWAs): no pass is needed.
  virtual bool needs_passes() const { return true; }
  // Adds every token of the model's last forward pass.
  virtual void add_pass() = 0;
  // Means over the tokens added (static ones: the weights').
  virtual std::vector<Connections> connections() const = 0;
  virtual std::optional<AmaxGain> amax_gain() const { return std::nullopt; }
};

// What a trunk shows of the model's last forward pass. A family offers what its record in
// model/family.hpp says: routed inputs, a mixing sum, both or neither.
class DepthView {
 public:
  virtual ~DepthView() = default;
  virtual std::vector<RoutedInput> routed_inputs() const { return {}; }
  // The routes' distributions of routed input `index` for one token of the last pass: routes x
  // sources values, row-major (a family without routed inputs is never asked).
  virtual void route_distributions(int index, std::int64_t token, std::span<double> p) const;
  // The depth reads whose largest weight the routing-collapse statistic averages (Delta AttnRes's
  // routing_max_weight, docs/delta-gated-spec.md §1.8: the softmax reads with more than one
  // source), and that weight for one token of the last pass (a family without them is never asked).
  virtual std::vector<int> max_weight_reads() const { return {}; }
  virtual double max_weight(int read, std::int64_t token) const;
  // A new sum over passes (null: the family has neither connections nor gains).
  virtual std::unique_ptr<MixingSum> mixing_sum() const { return nullptr; }
  // Tokens in the last forward pass.
  virtual std::int64_t tokens() const = 0;
};

// The connections a mode's weights determine whatever the token (DenseFormer's DWA weights,
// "dwa"; static HC's unfolded dense connections, "hc"), from a weights file; empty for other modes,
// whose connections vary by token (dynamic HC, mHC, MUDD: their mixing sums average them). The file
// may hold a larger model of the family (a dynamic HC file gives its static part).
std::vector<Connections> static_connections(const ModelConfig& config, const SafetensorsFile& weights,
                                            const std::string& path);

// MUDD's depth distribution of one way c of a DA for one token (baselines-spec §6.5). Its weights
// dw[c, j] are signed and not normalised, so JS is not defined on them; each is weighed by the size
// of what it mixes: p(j) = |dw[c, j]|·‖X_j‖ / Σ_j |dw[c, j]|·‖X_j‖ (X_j: the sources the DA mixes,
// with PrePostDANorm the normalised ones; its skip term x_c = X_{i+1} + ... is not a source and
// not counted). When the sum is 0 the way mixes nothing in: p puts all weight on the last source,
// the block output X_{i+1} that way then carries with PrePostDANorm (x_c = X_{i+1}, as at its
// initialisation, dw = 0), and that the base variant's initialisation (dw = e_last) gives too.
// dw, norms and p have one entry per source.
void mudd_way_distribution(std::span<const float> dw, std::span<const float> norms, std::span<double> p);

}  // namespace attnres
