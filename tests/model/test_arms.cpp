// The residual families' records (model/family.hpp) and the arms (model/arms.hpp): one entry per
// mode, in the order of the config's choices, whose facts agree with what the code does with the mode.
#include <gtest/gtest.h>

#include <algorithm>

#include "bench/flops.hpp"
#include "common/model_util.hpp"
#include "model/arms.hpp"
#include "model/config.hpp"
#include "model/family.hpp"
#include "model/model.hpp"

namespace attnres {
namespace {

TEST(ResidualModes, OneRecordPerModeInConfigOrder) {
  // The config's choices are the records' modes, family by family, each mode in one family.
  std::size_t i = 0;
  for (const ResidualFamily* f : residual_families())
    for (const ResidualModeInfo& m : f->modes) {
      ASSERT_LT(i, residual_modes().size());
      EXPECT_EQ(residual_mode_values()[i], m.mode);
      EXPECT_EQ(&residual_family(m.mode), f) << m.name;
      EXPECT_EQ(residual_mode_info(m.mode).name, std::string(m.name));
      EXPECT_EQ(parse_residual_mode(m.name), m.mode);
      ++i;
    }
  EXPECT_EQ(i, residual_modes().size());
  EXPECT_EQ(i, residual_mode_values().size());
  const auto& choices = std::ranges::find_if(model_config_keys(), [](const auto& k) { return k.name == "residual"; })->choices;
  ASSERT_EQ(choices.size(), i);
  for (std::size_t k = 0; k < i; ++k) EXPECT_EQ(choices[k], residual_modes()[k].name);
}

TEST(ResidualModes, EveryRecordIsComplete) {
  for (const ResidualFamily* f : residual_families()) {
    EXPECT_FALSE(f->modes.empty()) << f->name;
    EXPECT_NE(f->trunk_float, nullptr) << f->name;
    EXPECT_NE(f->trunk_double, nullptr) << f->name;
    EXPECT_NE(f->add_params, nullptr) << f->name;
    EXPECT_NE(f->residual_flops, nullptr) << f->name;
    const bool cuda = std::ranges::any_of(f->modes, [](const ResidualModeInfo& m) { return m.cuda; });
    EXPECT_TRUE(cuda || f->cuda_lacks.empty()) << f->name;
    for (const ArmRecord& a : f->arms) EXPECT_EQ(&residual_family(apply_arm(ModelConfig{}, a.name)), f) << a.name;
  }
}

// Every mode of every family trains on CUDA (issue #48): each test variant, the value residual's
// included, is accepted. A record that sets a mode's `cuda` false, or lists a key in cuda_lacks,
// fails this.
TEST(ResidualModes, EveryModeTrainsOnCuda) {
  for (const testing::Variant& v : testing::all_variants()) {
    EXPECT_EQ(cuda_refusal(testing::tiny_config(v)), "") << v.name;
    EXPECT_TRUE(residual_mode_info(v.residual).cuda) << v.name;
  }
  for (const ResidualFamily* f : residual_families()) EXPECT_TRUE(f->cuda_lacks.empty()) << f->name;
}

// The rule for a family that lands on the CPU first: a mode without `cuda` is refused by its name,
// a key in cuda_lacks only when the config moves it off its default, naming the key.
TEST(ResidualModes, ARecordRefusesWhatItLacksByName) {
  ResidualFamily f = residual_family(ResidualMode::delta);
  f.cuda_lacks = {"delta_gate", "delta_null_source"};
  ModelConfig c = testing::tiny_config(ResidualMode::delta);
  EXPECT_EQ(cuda_refusal(f, c), "");
  c.delta_null_source = true;
  EXPECT_EQ(cuda_refusal(f, c), "model.delta_null_source");
  c.delta_gate = kernels::DeltaGate::learnable_alpha;
  EXPECT_EQ(cuda_refusal(f, c), "model.delta_gate");  // the list's order
  EXPECT_EQ(cuda_refusal(c), "");                      // the real record lacks neither
  f.modes[0].cuda = false;
  EXPECT_EQ(cuda_refusal(f, c), "residual mode 'delta'");
  c.residual = ResidualMode::delta_block;
  EXPECT_EQ(cuda_refusal(f, c), "model.delta_gate");  // delta_block keeps its `cuda`
}

// Hyper-connections (static and dynamic, with or without tanh, either readout) and mHC (either
// Sinkhorn order, any iterations, bias init, pre_eps, readout) train on CUDA (issue #48).
TEST(ResidualModes, HyperConnectionsAndMhcTrainOnCudaWithEveryOption) {
  ModelConfig hc = testing::tiny_config(ResidualMode::hc);
  EXPECT_EQ(cuda_refusal(hc), "");
  hc.hc_dynamic = false;
  hc.hc_reduce = StreamReadout::mean;
  EXPECT_EQ(cuda_refusal(hc), "");
  hc.hc_dynamic = true;
  hc.hc_tanh = false;
  hc.hc_n = kernels::kMaxStreams;
  EXPECT_EQ(cuda_refusal(hc), "");
  hc.value_residual = true;
  EXPECT_EQ(cuda_refusal(hc), "");
  ModelConfig mhc = testing::tiny_config(ResidualMode::mhc);
  EXPECT_EQ(cuda_refusal(mhc), "");
  mhc.mhc_sinkhorn_order = kernels::SinkhornOrder::row_col;
  mhc.mhc_sinkhorn_iters = 3;
  mhc.mhc_bias_init = MhcBiasInit::zero;
  mhc.mhc_pre_eps = 1e-6;
  mhc.mhc_reduce = StreamReadout::mean;
  mhc.value_residual = true;
  EXPECT_EQ(cuda_refusal(mhc), "");
  for (const char* arm : {"hc", "hc-static", "mhc"}) EXPECT_EQ(cuda_refusal(apply_arm(ModelConfig{}, arm)), "") << arm;
}

// Delta AttnRes trains on CUDA with every option (issue #48): each gate, the null source, the V
// route, both delta_block schedules and either decay policy; the family lacks nothing.
TEST(ResidualModes, DeltaOnCudaTakesEveryOption) {
  for (const ResidualMode mode : {ResidualMode::delta, ResidualMode::delta_block})
    for (const kernels::DeltaGate gate : kernels::kDeltaGates)
      for (const bool null : {false, true})
        for (const DeltaValueRoute route : {DeltaValueRoute::none, DeltaValueRoute::decoupled}) {
          ModelConfig c = testing::tiny_config(mode);
          c.delta_gate = gate;
          c.delta_null_source = null;
          c.delta_value_route = route;
          c.delta_decay_all = !null;
          if (mode == ResidualMode::delta_block) c.delta_block_partial = route == DeltaValueRoute::none;
          EXPECT_EQ(cuda_refusal(c), "") << to_string(mode) << " " << kernels::to_string(gate) << " null " << null;
        }
  EXPECT_TRUE(residual_family(ResidualMode::delta).cuda_lacks.empty());
}

// The Gated Residual trains on CUDA with every key of its own (issue #48): any branch count and
// rank, either norm decay, with the value residual; the family lacks nothing.
TEST(ResidualModes, GatedResidualRunsOnCudaWithEveryKey) {
  ModelConfig c = testing::tiny_config(ResidualMode::gr);
  EXPECT_EQ(cuda_refusal(c), "");
  c.gr_n = 8;
  c.gr_rank = 3;
  c.gr_decay_norm = true;
  c.value_residual = true;
  EXPECT_EQ(cuda_refusal(c), "");
  EXPECT_TRUE(residual_family(c).cuda_lacks.empty());
}

// MUDDFormer trains on CUDA (issue #48) in every variant: no option of it is refused.
TEST(ResidualModes, MuddOnCudaTakesEveryVariant) {
  for (const MuddWays ways : {MuddWays::qkvr, MuddWays::r})
    for (const bool dynamic : {true, false})
      for (const bool prepost : {false, true}) {
        ModelConfig c = testing::tiny_config(ResidualMode::mudd);
        c.mudd_ways = ways;
        c.mudd_dynamic = dynamic;
        c.mudd_prepost_norm = prepost;
        c.mudd_gelu = kernels::Gelu::tanh;
        c.mudd_sep_qkv_norm = !prepost;
        c.mudd_hidden_round = 0;
        c.mudd_last_expand = 1;
        c.mudd_decay_all = dynamic;
        c.value_residual = prepost;
        EXPECT_EQ(cuda_refusal(c), "") << to_string(c.mudd_ways) << " dynamic " << dynamic << " prepost " << prepost;
      }
  EXPECT_TRUE(residual_family(ResidualMode::mudd).cuda_lacks.empty());
}

TEST(ResidualModes, FamiliesAreTheTrunksTheConfigDescribes) {
  for (const testing::Variant& v : testing::all_variants()) {
    const ModelConfig c = testing::tiny_config(v);
    const std::string family = residual_family(c).name;
    EXPECT_EQ(family == "n-stream", c.uses_streams()) << v.name;
    EXPECT_EQ(family == "MUDD", c.residual == ResidualMode::mudd) << v.name;
    EXPECT_EQ(family == "Delta AttnRes", c.uses_delta_reads()) << v.name;
    // The FLOP count takes the family's term: none without a depth mixing of its own.
    const double residual = bench::training_flops_per_token(c, 4).depth_reads;
    EXPECT_EQ(residual == 0, c.residual == ResidualMode::prenorm || c.residual == ResidualMode::denseformer) << v.name;
  }
}

TEST(ResidualModes, ConnectionTablesAreLabelledByTheirFamily) {
  // GR's gates are over its branches, the other tables over the embedding and the mixed outputs.
  ASSERT_NE(connection_kind("gr.read"), nullptr);
  EXPECT_EQ(connection_kind("gr.read")->axis, ConnectionAxis::branch);
  EXPECT_EQ(connection_column_label(ConnectionAxis::branch, 0), "branch 0");
  EXPECT_EQ(connection_tick_label(ConnectionAxis::branch, 0), "0");
  for (const char* name : {"dwa", "hc", "mhc", "hc_static_part", "mudd.q", "mudd.r"}) {
    ASSERT_NE(connection_kind(name), nullptr) << name;
    EXPECT_EQ(connection_kind(name)->axis, ConnectionAxis::source) << name;
  }
  EXPECT_EQ(connection_column_label(ConnectionAxis::source, 0), "emb");
  EXPECT_EQ(connection_column_label(ConnectionAxis::source, 2), "2");
  EXPECT_EQ(connection_kind("no such table"), nullptr);
  // Every table a model emits is in its family's record.
  for (const testing::Variant& v : testing::all_variants()) {
    const ModelConfig c = testing::tiny_config(v);
    if (!residual_mode_info(c.residual).diagnostics.connections) continue;
    Model<double> model(c, 1, 4, false);
    testing::randomize_weights(model, 8);
    const std::vector<std::int32_t> tokens = {1, 2, 3, 4, 5};
    model.forward(tokens, 1, 4);
    const std::unique_ptr<MixingSum> sum = model.depth_view().mixing_sum();
    ASSERT_NE(sum, nullptr) << v.name;
    sum->add_pass();
    for (const Connections& t : sum->connections()) {
      const ConnectionKind* kind = connection_kind(t.name);
      ASSERT_NE(kind, nullptr) << v.name << " " << t.name;
      const auto& own = residual_family(c).connections;
      EXPECT_TRUE(std::ranges::any_of(own, [&](const ConnectionKind& k) { return &k == kind; })) << t.name;
    }
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
