// Structural invariants of the residual modes (spec §4, §5): exact equalities between
// arms, the zero-query limit, parameter counts and seed-keyed initialisation.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "common/model_util.hpp"
#include "kernels/dwa.hpp"
#include "model/model.hpp"
#include "util/error.hpp"

using namespace attnres;
using namespace attnres::testing;

namespace {

struct Run {
  double loss = 0;
  std::vector<float> grads;
};

// Copies weights by name from `from` into `to` (names missing in `from` keep their values).
void copy_shared_weights(const Model<float>& from, Model<float>& to) {
  for (const auto& p : to.layout().params()) {
    const ParamInfo* q = from.layout().find(p.name);
    if (q == nullptr) continue;
    std::memcpy(to.params().data() + p.offset, from.params().data() + q->offset, sizeof(float) * p.numel);
  }
}

std::vector<float> grad_of(const Model<float>& m, const std::string& name) {
  const ParamInfo& p = m.layout().at(name);
  return {m.grads().begin() + p.offset, m.grads().begin() + p.offset + p.numel};
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

constexpr int B = 2, T = 6;

}  // namespace

TEST(Invariants, RdTiedEqualsBlockBitForBit) {
  const ModelConfig block_cfg = tiny_config(ResidualMode::block);
  const ModelConfig tied_cfg = tiny_config(ResidualMode::rd, ValueRoute::tied);
  Model<float> block(block_cfg, B, T, true), tied(tied_cfg, B, T, true);
  randomize_weights(block, 5);
  ASSERT_EQ(block.layout().total(), tied.layout().total());
  copy_shared_weights(block, tied);
  const auto tokens = random_tokens(B, T, block_cfg.vocab_size, 9);
  const double lb = block.forward_backward(tokens, B, T);
  const double lt = tied.forward_backward(tokens, B, T);
  EXPECT_EQ(lb, lt);
  for (const auto& p : block.layout().params())
    EXPECT_TRUE(bitwise_equal(grad_of(block, p.name), grad_of(tied, p.name))) << p.name;
}

TEST(Invariants, RdDecoupledAtInitialisationEqualsBlock) {
  const ModelConfig block_cfg = tiny_config(ResidualMode::block);
  const ModelConfig rd_cfg = tiny_config(ResidualMode::rd, ValueRoute::decoupled);
  Model<float> block(block_cfg, B, T, true), rd(rd_cfg, B, T, true);
  init_params<float>(block.layout(), 11, block.params());
  init_params<float>(rd.layout(), 11, rd.params());
  // Seed-keyed init: every shared tensor starts identical.
  for (const auto& p : block.layout().params()) {
    const ParamInfo& q = rd.layout().at(p.name);
    EXPECT_EQ(std::memcmp(block.params().data() + p.offset, rd.params().data() + q.offset, sizeof(float) * p.numel), 0)
        << p.name;
  }
  const auto tokens = random_tokens(B, T, block_cfg.vocab_size, 2);
  const double lb = block.forward_backward(tokens, B, T);
  const double lr = rd.forward_backward(tokens, B, T);
  EXPECT_EQ(lb, lr);  // both routes are uniform: the same function, bit for bit
  for (const auto& p : block.layout().params()) {
    const auto gb = grad_of(block, p.name);
    auto gr = grad_of(rd, p.name);
    const auto dot = p.name.rfind(".attn_res.query");
    if (dot != std::string::npos && dot + 15 == p.name.size()) {
      // Block's query collects what RD splits between its two routes.
      const auto gv = grad_of(rd, p.name.substr(0, dot) + ".attn_res.value_query");
      double mag = 0;
      for (std::size_t i = 0; i < gr.size(); ++i) {
        mag = std::max(mag, double(std::abs(gv[i])));
        gr[i] += gv[i];
      }
      if (p.name != "layers.0.attn_res.query") {
        EXPECT_GT(mag, 0.0) << p.name;
      }
    }
    EXPECT_LT(max_rel_error(gr, gb), 1e-5) << p.name;
  }
}

TEST(Invariants, ZeroQueriesMatchPrenormAsEpsilonVanishes) {
  for (ResidualMode mode : {ResidualMode::block, ResidualMode::full}) {
    for (int n_blocks : {1, 2}) {
      ModelConfig c = tiny_config(mode, ValueRoute::decoupled, 2, n_blocks);
      c.norm_eps = 0.0;
      ModelConfig p = c;
      p.residual = ResidualMode::prenorm;
      Model<double> attnres(c, B, T, false), prenorm(p, B, T, false);
      randomize_weights(prenorm, 3);
      randomize_weights(attnres, 3);
      // Same shared weights; all queries zero.
      for (const auto& info : attnres.layout().params()) {
        double* dst = attnres.params().data() + info.offset;
        if (const ParamInfo* q = prenorm.layout().find(info.name))
          std::memcpy(dst, prenorm.params().data() + q->offset, sizeof(double) * info.numel);
        else if (info.kind == ParamKind::query)
          std::fill(dst, dst + info.numel, 0.0);
      }
      std::vector<std::int32_t> inputs(B * T);
      for (int i = 0; i < B * T; ++i) inputs[i] = (i * 7) % c.vocab_size;
      std::vector<double> la(B * T * c.vocab_size), lp(la.size());
      attnres.logits(inputs, B, T, la);
      prenorm.logits(inputs, B, T, lp);
      EXPECT_LT(max_rel_error(la, lp), 1e-12) << to_string(mode) << " n_blocks=" << n_blocks;
    }
  }
}

TEST(Invariants, BlocksOfOneSublayerEqualFull) {
  ModelConfig full_cfg = tiny_config(ResidualMode::full);
  ModelConfig block_cfg = tiny_config(ResidualMode::block, ValueRoute::decoupled, 2, 4);  // n_blocks = 2*n_layers
  Model<float> full(full_cfg, B, T, true), block(block_cfg, B, T, true);
  randomize_weights(full, 4);
  copy_shared_weights(full, block);
  const auto tokens = random_tokens(B, T, full_cfg.vocab_size, 6);
  EXPECT_EQ(full.forward_backward(tokens, B, T), block.forward_backward(tokens, B, T));
  EXPECT_TRUE(bitwise_equal({full.grads().begin(), full.grads().end()}, {block.grads().begin(), block.grads().end()}));
}

TEST(Invariants, RdAddsExactlyOneVectorPerLayer) {
  for (int layers : {2, 4, 16}) {
    ModelConfig block = tiny_config(ResidualMode::block, ValueRoute::decoupled, layers, 2);
    ModelConfig rd = block;
    rd.residual = ResidualMode::rd;
    EXPECT_EQ(ParamLayout(rd).total() - ParamLayout(block).total(), std::int64_t(layers) * block.d_model);
    for (ValueRoute r : {ValueRoute::tied, ValueRoute::frozen}) {
      rd.value_route = r;
      EXPECT_EQ(ParamLayout(rd).total(), ParamLayout(block).total()) << to_string(r);
    }
    rd.value_route = ValueRoute::average;
    EXPECT_EQ(ParamLayout(rd).total() - ParamLayout(block).total(), std::int64_t(layers) * block.d_model);
  }
}

TEST(Invariants, PaperScaleParameterCounts) {
  // 16 x 576 and 24 x 832 with heads of 64, SwiGLU 5d and a tied 32,000 vocabulary (spec §8).
  ModelConfig s;
  s.vocab_size = 32000;
  s.d_model = 576;
  s.n_layers = 16;
  s.n_heads = 9;
  s.mlp_hidden = 5 * 576;
  s.residual = ResidualMode::block;
  s.n_blocks = 8;
  const double s_count = double(ParamLayout(s).total());
  EXPECT_NEAR(s_count / 1e6, 119.3, 0.5);
  ModelConfig m = s;
  m.d_model = 832;
  m.n_layers = 24;
  m.n_heads = 13;
  m.mlp_hidden = 5 * 832;
  EXPECT_NEAR(double(ParamLayout(m).total()) / 1e6, 342.3, 0.5);
}

TEST(Invariants, InitialisationFollowsTheSpec) {
  ModelConfig c = tiny_config(ResidualMode::rd);
  c.d_model = 64;
  c.n_heads = 4;
  c.mlp_hidden = 160;
  c.vocab_size = 500;
  const ParamLayout layout(c);
  std::vector<float> a(layout.total()), b(layout.total());
  init_params<float>(layout, 1, std::span<float>(a));
  init_params<float>(layout, 2, std::span<float>(b));
  EXPECT_NE(a, b);
  auto stddev = [&](const std::string& name) {
    const ParamInfo& p = layout.at(name);
    double s = 0;
    for (std::int64_t i = 0; i < p.numel; ++i) s += double(a[p.offset + i]) * a[p.offset + i];
    return std::sqrt(s / p.numel);
  };
  EXPECT_NEAR(stddev("tok_emb.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("layers.0.attn.wq.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("layers.0.mlp.w_down.weight"), 0.02 / std::sqrt(4.0), 0.001);
  EXPECT_NEAR(stddev("layers.1.attn.wo.weight"), 0.02 / std::sqrt(4.0), 0.001);
  for (const auto& p : layout.params()) {
    const float expected = p.kind == ParamKind::query ? 0.0f : 1.0f;
    if (p.kind != ParamKind::matrix) {
      for (std::int64_t i = 0; i < p.numel; ++i) EXPECT_EQ(a[p.offset + i], expected) << p.name;
    }
  }
}

TEST(Invariants, DepthTensorsExistOnlyWhereUsed) {
  EXPECT_EQ(ParamLayout(tiny_config(ResidualMode::prenorm)).find("layers.0.attn_res.query"), nullptr);
  EXPECT_EQ(ParamLayout(tiny_config(ResidualMode::prenorm)).find("final_res.query"), nullptr);
  EXPECT_NE(ParamLayout(tiny_config(ResidualMode::block)).find("final_res.key_norm.weight"), nullptr);
  EXPECT_EQ(ParamLayout(tiny_config(ResidualMode::block)).find("layers.0.attn_res.value_query"), nullptr);
  EXPECT_EQ(ParamLayout(tiny_config(ResidualMode::rd, ValueRoute::tied)).find("layers.0.attn_res.value_query"), nullptr);
  EXPECT_EQ(ParamLayout(tiny_config(ResidualMode::rd, ValueRoute::frozen)).find("layers.0.attn_res.value_query"), nullptr);
  EXPECT_NE(ParamLayout(tiny_config(ResidualMode::rd, ValueRoute::average)).find("layers.1.attn_res.value_query"), nullptr);
  ModelConfig untied = tiny_config(ResidualMode::block);
  untied.tie_embeddings = false;
  EXPECT_NE(ParamLayout(untied).find("lm_head.weight"), nullptr);
  EXPECT_EQ(ParamLayout(tiny_config(ResidualMode::block)).find("lm_head.weight"), nullptr);
}

TEST(Invariants, RepeatedStepsAreBitIdentical) {
  const ModelConfig c = tiny_config(ResidualMode::rd);
  Model<float> a(c, B, T, true), b(c, B, T, true);
  randomize_weights(a, 1);
  randomize_weights(b, 1);
  const auto tokens = random_tokens(B, T, c.vocab_size, 1);
  EXPECT_EQ(a.forward_backward(tokens, B, T), b.forward_backward(tokens, B, T));
  EXPECT_TRUE(bitwise_equal({a.grads().begin(), a.grads().end()}, {b.grads().begin(), b.grads().end()}));
}

TEST(Invariants, BadConfigsAreRejected) {
  ModelConfig c = tiny_config(ResidualMode::block, ValueRoute::decoupled, 2, 3);
  EXPECT_THROW(c.validate(), Error);  // 3 does not divide 4 sublayers
  c = tiny_config(ResidualMode::block, ValueRoute::decoupled, 3, 3);  // blocks of 2 sublayers: fine
  EXPECT_NO_THROW(c.validate());
  c = tiny_config(ResidualMode::block, ValueRoute::decoupled, 3, 2);  // blocks of 3: odd
  EXPECT_THROW(c.validate(), Error);
  c = tiny_config(ResidualMode::block);
  c.n_heads = 3;
  EXPECT_THROW(c.validate(), Error);
  EXPECT_THROW(parse_residual_mode("blocks"), Error);
}

// ------------------------------------------------------------------ baselines (baselines-spec §6.1)

namespace {

// Logits, loss and every shared parameter's gradient of `a` and `b` equal bit for bit (same
// weights where the names agree).
void expect_same_function(Model<float>& a, Model<float>& b, const std::string& what) {
  const auto tokens = random_tokens(B, T, a.config().vocab_size, 9);
  std::vector<std::int32_t> inputs;
  for (int r = 0; r < B; ++r)
    for (int t = 0; t < T; ++t) inputs.push_back(tokens[r * (T + 1) + t]);
  std::vector<float> la(B * T * a.config().vocab_size), lb(la.size());
  a.logits(inputs, B, T, la);
  b.logits(inputs, B, T, lb);
  EXPECT_TRUE(bitwise_equal(la, lb)) << what << ": logits";
  EXPECT_EQ(a.forward_backward(tokens, B, T), b.forward_backward(tokens, B, T)) << what;
  for (const auto& p : a.layout().params()) {
    if (b.layout().find(p.name) != nullptr) {
      EXPECT_TRUE(bitwise_equal(grad_of(a, p.name), grad_of(b, p.name))) << what << ": " << p.name;
    }
  }
}

}  // namespace

TEST(Invariants, DenseFormerAtIdentityInitEqualsPrenormBitForBit) {
  for (auto [k, p] : {std::pair{1, 1}, std::pair{2, 2}, std::pair{4, 5}}) {
    ModelConfig pre = tiny_config(ResidualMode::prenorm, ValueRoute::decoupled, 4);
    ModelConfig dense = pre;
    dense.residual = ResidualMode::denseformer;
    dense.dwa_dilation = k;
    dense.dwa_period = p;
    Model<float> a(pre, B, T, true), b(dense, B, T, true);
    randomize_weights(a, 3);
    init_params<float>(b.layout(), 3, b.params());  // the DWAs at identity
    copy_shared_weights(a, b);
    expect_same_function(a, b, "denseformer " + std::to_string(k) + "x" + std::to_string(p));
    // The DWA weights do get a gradient (except where there is a single source).
    double mag = 0;
    for (const auto& info : b.layout().params())
      if (info.name.rfind("dwa.", 0) == 0)
        for (float g : grad_of(b, info.name)) mag = std::max(mag, double(std::abs(g)));
    if (k == 1 || p == 2) {
      EXPECT_GT(mag, 0.0);
    }
  }
}

TEST(Invariants, ValueResidualWithZeroMixEqualsTheModeWithout) {
  using kernels::VresMode;
  for (ResidualMode mode : {ResidualMode::prenorm, ResidualMode::block, ResidualMode::rd, ResidualMode::denseformer}) {
    for (VresMode vm : {VresMode::constant, VresMode::learned_pair, VresMode::learned_convex}) {
      ModelConfig plain = tiny_config(mode, ValueRoute::decoupled, 3, 3);
      ModelConfig vres = plain;
      vres.value_residual = true;
      vres.vres_mode = vm;
      vres.vres_lambda1 = 0.0;
      vres.vres_lambda2 = 1.0;  // convex: lambda2 = 1 - lambda1 = 1 too
      Model<float> a(plain, B, T, true), b(vres, B, T, true);
      randomize_weights(a, 4);
      init_params<float>(b.layout(), 4, b.params());  // lambdas at (0, 1)
      copy_shared_weights(a, b);
      expect_same_function(a, b, to_string(mode) + " + value_residual " + kernels::to_string(vm));
    }
  }
}

TEST(Invariants, BaselineParameterCountsMatchTheSpec) {
  // baselines-spec §6.3 at the S (16 x 576) and M (24 x 832) presets, extra over prenorm.
  // HC dynamic and static and mHC at n = 4 (§6.3).
  // MUDD with the official rounding and three attention norms (§6.3).
  for (auto [layers, d, dense11, dense45, hc_dynamic, hc_static, mhc, mudd] :
       {std::tuple{16, 576, 152, 9, 129856, 768, 1770336, 723373},
        std::tuple{24, 832, 324, 15, 280800, 1152, 3835152, 1977413}}) {
    ModelConfig pre;
    pre.vocab_size = 1000;
    pre.d_model = d;
    pre.n_layers = layers;
    pre.n_heads = d / 64;
    pre.mlp_hidden = 16;
    pre.residual = ResidualMode::prenorm;
    const std::int64_t base = ParamLayout(pre).total();
    ModelConfig c = pre;
    c.residual = ResidualMode::denseformer;
    EXPECT_EQ(ParamLayout(c).total() - base, dense11);
    EXPECT_EQ(dense11, layers * (layers + 3) / 2);
    c.dwa_dilation = 4;
    c.dwa_period = 5;
    EXPECT_EQ(ParamLayout(c).total() - base, dense45);
    EXPECT_EQ(ParamLayout(c).total() - base, kernels::dwa_parameter_count(layers, 4, 5));
    ModelConfig v = pre;
    v.value_residual = true;
    EXPECT_EQ(ParamLayout(v).total(), base);  // fixed: no parameters
    v.vres_mode = kernels::VresMode::learned_convex;
    EXPECT_EQ(ParamLayout(v).total() - base, layers - 1);
    v.vres_mode = kernels::VresMode::learned_pair;
    EXPECT_EQ(ParamLayout(v).total() - base, 2 * (layers - 1));
    ModelConfig h = pre;
    h.residual = ResidualMode::hc;
    EXPECT_EQ(ParamLayout(h).total() - base, hc_dynamic);
    h.hc_dynamic = false;
    EXPECT_EQ(ParamLayout(h).total() - base, hc_static);
    h.residual = ResidualMode::mhc;
    EXPECT_EQ(ParamLayout(h).total() - base, mhc);
    ModelConfig u = pre;
    u.residual = ResidualMode::mudd;
    EXPECT_EQ(ParamLayout(u).total() - base, mudd);
    u.mudd_prepost_norm = true;  // (L+1) source norms, a generator and a post norm per DA
    EXPECT_EQ(ParamLayout(u).total() - base, mudd + (3 * layers + 1) * d);
  }
}

TEST(Invariants, BaselineParametersInitByNameAndFollowTheDecayPolicy) {
  ModelConfig c = tiny_config(ResidualMode::denseformer, ValueRoute::decoupled, 3);
  c.value_residual = true;
  c.vres_mode = kernels::VresMode::learned_pair;
  c.vres_lambda1 = 0.25;
  c.vres_lambda2 = 0.75;
  const ParamLayout layout(c);
  std::vector<float> a(layout.total());
  init_params<float>(layout, 1, std::span<float>(a));
  auto values = [&](const std::string& name) {
    const ParamInfo& p = layout.at(name);
    return std::vector<float>(a.begin() + p.offset, a.begin() + p.offset + p.numel);
  };
  EXPECT_EQ(values("dwa.1.alpha"), (std::vector<float>{0, 1}));
  EXPECT_EQ(values("dwa.3.alpha"), (std::vector<float>{0, 0, 0, 1}));
  EXPECT_EQ(values("layers.2.attn.vres_lambda"), (std::vector<float>{0.25f, 0.75f}));
  EXPECT_EQ(layout.find("layers.0.attn.vres_lambda"), nullptr);  // the first layer keeps its own V
  EXPECT_TRUE(layout.at("dwa.2.alpha").weight_decay());         // the official code's policy
  EXPECT_FALSE(layout.at("layers.1.attn.vres_lambda").weight_decay());
  c.dwa_weight_decay = false;
  EXPECT_FALSE(ParamLayout(c).at("dwa.2.alpha").weight_decay());
  // Shared tensors draw the same values as in prenorm: the new parameters consume no RNG.
  ModelConfig pre = tiny_config(ResidualMode::prenorm, ValueRoute::decoupled, 3);
  const ParamLayout pl(pre);
  std::vector<float> b(pl.total());
  init_params<float>(pl, 1, std::span<float>(b));
  for (const auto& p : pl.params()) {
    const ParamInfo& q = layout.at(p.name);
    EXPECT_EQ(std::memcmp(b.data() + p.offset, a.data() + q.offset, sizeof(float) * p.numel), 0) << p.name;
  }
  c.dwa_dilation = 0;
  EXPECT_THROW(c.validate(), Error);
}

namespace {

// Logits and every shared parameter's gradient of two double models with the same shared weights.
void expect_close_function(Model<double>& a, Model<double>& b, double tolerance, const std::string& what) {
  const auto tokens = random_tokens(B, T, a.config().vocab_size, 9);
  std::vector<std::int32_t> inputs;
  for (int r = 0; r < B; ++r)
    for (int t = 0; t < T; ++t) inputs.push_back(tokens[r * (T + 1) + t]);
  std::vector<double> la(B * T * a.config().vocab_size), lb(la.size());
  a.logits(inputs, B, T, la);
  b.logits(inputs, B, T, lb);
  EXPECT_LT(max_rel_error(lb, la), tolerance) << what << ": logits";
  a.forward_backward(tokens, B, T);
  b.forward_backward(tokens, B, T);
  for (const auto& p : a.layout().params()) {
    const ParamInfo& q = b.layout().at(p.name);
    const std::span<const double> ga(a.grads().data() + p.offset, p.numel), gb(b.grads().data() + q.offset, q.numel);
    EXPECT_LT(max_rel_error(gb, ga), tolerance) << what << ": grad " << p.name;
  }
}

// A prenorm model with random weights, and a model of `streams`'s config at its initialisation
// with prenorm's weights for the shared tensors.
void expect_init_equals_prenorm(ModelConfig streams, double tolerance, const std::string& what) {
  ModelConfig pre = streams;
  pre.residual = ResidualMode::prenorm;
  Model<double> a(pre, B, T, true), b(streams, B, T, true);
  randomize_weights(a, 3);
  init_params<double>(b.layout(), 3, b.params());
  for (const auto& p : b.layout().params())
    if (const ParamInfo* q = a.layout().find(p.name))
      std::memcpy(b.params().data() + p.offset, a.params().data() + q->offset, sizeof(double) * p.numel);
  expect_close_function(a, b, tolerance, what);
}

}  // namespace

TEST(Invariants, HyperConnectionsAtInitEqualPrenormUpToTheFinalNormsEpsilon) {
  // baselines-spec §3.1, §6.1: every stream stays the pre-norm stream and the readout is n x, which
  // the final RMSNorm removes (exactly as eps -> 0). Gradients of the shared weights agree too.
  for (bool dynamic : {true, false}) {
    for (int n : {1, 3, 4}) {
      ModelConfig c = tiny_config(ResidualMode::hc, ValueRoute::decoupled, 3);
      c.hc_n = n;
      c.hc_dynamic = dynamic;
      c.norm_eps = 0;
      const std::string what = "hc n=" + std::to_string(n) + (dynamic ? " dynamic" : " static");
      expect_init_equals_prenorm(c, 1e-12, what);
      c.norm_eps = 1e-6;  // eps / n^2 instead of eps in the final norm
      expect_init_equals_prenorm(c, 1e-5, what + " eps 1e-6");
    }
  }
}

TEST(Invariants, MhcWithZeroPhiAndZeroPostBiasEqualsPrenormUpToEpsilon) {
  // baselines-spec §4.1, §6.1: with phi = 0 and b_post = 0 the streams stay equal; H_pre only scales
  // the sublayer input (its RMSNorm removes that), H_post = 1, H_res is doubly stochastic.
  for (auto order : kernels::kSinkhornOrders) {
    for (auto bias : kMhcBiasInits) {
      ModelConfig c = tiny_config(ResidualMode::mhc, ValueRoute::decoupled, 3);
      c.mhc_n = 3;
      c.mhc_phi_std = 0;
      c.mhc_bias_init = bias;
      c.mhc_sinkhorn_order = order;
      c.norm_eps = 0;
      expect_init_equals_prenorm(c, 1e-12, "mhc " + kernels::to_string(order) + " bias " + to_string(bias));
    }
  }
  // At the default phi ~ N(0, 0.02) it is only approximately prenorm.
  ModelConfig c = tiny_config(ResidualMode::mhc, ValueRoute::decoupled, 3);
  c.norm_eps = 0;
  ModelConfig pre = c;
  pre.residual = ResidualMode::prenorm;
  Model<double> a(pre, B, T, false), b(c, B, T, false);
  init_params<double>(b.layout(), 3, b.params());
  EXPECT_NE(b.params()[b.layout().at("mhc.0.phi").offset], 0.0);
}

TEST(Invariants, StreamParametersInitByNameAndFollowTheDecayPolicy) {
  ModelConfig c = tiny_config(ResidualMode::hc, ValueRoute::decoupled, 2);
  c.hc_n = 3;
  c.hc_scale_init = 0.25;
  const ParamLayout layout(c);
  std::vector<float> a(layout.total());
  init_params<float>(layout, 1, std::span<float>(a));
  auto values = [&](const ParamLayout& l, const std::vector<float>& v, const std::string& name) {
    const ParamInfo& p = l.at(name);
    return std::vector<float>(v.begin() + p.offset, v.begin() + p.offset + p.numel);
  };
  // A = [A_m | A_r] with A_m = e_{j mod n}, A_r = I (row-major n x (n+1)); sublayer 1's home is stream 1,
  // sublayer 3's is stream 0.
  EXPECT_EQ(values(layout, a, "hc.1.A"), (std::vector<float>{0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1}));
  EXPECT_EQ(values(layout, a, "hc.3.A"), (std::vector<float>{1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}));
  EXPECT_EQ(layout.at("hc.0.A").shape, (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(layout.at("hc.0.w_alpha").shape, (std::vector<std::int64_t>{4, c.d_model}));
  EXPECT_EQ(values(layout, a, "hc.2.B"), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(values(layout, a, "hc.2.s_alpha"), (std::vector<float>{0.25f}));
  EXPECT_EQ(values(layout, a, "hc.2.s_beta"), (std::vector<float>{0.25f}));
  for (float w : values(layout, a, "hc.0.w_alpha")) EXPECT_EQ(w, 0.0f);
  for (float w : values(layout, a, "hc.0.norm.weight")) EXPECT_EQ(w, 1.0f);
  for (const char* name : {"A", "B", "s_alpha", "s_beta", "norm.weight"})
    EXPECT_FALSE(layout.at(std::string("hc.1.") + name).weight_decay()) << name;
  for (const char* name : {"w_alpha", "w_beta"}) EXPECT_TRUE(layout.at(std::string("hc.1.") + name).weight_decay());
  c.hc_dynamic = false;
  EXPECT_EQ(ParamLayout(c).find("hc.0.w_alpha"), nullptr);

  ModelConfig m = tiny_config(ResidualMode::mhc, ValueRoute::decoupled, 2);
  m.mhc_n = 2;
  m.mhc_alpha_init = 0.125;
  const ParamLayout ml(m);
  std::vector<float> b(ml.total());
  init_params<float>(ml, 1, std::span<float>(b));
  EXPECT_EQ(ml.at("mhc.0.phi").shape, (std::vector<std::int64_t>{8, 2 * m.d_model}));
  // b = [pre | post | res]: +3 on the home stream j mod n, post 0, res 6I - 3.
  EXPECT_EQ(values(ml, b, "mhc.1.b"), (std::vector<float>{-3, 3, 0, 0, 3, -3, -3, 3}));
  EXPECT_EQ(values(ml, b, "mhc.2.b"), (std::vector<float>{3, -3, 0, 0, 3, -3, -3, 3}));
  EXPECT_EQ(values(ml, b, "mhc.0.alpha"), (std::vector<float>{0.125f, 0.125f, 0.125f}));
  EXPECT_TRUE(ml.at("mhc.0.phi").weight_decay());
  EXPECT_FALSE(ml.at("mhc.0.alpha").weight_decay());
  EXPECT_FALSE(ml.at("mhc.0.b").weight_decay());
  m.mhc_bias_init = MhcBiasInit::zero;
  {
    const ParamLayout zl(m);
    std::vector<float> z(zl.total());
    init_params<float>(zl, 1, std::span<float>(z));
    for (float v : values(zl, z, "mhc.1.b")) EXPECT_EQ(v, 0.0f);
    // phi comes from its own named stream: another seed, other values; the same seed, the same.
    std::vector<float> z2(zl.total());
    init_params<float>(zl, 2, std::span<float>(z2));
    EXPECT_NE(values(zl, z, "mhc.1.phi"), values(zl, z2, "mhc.1.phi"));
    EXPECT_EQ(values(zl, z, "mhc.1.phi"), values(ml, b, "mhc.1.phi"));
  }
  // Shared tensors draw the same values as in prenorm: the new parameters consume no RNG.
  for (const ModelConfig& cfg : {c, m}) {
    ModelConfig pre = cfg;
    pre.residual = ResidualMode::prenorm;
    const ParamLayout pl(pre), sl(cfg);
    std::vector<float> p(pl.total()), s(sl.total());
    init_params<float>(pl, 1, std::span<float>(p));
    init_params<float>(sl, 1, std::span<float>(s));
    for (const auto& info : pl.params()) EXPECT_EQ(values(pl, p, info.name), values(sl, s, info.name)) << info.name;
  }
}

TEST(Invariants, StreamConfigsAreValidatedAndOldConfigsLoad) {
  auto message = [](ModelConfig c) {
    try {
      c.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ModelConfig c = tiny_config(ResidualMode::hc);
  c.hc_n = 0;
  EXPECT_NE(message(c).find("hc_n"), std::string::npos) << message(c);
  c.hc_n = kernels::kMaxStreams + 1;
  EXPECT_NE(message(c).find("hc_n"), std::string::npos) << message(c);
  c.hc_n = kernels::kMaxStreams;
  EXPECT_EQ(message(c), "");
  c.mhc_n = 9;
  EXPECT_NE(message(c).find("mhc_n"), std::string::npos);
  c.mhc_n = 4;
  c.mhc_sinkhorn_iters = 0;
  EXPECT_NE(message(c).find("mhc_sinkhorn_iters"), std::string::npos);
  c.mhc_sinkhorn_iters = 20;
  c.mhc_phi_std = -1;
  EXPECT_NE(message(c).find("mhc_phi_std"), std::string::npos);
  // A config written before these keys existed reads with their defaults.
  nlohmann::json j = tiny_config(ResidualMode::block);
  for (const char* key : {"hc_n", "hc_dynamic", "hc_tanh", "hc_scale_init", "hc_reduce", "mhc_n", "mhc_sinkhorn_iters",
                          "mhc_sinkhorn_order", "mhc_alpha_init", "mhc_phi_std", "mhc_bias_init", "mhc_pre_eps",
                          "mhc_reduce"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    j.erase(key);
  }
  const ModelConfig old = model_config_from_json(j, "old.json");
  EXPECT_EQ(old.hc_n, 4);
  EXPECT_EQ(old.mhc_n, 4);
  EXPECT_EQ(old.mhc_sinkhorn_iters, 20);
  EXPECT_EQ(old.mhc_sinkhorn_order, kernels::SinkhornOrder::col_row);
  EXPECT_EQ(old.mhc_bias_init, MhcBiasInit::home_pm3);
  EXPECT_TRUE(old.hc_dynamic && old.hc_tanh);
  EXPECT_EQ(old.hc_scale_init, 0.01);
  EXPECT_EQ(old.mhc_alpha_init, 0.01);
  EXPECT_EQ(old.mhc_phi_std, 0.02);
  EXPECT_EQ(old.mhc_pre_eps, 0.0);
  EXPECT_EQ(old.hc_reduce, StreamReadout::sum);
  EXPECT_EQ(old.mhc_reduce, StreamReadout::sum);
  nlohmann::json bad = tiny_config(ResidualMode::mhc);
  bad["mhc_sinkhorn_order"] = "diagonal";
  EXPECT_THROW(model_config_from_json(bad, "bad.json"), Error);
}

// ------------------------------------------------------------------ MUDD (baselines-spec §2, §6.1)

namespace {

// The MUDD variants of model_util.hpp on a 3-layer prenorm base (one 4-way DA, then the last).
std::vector<Variant> mudd_variants() {
  std::vector<Variant> v;
  for (const Variant& x : all_variants())
    if (x.residual == ResidualMode::mudd && !x.value_residual) v.push_back(x);
  return v;
}

}  // namespace

TEST(Invariants, MuddAtInitialisationComputesPrenormsFunctionBitForBit) {
  const auto variants = mudd_variants();
  ASSERT_GE(variants.size(), 5u);
  for (const Variant& v : variants) {
    for (bool sep : {true, false}) {
      const ModelConfig pre = tiny_config(ResidualMode::prenorm, ValueRoute::decoupled, 3);
      ModelConfig mc = v.apply(pre);
      mc.mudd_sep_qkv_norm = sep;
      const std::string what = v.name + (sep ? "" : " (one attention norm)");
      Model<float> a(pre, B, T, true), b(mc, B, T, true);
      randomize_weights(a, 3);
      init_params<float>(b.layout(), 3, b.params());  // W2 = 0, a = e_last (PrePost: a = 0, post norm 1e-3)
      copy_shared_weights(a, b);
      // The K and V norms start where Q's does (1 at a real initialisation; here prenorm's weights).
      for (int i = 0; i < mc.n_layers; ++i) {
        const std::string p = "layers." + std::to_string(i) + ".";
        const ParamInfo& q = b.layout().at(p + "attn_norm.weight");
        for (const char* other : {"attn_norm_k.weight", "attn_norm_v.weight"})
          if (const ParamInfo* o = b.layout().find(p + other))
            std::memcpy(b.params().data() + o->offset, b.params().data() + q.offset, sizeof(float) * q.numel);
      }
      const auto tokens = random_tokens(B, T, pre.vocab_size, 9);
      std::vector<std::int32_t> inputs;
      for (int r = 0; r < B; ++r)
        for (int t = 0; t < T; ++t) inputs.push_back(tokens[r * (T + 1) + t]);
      std::vector<float> la(B * T * pre.vocab_size), lb(la.size());
      a.logits(inputs, B, T, la);
      b.logits(inputs, B, T, lb);
      EXPECT_TRUE(bitwise_equal(la, lb)) << what << ": logits";
      EXPECT_EQ(a.forward_backward(tokens, B, T), b.forward_backward(tokens, B, T)) << what;
      // The gradients agree to rounding (MUDD sums the streams' gradients in another order); the
      // three attention norms of a block share prenorm's one.
      for (const auto& p : a.layout().params()) {
        auto g = grad_of(b, p.name);
        const auto dot = p.name.find(".attn_norm.weight");
        if (dot != std::string::npos)
          for (const char* other : {".attn_norm_k.weight", ".attn_norm_v.weight"})
            if (b.layout().find(p.name.substr(0, dot) + other) != nullptr) {
              const auto go = grad_of(b, p.name.substr(0, dot) + other);
              for (std::size_t i = 0; i < g.size(); ++i) g[i] += go[i];
            }
        EXPECT_LT(max_rel_error(g, grad_of(a, p.name)), 1e-5) << what << ": " << p.name;
      }
      // The static weights learn from the first step on (W1, the generator norm and, with
      // PrePost, the source norms get zero gradient while W2 = 0 and a = 0).
      for (int i = 0; i < mc.n_layers; ++i) {
        double mag = 0;
        for (float x : grad_of(b, "mudd." + std::to_string(i) + ".a")) mag = std::max(mag, double(std::abs(x)));
        EXPECT_GT(mag, 0.0) << what << ": mudd." << i << ".a";
        if (mc.mudd_dynamic) {
          mag = 0;
          for (float x : grad_of(b, "mudd." + std::to_string(i) + ".w2")) mag = std::max(mag, double(std::abs(x)));
          EXPECT_GT(mag, 0.0) << what << ": mudd." << i << ".w2";
        }
      }
    }
  }
}

TEST(Invariants, MuddParametersInitByNameAndFollowTheDecayPolicy) {
  ModelConfig c = tiny_config(ResidualMode::mudd, ValueRoute::decoupled, 3);
  c.d_model = 64;
  c.n_heads = 4;
  c.mlp_hidden = 96;
  const ParamLayout layout(c);
  std::vector<float> a(layout.total());
  init_params<float>(layout, 1, std::span<float>(a));
  auto values = [&](const ParamLayout& l, const std::vector<float>& buf, const std::string& name) {
    const ParamInfo& p = l.at(name);
    return std::vector<float>(buf.begin() + p.offset, buf.begin() + p.offset + p.numel);
  };
  // Shapes (spec §2.1: K rounds up past a multiple of 64; the last DA has R alone and e = 4).
  EXPECT_EQ(layout.at("mudd.0.w1").shape, (std::vector<std::int64_t>{64, 64}));  // C*S = 4*2 = 8 -> 64
  EXPECT_EQ(layout.at("mudd.0.w2").shape, (std::vector<std::int64_t>{8, 64}));
  EXPECT_EQ(layout.at("mudd.1.w2").shape, (std::vector<std::int64_t>{12, 64}));
  EXPECT_EQ(layout.at("mudd.2.a").shape, (std::vector<std::int64_t>{1, 4}));
  EXPECT_EQ(layout.at("mudd.2.w1").shape, (std::vector<std::int64_t>{64, 64}));  // 1*4*4 = 16 -> 64
  // W1 ~ N(0, 1/d); W2 = 0; a = e_last in every way.
  double ss = 0;
  for (float x : values(layout, a, "mudd.1.w1")) ss += double(x) * x;
  EXPECT_NEAR(std::sqrt(ss / layout.at("mudd.1.w1").numel), 1.0 / 8.0, 0.01);
  for (float x : values(layout, a, "mudd.0.w2")) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(values(layout, a, "mudd.1.a"), (std::vector<float>{0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1}));
  EXPECT_EQ(values(layout, a, "mudd.2.a"), (std::vector<float>{0, 0, 0, 1}));
  EXPECT_EQ(values(layout, a, "layers.1.attn_norm_k.weight"), std::vector<float>(64, 1.0f));
  // Decay: every mudd.* parameter by default (the official code), the matrices only without.
  for (const char* name : {"mudd.0.w1", "mudd.0.w2", "mudd.0.a"}) EXPECT_TRUE(layout.at(name).weight_decay()) << name;
  EXPECT_FALSE(layout.at("layers.0.attn_norm_k.weight").weight_decay());
  ModelConfig nd = c;
  nd.mudd_decay_all = false;
  nd.mudd_prepost_norm = true;
  EXPECT_TRUE(ParamLayout(nd).at("mudd.1.w2").weight_decay());
  for (const char* name : {"mudd.1.a", "mudd.1.gen_norm.weight", "mudd.1.post_norm.weight", "mudd.src_norm.3.weight"})
    EXPECT_FALSE(ParamLayout(nd).at(name).weight_decay()) << name;
  // PrePostDANorm: a = 0, the post norm 1e-3, the other norms 1.
  ModelConfig pp = c;
  pp.mudd_prepost_norm = true;
  const ParamLayout lp(pp);
  std::vector<float> b(lp.total());
  init_params<float>(lp, 1, std::span<float>(b));
  EXPECT_EQ(values(lp, b, "mudd.1.a"), std::vector<float>(12, 0.0f));
  EXPECT_EQ(values(lp, b, "mudd.2.post_norm.weight"), std::vector<float>(64, 1e-3f));
  EXPECT_EQ(values(lp, b, "mudd.src_norm.0.weight"), std::vector<float>(64, 1.0f));
  EXPECT_TRUE(lp.at("mudd.src_norm.0.weight").weight_decay());
  EXPECT_EQ(lp.find("mudd.src_norm.4.weight"), nullptr);
  // Static: no generator. mudd_ways = r: one attention norm.
  ModelConfig st = c;
  st.mudd_dynamic = false;
  EXPECT_EQ(ParamLayout(st).find("mudd.0.w1"), nullptr);
  ModelConfig r = c;
  r.mudd_ways = MuddWays::r;
  EXPECT_EQ(ParamLayout(r).find("layers.0.attn_norm_k.weight"), nullptr);
  EXPECT_EQ(ParamLayout(r).at("mudd.0.a").shape, (std::vector<std::int64_t>{1, 2}));
  // The new parameters draw nothing from the shared streams: prenorm's tensors are identical.
  ModelConfig pre = c;
  pre.residual = ResidualMode::prenorm;
  const ParamLayout pl(pre);
  std::vector<float> p0(pl.total());
  init_params<float>(pl, 1, std::span<float>(p0));
  for (const auto& p : pl.params())
    EXPECT_EQ(values(pl, p0, p.name), values(layout, a, p.name)) << p.name;
}

TEST(Invariants, MuddConfigKeysValidateAndDefault) {
  // A config written before the MUDD keys existed loads with the official defaults.
  nlohmann::json j;
  to_json(j, tiny_config(ResidualMode::mudd));
  for (const char* key : {"mudd_ways", "mudd_dynamic", "mudd_hidden_round", "mudd_last_expand", "mudd_gelu",
                          "mudd_sep_qkv_norm", "mudd_prepost_norm", "mudd_decay_all"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    j.erase(key);
  }
  const ModelConfig c = model_config_from_json(j, "old.json");
  EXPECT_EQ(c.residual, ResidualMode::mudd);
  EXPECT_EQ(c.mudd_ways, MuddWays::qkvr);
  EXPECT_TRUE(c.mudd_dynamic);
  EXPECT_EQ(c.mudd_hidden_round, 64);
  EXPECT_EQ(c.mudd_last_expand, 4);
  EXPECT_EQ(c.mudd_gelu, kernels::Gelu::erf);
  EXPECT_TRUE(c.mudd_sep_qkv_norm);
  EXPECT_FALSE(c.mudd_prepost_norm);
  EXPECT_TRUE(c.mudd_decay_all);
  auto message = [](const ModelConfig& bad) {
    try {
      bad.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ModelConfig bad = c;
  bad.mudd_hidden_round = -1;
  EXPECT_NE(message(bad).find("mudd_hidden_round"), std::string::npos) << message(bad);
  bad = c;
  bad.mudd_last_expand = 0;
  EXPECT_NE(message(bad).find("mudd_last_expand"), std::string::npos) << message(bad);
  nlohmann::json w = j;
  w["mudd_ways"] = "qk";
  try {
    model_config_from_json(w, "x.json");
    ADD_FAILURE() << "mudd_ways = qk accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mudd_ways"), std::string::npos) << e.what();
  }
  w = j;
  w["mudd_gelu"] = "relu";
  EXPECT_THROW(model_config_from_json(w, "x.json"), Error);
  EXPECT_EQ(parse_residual_mode("mudd"), ResidualMode::mudd);
}

// Model::mudd_source_norms gives ‖X_j‖ of the sources each DA mixes (baselines-spec §6.5). With
// every block's attention and MLP outputs zeroed (W_O = W_down = 0), block b's output is its R
// input, so the sources follow directly from the embedding and the R weights: X_0 = emb,
// X_{i+2} = Σ_j dw[R,j] X_j (PrePostDANorm: X_{i+1} + RMSNorm_post(Σ_j dw[R,j] X^_j), X^_j =
// RMSNorm_j(X_j)). The norms must be those of these vectors, the normalised ones with PrePost.
TEST(Invariants, MuddSourceNormsAreTheNormsOfWhatEachDaMixes) {
  int checked = 0;
  for (const Variant& v : mudd_variants()) {
    if (v.mudd_ways != MuddWays::qkvr) continue;
    const ModelConfig c = tiny_config(v, 3);
    const int L = c.n_layers, d = c.d_model;
    Model<double> m(c, B, T, false);
    randomize_weights(m, 13);
    auto tensor = [&](const std::string& name) { return m.params().data() + m.layout().at(name).offset; };
    for (int i = 0; i < L; ++i)
      for (const char* zeroed : {".attn.wo.weight", ".mlp.w_down.weight"}) {
        const std::string name = "layers." + std::to_string(i) + zeroed;
        std::fill(tensor(name), tensor(name) + m.layout().at(name).numel, 0.0);
      }
    const auto tokens = random_tokens(B, T, c.vocab_size, 21);
    m.forward(tokens, B, T);
    // y = RMSNorm(x) with weight w.
    auto rmsnorm = [&](const std::vector<double>& x, const double* w) {
      double ms = 0;
      for (double e : x) ms += e * e / d;
      std::vector<double> y(x.size());
      for (int e = 0; e < d; ++e) y[e] = x[e] / std::sqrt(ms + c.norm_eps) * w[e];
      return y;
    };
    auto norm = [](const std::vector<double>& x) {
      double ss = 0;
      for (double e : x) ss += e * e;
      return std::sqrt(ss);
    };
    for (int r = 0; r < B; ++r)
      for (int t = 0; t < T; ++t) {
        const std::int64_t token = std::int64_t(r) * T + t;
        const int id = tokens[r * (T + 1) + t];
        std::vector<std::vector<double>> X = {std::vector<double>(tensor("tok_emb.weight") + id * d,
                                                                  tensor("tok_emb.weight") + (id + 1) * d)};
        std::vector<std::vector<double>> mixed;  // what the DAs read: X_j, or X^_j with PrePost
        auto add_source = [&](std::vector<double> x) {
          mixed.push_back(c.mudd_prepost_norm ? rmsnorm(x, tensor("mudd.src_norm." + std::to_string(X.size() - 1) +
                                                                  ".weight"))
                                              : x);
        };
        add_source(X[0]);
        X.push_back(std::vector<double>(X[0]));  // block 0 reads the embedding on every stream: X_1 = its R input
        add_source(X[1]);
        for (int i = 0; i < L; ++i) {
          const int S = c.mudd_da_sources(i);
          std::vector<double> got(static_cast<std::size_t>(S));
          m.mudd_source_norms(i, token, got);
          for (int j = 0; j < S; ++j) {
            EXPECT_NEAR(got[j], norm(mixed[j]), 1e-12 * norm(mixed[j])) << v.name << " DA " << i << " source " << j;
            ++checked;
          }
          if (i + 1 == L) break;
          std::vector<double> dw(static_cast<std::size_t>(S)), sum(static_cast<std::size_t>(d), 0.0);
          m.mudd_weights(i, 3, token, dw);  // the R way
          for (int j = 0; j < S; ++j)
            for (int e = 0; e < d; ++e) sum[e] += dw[j] * mixed[j][e];
          std::vector<double> next = sum;
          if (c.mudd_prepost_norm) {
            next = rmsnorm(sum, tensor("mudd." + std::to_string(i) + ".post_norm.weight"));
            for (int e = 0; e < d; ++e) next[e] += X[i + 1][e];
          }
          X.push_back(next);
          add_source(next);
        }
      }
  }
  EXPECT_GT(checked, 0);
  // Wrong queries are errors.
  Model<double> m(tiny_config(ResidualMode::mudd, ValueRoute::decoupled, 3), 1, 2, false);
  m.forward(random_tokens(1, 2, 11, 1), 1, 2);
  std::vector<double> two(2), three(3);
  EXPECT_NO_THROW(m.mudd_source_norms(0, 1, two));
  EXPECT_THROW(m.mudd_source_norms(0, 1, three), Error);
  EXPECT_THROW(m.mudd_source_norms(0, 2, two), Error);
  EXPECT_THROW(m.mudd_source_norms(3, 0, two), Error);
  Model<double> pre(tiny_config(ResidualMode::prenorm), 1, 2, false);
  pre.forward(random_tokens(1, 2, 11, 1), 1, 2);
  EXPECT_THROW(pre.mudd_source_norms(0, 0, two), Error);
}
