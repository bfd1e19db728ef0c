// The one list of residual families (model/family.hpp), and what is derived from their records.
#include <algorithm>

#include "model/family.hpp"
#include "util/error.hpp"

namespace attnres {

// Each family's record, defined beside its trunk. A new family is one line here, in the order of
// the config's choices (a new family goes last: checkpoints name modes, not their index).
#define ATTNRES_RESIDUAL_FAMILIES(X) \
  X(single_stream_family)            \
  X(stream_family)                   \
  X(mudd_family)                     \
  X(delta_family)                    \
  X(gated_residual_family)           \
  /* (the list ends here) */

#define ATTNRES_DECLARE_FAMILY(f) const ResidualFamily& f();
ATTNRES_RESIDUAL_FAMILIES(ATTNRES_DECLARE_FAMILY)
#undef ATTNRES_DECLARE_FAMILY

const std::vector<const ResidualFamily*>& residual_families() {
#define ATTNRES_FAMILY_ENTRY(f) &f(),
  static const std::vector<const ResidualFamily*> families = {ATTNRES_RESIDUAL_FAMILIES(ATTNRES_FAMILY_ENTRY)};
#undef ATTNRES_FAMILY_ENTRY
  return families;
}

const ResidualFamily& residual_family(ResidualMode mode) {
  for (const ResidualFamily* f : residual_families())
    for (const ResidualModeInfo& m : f->modes)
      if (m.mode == mode) return *f;
  ATTNRES_UNREACHABLE("residual mode ", static_cast<int>(mode), " has no family record (model/families.cpp)");
}

const std::vector<ResidualModeInfo>& residual_modes() {
  static const std::vector<ResidualModeInfo> modes = from_families(&ResidualFamily::modes);
  return modes;
}

const std::vector<ResidualMode>& residual_mode_values() {
  static const std::vector<ResidualMode> values = [] {
    std::vector<ResidualMode> out;
    for (const ResidualModeInfo& m : residual_modes()) out.push_back(m.mode);
    return out;
  }();
  return values;
}

const ResidualModeInfo& residual_mode_info(ResidualMode mode) {
  for (const ResidualModeInfo& m : residual_modes())
    if (m.mode == mode) return m;
  ATTNRES_UNREACHABLE("residual mode ", static_cast<int>(mode), " has no family record (model/families.cpp)");
}

const std::vector<ModeSpecificKey>& mode_specific_keys() {
  static const std::vector<ModeSpecificKey> keys = from_families(&ResidualFamily::keys);
  return keys;
}

bool has_model_norms(const ModelConfig& config) { return residual_family(config).model_norms; }

const char* to_string(ConnectionAxis axis) {
  switch (axis) {
    case ConnectionAxis::source: return "source";
    case ConnectionAxis::branch: return "branch";
    case ConnectionAxis::stream: return "stream";
  }
  return "?";
}

std::string connection_tick_label(ConnectionAxis axis, int k) {
  return axis == ConnectionAxis::source && k == 0 ? "emb" : std::to_string(k);
}

std::string connection_column_label(ConnectionAxis axis, int k) {
  return axis == ConnectionAxis::source ? connection_tick_label(axis, k) : concat(to_string(axis), " ", k);
}

const ConnectionKind* connection_kind(const std::string& name) {
  for (const ResidualFamily* f : residual_families())
    for (const ConnectionKind& k : f->connections)
      if (name == k.name) return &k;
  return nullptr;
}

std::string cuda_refusal(const ResidualFamily& f, const ModelConfig& config) {
  const auto mode = std::ranges::find_if(f.modes, [&](const ResidualModeInfo& m) { return m.mode == config.residual; });
  if (mode == f.modes.end())
    ATTNRES_UNREACHABLE("the ", f.name, " family has no mode '", to_string(config.residual), "'");
  if (!mode->cuda) return concat("residual mode '", to_string(config.residual), "'");
  const ModelConfig defaults;
  for (const char* name : f.cuda_lacks) {
    const auto key = std::ranges::find_if(model_config_keys(), [&](const auto& k) { return k.name == name; });
    if (key == model_config_keys().end())
      ATTNRES_UNREACHABLE("the ", f.name, " family's cuda_lacks names '", name, "', which is not a model config key");
    if (key->get(config) != key->get(defaults)) return concat("model.", name);
  }
  return "";
}

std::string cuda_refusal(const ModelConfig& config) { return cuda_refusal(residual_family(config), config); }

}  // namespace attnres
