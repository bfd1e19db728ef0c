#include "model/arms.hpp"

#include <string_view>

#include "util/error.hpp"
#include "util/suggest.hpp"

namespace attnres {

const std::vector<ResidualModeInfo>& residual_modes() {
  // routing, connections, amax_gain
  static const std::vector<ResidualModeInfo> modes = {
      {ResidualMode::prenorm, "prenorm", TrunkFamily::single_stream, true, {}},
      {ResidualMode::full, "full", TrunkFamily::single_stream, true, {.routing = true}},
      {ResidualMode::block, "block", TrunkFamily::single_stream, true, {.routing = true}},
      {ResidualMode::rd, "rd", TrunkFamily::single_stream, true, {.routing = true}},
      // DenseFormer's connections are its DWA weights.
      {ResidualMode::denseformer, "denseformer", TrunkFamily::single_stream, false, {.connections = true}},
      {ResidualMode::hc, "hc", TrunkFamily::streams, false, {.connections = true, .amax_gain = true}},
      {ResidualMode::mhc, "mhc", TrunkFamily::streams, false, {.connections = true, .amax_gain = true}},
      // MUDD's routing: its Q, K and V ways (mudd_ways = qkvr); its connections: the ways' weights.
      {ResidualMode::mudd, "mudd", TrunkFamily::mudd, false, {.routing = true, .connections = true}},
      // Delta AttnRes's routing: its attention reads (Q/K and, decoupled, V); also routing_max_weight.
      {ResidualMode::delta, "delta", TrunkFamily::delta, false, {.routing = true}},
      {ResidualMode::delta_block, "delta_block", TrunkFamily::delta, false, {.routing = true}},
      // GR's gates (spec §2.7): per branch, the read gates' channel mean and the write gates.
      {ResidualMode::gr, "gr", TrunkFamily::gated, false, {.connections = true}},
  };
  return modes;
}

const ResidualModeInfo& residual_mode_info(ResidualMode mode) {
  for (const ResidualModeInfo& m : residual_modes())
    if (m.mode == mode) return m;
  ATTNRES_UNREACHABLE("residual mode ", static_cast<int>(mode), " has no record in model/arms.cpp");
}

bool has_model_norms(const ModelConfig& config) { return trunk_family_info(trunk_family(config)).model_norms; }

const TrunkFamilyInfo& trunk_family_info(TrunkFamily family) {
  static const TrunkFamilyInfo families[] = {
      {TrunkFamily::single_stream, "single-stream", single_stream_residual_flops},
      {TrunkFamily::streams, "n-stream", stream_residual_flops},
      {TrunkFamily::mudd, "MUDD", mudd_residual_flops},
      {TrunkFamily::delta, "Delta AttnRes", delta_residual_flops},
      {TrunkFamily::gated, "gated residual", gated_residual_flops, false},
  };
  for (const TrunkFamilyInfo& f : families)
    if (f.family == family) return f;
  ATTNRES_UNREACHABLE("trunk family ", static_cast<int>(family), " has no record in model/arms.cpp");
}

namespace {

// An arm: a mode with its settings (the config's other keys stay as the base has them).
struct Arm {
  const char* name;
  void (*apply)(ModelConfig&);
};

const std::vector<Arm>& arms() {
  using M = ModelConfig;
  static const std::vector<Arm> arms = {
      {"prenorm", [](M& m) { m.residual = ResidualMode::prenorm; }},
      {"full", [](M& m) { m.residual = ResidualMode::full; }},
      {"block", [](M& m) { m.residual = ResidualMode::block; }},
      {"rd", [](M& m) { m.residual = ResidualMode::rd, m.value_route = ValueRoute::decoupled; }},
      {"rd-tied", [](M& m) { m.residual = ResidualMode::rd, m.value_route = ValueRoute::tied; }},
      {"rd-average", [](M& m) { m.residual = ResidualMode::rd, m.value_route = ValueRoute::average; }},
      {"rd-frozen", [](M& m) { m.residual = ResidualMode::rd, m.value_route = ValueRoute::frozen; }},
      {"denseformer", [](M& m) { m.residual = ResidualMode::denseformer, m.dwa_dilation = 1, m.dwa_period = 1; }},
      {"denseformer-4x5",
       [](M& m) { m.residual = ResidualMode::denseformer, m.dwa_dilation = 4, m.dwa_period = 5; }},
      {"hc", [](M& m) { m.residual = ResidualMode::hc, m.hc_dynamic = true; }},  // hc_n etc. from the config
      {"hc-static", [](M& m) { m.residual = ResidualMode::hc, m.hc_dynamic = false; }},
      {"mhc", [](M& m) { m.residual = ResidualMode::mhc; }},
      {"mudd",
       [](M& m) { m.residual = ResidualMode::mudd, m.mudd_ways = MuddWays::qkvr, m.mudd_dynamic = true; }},
      {"mudd-static",
       [](M& m) { m.residual = ResidualMode::mudd, m.mudd_ways = MuddWays::qkvr, m.mudd_dynamic = false; }},
      {"mudd-r", [](M& m) { m.residual = ResidualMode::mudd, m.mudd_ways = MuddWays::r, m.mudd_dynamic = true; }},
      {"delta", [](M& m) { m.residual = ResidualMode::delta; }},  // the delta_* keys from the config
      {"delta-block", [](M& m) { m.residual = ResidualMode::delta_block; }},  // and n_blocks
      {"gr", [](M& m) { m.residual = ResidualMode::gr; }},  // gr_n, gr_rank, gr_decay_norm from the config
  };
  return arms;
}

}  // namespace

const std::vector<std::string>& arm_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Arm& a : arms()) out.emplace_back(a.name);
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
  for (const Arm& a : arms())
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
