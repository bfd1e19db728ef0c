// Depth-routing diagnostics on evaluation tokens (spec §7): per attention sublayer, the mean
// depth distribution of the Q/K route and of the V route, and the per-token Jensen-Shannon
// divergence between them, averaged over tokens. MUDD's Q, K and V ways get the same diagnostic on
// distributions made of its mixing weights (baselines-spec §6.5).
#pragma once

#include <cstdint>
#include <span>
#include <optional>
#include <vector>

#include "data/loader.hpp"
#include "model/safetensors.hpp"
#include "results/run_result.hpp"
#include "train/inference.hpp"

namespace attnres::experiment {

// Runs the model over the split's first windows (up to max_tokens) and averages per token, one
// entry per attention sublayer, as result.json records them: v_mean and js_nats (0 for
// single-source layers) only where the attention input has two routes. The model must keep its
// depth routing (InferenceBackend::routing(): the CPU backend does).
//
// MUDD with Q, K and V ways (mudd_ways = qkvr): one entry per block b, whose routes are the Q, K
// and V ways of the DA feeding it, each token's weights made a distribution by
// mudd_way_distribution: qk_mean is the Q way's mean, k_mean the K way's, v_mean the V way's,
// js_nats the per-token JS(p_Q, p_V) and js_k_nats JS(p_K, p_V). Block 0 reads the embedding
// alone: one source, JS 0. Static MUDD (dw = a) too: the source norms are per token.
//
// Empty for modes without either (prenorm, denseformer, hc, mhc, and mudd_ways = r, whose one
// stream per block has no Q/K/V split to compare).
std::vector<results::LayerRouting> routing_diagnostics(InferenceBackend& model, const data::TokenDataset& split,
                                                       int batch, int seq, std::int64_t max_tokens);

// MUDD's depth distribution of one way c of a DA for one token (baselines-spec §6.5). Its weights
// dw[c, j] are signed and not normalised, so JS is not defined on them; each is weighed by the size
// of what it mixes: p(j) = |dw[c, j]|·‖X_j‖ / Σ_j |dw[c, j]|·‖X_j‖ (X_j: the sources the DA mixes,
// with PrePostDANorm the normalised ones; its skip term x_c = X_{i+1} + ... is not a source and
// not counted). When the sum is 0 the way mixes nothing in: p puts all weight on the last source,
// the block output X_{i+1} that way then carries with PrePostDANorm (x_c = X_{i+1}, as at its
// initialisation, dw = 0), and that the base variant's initialisation (dw = e_last) gives too.
// dw, norms and p have one entry per source.
void mudd_way_distribution(std::span<const float> dw, std::span<const float> norms, std::span<double> p);

// MUDD's connections (baselines-spec §6.5): per way ("mudd.q", "mudd.k", "mudd.v", "mudd.r"; the
// last DA has R alone), one row per DA module (target i+1: the block it feeds, n_layers: the final
// norm) with the token-mean of dw[way, j] over the split's first windows (up to max_tokens), for
// sources j = 0..i+1. Empty for other modes. The model must keep its routing (the CPU backend).
std::vector<results::Connections> mudd_connections(InferenceBackend& model, const data::TokenDataset& split,
                                                   int batch, int seq, std::int64_t max_tokens);

// HC's and mHC's diagnostics (baselines-spec §6.5) over the split's first windows (up to
// max_tokens), from every token's stream coefficients (experiment/stream_mixing.hpp): the token
// mean of the unfolded dense connections c_kj = B_j (prod A_r) A_m^k ("hc", or "mhc" with H_pre,
// H_post and H_res in those roles; rows as static_connections' HC) and the Amax gains of the
// H_res products. nullopt for other modes. The model must keep its routing (the CPU backend).
struct StreamDiagnostics {
  results::Connections connections;
  results::AmaxGain gain;
};
std::optional<StreamDiagnostics> stream_diagnostics(InferenceBackend& model, const data::TokenDataset& split,
                                                    int batch, int seq, std::int64_t max_tokens);

// The static depth connections of a mode (results::Connections) from its weights file, as
// result.json records them: DenseFormer's DWA weights ("dwa": targets are the blocks a DWA follows,
// sources the block outputs, 0 the embedding); static HC's unfolded dense connections from A and B
// ("hc", exactly: every token has these coefficients; targets are sublayers 0 .. 2 n_layers - 1 and
// the final readout 2 n_layers, source s > 0 sublayer s - 1's output). Empty for other modes,
// dynamic HC included: its connections vary by token (stream_diagnostics).
std::vector<results::Connections> static_connections(const ModelConfig& config, const SafetensorsFile& weights,
                                                     const std::string& path);

}  // namespace attnres::experiment
