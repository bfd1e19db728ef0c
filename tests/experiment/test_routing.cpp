// MUDD's routing distributions (model/diagnostics.hpp, baselines-spec §6.5) on a case small enough
// to compute by hand: two sources, norms ‖X_0‖ = 2, ‖X_1‖ = 1, and one token's dw per way.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/diagnostics.hpp"
#include "analysis/stats.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

std::vector<double> way(std::vector<float> dw, std::vector<float> norms) {
  std::vector<double> p(dw.size());
  mudd_way_distribution(dw, norms, p);
  return p;
}

TEST(MuddRouting, WaysAreWeighedBySourceNormsAndCompared) {
  const std::vector<float> norms = {2, 1};
  // |dw|·‖X‖: Q (1, 1), K (0, 3), V (3, 1). Signs do not matter, sizes do.
  const std::vector<double> q = way({0.5f, -1.0f}, norms), k = way({0.0f, 3.0f}, norms), v = way({-1.5f, 1.0f}, norms);
  EXPECT_EQ(q, (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(k, (std::vector<double>{0.0, 1.0}));
  EXPECT_EQ(v, (std::vector<double>{0.75, 0.25}));
  // JS(p_Q, p_V): M = (0.625, 0.375); JS(p_K, p_V): M = (0.375, 0.625), and 0·log 0 = 0.
  const double js_qv = 0.5 * (0.5 * std::log(0.5 / 0.625) + 0.5 * std::log(0.5 / 0.375)) +
                       0.5 * (0.75 * std::log(0.75 / 0.625) + 0.25 * std::log(0.25 / 0.375));
  const double js_kv = 0.5 * std::log(1 / 0.625) + 0.5 * (0.75 * std::log(0.75 / 0.375) + 0.25 * std::log(0.25 / 0.625));
  EXPECT_NEAR(js_qv, 0.0338221, 1e-7);  // the numbers above, worked out by hand
  EXPECT_NEAR(js_kv, 0.3803957, 1e-7);
  EXPECT_NEAR(js_divergence_nats(q, v), js_qv, 1e-15);
  EXPECT_NEAR(js_divergence_nats(k, v), js_kv, 1e-15);
  // A static weight still gives per-token distributions: the same dw on other source norms.
  EXPECT_EQ(way({0.5f, -1.0f}, {1, 3}), (std::vector<double>{0.5 / 3.5, 3 / 3.5}));
}

TEST(MuddRouting, AWayThatMixesNothingInPutsItsWeightOnTheCurrentBlock) {
  // PrePostDANorm at initialisation (dw = 0): the way carries X_{i+1}, the last source, alone.
  EXPECT_EQ(way({0, 0, 0}, {1, 2, 3}), (std::vector<double>{0, 0, 1}));
  EXPECT_EQ(way({1, -2, 0}, {0, 0, 5}), (std::vector<double>{0, 0, 1}));  // only zero sources weighted
  // The base variant's initialisation (dw = e_last) gives the same distribution.
  EXPECT_EQ(way({0, 0, 1}, {1, 2, 3}), (std::vector<double>{0, 0, 1}));
  EXPECT_THROW(way({1, 2}, {1, 2, 3}), Error);
}

}  // namespace
}  // namespace attnres::analysis
