// The model's hyper-parameters: a value type, validated, saved as JSON in checkpoints.
#pragma once

#include <array>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "util/config_key.hpp"

namespace attnres {

enum class ResidualMode { prenorm, full, block, rd };
enum class ValueRoute { decoupled, tied, average, frozen };
inline constexpr std::array kResidualModes = {ResidualMode::prenorm, ResidualMode::full, ResidualMode::block,
                                              ResidualMode::rd};
inline constexpr std::array kValueRoutes = {ValueRoute::decoupled, ValueRoute::tied, ValueRoute::average,
                                            ValueRoute::frozen};

std::string to_string(ResidualMode mode);
std::string to_string(ValueRoute route);
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

  int head_dim() const { return d_model / n_heads; }
  int n_sublayers() const { return 2 * n_layers; }
  // Blocks actually used by the depth reads (full: one per sublayer; prenorm: none).
  int effective_blocks() const;
  int sublayers_per_block() const { return n_sublayers() / effective_blocks(); }
  bool uses_depth_reads() const { return residual != ResidualMode::prenorm; }
  bool has_value_query() const {
    return residual == ResidualMode::rd &&
           (value_route == ValueRoute::decoupled || value_route == ValueRoute::average);
  }

  // Throws Error naming the offending key.
  void validate() const;
};

// Every key of the model's configuration (section "model"), in the order files list them: the
// one list behind its JSON, the [model] table of config files and the docs.
const ConfigKeys<ModelConfig>& model_config_keys();

// The JSON object of every key (checkpoint metadata `config`).
void to_json(nlohmann::json& j, const ModelConfig& c);
// Strict: unknown keys and wrong types are errors; missing keys take their defaults; the result
// is validated. `where` names the source in messages.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace attnres
