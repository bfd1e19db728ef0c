// Delta AttnRes (delta, delta_block; docs/delta-gated-spec.md §1) at the model level: the source
// schedules of §3, the identity-start invariant of §1.5, delta_block with N = L against delta, the
// V route against the mode without it, parameter counts (§1.6), names, init and weight decay
// (§1.7), and the refusal of keys that do not apply.
#include <gtest/gtest.h>

#include <cstring>

#include "common/model_util.hpp"
#include "model/model.hpp"
#include "model/topology.hpp"
#include "util/error.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace k = attnres::kernels;

namespace {

constexpr int B = 2, T = 6;

ModelConfig delta_config(ResidualMode mode, int n_layers = 2, int n_blocks = 2) {
  return tiny_config(mode, ValueRoute::decoupled, n_layers, n_blocks);
}

// Copies weights by name from `from` into `to` (names missing in `from` keep their values).
template <class Real>
void copy_shared(const Model<Real>& from, Model<Real>& to) {
  for (const auto& p : to.layout().params())
    if (const ParamInfo* q = from.layout().find(p.name))
      std::memcpy(to.params().data() + p.offset, from.params().data() + q->offset, sizeof(Real) * p.numel);
}

template <class Real>
std::vector<Real> logits_of(Model<Real>& m) {
  std::vector<std::int32_t> inputs(B * T);
  for (int i = 0; i < B * T; ++i) inputs[i] = (i * 7 + 3) % m.config().vocab_size;
  std::vector<Real> out(static_cast<std::size_t>(B * T * m.config().vocab_size));
  m.logits(inputs, B, T, out);
  return out;
}

template <class Real>
bool bitwise_equal(std::span<const Real> a, std::span<const Real> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(Real) * a.size()) == 0;
}

}  // namespace

TEST(Delta, SourceSchedulesOfTheSpec) {
  ModelConfig c = delta_config(ResidualMode::delta, 6);
  EXPECT_TRUE(delta_read_sources(c, 0).empty());
  for (int j = 1; j < 12; ++j) {
    std::vector<int> want = {kEmbedding};
    for (int i = 0; i < j; ++i) want.push_back(i);
    EXPECT_EQ(delta_read_sources(c, j), want) << j;
  }
  // 12 sublayers in N = 3 blocks of 4 (§3).
  c = delta_config(ResidualMode::delta_block, 6, 3);
  const std::vector<std::vector<int>> partial = {{},           {-1, 0},       {-1, 1},       {-1, 2},
                                                 {-1, 3},      {-1, 3, 4},    {-1, 3, 5},    {-1, 3, 6},
                                                 {-1, 3, 7},   {-1, 3, 7, 8}, {-1, 3, 7, 9}, {-1, 3, 7, 10}};
  const std::vector<std::vector<int>> released = {{},       {-1},     {-1},     {-1},       {-1},       {-1, 3},
                                                  {-1, 3},  {-1, 3},  {-1, 3},  {-1, 3, 7}, {-1, 3, 7}, {-1, 3, 7}};
  for (int j = 0; j < 12; ++j) EXPECT_EQ(delta_read_sources(c, j), partial[static_cast<std::size_t>(j)]) << j;
  c.delta_block_partial = false;
  for (int j = 0; j < 12; ++j) EXPECT_EQ(delta_read_sources(c, j), released[static_cast<std::size_t>(j)]) << j;
}

