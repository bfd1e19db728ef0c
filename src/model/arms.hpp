// The arms of an experiment or a benchmark: named model variants over one base configuration (a
// residual mode with its settings), the optional "+vres" suffix (ResFormer's value residual) and
// the twin suffix "~". bench, the experiment runner, protocol files and the CLI take them from here
// rather than asking the mode themselves; the facts of each mode are its family's record
// (model/family.hpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/config.hpp"
#include "model/family.hpp"

namespace attnres {

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
