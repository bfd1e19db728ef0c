// The residual modes' record (model/arms.hpp): one entry per mode, in the order of the config's
// choices, whose facts agree with what the code does with the mode.
#include <gtest/gtest.h>

#include <algorithm>

#include "bench/flops.hpp"
#include "common/model_util.hpp"
#include "model/arms.hpp"
#include "model/config.hpp"

namespace attnres {
namespace {

TEST(ResidualModes, OneRecordPerModeInConfigOrder) {
  ASSERT_EQ(residual_modes().size(), kResidualModes.size());
  for (std::size_t i = 0; i < kResidualModes.size(); ++i) {
    const ResidualModeInfo& m = residual_modes()[i];
    EXPECT_EQ(m.mode, kResidualModes[i]);
    EXPECT_EQ(&residual_mode_info(m.mode), &m);
    EXPECT_EQ(parse_residual_mode(m.name), m.mode);
    EXPECT_EQ(trunk_family_info(m.family).family, m.family);
  }
}

TEST(ResidualModes, TheRecordSaysWhereAModeRuns) {
  for (const testing::Variant& v : testing::all_variants())
    EXPECT_EQ(residual_mode_info(v.residual).cuda && !v.value_residual, v.on_cuda()) << v.name;
}

TEST(ResidualModes, FamiliesAreTheTrunksTheConfigDescribes) {
  for (const testing::Variant& v : testing::all_variants()) {
    const ModelConfig c = testing::tiny_config(v);
    const TrunkFamily f = trunk_family(c);
    EXPECT_EQ(f == TrunkFamily::streams, c.uses_streams()) << v.name;
    EXPECT_EQ(f == TrunkFamily::mudd, c.residual == ResidualMode::mudd) << v.name;
    EXPECT_EQ(f == TrunkFamily::delta, c.uses_delta_reads()) << v.name;
    // The FLOP count takes the family's term: none without a depth mixing of its own.
    const double residual = bench::training_flops_per_token(c, 4).depth_reads;
    EXPECT_EQ(residual == 0, c.residual == ResidualMode::prenorm || c.residual == ResidualMode::denseformer) << v.name;
  }
}

TEST(Arms, EveryArmIsAModeWithItsSettings) {
  for (const std::string& arm : arm_names()) {
    const ModelConfig m = apply_arm(ModelConfig{}, arm);
    std::string mode = residual_mode_info(m.residual).name;  // arm names spell delta_block delta-block
    std::replace(mode.begin(), mode.end(), '_', '-');
    EXPECT_EQ(arm.rfind(mode, 0), 0u) << arm;  // named after its mode
    EXPECT_TRUE(apply_arm(ModelConfig{}, arm + "+vres").value_residual) << arm;
  }
  EXPECT_THROW(apply_arm(ModelConfig{}, "blok"), Error);
}

}  // namespace
TEST(Arms, ModeSpecificKeysOfTheBaseGoOnlyToTheirModesArms) {
  // One base configuration serves every arm: its delta_* and gr_* settings are those arms' own.
  ModelConfig base;
  base.residual = ResidualMode::delta_block;
  base.delta_gate = kernels::DeltaGate::sigmoid_scalar;
  base.delta_block_partial = false;
  for (const std::string arm : {"block", "rd", "gr", "mudd"}) {
    const ModelConfig m = apply_arm(base, arm);
    EXPECT_EQ(m.delta_gate, kernels::DeltaGate::none) << arm;
    EXPECT_TRUE(m.delta_block_partial) << arm;
    EXPECT_NO_THROW(m.validate()) << arm;
  }
  const ModelConfig delta = apply_arm(base, "delta");
  EXPECT_EQ(delta.delta_gate, kernels::DeltaGate::sigmoid_scalar);
  EXPECT_TRUE(delta.delta_block_partial);  // delta_block's schedule key
  EXPECT_NO_THROW(delta.validate());
  const ModelConfig delta_block = apply_arm(base, "delta-block");
  EXPECT_EQ(delta_block.delta_gate, kernels::DeltaGate::sigmoid_scalar);
  EXPECT_FALSE(delta_block.delta_block_partial);
  // Every listed key is a model config key, and each applies to at least one mode.
  for (const ModeSpecificKey& k : mode_specific_keys()) {
    EXPECT_FALSE(k.modes.empty()) << k.name;
    EXPECT_TRUE(std::ranges::any_of(model_config_keys(), [&](const auto& key) { return key.name == k.name; })) << k.name;
  }
}

}  // namespace attnres
