// The Gated Residual (gr, docs/delta-gated-spec.md §2) at the model level: the invariant of §2.5,
// the parameter counts of §2.6, names, init and decay of §2.3 and §2.7, the config keys and their
// refusal under other modes, the arm and the gate diagnostics (the FLOP term: tests/bench/test_flops.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/model_util.hpp"
#include "model/arms.hpp"
#include "model/model.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"

using namespace attnres;
using namespace attnres::testing;

namespace {

constexpr int B = 2, T = 6;

ModelConfig gr_config(int n, bool tied = true) {
  ModelConfig c = tiny_config(ResidualMode::gr, ValueRoute::decoupled, 3);
  c.gr_n = n;
  c.gr_rank = 3;
  c.tie_embeddings = tied;
  return c;
}

void set(Model<double>& m, const std::string& name, double value) {
  const ParamInfo& p = m.layout().at(name);
  std::fill_n(m.params().data() + p.offset, p.numel, value);
}

std::vector<double> logits_of(Model<double>& m, const std::vector<std::int32_t>& inputs) {
  std::vector<double> out(static_cast<std::size_t>(B * T * m.config().vocab_size));
  m.logits(inputs, B, T, out);
  return out;
}

// The S (16 x 576) or M (24 x 832) preset: heads of 64, SwiGLU 5d, a tied 32,000 vocabulary.
ModelConfig preset(int layers, int d, ResidualMode mode) {
  ModelConfig c;
  c.vocab_size = 32000;
  c.d_model = d;
  c.n_layers = layers;
  c.n_heads = d / 64;
  c.mlp_hidden = 5 * d;
  c.residual = mode;
  return c;
}

}  // namespace

// §2.5: W_up = 0, W_inject = 0 and the norm weights 0 make every read gate 1/2 and every write
// gate 1, so each branch is pre-norm's stream and each read ½ RMSNorm(x_j): pre-norm with every
// norm weight 1/2, for any W_down (n = 2, 3, 4, tied and untied head). Not vacuous: a nonzero W_up
// changes the function.
TEST(GatedResidual, WithZeroUpAndInjectEqualsPrenormWithHalfNorms) {
  for (const bool tied : {true, false})
    for (const int n : {2, 3, 4}) {
      const ModelConfig c = gr_config(n, tied);
      ModelConfig pc = c;
      pc.residual = ResidualMode::prenorm;
      pc.gr_n = 4, pc.gr_rank = 0;
      Model<double> gr(c, B, T, false), pre(pc, B, T, false);
      randomize_weights(gr, 5);
      for (const auto& p : pre.layout().params()) {
        if (const ParamInfo* q = gr.layout().find(p.name)) {
          std::memcpy(pre.params().data() + p.offset, gr.params().data() + q->offset, sizeof(double) * p.numel);
        } else {
          ASSERT_NE(p.name.find("norm.weight"), std::string::npos) << p.name;  // only the norms are pre-norm's own
          set(pre, p.name, 0.5);
        }
      }
      for (int j = 0; j <= c.n_sublayers(); ++j) {
        const std::string q = j < c.n_sublayers() ? "gr." + std::to_string(j) + "." : std::string("gr_final.");
        set(gr, q + "w_up", 0.0);
        set(gr, q + "norm.weight", 0.0);
        if (j < c.n_sublayers()) set(gr, q + "w_inject", 0.0);
      }
      const auto inputs = random_tokens(B, T - 1, c.vocab_size, 4);  // B x T after dropping the targets
      std::vector<std::int32_t> in(inputs.begin(), inputs.begin() + B * T);
      const auto a = logits_of(gr, in), b = logits_of(pre, in);
      const double err = max_rel_error(a, b);
      EXPECT_LT(err, 1e-13) << "n=" << n << (tied ? " tied" : " untied");
      set(gr, "gr.2.w_up", 0.3);
      EXPECT_GT(max_rel_error(logits_of(gr, in), b), 1e-4) << "n=" << n;
    }
}

