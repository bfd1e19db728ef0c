// Where every named parameter lives in the flat parameter buffer, how it is initialised
// and whether it is weight-decayed. Gradients and optimizer moments use the same layout.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace attnres {

enum class ParamKind {
  matrix,       // N(0, std); weight-decayed
  norm_weight,  // ones (RMSNorm weights and depth-read key-norm weights); no decay (MUDD's own norms:
                // its policy)
  query,        // zeros (pseudo-queries, spec §2); no decay
  fixed,        // the layout's own init_values, no RNG (DenseFormer's identity DWA weights, the
                // value-residual lambdas, the HC and mHC coefficients, MUDD's W2, a and post norm:
                // baselines-spec §6.1); decay as the mode's policy says
};

struct ParamInfo {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  ParamKind kind = ParamKind::matrix;
  double init_std = 0;              // matrices only (0: zeros, no RNG)
  std::vector<double> init_values;  // fixed only: numel values
  bool decay = false;               // weight-decayed (matrices; a baseline's own tensors by its policy)

  bool weight_decay() const { return decay; }
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& config);

  const std::vector<ParamInfo>& params() const { return params_; }
  std::int64_t total() const { return total_; }
  const ParamInfo* find(const std::string& name) const;
  const ParamInfo& at(const std::string& name) const;  // throws Error when absent

  // While the layout is built: the next parameter (the model's, then its trunk family's at their
  // places: model/trunk.hpp's add_trunk_params), returned so a family can set its decay policy.
  // add_fixed: shape empty is one dimension of values.size().
  ParamInfo& add(std::string name, std::vector<std::int64_t> shape, ParamKind kind, double init_std = 0);
  ParamInfo& add_fixed(std::string name, std::vector<double> values, bool decay, std::vector<std::int64_t> shape = {});

 private:

  std::vector<ParamInfo> params_;
  std::int64_t total_ = 0;
};

// Initialisation keyed by (seed, parameter name): a parameter's values do not depend on
// which other parameters exist, so two arms with one seed share their common weights exactly.
// perturbation > 0 makes a twin: every value w becomes w·(1 + perturbation·ξ), ξ ~ N(0, 1) from
// the stream (seed, "twin:" + name), drawn after the initialisation's own stream so the unperturbed
// values are those of perturbation = 0 (zeros, such as the pseudo-queries, stay zero: a twin
// differs from its original as rounding would, only where there are values to round).
template <class Real>
void init_params(const ParamLayout& layout, std::uint64_t seed, std::span<Real> params, double perturbation = 0);

}  // namespace attnres
