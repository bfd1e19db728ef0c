// Depth-routing diagnostics on evaluation tokens (spec §7): per attention sublayer, the mean
// depth distribution of the Q/K route and of the V route, and the per-token Jensen-Shannon
// divergence between them, averaged over tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "data/loader.hpp"
#include "model/model.hpp"

namespace attnres::experiment {

struct LayerRoutingStats {
  int layer = 0;
  int sources = 0;
  std::vector<double> qk_mean;  // [sources]
  std::vector<double> v_mean;   // empty when the attention input has one route
  double js_nats = 0;           // mean over tokens; 0 for single-source layers; unset when one route
  bool has_value_route = false;
};

// Runs the model over the split's first windows (up to max_tokens) and averages per token.
std::vector<LayerRoutingStats> routing_diagnostics(Model<float>& model, const data::TokenDataset& split, int batch,
                                                   int seq, std::int64_t max_tokens);

}  // namespace attnres::experiment