// §2.6 at the S and M presets (r = d/8, n = 4): per sublayer n d + 2 r n d + n² d, the final mixer
// n d + 2 r n d, minus the pre-norms and the final norm.
TEST(GatedResidual, ParameterCountsMatchTheSpec) {
  const ModelConfig s = preset(16, 576, ResidualMode::gr);
  EXPECT_EQ(ParamLayout(s).total(), 130611456);
  EXPECT_EQ(ParamLayout(s).total() - ParamLayout(preset(16, 576, ResidualMode::prenorm)).total(), 11300544);
  EXPECT_EQ(ParamLayout(preset(24, 832, ResidualMode::gr)).total() -
                ParamLayout(preset(24, 832, ResidualMode::prenorm)).total(),
            34680256);
}

// §2.7's names and order (after the layers; no pre-norms, no final norm), §2.3's init (matrices
// N(0, 0.02) from their own named streams, norm weights 0) and decay (the matrices; the norm
// weights with gr_decay_norm).
TEST(GatedResidual, ParametersAreNamedInitialisedAndDecayedAsTheSpecSays) {
  for (const bool decay_norm : {false, true}) {
    ModelConfig c = gr_config(3);
    c.gr_decay_norm = decay_norm;
    const ParamLayout layout(c);
    for (const auto& p : layout.params()) {
      EXPECT_EQ(p.name.find("attn_norm"), std::string::npos);
      EXPECT_EQ(p.name.find("mlp_norm"), std::string::npos);
      EXPECT_NE(p.name, "final_norm.weight");
    }
    std::vector<std::string> names;
    for (const auto& p : layout.params())
      if (p.name.rfind("gr", 0) == 0) names.push_back(p.name);
    ASSERT_EQ(names.size(), 4u * 6 + 3);
    EXPECT_EQ(names[0], "gr.0.norm.weight");
    EXPECT_EQ(names[3], "gr.0.w_inject");
    EXPECT_EQ(names[4], "gr.1.norm.weight");
    EXPECT_EQ(names[24], "gr_final.norm.weight");
    EXPECT_EQ(names[26], "gr_final.w_up");
    EXPECT_EQ(layout.at("gr.0.w_down").shape, (std::vector<std::int64_t>{3, 24}));
    EXPECT_EQ(layout.at("gr.0.w_up").shape, (std::vector<std::int64_t>{24, 3}));
    EXPECT_EQ(layout.at("gr.0.w_inject").shape, (std::vector<std::int64_t>{3, 24}));
    EXPECT_EQ(layout.at("gr_final.norm.weight").numel, 24);
      EXPECT_LT(layout.at("layers.2.mlp.w_down.weight").offset, layout.at("gr.0.norm.weight").offset);  // after the layers
    std::vector<double> params(static_cast<std::size_t>(layout.total()));
    init_params<double>(layout, 17, params);
    for (const std::string& name : names) {
      const ParamInfo& p = layout.at(name);
      const bool norm = name.ends_with("norm.weight");
      EXPECT_EQ(p.weight_decay(), norm ? decay_norm : true) << name;
      Rng rng(17, name);  // the matrices' own stream
      for (std::int64_t i = 0; i < p.numel; ++i)
        EXPECT_EQ(params[static_cast<std::size_t>(p.offset + i)], norm ? 0.0 : rng.normal() * 0.02) << name;
    }
  }
  // The default rank is d / 8, at least 1.
  ModelConfig c = gr_config(2);
  c.gr_rank = 0;
  EXPECT_EQ(c.gr_bottleneck(), 1);
  c.d_model = 576;
  EXPECT_EQ(c.gr_bottleneck(), 72);
}

