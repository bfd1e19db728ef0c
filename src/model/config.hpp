// The model's hyper-parameters: a value type, validated, saved as JSON in checkpoints.
#pragma once

#include <algorithm>
#include <array>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "kernels/delta_read.hpp"
#include "kernels/mhc.hpp"
#include "kernels/mudd.hpp"
#include "kernels/value_residual.hpp"
#include "util/config_key.hpp"

namespace attnres {

// The residual modes. A mode's name, family and facts are its family's record (model/family.hpp),
// whose order is the order of the config's choices (residual_mode_values()).
enum class ResidualMode {
  prenorm, full, block, rd, denseformer, hc, mhc, mudd,
  delta, delta_block,  // Delta AttnRes (docs/delta-gated-spec.md §1)
  gr,                  // the Gated Residual (docs/delta-gated-spec.md §2)
};
enum class ValueRoute { decoupled, tied, average, frozen };
// MUDDFormer's ways (baselines-spec §2.5): four streams Q, K, V, R, or R alone ("DDFormer").
enum class MuddWays { qkvr, r };
inline constexpr std::array kMuddWays = {MuddWays::qkvr, MuddWays::r};
inline constexpr std::array kValueRoutes = {ValueRoute::decoupled, ValueRoute::tied, ValueRoute::average,
                                            ValueRoute::frozen};
// Delta AttnRes's V route (docs/delta-gated-spec.md §1.3): none, or attention sublayers take V from
// their own read (own query and key-norm weight, the same sources and gate).
enum class DeltaValueRoute { none, decoupled };
inline constexpr std::array kDeltaValueRoutes = {DeltaValueRoute::none, DeltaValueRoute::decoupled};
// Hyper-connections' exit: the sum of the n streams (the papers') or their mean (Megatron's mHC).
enum class StreamReadout { sum, mean };
inline constexpr std::array kStreamReadouts = {StreamReadout::sum, StreamReadout::mean};
// mHC's bias at init (baselines-spec §4.1): home_pm3 = +3 on the sublayer's home stream in H_pre
// and -3 elsewhere, 0 for H_post, 6I - 3 for H_res (PaddleFleet's "A.6 values"); zero = all 0.
enum class MhcBiasInit { home_pm3, zero };
inline constexpr std::array kMhcBiasInits = {MhcBiasInit::home_pm3, MhcBiasInit::zero};

std::string to_string(ResidualMode mode);
std::string to_string(ValueRoute route);
std::string to_string(StreamReadout readout);
std::string to_string(MhcBiasInit init);
std::string to_string(MuddWays ways);
std::string to_string(DeltaValueRoute route);
ResidualMode parse_residual_mode(const std::string& text);  // throws Error naming the valid values
ValueRoute parse_value_route(const std::string& text);

struct ModelConfig {
  int vocab_size = 257;
  int d_model = 64;
  int n_layers = 2;
  int n_heads = 2;
  int mlp_hidden = 320;
  ResidualMode residual = ResidualMode::block;
  int n_blocks = 2;  // Block AttnRes blocks; `full` uses 2 * n_layers
  ValueRoute value_route = ValueRoute::decoupled;  // rd only
  bool tie_embeddings = true;
  double norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int max_seq_len = 256;
  // DenseFormer (baselines-spec §1): a DWA after every dwa_period-th block, reading every
  // dwa_dilation-th block output (the paper's full model: 1 x 1).
  int dwa_dilation = 1;
  int dwa_period = 1;
  bool dwa_weight_decay = true;  // the official code decays the DWA weights
  // ResFormer's value residual (baselines-spec §5), in any mode: attention layers after the first
  // use V' = lambda1 V_1 + lambda2 V_n.
  bool value_residual = false;
  kernels::VresMode vres_mode = kernels::VresMode::fixed;
  double vres_lambda1 = 0.5;  // constant: the lambdas; learned: their initial values
  double vres_lambda2 = 0.5;
  // Hyper-connections (baselines-spec §3): n residual streams, one HC module per sublayer, home
  // stream j mod n of sublayer j; static (A, B) or dynamic (plus s * tanh(RMSNorm(H) W)).
  int hc_n = 4;
  bool hc_dynamic = true;
  bool hc_tanh = true;
  double hc_scale_init = 0.01;  // s_alpha and s_beta at init
  StreamReadout hc_reduce = StreamReadout::sum;
  // mHC (baselines-spec §4): coefficients from the flattened n-stream state through sigmoid, 2
  // sigmoid and Sinkhorn-Knopp.
  int mhc_n = 4;
  int mhc_sinkhorn_iters = 20;
  kernels::SinkhornOrder mhc_sinkhorn_order = kernels::SinkhornOrder::col_row;
  double mhc_alpha_init = 0.01;  // alpha_pre, alpha_post, alpha_res at init
  double mhc_phi_std = 0.02;     // phi ~ N(0, std); 0: phi = 0
  MhcBiasInit mhc_bias_init = MhcBiasInit::home_pm3;
  double mhc_pre_eps = 0;        // added to H_pre (DeepSeek-V4 / Megatron: 1e-6)
  StreamReadout mhc_reduce = StreamReadout::sum;
  // MUDDFormer (baselines-spec §2): a DA module after every block mixes all earlier block outputs
  // into the next block's Q, K, V and residual (R) inputs, with per-token weights from a small
  // generator. Defaults: the official training code.
  MuddWays mudd_ways = MuddWays::qkvr;
  bool mudd_dynamic = true;       // false: static weights a only ("+multiway static dense")
  int mudd_hidden_round = 64;     // generator width rounded up past a multiple of this; 0: none
  int mudd_last_expand = 4;       // the last DA's generator width factor
  kernels::Gelu mudd_gelu = kernels::Gelu::erf;
  bool mudd_sep_qkv_norm = true;  // qkvr: Q, K and V each have their own pre-norm weight
  bool mudd_prepost_norm = false; // PrePostDANorm (§2.2)
  bool mudd_decay_all = true;     // the mudd.* parameters all weight-decayed (the official policy)
  // Delta AttnRes (docs/delta-gated-spec.md §1): pre-norm plus additive softmax reads over the deltas,
  // h = x + g * sum_s alpha_s v_s. Defaults: the released code's.
  bool delta_null_source = false;  // a learned source (init 0) prepended to every read
  kernels::DeltaGate delta_gate = kernels::DeltaGate::none;
  DeltaValueRoute delta_value_route = DeltaValueRoute::none;
  bool delta_block_partial = true;  // delta_block: Block AttnRes's sources; false: the released schedule
  bool delta_decay_all = true;      // the reads' parameters weight-decayed (the released code's policy)
  // The Gated Residual (docs/delta-gated-spec.md §2): gr_n branches per token, each sublayer's input
  // a gated mean of them through a rank-gr_rank bottleneck (0: d_model / 8), per-branch gated writes.
  int gr_n = 4;
  int gr_rank = 0;
  bool gr_decay_norm = false;  // weight-decay the zero-centred norm weights too (toward scale 1)