// §1.5: at zero queries (and a zero null source) every read adds a positive multiple of the stream,
// which the next RMSNorm removes: pre-norm's function up to epsilon.
TEST(Delta, AtInitialisationComputesPrenormsFunctionAsEpsilonVanishes) {
  struct Case {
    ResidualMode mode;
    k::DeltaGate gate;
    bool null;
    DeltaValueRoute route;
  };
  for (const Case& x : {Case{ResidualMode::delta, k::DeltaGate::none, false, DeltaValueRoute::none},
                        Case{ResidualMode::delta, k::DeltaGate::sigmoid_scalar, true, DeltaValueRoute::decoupled},
                        Case{ResidualMode::delta, k::DeltaGate::sigmoid_vector, true, DeltaValueRoute::none},
                        Case{ResidualMode::delta_block, k::DeltaGate::none, false, DeltaValueRoute::decoupled},
                        Case{ResidualMode::delta_block, k::DeltaGate::learnable_alpha, true, DeltaValueRoute::none}}) {
    ModelConfig c = delta_config(x.mode, 4, 2);
    c.norm_eps = 1e-12;
    c.delta_gate = x.gate;
    c.delta_null_source = x.null;
    c.delta_value_route = x.route;
    ModelConfig p = delta_config(ResidualMode::prenorm, 4, 2);
    p.norm_eps = c.norm_eps;
    Model<double> delta(c, B, T, false), prenorm(p, B, T, false);
    randomize_weights(prenorm, 3);
    init_params<double>(delta.layout(), 3, delta.params());  // the reads at their init
    copy_shared(prenorm, delta);
    const double err = max_rel_error(logits_of(delta), logits_of(prenorm));
    std::printf("[delta] identity start %s gate %s null %d: max rel err %.2e\n", to_string(x.mode).c_str(),
                k::to_string(x.gate).c_str(), x.null, err);
    EXPECT_LT(err, 1e-9) << to_string(x.mode) << " " << k::to_string(x.gate);
  }
  // The released Delta Block schedule has no such invariant (its sources do not sum to the stream).
  ModelConfig c = delta_config(ResidualMode::delta_block, 4, 2);
  c.norm_eps = 1e-12;
  c.delta_block_partial = false;
  ModelConfig p = delta_config(ResidualMode::prenorm, 4, 2);
  p.norm_eps = c.norm_eps;
  Model<double> delta(c, B, T, false), prenorm(p, B, T, false);
  randomize_weights(prenorm, 3);
  init_params<double>(delta.layout(), 3, delta.params());
  copy_shared(prenorm, delta);
  EXPECT_GT(max_rel_error(logits_of(delta), logits_of(prenorm)), 1e-3);
}

// learnable_alpha = 0 (its init): h = x exactly, so the model is pre-norm bit for bit whatever
// its queries.
TEST(Delta, LearnableAlphaZeroIsPrenormBitForBit) {
  for (ResidualMode mode : {ResidualMode::delta, ResidualMode::delta_block}) {
    ModelConfig c = delta_config(mode, 4, 2);
    c.delta_gate = k::DeltaGate::learnable_alpha;
    c.delta_null_source = true;
    Model<double> delta(c, B, T, false), prenorm(delta_config(ResidualMode::prenorm, 4, 2), B, T, false);
    randomize_weights(delta, 5);
    for (const auto& p : delta.layout().params())
      if (p.name.ends_with("gate_alpha")) delta.params()[static_cast<std::size_t>(p.offset)] = 0.0;
    copy_shared(delta, prenorm);
    const auto a = logits_of(delta), b = logits_of(prenorm);
    EXPECT_TRUE(bitwise_equal<double>(a, b)) << to_string(mode) << ": max rel err " << max_rel_error(a, b);
  }
}

// delta_block with N = L (one sublayer per block) is delta, bit for bit, loss and gradients.
TEST(Delta, DeltaBlockWithOneSublayerPerBlockIsDeltaBitForBit) {
  for (bool null : {false, true}) {
    ModelConfig d = delta_config(ResidualMode::delta, 2);
    d.delta_null_source = null;
    d.delta_gate = k::DeltaGate::sigmoid_vector;
    d.delta_value_route = DeltaValueRoute::decoupled;
    ModelConfig b = d;
    b.residual = ResidualMode::delta_block;
    b.n_blocks = 4;
    Model<float> md(d, B, T, true), mb(b, B, T, true);
    randomize_weights(md, 4);
    copy_shared(md, mb);
    const auto tokens = random_tokens(B, T, d.vocab_size, 6);
    EXPECT_EQ(md.forward_backward(tokens, B, T), mb.forward_backward(tokens, B, T));
    EXPECT_TRUE(bitwise_equal<float>(md.grads(), mb.grads()));
  }
}

// The V route with value_query = query and value_key_norm = key_norm is the mode without it.
TEST(Delta, ValueRouteWithTheQueryRouteWeightsIsTheModeWithout) {
  ModelConfig c = delta_config(ResidualMode::delta_block, 2);
  c.delta_null_source = true;
  ModelConfig v = c;
  v.delta_value_route = DeltaValueRoute::decoupled;
  Model<float> plain(c, B, T, false), routed(v, B, T, false);
  randomize_weights(plain, 8);
  copy_shared(plain, routed);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".attn_res.";
    for (const auto& [from, to] : {std::pair{"query", "value_query"}, {"key_norm.weight", "value_key_norm.weight"}}) {
      const ParamInfo &a = routed.layout().at(p + from), &b = routed.layout().at(p + to);
      std::memcpy(routed.params().data() + b.offset, routed.params().data() + a.offset, sizeof(float) * a.numel);
    }
  }
  EXPECT_TRUE(bitwise_equal<float>(logits_of(plain), logits_of(routed)));
}

