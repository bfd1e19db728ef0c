// Whole-model finite-difference gradient checks in float64, every mode and control,
// every parameter (pseudo-queries, key-norm weights and value queries included).
#include <gtest/gtest.h>

#include <limits>

#include "common/model_util.hpp"
#include "model/model.hpp"
#include "model/topology.hpp"

using namespace attnres;
using namespace attnres::testing;

namespace {

// Delta AttnRes's released Delta Block schedule has more reads of a single source (the softmax is
// then 1 whatever its query and key norm: zero gradient) than the first.
bool single_source_read_weight(const ModelConfig& c, const std::string& name) {
  const bool read_weight = name.find("query") != std::string::npos || name.find("key_norm") != std::string::npos;
  if (!c.uses_delta_reads() || name.find("_res.") == std::string::npos || !read_weight) return false;
  const int layer = std::stoi(name.substr(std::string("layers.").size()));
  const int j = 2 * layer + (name.find(".mlp_res.") != std::string::npos ? 1 : 0);
  return delta_read_sources(c, j).size() + (c.delta_null_source ? 1 : 0) <= 1;
}

void check_model_gradients(const ModelConfig& config) {
  const int B = 2, T = 5;
  Model<double> model(config, B, T, true);
  randomize_weights(model, 7);
  const auto tokens = random_tokens(B, T, config.vocab_size, 3);
  const double loss0 = model.forward_backward(tokens, B, T);
  const std::vector<double> analytic(model.grads().begin(), model.grads().end());
  auto loss = [&] { return model.forward(tokens, B, T); };
  // The central difference's rounding noise, |loss| eps / h (h = 1e-6): about 5e-10 here. A
  // tensor whose gradient is itself small (hc.*.w_beta without tanh: ~3e-4) is compared against
  // that floor, not relative to its own size alone; a missing term still errs by O(its size).
  const double noise = 4 * std::abs(loss0) * std::numeric_limits<double>::epsilon() / 1e-6;
  for (const auto& p : model.layout().params()) {
    std::span<double> x = model.params().subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel));
    const std::vector<double> numeric = numeric_gradient(loss, x);
    const std::span<const double> a(analytic.data() + p.offset, static_cast<std::size_t>(p.numel));
    double diff = 0, mag = 0;
    for (std::size_t i = 0; i < numeric.size(); ++i) {
      diff = std::max(diff, std::abs(a[i] - numeric[i]));
      mag = std::max(mag, std::abs(numeric[i]));
    }
    EXPECT_LT(diff, 1e-6 * mag + noise) << p.name << ": max |analytic - numeric| " << diff << ", max |numeric| " << mag;
    // A gradient that is zero everywhere can only be right where the spec says so. (mHC's zero
    // gradients of baselines-spec §4.4, H_res of the first sublayer, whose input streams are equal
    // copies, and of the last under the sum/mean readout, are parts of mhc.{j}.b and .phi, whose
    // H_pre and H_post parts do get gradients, so no tensor is exempt.)
    if (p.name.rfind("layers.0.attn_res.", 0) != 0 && !single_source_read_weight(config, p.name)) {
      // the first read has one source: zero gradient
      EXPECT_GT(mag, 0.0) << p.name << " has no gradient at all";
    }
  }
}

}  // namespace

class ModelGradients : public ::testing::TestWithParam<Variant> {};

TEST_P(ModelGradients, MatchFiniteDifferences) {
  const Variant v = GetParam();
  check_model_gradients(tiny_config(v));
}

TEST_P(ModelGradients, MatchFiniteDifferencesUntiedHead) {
  const Variant v = GetParam();
  ModelConfig c = tiny_config(v);
  c.tie_embeddings = false;
  check_model_gradients(c);
}

INSTANTIATE_TEST_SUITE_P(AllModes, ModelGradients, ::testing::ValuesIn(all_variants()),
                         [](const auto& info) { return info.param.name; });

TEST(ModelGradientsBlocks, FourBlocksOfTwoLayers) {
  // 4 layers, blocks of 4 sublayers: partial sums with several earlier outputs.
  check_model_gradients(tiny_config(ResidualMode::rd, ValueRoute::decoupled, 4, 2));
}
