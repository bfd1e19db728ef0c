// Whole-model finite-difference gradient checks in float64, every mode and control,
// every parameter (pseudo-queries, key-norm weights and value queries included).
#include <gtest/gtest.h>

#include "common/model_util.hpp"
#include "model/model.hpp"

using namespace attnres;
using namespace attnres::testing;

namespace {

void check_model_gradients(const ModelConfig& config) {
  const int B = 2, T = 5;
  Model<double> model(config, B, T, true);
  randomize_weights(model, 7);
  const auto tokens = random_tokens(B, T, config.vocab_size, 3);
  model.forward_backward(tokens, B, T);
  const std::vector<double> analytic(model.grads().begin(), model.grads().end());
  auto loss = [&] { return model.forward(tokens, B, T); };
  for (const auto& p : model.layout().params()) {
    std::span<double> x = model.params().subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel));
    const std::vector<double> numeric = numeric_gradient(loss, x);
    const std::span<const double> a(analytic.data() + p.offset, static_cast<std::size_t>(p.numel));
    const double err = max_rel_error(a, std::span<const double>(numeric));
    EXPECT_LT(err, 1e-6) << p.name;
    // A gradient that is zero everywhere can only be right where the spec says so.
    double mag = 0;
    for (double v : numeric) mag = std::max(mag, std::abs(v));
    if (p.name.rfind("layers.0.attn_res.", 0) != 0) {  // the first read has one source: zero gradient
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