// §1.6: S (16 x 576) and M (24 x 832), heads of 64, SwiGLU 5d, tied 32,000 vocabulary.
TEST(Delta, ParameterCountsOfTheSpec) {
  auto preset = [](int layers, int d) {
    ModelConfig c;
    c.vocab_size = 32000, c.d_model = d, c.n_layers = layers, c.n_heads = d / 64, c.mlp_hidden = 5 * d;
    c.residual = ResidualMode::prenorm;
    return c;
  };
  for (const auto& [layers, d] : {std::pair{16, 576}, {24, 832}}) {
    const ModelConfig pre = preset(layers, d);
    const std::int64_t base = ParamLayout(pre).total();
    auto extra = [&](auto change) {
      ModelConfig c = pre;
      c.residual = ResidualMode::delta;
      change(c);
      return ParamLayout(c).total() - base;
    };
    const bool s = layers == 16;
    if (s) {
      EXPECT_EQ(base, 119310912);
    }
    EXPECT_EQ(extra([](ModelConfig&) {}), s ? 36864 : 79872);
    EXPECT_EQ(extra([](ModelConfig& c) { c.residual = ResidualMode::delta_block, c.n_blocks = 8; }),
              s ? 36864 : 79872);
    EXPECT_EQ(extra([](ModelConfig& c) { c.delta_null_source = true; }), s ? 55296 : 119808);
    EXPECT_EQ(extra([](ModelConfig& c) { c.delta_value_route = DeltaValueRoute::decoupled; }), s ? 55296 : 119808);
    EXPECT_EQ(extra([](ModelConfig& c) { c.delta_gate = k::DeltaGate::sigmoid_scalar; }), s ? 36896 : 79920);
    EXPECT_EQ(extra([](ModelConfig& c) { c.delta_gate = k::DeltaGate::learnable_alpha; }), s ? 36896 : 79920);
    EXPECT_EQ(extra([](ModelConfig& c) { c.delta_gate = k::DeltaGate::sigmoid_vector; }), s ? 10672128 : 33346560);
  }
}

// §1.7: names in ParamLayout order after the MLP's, deterministic inits, the decay policy.
TEST(Delta, ParametersNamesInitAndDecay) {
  for (bool decay_all : {true, false}) {
    ModelConfig c = delta_config(ResidualMode::delta, 2);
    c.delta_null_source = true;
    c.delta_gate = k::DeltaGate::sigmoid_vector;
    c.delta_value_route = DeltaValueRoute::decoupled;
    c.delta_decay_all = decay_all;
    const ParamLayout layout(c);
    std::vector<std::string> names;
    for (const auto& p : layout.params())
      if (p.name.rfind("layers.1.", 0) == 0) names.push_back(p.name);
    const std::vector<std::string> want = {
        "layers.1.attn_norm.weight", "layers.1.attn.wq.weight", "layers.1.attn.wk.weight", "layers.1.attn.wv.weight",
        "layers.1.attn.wo.weight", "layers.1.mlp_norm.weight", "layers.1.mlp.w_gate.weight",
        "layers.1.mlp.w_up.weight", "layers.1.mlp.w_down.weight", "layers.1.attn_res.query",
        "layers.1.attn_res.key_norm.weight", "layers.1.attn_res.value_query",
        "layers.1.attn_res.value_key_norm.weight", "layers.1.attn_res.null_source", "layers.1.attn_res.gate.weight",
        "layers.1.attn_res.gate.bias", "layers.1.mlp_res.query", "layers.1.mlp_res.key_norm.weight",
        "layers.1.mlp_res.null_source", "layers.1.mlp_res.gate.weight", "layers.1.mlp_res.gate.bias"};
    EXPECT_EQ(names, want);
    EXPECT_EQ(layout.find("final_res.query"), nullptr);
    Model<double> m(c, 1, 2, false);
    init_params<double>(m.layout(), 1, m.params());
    Model<double> other(c, 1, 2, false);
    init_params<double>(other.layout(), 99, other.params());  // no draws: every seed gives the same reads
    for (const auto& p : layout.params()) {
      if (p.name.find("_res.") == std::string::npos) continue;
      const double want_init = p.name.ends_with("key_norm.weight") ? 1.0 : p.name.ends_with("gate.bias") ? -2.0 : 0.0;
      for (std::int64_t i = 0; i < p.numel; ++i) {
        EXPECT_EQ(m.params()[static_cast<std::size_t>(p.offset + i)], want_init) << p.name;
        EXPECT_EQ(other.params()[static_cast<std::size_t>(p.offset + i)], want_init) << p.name;
      }
      EXPECT_EQ(p.weight_decay(), decay_all || p.name.ends_with("gate.weight")) << p.name;
    }
  }
  ModelConfig c = delta_config(ResidualMode::delta_block, 2);
  c.delta_gate = k::DeltaGate::sigmoid_scalar;
  EXPECT_EQ(ParamLayout(c).at("layers.0.mlp_res.gate_logit").init_values, std::vector<double>{-2.0});
  c.delta_gate = k::DeltaGate::learnable_alpha;
  EXPECT_EQ(ParamLayout(c).at("layers.0.attn_res.gate_alpha").init_values, std::vector<double>{0.0});
}

