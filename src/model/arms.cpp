#include "model/arms.hpp"

#include <string_view>

#include "util/error.hpp"
#include "util/suggest.hpp"

namespace attnres {

namespace {

// Every family's arms, in the families' order.
const std::vector<ArmRecord>& arms() {
  static const std::vector<ArmRecord> arms = from_families(&ResidualFamily::arms);
  return arms;
}

}  // namespace

const std::vector<std::string>& arm_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const ArmRecord& a : arms()) out.emplace_back(a.name);
    return out;
  }();
  return names;
}

ModelConfig apply_arm(ModelConfig m, const std::string& arm) {
  // "+vres" on any arm adds ResFormer's value residual (with the config's vres_* settings).
  constexpr std::string_view kVres = "+vres";
  std::string base = is_twin(arm) ? twin_original(arm) : arm;
  if (is_bf16_arm(base)) base.resize(base.size() - kBf16Suffix.size());  // a training setting, not the model's
  if (base.size() > kVres.size() && base.ends_with(kVres)) {
    base.resize(base.size() - kVres.size());
    m.value_residual = true;
  }
  for (const ArmRecord& a : arms())
    if (base == a.name) {
      a.apply(m);
      // The base's delta_* / gr_* keys are the settings of those modes' arms; the other arms take
      // the defaults (validate refuses them elsewhere).
      reset_keys_of_other_modes(m);
      return m;
    }
  std::vector<std::string> names = arm_names();
  for (const auto& n : arm_names()) names.push_back(n + std::string(kVres));
  fail("unknown arm '", arm, "' (expected ", arm_names_text(), ")", did_you_mean(arm, names));
}

std::string arm_names_text() {
  std::string list;
  for (const auto& n : arm_names()) list += (list.empty() ? "" : ", ") + n;
  return list + "; each optionally with the suffix +vres (value_residual) and then @bf16 (bf16 matmuls); the "
                "baseline's twin with the suffix ~";
}

}  // namespace attnres
