// Depth-routing diagnostics on evaluation tokens (spec §7): per attention sublayer, the mean
// depth distribution of the Q/K route and of the V route, and the per-token Jensen-Shannon
// divergence between them, averaged over tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "data/loader.hpp"
#include "model/safetensors.hpp"
#include "results/run_result.hpp"
#include "train/inference.hpp"

namespace attnres::experiment {

// Runs the model over the split's first windows (up to max_tokens) and averages per token, one
// entry per attention sublayer, as result.json records them: v_mean and js_nats (0 for
// single-source layers) only where the attention input has two routes. Empty without depth reads.
// The model must keep its depth routing (InferenceBackend::routing(): the CPU backend does).
std::vector<results::LayerRouting> routing_diagnostics(InferenceBackend& model, const data::TokenDataset& split,
                                                       int batch, int seq, std::int64_t max_tokens);

// MUDD's connections (baselines-spec §6.5): per way ("mudd.q", "mudd.k", "mudd.v", "mudd.r"; the
// last DA has R alone), one row per DA module (target i+1: the block it feeds, n_layers: the final
// norm) with the token-mean of dw[way, j] over the split's first windows (up to max_tokens), for
// sources j = 0..i+1. Empty for other modes. The model must keep its routing (the CPU backend).
std::vector<results::Connections> mudd_connections(InferenceBackend& model, const data::TokenDataset& split,
                                                   int batch, int seq, std::int64_t max_tokens);

// The static depth connections of a mode (results::Connections) from its weights file, as
// result.json records them: DenseFormer's DWA weights ("dwa": targets are the blocks a DWA follows,
// sources the block outputs, 0 the embedding); HC's unfolded dense connections from A and B ("hc",
// or "hc_static_part" for dynamic HC, whose per-token terms it leaves out: targets are sublayers
// 0 .. 2 n_layers - 1 and the final readout 2 n_layers, source s > 0 sublayer s - 1's output).
// Empty for modes without.
std::vector<results::Connections> static_connections(const ModelConfig& config, const SafetensorsFile& weights,
                                                     const std::string& path);

}  // namespace attnres::experiment