// Keys that do not apply are refused before any work, naming the key and the mode; delta ignores
// n_blocks, delta_block checks it as block does.
TEST(Delta, KeysOutsideTheirModesAreRefused) {
  auto message = [](const ModelConfig& c) {
    try {
      c.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (ResidualMode other : {ResidualMode::prenorm, ResidualMode::block, ResidualMode::rd, ResidualMode::hc}) {
    ModelConfig c = delta_config(other);
    c.delta_gate = k::DeltaGate::sigmoid_scalar;
    EXPECT_NE(message(c).find("'delta_gate'"), std::string::npos) << message(c);
    EXPECT_NE(message(c).find("'" + to_string(other) + "'"), std::string::npos) << message(c);
    c = delta_config(other);
    c.delta_null_source = true;
    EXPECT_NE(message(c).find("'delta_null_source'"), std::string::npos);
    c = delta_config(other);
    c.delta_value_route = DeltaValueRoute::decoupled;
    EXPECT_NE(message(c).find("'delta_value_route'"), std::string::npos);
    c = delta_config(other);
    c.delta_decay_all = false;
    EXPECT_NE(message(c).find("'delta_decay_all'"), std::string::npos);
  }
  ModelConfig c = delta_config(ResidualMode::delta);
  c.delta_block_partial = false;
  EXPECT_NE(message(c).find("'delta_block_partial'"), std::string::npos);
  EXPECT_NE(message(c).find("'delta'"), std::string::npos);
  c = delta_config(ResidualMode::delta, 2, 3);  // n_blocks is ignored by delta
  EXPECT_EQ(message(c), "");
  c.residual = ResidualMode::delta_block;  // 3 does not divide 4 sublayers
  EXPECT_NE(message(c).find("n_blocks"), std::string::npos);
  c = delta_config(ResidualMode::delta_block, 3, 2);  // blocks of 3: odd
  EXPECT_NE(message(c).find("n_blocks"), std::string::npos);
  c = delta_config(ResidualMode::delta_block, 2, 4);  // N = L
  c.delta_block_partial = false;
  EXPECT_EQ(message(c), "");
}

// The depth view (routing diagnostics, spec §1.8): the attention reads with sources and their V
// route; routing_max_weight's reads are those with more than one source, each at 1/n at zero
// queries, and with trained queries the largest weight of the softmax the routes show.
TEST(Delta, DepthViewShowsTheReadsAndTheirLargestWeights) {
  ModelConfig c = delta_config(ResidualMode::delta_block, 2);
  c.delta_value_route = DeltaValueRoute::decoupled;
  Model<double> m(c, B, T, false);
  init_params<double>(m.layout(), 1, m.params());
  logits_of(m);
  const DepthView& view = m.depth_view();
  const std::vector<RoutedInput> inputs = view.routed_inputs();
  ASSERT_EQ(inputs.size(), 1u);  // layer 0's attention read has no sources
  EXPECT_EQ(inputs[0].layer, 1);
  EXPECT_EQ(inputs[0].sources, 2);
  EXPECT_EQ(inputs[0].routes, 2);
  EXPECT_EQ(view.max_weight_reads(), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(view.max_weight(3, 0), 1.0 / 3);
  randomize_weights(m, 2);
  logits_of(m);
  std::vector<double> p(4);
  for (std::int64_t t = 0; t < view.tokens(); ++t) {
    view.route_distributions(0, t, p);
    EXPECT_NEAR(p[0] + p[1], 1.0, 1e-12);
    EXPECT_NEAR(p[2] + p[3], 1.0, 1e-12);
    EXPECT_EQ(view.max_weight(2, t), std::max(p[0], p[1]));  // read 2 is layer 1's attention read
  }
}
