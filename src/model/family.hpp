// A residual family is one record (issue #48): everything the rest of the code knows of a trunk
// family and its modes, written beside its trunk (model/<family>_trunk.cpp) and registered by one
// line in model/families.cpp. What other code needs of a mode — the config's choices, the
// mode-specific keys, the trunk, its parameters, static connections and FLOP term, whether the
// model keeps its norms, what the CUDA backend lacks, the diagnostics offered and the labels of the
// connections a report shows — is derived from the records here; nothing outside model/ (and a
// family's kernels) names a mode.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/diagnostics.hpp"

namespace attnres {

class ParamLayout;                       // model/param_layout.hpp
template <class Real> class Trunk;       // model/trunk.hpp
template <class Real> struct ModelParts; // model/trunk.hpp
enum class ParamPlace;                   // model/trunk.hpp

// What a run's depth diagnostics (experiment/diagnostics.hpp; results/run_result.hpp) record of a mode.
struct DiagnosticsOffered {
  bool routing = false;      // per-token depth distributions of the attention inputs, their JS divergence
  bool connections = false;  // the signed mixing weights from each source to each consumer
  bool amax_gain = false;    // the gains of the n-stream residual mixing
};

struct ResidualModeInfo {
  ResidualMode mode;
  const char* name;  // the value of model.residual
  bool cuda;  // the CUDA backend implements it (docs/cuda.md); the others run on the CPU only
  DiagnosticsOffered diagnostics;
};

// A config key that applies to some residual modes only: a value other than the default under
// another mode is an Error naming the key and its modes (ModelConfig::validate).
// python/attnres/config.py's MODE_KEYS is the same list.
struct ModeSpecificKey {
  const char* name;
  std::vector<ResidualMode> modes;
};

// What the columns of a depth-connection table are (results::Connections' sources).
enum class ConnectionAxis {
  source,  // the embedding (column 0, "emb") and the outputs mixed after it (1, 2, ...)
  branch,  // the family's parallel branches 0 .. n-1 (GR's gates)
  stream,  // the n residual streams 0 .. n-1
};
const char* to_string(ConnectionAxis axis);  // "source", "branch", "stream"
// Column k's label: a plot's tick ("emb" for source 0, else k; the axis is named under the ticks)
// and a table's header ("emb", "1", ... for sources; "branch 0", "stream 0", ... for the others).
std::string connection_tick_label(ConnectionAxis axis, int k);
std::string connection_column_label(ConnectionAxis axis, int k);

// A connection table a family emits (Connections::name) and how a report shows it.
struct ConnectionKind {
  const char* name;
  ConnectionAxis axis;
  std::vector<std::string> notes;  // the table's notes
};

// An arm of experiments and benchmarks (model/arms.hpp): a name and the settings it gives one of the
// family's modes over a base configuration (the config's other keys stay as the base has them).
struct ArmRecord {
  const char* name;
  void (*apply)(ModelConfig& config);
};

template <class Real>
using TrunkFactory = std::unique_ptr<Trunk<Real>> (*)(const ModelParts<Real>&);

struct ResidualFamily {
  const char* name;
  std::vector<ResidualModeInfo> modes;  // in the order of the config's choices
  TrunkFactory<float> trunk_float;
  TrunkFactory<double> trunk_double;
  // The CUDA backend (src/cuda: a layer above this one, so it is described rather than pointed at)
  // trains the modes whose `cuda` is true with every key of this list at its default; a config that
  // sets one is refused naming it. Empty where no mode has `cuda`.
  std::vector<const char*> cuda_lacks = {};
  // Where its parameters go in the layout (model/trunk.hpp's add_trunk_params).
  void (*add_params)(ParamLayout& layout, const ModelConfig& config, ParamPlace place, int layer);
  // The connections its weights determine whatever the token (null: none; trunk_static_connections).
  std::vector<Connections> (*static_connections)(const ModelConfig& config, const ParamLayout& layout,
                                                 std::span<const double> params) = nullptr;
  // The per-token training FLOPs of its residual wiring (depth reads, DA modules, stream modules):
  // bench/flops.hpp's depth_reads term, whose comment gives the formulas.
  double (*residual_flops)(const ModelConfig& config);
  // The model owns the sublayer pre-norms and the final norm (layers.{i}.attn_norm, mlp_norm,
  // final_norm); false: the trunk's reads normalise the sublayer inputs themselves and its output
  // goes straight to the LM head (gr: docs/delta-gated-spec.md §2.1).
  bool model_norms = true;
  std::vector<ModeSpecificKey> keys = {};  // its modes' own keys
  std::vector<ConnectionKind> connections = {};  // every connection table it emits
  std::vector<ArmRecord> arms = {};  // its arms, named after their modes
};

// Every family, in the order of the config's choices (model/families.cpp).
const std::vector<const ResidualFamily*>& residual_families();
const ResidualFamily& residual_family(ResidualMode mode);
inline const ResidualFamily& residual_family(const ModelConfig& config) { return residual_family(config.residual); }

// Derived from the records.
// One field of every record, in the families' order (their modes, keys, arms).
template <class T>
std::vector<T> from_families(std::vector<T> ResidualFamily::*field) {
  std::vector<T> out;
  for (const ResidualFamily* f : residual_families()) out.insert(out.end(), (f->*field).begin(), (f->*field).end());
  return out;
}
// Every mode in the config's order (the choices of model.residual).
const std::vector<ResidualMode>& residual_mode_values();
const std::vector<ResidualModeInfo>& residual_modes();
const ResidualModeInfo& residual_mode_info(ResidualMode mode);
const std::vector<ModeSpecificKey>& mode_specific_keys();
// Whether the model of `config` has the sublayer pre-norms and the final norm.
bool has_model_norms(const ModelConfig& config);
// The connection table named `name` (null: no family emits it).
const ConnectionKind* connection_kind(const std::string& name);
// What of `config` the CUDA backend cannot train ("residual mode 'hc'", "model.value_residual"),
// or "" when it can. Every mode of every family trains on CUDA today (issue #48); the rule stays for
// a family that lands on the CPU first. The second form applies it to a given record (tests).
std::string cuda_refusal(const ModelConfig& config);
std::string cuda_refusal(const ResidualFamily& family, const ModelConfig& config);

}  // namespace attnres
