// The facts of every residual mode in one record (its name, trunk, device support, FLOP term and
// diagnostics), and the arms of an experiment or a benchmark: named model variants over one base
// configuration (a residual mode with its settings), the optional "+vres" suffix (ResFormer's
// value residual) and the twin suffix "~". bench, the experiment runner, protocol files, the CUDA
// backend and the CLI take them from here rather than asking the mode themselves.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/config.hpp"

namespace attnres {

// The trunks (model/trunk.hpp): the part of the model between the embedding and the final norm
// that a residual mode shapes. Each family is one class with its own buffers and parameters.
enum class TrunkFamily {
  single_stream,  // one residual stream per token: prenorm, full, block, rd, denseformer
  streams,        // n residual streams per token: hc, mhc
  mudd,           // four streams mixed from every block output: mudd
  delta,          // pre-norm plus additive reads over the deltas: delta, delta_block
  gated,          // n branches read through a gated mean, written through per-branch gates: gr
};

// What a run's depth diagnostics (experiment/diagnostics.hpp; results/run_result.hpp) record of a mode.
struct DiagnosticsOffered {
  bool routing = false;      // per-token depth distributions of the attention inputs, their JS divergence
  bool connections = false;  // the signed mixing weights from each source to each consumer
  bool amax_gain = false;    // the gains of the n-stream residual mixing
};

struct ResidualModeInfo {
  ResidualMode mode;
  const char* name;  // the value of model.residual
  TrunkFamily family;
  bool cuda;  // the CUDA backend implements it (docs/cuda.md); the others run on the CPU only
  DiagnosticsOffered diagnostics;
};

struct TrunkFamilyInfo {
  TrunkFamily family;
  const char* name;
  // The per-token training FLOPs of the family's residual wiring (depth reads, DA modules, stream
  // modules): bench/flops.hpp's depth_reads term, whose comment gives the formulas.
  double (*residual_flops)(const ModelConfig& config);
  // The model owns the sublayer pre-norms and the final norm (layers.{i}.attn_norm, mlp_norm,
  // final_norm); false: the trunk's reads normalise the sublayer inputs themselves and its output
  // goes straight to the LM head (gr: docs/delta-gated-spec.md §2.1).
  bool model_norms = true;
};

// Every mode, in kResidualModes order; an entry per family.
const std::vector<ResidualModeInfo>& residual_modes();
const ResidualModeInfo& residual_mode_info(ResidualMode mode);
const TrunkFamilyInfo& trunk_family_info(TrunkFamily family);
inline TrunkFamily trunk_family(const ModelConfig& config) { return residual_mode_info(config.residual).family; }
// Whether the model of `config` has the sublayer pre-norms and the final norm (TrunkFamilyInfo).
bool has_model_norms(const ModelConfig& config);

// The families' FLOP terms (each defined beside its trunk).
double single_stream_residual_flops(const ModelConfig& config);
double stream_residual_flops(const ModelConfig& config);
double mudd_residual_flops(const ModelConfig& config);
double delta_residual_flops(const ModelConfig& config);
double gated_residual_flops(const ModelConfig& config);

// The arm names: prenorm, full, block, rd, rd-tied, rd-average, rd-frozen, denseformer (1 x 1),
// denseformer-4x5, hc (dynamic), hc-static, mhc (the hc_* / mhc_* keys from the config), mudd
// (qkvr, dynamic), mudd-static, mudd-r (DDFormer; the other mudd_* keys from the config), delta,
// delta-block (Delta AttnRes; n_blocks and the other delta_* keys from the config).
const std::vector<std::string>& arm_names();
// The arm names for help texts and messages.
std::string arm_names_text();

// The model of an arm: the base configuration with the arm's residual mode and settings; any arm
// with "+vres" has value_residual on; a twin "<arm>~" has its original's model. An unknown name is
// an Error naming the choices (and the closest one).
ModelConfig apply_arm(ModelConfig model, const std::string& arm);

// A twin of an arm (the noise floor, docs/experiments.md): "<arm>~" trains the same model from the
// same seed on the same data order, with its initial weights perturbed at a stated relative size
// (train.init_perturbation), so it differs from the arm as rounding would. Only the baseline of an
// arm list has a twin; its ΔNLL against the baseline is the experiment's noise floor.
inline constexpr char kTwinSuffix = '~';
inline bool is_twin(const std::string& arm) { return arm.size() > 1 && arm.back() == kTwinSuffix; }
inline std::string twin_of(const std::string& arm) { return arm + kTwinSuffix; }
inline std::string twin_original(const std::string& twin) { return twin.substr(0, twin.size() - 1); }
// The perturbation of a twin's initial weights when the protocol names none ([experiment.noise]).
inline constexpr double kDefaultTwinPerturbation = 1e-6;

// An arm trained with bf16 matmuls (train.precision = bf16) whatever the base configuration's:
// "<arm>@bf16" (before a twin's "~"), the same model. Its ΔNLL against the fp32 arm is the cost of
// bf16 in nats (docs/performance.md, "bf16 or fp32 for studies").
inline constexpr std::string_view kBf16Suffix = "@bf16";
inline bool is_bf16_arm(const std::string& arm) {
  const std::string a = is_twin(arm) ? twin_original(arm) : arm;
  return a.size() > kBf16Suffix.size() && a.ends_with(kBf16Suffix);
}

}  // namespace attnres
