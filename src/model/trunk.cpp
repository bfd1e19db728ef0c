// The one place a trunk family is plugged in: its trunk, its parameters and its static
// connections, by the mode's family (model/arms.hpp). A new mode of an existing family changes
// nothing here.
#include "model/trunk.hpp"

#include "model/arms.hpp"

namespace attnres {

template <class Real>
std::unique_ptr<Trunk<Real>> make_trunk(const ModelParts<Real>& parts) {
  switch (trunk_family(parts.config)) {
    case TrunkFamily::single_stream: return make_single_stream_trunk(parts);
    case TrunkFamily::streams: return make_stream_trunk(parts);
    case TrunkFamily::mudd: return make_mudd_trunk(parts);
    case TrunkFamily::delta: return make_delta_trunk(parts);
    case TrunkFamily::gated: return make_gated_residual_trunk(parts);
  }
  return nullptr;  // (every family is a case above)
}

void add_trunk_params(ParamLayout& layout, const ModelConfig& config, ParamPlace place, int layer) {
  switch (trunk_family(config)) {
    case TrunkFamily::single_stream: return add_single_stream_params(layout, config, place, layer);
    case TrunkFamily::streams: return add_stream_params(layout, config, place, layer);
    case TrunkFamily::mudd: return add_mudd_params(layout, config, place, layer);
    case TrunkFamily::delta: return add_delta_params(layout, config, place, layer);
    case TrunkFamily::gated: return add_gated_residual_params(layout, config, place, layer);
  }
}

std::vector<Connections> trunk_static_connections(const ModelConfig& config, const ParamLayout& layout,
                                                  std::span<const double> params) {
  switch (trunk_family(config)) {
    case TrunkFamily::single_stream: return single_stream_static_connections(config, layout, params);
    case TrunkFamily::streams: return stream_static_connections(config, layout, params);
    case TrunkFamily::mudd: return {};  // per token only
    case TrunkFamily::delta: return {};  // per token only
    case TrunkFamily::gated: return {};  // per token only (its gates)
  }
  return {};
}

template std::unique_ptr<Trunk<float>> make_trunk(const ModelParts<float>&);
template std::unique_ptr<Trunk<double>> make_trunk(const ModelParts<double>&);

}  // namespace attnres
