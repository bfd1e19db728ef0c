// The trunk, parameters and static connections of a config's family, from its record
// (model/family.hpp). A new family or mode changes nothing here.
#include "model/trunk.hpp"

#include <type_traits>

#include "model/family.hpp"

namespace attnres {

template <class Real>
std::unique_ptr<Trunk<Real>> make_trunk(const ModelParts<Real>& parts) {
  const ResidualFamily& f = residual_family(parts.config);
  if constexpr (std::is_same_v<Real, float>)
    return f.trunk_float(parts);
  else
    return f.trunk_double(parts);
}

void add_trunk_params(ParamLayout& layout, const ModelConfig& config, ParamPlace place, int layer) {
  residual_family(config).add_params(layout, config, place, layer);
}

std::vector<Connections> trunk_static_connections(const ModelConfig& config, const ParamLayout& layout,
                                                  std::span<const double> params) {
  const ResidualFamily& f = residual_family(config);
  return f.static_connections != nullptr ? f.static_connections(config, layout, params) : std::vector<Connections>{};
}

template std::unique_ptr<Trunk<float>> make_trunk(const ModelParts<float>&);
template std::unique_ptr<Trunk<double>> make_trunk(const ModelParts<double>&);

}  // namespace attnres
