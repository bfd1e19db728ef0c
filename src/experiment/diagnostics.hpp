// A run's depth diagnostics on evaluation tokens (spec §7, baselines-spec §6.5), whatever its
// residual mode: the model's depth view (model/diagnostics.hpp) says what its last pass mixed, and
// diagnose() averages it over the split's first windows. Routing: per routed attention input the
// mean depth distribution of each route and the per-token Jensen-Shannon divergence against the V
// route (Q/K for full, block and rd; MUDD's Q, K and V ways); connections and Amax gains: the
// family's sums (DenseFormer's DWA weights, HC's and mHC's unfolded connections and gains, MUDD's
// mixing weights). Which mode offers which is its family's record (model/family.hpp).
#pragma once

#include <cstdint>

#include "data/loader.hpp"
#include "model/diagnostics.hpp"
#include "train/inference.hpp"

namespace attnres::experiment {

// Runs the model over the split's first windows (up to max_tokens), `batch` at a time, when its
// mode has anything to average over tokens. The backend must keep its model on the host
// (InferenceBackend::host_model: the CPU backend does) unless the mode offers no diagnostics.
DepthDiagnostics diagnose(InferenceBackend& model, const data::TokenDataset& split, int batch, int seq,
                          std::int64_t max_tokens);

}  // namespace attnres::experiment
