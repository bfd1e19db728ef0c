// Tiny model configurations and random weights for model-level tests.
#pragma once

#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "model/config.hpp"
#include "model/model.hpp"
#include "util/rng.hpp"

namespace attnres::testing {

struct Variant {
  std::string name;
  ResidualMode residual;
  ValueRoute route;
};

inline std::vector<Variant> all_variants() {
  return {{"prenorm", ResidualMode::prenorm, ValueRoute::decoupled},
          {"full", ResidualMode::full, ValueRoute::decoupled},
          {"block", ResidualMode::block, ValueRoute::decoupled},
          {"rd", ResidualMode::rd, ValueRoute::decoupled},
          {"rd_tied", ResidualMode::rd, ValueRoute::tied},
          {"rd_average", ResidualMode::rd, ValueRoute::average},
          {"rd_frozen", ResidualMode::rd, ValueRoute::frozen}};
}

inline ModelConfig tiny_config(ResidualMode residual, ValueRoute route = ValueRoute::decoupled, int n_layers = 2,
                               int n_blocks = 2) {
  ModelConfig c;
  c.vocab_size = 11;
  c.d_model = 8;
  c.n_layers = n_layers;
  c.n_heads = 2;
  c.mlp_hidden = 12;
  c.residual = residual;
  c.n_blocks = n_blocks;
  c.value_route = route;
  c.max_seq_len = 8;
  return c;
}

// Initialises by seed, then perturbs every parameter so no gradient is trivially zero:
// queries and value queries random, norm weights around 1, matrices larger than at init.
struct WeightScales {
  double matrix = 0.3;  // std of matrices
  double norm = 0.2;    // std of norm weights around 1
  double query = 0.5;   // std of pseudo-queries
};

template <class Real>
void randomize_weights(Model<Real>& model, std::uint64_t seed, WeightScales scales = {}) {
  init_params<Real>(model.layout(), seed, model.params());
  for (const auto& p : model.layout().params()) {
    Rng rng(seed + 1, p.name);
    Real* x = model.params().data() + p.offset;
    for (std::int64_t i = 0; i < p.numel; ++i) {
      const double z = rng.normal();
      switch (p.kind) {
        case ParamKind::matrix: x[i] = static_cast<Real>(scales.matrix * z); break;
        case ParamKind::norm_weight: x[i] = static_cast<Real>(1.0 + scales.norm * z); break;
        case ParamKind::query: x[i] = static_cast<Real>(scales.query * z); break;
      }
    }
  }
}

inline std::vector<std::int32_t> random_tokens(int batch, int seq, int vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> t(static_cast<std::size_t>(batch * (seq + 1)));
  for (auto& x : t) x = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
  return t;
}

}  // namespace attnres::testing