  int head_dim() const { return d_model / n_heads; }
  int n_sublayers() const { return 2 * n_layers; }
  // Blocks actually used by the depth reads (full: one per sublayer; prenorm: none).
  int effective_blocks() const;
  int sublayers_per_block() const { return n_sublayers() / effective_blocks(); }
  bool uses_depth_reads() const {
    return residual == ResidualMode::full || residual == ResidualMode::block || residual == ResidualMode::rd;
  }
  // Delta AttnRes (delta, delta_block): additive reads over the deltas (model/delta_trunk.cpp).
  bool uses_delta_reads() const { return residual == ResidualMode::delta || residual == ResidualMode::delta_block; }
  // MUDDFormer: its own trunk of dynamic dense connections (model/mudd_trunk.cpp).
  bool uses_mudd() const { return residual == ResidualMode::mudd; }
  // The n-stream modes whose modules compute per-token coefficients (dynamic HC, mHC; static HC's are weights).
  bool uses_dynamic_streams() const { return residual == ResidualMode::mhc || (residual == ResidualMode::hc && hc_dynamic); }
  // hc and mhc carry n residual streams per token (1 in every other mode).
  bool uses_streams() const { return residual == ResidualMode::hc || residual == ResidualMode::mhc; }
  int n_streams() const {
    return residual == ResidualMode::hc ? hc_n : residual == ResidualMode::mhc ? mhc_n : 1;
  }
  StreamReadout stream_readout() const { return residual == ResidualMode::mhc ? mhc_reduce : hc_reduce; }
  // MUDD: the ways of DA module i (0-based, after block i): 4 (Q, K, V, R), or 1 for the last DA
  // and for mudd_ways = r; its sources X_0..X_{i+1}; its generator width K.
  int mudd_da_ways(int i) const { return mudd_ways == MuddWays::r || i == n_layers - 1 ? 1 : kernels::kMaxWays; }
  int mudd_da_sources(int i) const { return i + 2; }
  int mudd_da_hidden(int i) const;
  // MUDD with qkvr: the attention sublayer reads Q, K and V from three streams (else one).
  bool mudd_multiway() const { return residual == ResidualMode::mudd && mudd_ways == MuddWays::qkvr; }
  // gr: the read gate's bottleneck width (gr_rank, or d_model / 8 and at least 1 when 0).
  int gr_bottleneck() const { return gr_rank > 0 ? gr_rank : std::max(1, d_model / 8); }
  // Learned value-residual scalars per attention layer after the first (0 when none).
  int vres_parameters() const { return value_residual ? kernels::vres_parameter_count(vres_mode) : 0; }
  bool has_value_query() const {
    return residual == ResidualMode::rd &&
           (value_route == ValueRoute::decoupled || value_route == ValueRoute::average);
  }

  // The mode as messages name it: its name, with rd's value route ("rd/tied").
  std::string residual_label() const;

  // Throws Error naming the offending key.
  void validate() const;
};

// The keys that apply to some residual modes only (delta_*, gr_*: the families' records list them,
// model/family.hpp's mode_specific_keys()).
// Sets the keys that do not apply to c.residual to their defaults (an experiment's arms share one
// base configuration, whose gr_* settings are the gr arm's, say).
void reset_keys_of_other_modes(ModelConfig& c);

// Every key of the model's configuration (section "model"), in the order files list them: the
// one list behind its JSON, the [model] table of config files and the docs.
const ConfigKeys<ModelConfig>& model_config_keys();

// The JSON object of every key (checkpoint metadata `config`).
void to_json(nlohmann::json& j, const ModelConfig& c);
// Strict: unknown keys and wrong types are errors; missing keys take their defaults; the result
// is validated. `where` names the source in messages.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace attnres
