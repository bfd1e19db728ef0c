#include "model/arms.hpp"

#include <string_view>

#include "util/error.hpp"
#include "util/suggest.hpp"

namespace attnres {

const std::vector<std::string>& arm_names() {
  static const std::vector<std::string> names = {"prenorm",   "full",       "block",     "rd",
                                                 "rd-tied",   "rd-average", "rd-frozen", "denseformer",
                                                 "denseformer-4x5", "hc", "hc-static", "mhc", "mudd",
                                                 "mudd-static", "mudd-r"};
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
  if (base == "prenorm") m.residual = ResidualMode::prenorm;
  else if (base == "full") m.residual = ResidualMode::full;
  else if (base == "block") m.residual = ResidualMode::block;
  else if (base == "rd") m.residual = ResidualMode::rd, m.value_route = ValueRoute::decoupled;
  else if (base == "rd-tied") m.residual = ResidualMode::rd, m.value_route = ValueRoute::tied;
  else if (base == "rd-average") m.residual = ResidualMode::rd, m.value_route = ValueRoute::average;
  else if (base == "rd-frozen") m.residual = ResidualMode::rd, m.value_route = ValueRoute::frozen;
  else if (base == "denseformer") m.residual = ResidualMode::denseformer, m.dwa_dilation = 1, m.dwa_period = 1;
  else if (base == "denseformer-4x5") m.residual = ResidualMode::denseformer, m.dwa_dilation = 4, m.dwa_period = 5;
  else if (base == "hc") m.residual = ResidualMode::hc, m.hc_dynamic = true;  // hc_n etc. from the config
  else if (base == "hc-static") m.residual = ResidualMode::hc, m.hc_dynamic = false;
  else if (base == "mhc") m.residual = ResidualMode::mhc;
  else if (base == "mudd") m.residual = ResidualMode::mudd, m.mudd_ways = MuddWays::qkvr, m.mudd_dynamic = true;
  else if (base == "mudd-static") m.residual = ResidualMode::mudd, m.mudd_ways = MuddWays::qkvr, m.mudd_dynamic = false;
  else if (base == "mudd-r") m.residual = ResidualMode::mudd, m.mudd_ways = MuddWays::r, m.mudd_dynamic = true;
  else {
    std::vector<std::string> names = arm_names();
    for (const auto& n : arm_names()) names.push_back(n + std::string(kVres));
    fail("unknown arm '", arm, "' (expected ", arm_names_text(), ")", did_you_mean(arm, names));
  }
  return m;
}

std::string arm_names_text() {
  std::string list;
  for (const auto& n : arm_names()) list += (list.empty() ? "" : ", ") + n;
  return list + "; each optionally with the suffix +vres (value_residual) and then @bf16 (bf16 matmuls); the "
                "baseline's twin with the suffix ~";
}

}  // namespace attnres