// The keys: defaults, ranges, the JSON round trip, and the refusal of a non-default gr_* value
// under another mode (naming the key and both modes); the arms give the other modes the defaults.
TEST(GatedResidual, ConfigKeysValidateAndApplyToGrOnly) {
  const ModelConfig d;
  EXPECT_EQ(d.gr_n, 4);
  EXPECT_EQ(d.gr_rank, 0);
  EXPECT_FALSE(d.gr_decay_norm);
  for (const int n : {1, 9}) {
    ModelConfig c = gr_config(2);
    c.gr_n = n;
    EXPECT_THROW(c.validate(), Error) << n;
  }
  ModelConfig neg = gr_config(2);
  neg.gr_rank = -1;
  EXPECT_THROW(neg.validate(), Error);
  ModelConfig c = gr_config(3);
  c.gr_decay_norm = true;
  nlohmann::json j;
  to_json(j, c);
  const ModelConfig back = model_config_from_json(j, "gr.json");
  EXPECT_EQ(back.gr_n, 3);
  EXPECT_EQ(back.gr_rank, 3);
  EXPECT_TRUE(back.gr_decay_norm);
  for (const char* key : {"gr_n", "gr_rank", "gr_decay_norm"}) {
    nlohmann::json bad = j;
    bad["residual"] = "hc";
    for (const char* other : {"gr_n", "gr_rank", "gr_decay_norm"}) bad[other] = nlohmann::json(ModelConfig{}).at(other);
    bad[key] = std::string(key) == "gr_decay_norm" ? nlohmann::json(true) : nlohmann::json(2);
    try {
      model_config_from_json(bad, "bad.json");
      ADD_FAILURE() << key << " accepted under hc";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'" + std::string(key) + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("residual 'gr'"), std::string::npos) << what;
      EXPECT_NE(what.find("residual mode 'hc'"), std::string::npos) << what;
    }
  }
  // The arm gr keeps the base's gr_* keys; the other arms take the defaults.
  ModelConfig base = c;
  base.residual = ResidualMode::prenorm;
  base.gr_n = 3;  // (a base for an arm list need not validate on its own)
  const ModelConfig arm_gr = apply_arm(base, "gr");
  EXPECT_EQ(arm_gr.residual, ResidualMode::gr);
  EXPECT_EQ(arm_gr.gr_n, 3);
  EXPECT_NO_THROW(arm_gr.validate());
  const ModelConfig arm_pre = apply_arm(base, "prenorm");
  EXPECT_EQ(arm_pre.gr_n, 4);
  EXPECT_FALSE(arm_pre.gr_decay_norm);
  EXPECT_NO_THROW(arm_pre.validate());
  EXPECT_TRUE(residual_mode_info(ResidualMode::gr).cuda);  // issue #48: CUDA trains it too
  EXPECT_FALSE(has_model_norms(c));
  EXPECT_TRUE(has_model_norms(tiny_config(ResidualMode::hc)));
}

// The diagnostics (spec §2.7): per branch the read gates' channel mean (every module and the final
// mixer) and the write gates (every sublayer), averaged over tokens. With W_up = 0 and W_inject = 0
// they are exactly 1/2 and 1.
TEST(GatedResidual, DiagnosticsRecordTheGatesPerBranch) {
  const ModelConfig c = gr_config(3);
  Model<double> m(c, B, T, false);
  init_params<double>(m.layout(), 3, m.params());
  for (int j = 0; j <= c.n_sublayers(); ++j) {
    const std::string q = j < c.n_sublayers() ? "gr." + std::to_string(j) + "." : std::string("gr_final.");
    set(m, q + "w_up", 0.0);
    if (j < c.n_sublayers()) set(m, q + "w_inject", 0.0);
  }
  const auto tokens = random_tokens(B, T, c.vocab_size, 2);
  m.forward(tokens, B, T);
  auto sum = m.depth_view().mixing_sum();
  ASSERT_NE(sum, nullptr);
  sum->add_pass();
  const auto connections = sum->connections();
  ASSERT_EQ(connections.size(), 2u);
  EXPECT_EQ(connections[0].name, "gr.read");
  EXPECT_EQ(connections[1].name, "gr.write");
  ASSERT_EQ(connections[0].rows.size(), 7u);  // 6 modules and the final mixer
  ASSERT_EQ(connections[1].rows.size(), 6u);
  for (const auto& row : connections[0].rows) {
    EXPECT_EQ(row.sources, (std::vector<int>{0, 1, 2}));
    for (double w : row.weights) EXPECT_DOUBLE_EQ(w, 0.5);
  }
  for (const auto& row : connections[1].rows)
    for (double w : row.weights) EXPECT_DOUBLE_EQ(w, 1.0);
  // At the spec's init (W_up random) the read gates are 1/2 ± O(0.02).
  init_params<double>(m.layout(), 3, m.params());
  m.forward(tokens, B, T);
  auto init = m.depth_view().mixing_sum();
  init->add_pass();
  const auto at_init = init->connections();
  for (const auto& row : at_init[0].rows)
    for (double w : row.weights) EXPECT_NEAR(w, 0.5, 0.05);
}
