#include "model/diagnostics.hpp"

#include <cstddef>

#include "model/param_layout.hpp"
#include "model/safetensors.hpp"
#include "model/trunk.hpp"
#include "util/error.hpp"

namespace attnres {

void DepthView::route_distributions(int index, std::int64_t, std::span<double>) const {
  ATTNRES_UNREACHABLE("routed input ", index, " asked of a depth view that has none");
}

double DepthView::max_weight(int read, std::int64_t) const {
  ATTNRES_UNREACHABLE("read ", read, " asked for its largest weight of a depth view that has none");
}

std::vector<Connections> static_connections(const ModelConfig& config, const SafetensorsFile& weights,
                                            const std::string& path) {
  // Tensor by tensor, not load_weights: the file may hold a larger model of the family (dynamic
  // HC's file gives its static part), so only the config's own tensors are read.
  const ParamLayout layout(config);
  std::vector<double> params(static_cast<std::size_t>(layout.total()));
  for (const ParamInfo& p : layout.params()) {
    const std::vector<double> v = weights.at(p.name, path).values<double>();
    require(static_cast<std::int64_t>(v.size()) == p.numel, path, ": tensor '", p.name, "' has ", v.size(),
            " values, expected ", p.numel);
    for (std::size_t i = 0; i < v.size(); ++i) params[static_cast<std::size_t>(p.offset) + i] = v[i];
  }
  return trunk_static_connections(config, layout, params);
}

}  // namespace attnres
