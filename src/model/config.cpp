#include "model/config.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "kernels/attention.hpp"
#include "kernels/depth_read.hpp"
#include "model/family.hpp"
#include "util/error.hpp"

namespace attnres {

std::string to_string(ResidualMode mode) { return residual_mode_info(mode).name; }

std::string to_string(ValueRoute route) {
  switch (route) {
    case ValueRoute::decoupled: return "decoupled";
    case ValueRoute::tied: return "tied";
    case ValueRoute::average: return "average";
    case ValueRoute::frozen: return "frozen";
  }
  return "?";
}

std::string to_string(StreamReadout readout) { return readout == StreamReadout::sum ? "sum" : "mean"; }

std::string to_string(MhcBiasInit init) { return init == MhcBiasInit::home_pm3 ? "home_pm3" : "zero"; }
std::string to_string(MuddWays ways) { return ways == MuddWays::qkvr ? "qkvr" : "r"; }
std::string to_string(DeltaValueRoute route) { return route == DeltaValueRoute::none ? "none" : "decoupled"; }

ResidualMode parse_residual_mode(const std::string& text) { return parse_choice(text, residual_mode_values(), "residual mode"); }

ValueRoute parse_value_route(const std::string& text) {
  return parse_choice(text, kValueRoutes, "value route");
}

const ConfigKeys<ModelConfig>& model_config_keys() {
  using M = ModelConfig;
  static const std::string kStreamRange = "[1, " + std::to_string(kernels::kMaxStreams) + "]";
  static const std::string kGrBranchRange = "[2, " + std::to_string(kernels::kMaxStreams) + "]";
  static const ConfigKeys<ModelConfig> keys = config_section<M>(
      "model",
      {
          config_field("vocab_size", &M::vocab_size, "",
                       "vocabulary size, at least 2; in a training config 0 takes the data's, another value "
                       "must cover it"),
          config_field("d_model", &M::d_model, ">= 2", "width of the residual stream"),
          config_field("n_layers", &M::n_layers, ">= 1", "layers, each an attention and a SwiGLU sublayer"),
          config_field("n_heads", &M::n_heads, ">= 1",
                       "attention heads; must divide d_model, with head_dim = d_model / n_heads even"),
          config_field("mlp_hidden", &M::mlp_hidden, ">= 1", "SwiGLU hidden width"),
          config_choice("residual", &M::residual, residual_mode_values(), "the residual stream (docs/model.md)"),
          config_field("n_blocks", &M::n_blocks, "",
                       "Block AttnRes blocks of block, rd and delta_block: must divide 2·n_layers into blocks of "
                       "an even number of sublayers, or equal it"),
          config_choice("value_route", &M::value_route, kValueRoutes,
                        "rd only: the value route of attention sublayers (docs/model.md)"),
          config_field("tie_embeddings", &M::tie_embeddings, "", "LM head tied to the token embedding"),
          config_field("norm_eps", &M::norm_eps, ">= 0", "RMSNorm epsilon"),
          config_field("rope_theta", &M::rope_theta, "> 0", "RoPE base"),
          config_field("max_seq_len", &M::max_seq_len, ">= 1",
                       "RoPE table length and sampling context (train.seq_len raises it to itself)"),
          config_field("dwa_dilation", &M::dwa_dilation, ">= 1",
                       "denseformer: each DWA reads every dwa_dilation-th block output (k of k x p)"),
          config_field("dwa_period", &M::dwa_period, ">= 1",
                       "denseformer: a DWA follows every dwa_period-th block (p of k x p)"),
          config_field("dwa_weight_decay", &M::dwa_weight_decay, "",
                       "denseformer: the DWA weights are weight-decayed, as in the official code"),
          config_field("value_residual", &M::value_residual, "",
                       "ResFormer value residual, in any mode: attention layers after the first use "
                       "V' = lambda1 V_1 + lambda2 V_n"),
          config_choice("vres_mode", &M::vres_mode, kernels::kVresModes,
                        "value_residual: fixed 0.5/0.5, learned_convex (lambda, 1 - lambda), learned_pair or "
                        "constant (vres_lambda1, vres_lambda2)"),
          config_field("vres_lambda1", &M::vres_lambda1, "",
                       "value_residual: lambda1 (constant), or its initial value (learned)"),
          config_field("vres_lambda2", &M::vres_lambda2, "",
                       "value_residual: lambda2 (constant), or its initial value (learned_pair)"),
          config_field("hc_n", &M::hc_n, kStreamRange, "hc: residual streams n"),
          config_field("hc_dynamic", &M::hc_dynamic, "",
                       "hc: dynamic coefficients s * tanh(RMSNorm(H) W) + (A, B); false: static A, B only"),
          config_field("hc_tanh", &M::hc_tanh, "", "hc dynamic: tanh on the projections (false: the paper's W/O tanh)"),
          config_field("hc_scale_init", &M::hc_scale_init, "", "hc dynamic: s_alpha and s_beta at init"),
          config_choice("hc_reduce", &M::hc_reduce, kStreamReadouts, "hc: exit readout, sum or mean of the streams"),
          config_field("mhc_n", &M::mhc_n, kStreamRange, "mhc: residual streams n"),
          config_field("mhc_sinkhorn_iters", &M::mhc_sinkhorn_iters, ">= 1", "mhc: Sinkhorn-Knopp iterations"),
          config_choice("mhc_sinkhorn_order", &M::mhc_sinkhorn_order, kernels::kSinkhornOrders,
                        "mhc: col_row (the paper's eq. 9: row sums exact) or row_col (Megatron, DeepSeek-V4)"),
          config_field("mhc_alpha_init", &M::mhc_alpha_init, "", "mhc: alpha_pre, alpha_post and alpha_res at init"),
          config_field("mhc_phi_std", &M::mhc_phi_std, ">= 0", "mhc: phi ~ N(0, mhc_phi_std) at init; 0: phi = 0"),
          config_choice("mhc_bias_init", &M::mhc_bias_init, kMhcBiasInits,
                        "mhc: the bias at init, home_pm3 (+-3 around the home stream j mod n, H_res 6I - 3) or zero"),
          config_field("mhc_pre_eps", &M::mhc_pre_eps, ">= 0", "mhc: added to H_pre (DeepSeek-V4 and Megatron: 1e-6)"),
          config_choice("mhc_reduce", &M::mhc_reduce, kStreamReadouts, "mhc: exit readout, sum or mean of the streams"),
          config_choice("mudd_ways", &M::mudd_ways, kMuddWays,
                        "mudd: the streams each DA module writes: qkvr (Q, K, V and the residual R) or r (the "
                        "residual alone, DDFormer)"),
          config_field("mudd_dynamic", &M::mudd_dynamic, "",
                       "mudd: per-token weights from a generator on the block output; false: static weights only"),
          config_field("mudd_hidden_round", &M::mudd_hidden_round, ">= 0",
                       "mudd: the generator width C*S*e rounds up to the next strictly larger multiple of this "
                       "(the official configs: 64); 0: no rounding"),
          config_field("mudd_last_expand", &M::mudd_last_expand, ">= 1",
                       "mudd: the last DA module's generator width factor e (official: 4; the paper: 1)"),
          config_choice("mudd_gelu", &M::mudd_gelu, kernels::kGelus,
                        "mudd: the generator's GELU: erf (exact, the released PyTorch code) or tanh (JAX/flax)"),
          config_field("mudd_sep_qkv_norm", &M::mudd_sep_qkv_norm, "",
                       "mudd with qkvr: the Q, K and V inputs each have their own pre-norm weight"),
          config_field("mudd_prepost_norm", &M::mudd_prepost_norm, "",
                       "mudd: PrePostDANorm (normalised sources, x + mix, the R mix normalised; for deep, narrow "
                       "models)"),
          config_field("mudd_decay_all", &M::mudd_decay_all, "",
                       "mudd: weight-decay every mudd.* parameter (static weights and norms too), as the "
                       "official code; false: the generator matrices only"),
          config_field("delta_null_source", &M::delta_null_source, "",
                       "delta, delta_block: a learned null source (init 0) prepended to every read"),
          config_choice("delta_gate", &M::delta_gate, kernels::kDeltaGates,
                        "delta, delta_block: the gate g of h = x + g c: none, sigmoid_scalar (init logit -2), "
                        "sigmoid_vector (sigmoid(W x + b), W = 0, b = -2) or learnable_alpha (init 0)"),
          config_choice("delta_value_route", &M::delta_value_route, kDeltaValueRoutes,
                        "delta, delta_block: decoupled gives attention's V its own read (own query and key norm)"),
          config_field("delta_block_partial", &M::delta_block_partial, "",
                       "delta_block: Block AttnRes's sources (with the current block's partial sum); false: the "
                       "released code's schedule (completed blocks only, one sublayer late)"),
          config_field("delta_decay_all", &M::delta_decay_all, "",
                       "delta, delta_block: weight-decay the reads' parameters (the released code's policy); "
                       "false: only the vector gates' matrices"),
          config_field("gr_n", &M::gr_n, kGrBranchRange, "gr: residual branches n"),
          config_field("gr_rank", &M::gr_rank, ">= 0",
                       "gr: the read gate's bottleneck width r (W_down [r, n d]); 0: d_model / 8, at least 1"),
          config_field("gr_decay_norm", &M::gr_decay_norm, "",
                       "gr: weight-decay the zero-centred read norm weights too (toward scale 1); the three "
                       "matrices always are"),
      });
  return keys;
}

int ModelConfig::mudd_da_hidden(int i) const {
  return kernels::mudd_hidden_width(mudd_da_ways(i), mudd_da_sources(i), i == n_layers - 1 ? mudd_last_expand : 1,
                                    mudd_hidden_round);
}

std::string ModelConfig::residual_label() const {
  return to_string(residual) + (residual == ResidualMode::rd ? "/" + to_string(value_route) : "");
}

int ModelConfig::effective_blocks() const {
  switch (residual) {
    case ResidualMode::full:
    case ResidualMode::delta: return n_sublayers();  // delta: one sublayer per block, n_blocks ignored
    case ResidualMode::block:
    case ResidualMode::rd:
    case ResidualMode::delta_block: return n_blocks;
    default: return 1;
  }
}

namespace {

// The key of model_config_keys() named `name`.
const ConfigKey<ModelConfig>& model_key(std::string_view name) {
  for (const auto& k : model_config_keys())
    if (k.name == name) return k;
  ATTNRES_UNREACHABLE("mode_specific_keys() names '", name, "', which is not a model config key");
}

bool applies_to(const ModeSpecificKey& key, ResidualMode mode) { return std::ranges::find(key.modes, mode) != key.modes.end(); }

// A value other than the default under another mode is refused, naming the key and its modes (the
// keys of the older families' records, hc_*, mhc_*, mudd_*, dwa_*, predate this rule and list none).
void check_mode_keys(const ModelConfig& c) {
  const ModelConfig defaults;
  for (const ModeSpecificKey& key : mode_specific_keys()) {
    const auto& k = model_key(key.name);
    if (applies_to(key, c.residual) || k.get(c) == k.get(defaults)) continue;
    std::string modes;
    for (const ResidualMode m : key.modes) modes += (modes.empty() ? "'" : " or '") + to_string(m) + "'";
    fail("model config key '", key.name, "' applies to residual ", modes, ", not to residual mode '",
         to_string(c.residual), "'");
  }
}

}  // namespace

void reset_keys_of_other_modes(ModelConfig& c) {
  const ModelConfig defaults;
  for (const ModeSpecificKey& key : mode_specific_keys()) {
    const auto& k = model_key(key.name);
    if (!applies_to(key, c.residual)) k.set(c, k.get(defaults));
  }
}

void ModelConfig::validate() const {
  check_config_ranges(model_config_keys(), *this);
  check_mode_keys(*this);
  require(vocab_size >= 2, "model.vocab_size must be at least 2 (got ", vocab_size, ")");
  require(d_model % n_heads == 0, "model.n_heads (", n_heads, ") must divide model.d_model (", d_model, ")");
  require(head_dim() % 2 == 0, "model head_dim = d_model / n_heads must be even for RoPE (got ", head_dim(), ")");
  require(head_dim() <= kernels::kMaxHeadDim, "model head_dim must be at most ", kernels::kMaxHeadDim);
  require(n_sublayers() + 1 <= kernels::kMaxSources, "model.n_layers is too large for depth reads (at most ",
          (kernels::kMaxSources - 1) / 2, ")");
  if (residual == ResidualMode::block || residual == ResidualMode::rd || residual == ResidualMode::delta_block) {
    const int L = n_sublayers();
    require(n_blocks >= 1 && n_blocks <= L && L % n_blocks == 0,
            "model.n_blocks (", n_blocks, ") must divide the number of sublayers 2*n_layers = ", L);
    require(n_blocks == L || (L / n_blocks) % 2 == 0, "model.n_blocks (", n_blocks,
            ") must give blocks of an even number of sublayers (blocks start at attention sublayers), or equal ", L);
  }
}

void to_json(nlohmann::json& j, const ModelConfig& c) {
  j = nlohmann::json::object();
  for (const auto& k : model_config_keys()) j[k.name] = to_json_value(k.get(c));
}

ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& where) {
  require(j.is_object(), where, ": model config must be a JSON object");
  ModelConfig c;
  for (const auto& [name, node] : j.items()) {
    const ConfigKey<ModelConfig>* key = find_config_key(model_config_keys(), "model", name);
    if (key == nullptr) {
      std::vector<std::string> names;
      for (const auto& k : model_config_keys()) names.push_back(k.name);
      fail(where, ": unknown model config key '", name, "'", did_you_mean(name, names));
    }
    const std::optional<ConfigValue> value = from_json_value(node, key->type);
    require(value.has_value(), where, ": model config key '", name, "' must be ", type_phrase(key->type));
    set_config_value(c, *key, *value, where);
  }
  c.validate();
  return c;
}

}  // namespace attnres
