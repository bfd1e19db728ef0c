#include "model/config.hpp"

#include <nlohmann/json.hpp>

#include "kernels/attention.hpp"
#include "kernels/depth_read.hpp"
#include "util/error.hpp"

namespace attnres {

std::string to_string(ResidualMode mode) {
  switch (mode) {
    case ResidualMode::prenorm: return "prenorm";
    case ResidualMode::full: return "full";
    case ResidualMode::block: return "block";
    case ResidualMode::rd: return "rd";
  }
  return "?";
}

std::string to_string(ValueRoute route) {
  switch (route) {
    case ValueRoute::decoupled: return "decoupled";
    case ValueRoute::tied: return "tied";
    case ValueRoute::average: return "average";
    case ValueRoute::frozen: return "frozen";
  }
  return "?";
}

ResidualMode parse_residual_mode(const std::string& text) {
  for (auto m : {ResidualMode::prenorm, ResidualMode::full, ResidualMode::block, ResidualMode::rd})
    if (to_string(m) == text) return m;
  fail("unknown residual mode '", text, "' (expected prenorm, full, block or rd)");
}

ValueRoute parse_value_route(const std::string& text) {
  for (auto r : {ValueRoute::decoupled, ValueRoute::tied, ValueRoute::average, ValueRoute::frozen})
    if (to_string(r) == text) return r;
  fail("unknown value route '", text, "' (expected decoupled, tied, average or frozen)");
}

int ModelConfig::effective_blocks() const {
  switch (residual) {
    case ResidualMode::prenorm: return 1;
    case ResidualMode::full: return n_sublayers();
    default: return n_blocks;
  }
}

void ModelConfig::validate() const {
  require(vocab_size >= 2, "model.vocab_size must be at least 2 (got ", vocab_size, ")");
  require(d_model >= 2, "model.d_model must be at least 2 (got ", d_model, ")");
  require(n_layers >= 1, "model.n_layers must be at least 1 (got ", n_layers, ")");
  require(n_heads >= 1 && d_model % n_heads == 0, "model.n_heads (", n_heads, ") must divide model.d_model (",
          d_model, ")");
  require(head_dim() % 2 == 0, "model head_dim = d_model / n_heads must be even for RoPE (got ", head_dim(), ")");
  require(head_dim() <= kernels::kMaxHeadDim, "model head_dim must be at most ", kernels::kMaxHeadDim);
  require(mlp_hidden >= 1, "model.mlp_hidden must be at least 1 (got ", mlp_hidden, ")");
  require(norm_eps > 0 || norm_eps == 0, "model.norm_eps must be non-negative");
  require(rope_theta > 0, "model.rope_theta must be positive (got ", rope_theta, ")");
  require(max_seq_len >= 1, "model.max_seq_len must be at least 1 (got ", max_seq_len, ")");
  require(n_sublayers() + 1 <= kernels::kMaxSources, "model.n_layers is too large for depth reads (at most ",
          (kernels::kMaxSources - 1) / 2, ")");
  if (residual == ResidualMode::block || residual == ResidualMode::rd) {
    const int L = n_sublayers();
    require(n_blocks >= 1 && n_blocks <= L && L % n_blocks == 0,
            "model.n_blocks (", n_blocks, ") must divide the number of sublayers 2*n_layers = ", L);
    require(n_blocks == L || (L / n_blocks) % 2 == 0, "model.n_blocks (", n_blocks,
            ") must give blocks of an even number of sublayers (blocks start at attention sublayers), or equal ", L);
  }
}

void to_json(nlohmann::json& j, const ModelConfig& c) {
  j = nlohmann::json{{"vocab_size", c.vocab_size},
                     {"d_model", c.d_model},
                     {"n_layers", c.n_layers},
                     {"n_heads", c.n_heads},
                     {"mlp_hidden", c.mlp_hidden},
                     {"residual", to_string(c.residual)},
                     {"n_blocks", c.n_blocks},
                     {"value_route", to_string(c.value_route)},
                     {"tie_embeddings", c.tie_embeddings},
                     {"norm_eps", c.norm_eps},
                     {"rope_theta", c.rope_theta},
                     {"max_seq_len", c.max_seq_len}};
}

ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& where) {
  require(j.is_object(), where, ": model config must be a JSON object");
  ModelConfig c;
  for (const auto& [key, value] : j.items()) {
    auto as_int = [&]() {
      require(value.is_number_integer(), where, ": model config key '", key, "' must be an integer");
      return value.get<int>();
    };
    auto as_number = [&]() {
      require(value.is_number(), where, ": model config key '", key, "' must be a number");
      return value.get<double>();
    };
    auto as_string = [&]() {
      require(value.is_string(), where, ": model config key '", key, "' must be a string");
      return value.get<std::string>();
    };
    if (key == "vocab_size") c.vocab_size = as_int();
    else if (key == "d_model") c.d_model = as_int();
    else if (key == "n_layers") c.n_layers = as_int();
    else if (key == "n_heads") c.n_heads = as_int();
    else if (key == "mlp_hidden") c.mlp_hidden = as_int();
    else if (key == "residual") c.residual = parse_residual_mode(as_string());
    else if (key == "n_blocks") c.n_blocks = as_int();
    else if (key == "value_route") c.value_route = parse_value_route(as_string());
    else if (key == "tie_embeddings") {
      require(value.is_boolean(), where, ": model config key 'tie_embeddings' must be true or false");
      c.tie_embeddings = value.get<bool>();
    } else if (key == "norm_eps") c.norm_eps = as_number();
    else if (key == "rope_theta") c.rope_theta = as_number();
    else if (key == "max_seq_len") c.max_seq_len = as_int();
    else fail(where, ": unknown model config key '", key, "'");
  }
  c.validate();
  return c;
}

}  // namespace attnres
