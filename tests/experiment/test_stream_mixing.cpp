// The n-stream modes' depth diagnostics (model/stream_mixing.hpp) on small cases worked out
// by hand: the Amax gain of a matrix and of the composite H_res product, and the per-token
// unfolded connections c_kj = B_j (prod R) A_m^k averaged over tokens. Coefficients are laid out
// as the model saves them: per sublayer alpha [n, n+1] (column 0 the read A_m, alpha[i, k+1] =
// R[k, i]), then beta [n].
#include <gtest/gtest.h>

#include <vector>

#include "model/stream_mixing.hpp"
#include "results/run_result.hpp"
#include "util/error.hpp"

namespace attnres::experiment {
namespace {

// One sublayer's coefficients for n = 2 from the read a_m, the write matrix R (new = R old,
// row-major) and beta.
std::vector<double> sublayer2(std::vector<double> a_m, std::vector<double> R, std::vector<double> beta) {
  // alpha[i, 0] = a_m[i]; alpha[i, k+1] = R[k, i].
  return {a_m[0], R[0 * 2 + 0], R[1 * 2 + 0],  // alpha row i = 0
          a_m[1], R[0 * 2 + 1], R[1 * 2 + 1],  // alpha row i = 1
          beta[0], beta[1]};
}

std::vector<double> concat(std::vector<double> a, const std::vector<double>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(AmaxGain, IdentityIsNeutral) {
  const Gain g = amax_gain(std::vector<double>{1, 0, 0, 0, 1, 0, 0, 0, 1}, 3);
  EXPECT_EQ(g.forward, 1.0);
  EXPECT_EQ(g.backward, 1.0);
}

TEST(AmaxGain, ForwardIsTheLargestAbsoluteRowSumBackwardTheColumnSum) {
  // [[1, 2], [-3, 0.5]]: row sums 3, -2.5; column sums -2, 2.5.
  const Gain g = amax_gain(std::vector<double>{1, 2, -3, 0.5}, 2);
  EXPECT_EQ(g.forward, 3.0);
  EXPECT_EQ(g.backward, 2.5);
  // |sum|, not the sum of |entries|: [[1, -1], [0, 0]] keeps a common signal at 0 and 0.
  const Gain cancel = amax_gain(std::vector<double>{1, -1, 0, 0}, 2);
  EXPECT_EQ(cancel.forward, 0.0);
  EXPECT_EQ(cancel.backward, 1.0);
  EXPECT_THROW(amax_gain(std::vector<double>{1, 2, 3}, 2), Error);
}

TEST(AmaxGainSum, CompositeIsTheProductLaterSublayersLeft) {
  // Token 1: R0 = [[1, 2], [0, 3]], R1 = [[2, 0], [1, -1]]. P = R1 R0 = [[2, 4], [1, -1]]: row sums
  // 6, 0 (forward 6), column sums 3, 3 (backward 3). The wrong order R0 R1 = [[4, -2], [3, -3]]
  // would give (2, 7), and the transposes (A_r instead of A_r^T) would swap the two.
  // Single sublayers: R0 (3, 5), R1 (2, 3). Token 2: identities, gains 1.
  const std::vector<double> a_m = {1, 0}, beta = {1, 1};
  const std::vector<double> token1 =
      concat(sublayer2(a_m, {1, 2, 0, 3}, beta), sublayer2(a_m, {2, 0, 1, -1}, beta));
  const std::vector<double> token2 = concat(sublayer2(a_m, {1, 0, 0, 1}, beta), sublayer2(a_m, {1, 0, 0, 1}, beta));
  AmaxGainSum sum(2, 2);
  sum.add(token1);
  const results::AmaxGain one = sum.result();
  EXPECT_EQ(one.composite_forward_mean, 6.0);
  EXPECT_EQ(one.composite_backward_mean, 3.0);
  sum.add(token2);
  const results::AmaxGain g = sum.result();
  EXPECT_EQ(g.composite_forward_mean, 3.5);
  EXPECT_EQ(g.composite_forward_max, 6.0);
  EXPECT_EQ(g.composite_backward_mean, 2.0);
  EXPECT_EQ(g.composite_backward_max, 3.0);
  EXPECT_EQ(g.layer_forward_max, 3.0);
  EXPECT_EQ(g.layer_backward_max, 5.0);
  EXPECT_THROW(AmaxGainSum(2, 2).result(), Error);  // no token
  EXPECT_THROW(sum.add(std::span<const double>(token2).subspan(1)), Error);  // a token of the wrong size
}

TEST(AmaxGainSum, RowStochasticHresKeepsTheForwardGainAtOne) {
  // mHC: H_res (new = H_res old) with rows summing to 1 (Sinkhorn col -> row ends on the rows), its
  // columns not: [[0.5, 0.5], [0.9, 0.1]], column sums 1.4, 0.6. Twice: [[0.7, 0.3], [0.54, 0.46]],
  // rows 1 and 1, columns 1.24 and 0.76.
  const std::vector<double> h_res = {0.5, 0.5, 0.9, 0.1};
  const std::vector<double> layer = sublayer2({0.4, 0.6}, h_res, {1.2, 0.8});
  AmaxGainSum sum(2, 2);
  sum.add(concat(layer, layer));
  const results::AmaxGain g = sum.result();
  EXPECT_NEAR(g.composite_forward_max, 1.0, 1e-15);
  EXPECT_NEAR(g.composite_backward_max, 1.24, 1e-15);
  EXPECT_NEAR(g.layer_forward_max, 1.0, 1e-15);
  EXPECT_NEAR(g.layer_backward_max, 1.4, 1e-15);
}

TEST(UnfoldedConnections, ByHandAndAveragedPerToken) {
  // Token 1. Sublayer 0: A_m = (1, 0), R0 = [[1, 2], [0, 3]], B = (2, 0.5). Sublayer 1: A_m = (0, 1),
  // R1 = [[2, 0], [1, -1]], B = (1, -1). The embedding enters both streams with 1.
  //   target 0: emb 1
  //   target 1: emb A_m1 . R0 (1, 1) = (0, 1) . (3, 3) = 3;  sublayer 0: A_m1 . B0 = 0.5
  //   exit (sum): emb 1^T R1 R0 1 = |(6, 0)| = 6;  sublayer 0: 1^T R1 B0 = 4 + 1.5 = 5.5;  sublayer 1: 1^T B1 = 0
  const std::vector<double> token1 =
      concat(sublayer2({1, 0}, {1, 2, 0, 3}, {2, 0.5}), sublayer2({0, 1}, {2, 0, 1, -1}, {1, -1}));
  // Token 2: identities, A_m = (0, 1) then (1, 0), B = (0, 2) then (1, 1): target 1 reads emb 1 and
  // sublayer 0 with 0; the exit counts emb 2, sublayer 0 2, sublayer 1 2.
  const std::vector<double> token2 =
      concat(sublayer2({0, 1}, {1, 0, 0, 1}, {0, 2}), sublayer2({1, 0}, {1, 0, 0, 1}, {1, 1}));
  UnfoldedConnections sum(2, 2, 1.0);
  sum.add(token1);
  const results::Connections one = sum.mean("hc");
  EXPECT_EQ(one.name, "hc");
  ASSERT_EQ(one.rows.size(), 3u);
  EXPECT_EQ(one.rows[0].weights, (std::vector<double>{1}));
  EXPECT_EQ(one.rows[1].weights, (std::vector<double>{3, 0.5}));
  EXPECT_EQ(one.rows[2].weights, (std::vector<double>{6, 5.5, 0}));
  sum.add(token2);
  const results::Connections c = sum.mean("hc");
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(c.rows[static_cast<std::size_t>(k)].target, k);
    ASSERT_EQ(c.rows[static_cast<std::size_t>(k)].sources.size(), static_cast<std::size_t>(k + 1));
    for (int s = 0; s <= k; ++s) EXPECT_EQ(c.rows[static_cast<std::size_t>(k)].sources[static_cast<std::size_t>(s)], s);
  }
  EXPECT_EQ(c.rows[0].weights, (std::vector<double>{1}));
  // The mean of the tokens' products, not the product of mean coefficients (which would give
  // sublayer 0 -> target 1 = (0.5, 0.5) . (1, 1.25) = 1.125).
  EXPECT_EQ(c.rows[1].weights, (std::vector<double>{2, 0.25}));
  EXPECT_EQ(c.rows[2].weights, (std::vector<double>{4, 3.75, 1}));
  // The mean readout weighs every stream 1/n.
  UnfoldedConnections mean_readout(2, 2, 0.5);
  mean_readout.add(token1);
  EXPECT_EQ(mean_readout.mean("hc").rows[2].weights, (std::vector<double>{3, 2.75, 0}));
  EXPECT_THROW(UnfoldedConnections(2, 2, 1.0).mean("hc"), Error);  // no token
}

TEST(UnfoldedConnections, MhcTakesHpreHpostAndHresInHcsRoles) {
  // With mHC's coefficients (H_pre = A_m, H_post = B, H_res = R): sublayer 1 reads sublayer 0's
  // output with H_pre1 . H_post0, and the exit with 1^T H_res1 H_post0.
  const std::vector<double> pre0 = {0.3, 0.7}, post0 = {1.5, 0.25}, res0 = {0.6, 0.4, 0.2, 0.8};
  const std::vector<double> pre1 = {0.9, 0.1}, post1 = {0.5, 1.0}, res1 = {0.5, 0.5, 0.9, 0.1};
  UnfoldedConnections sum(2, 2, 1.0);
  sum.add(concat(sublayer2(pre0, res0, post0), sublayer2(pre1, res1, post1)));
  const results::Connections c = sum.mean("mhc");
  EXPECT_EQ(c.name, "mhc");
  EXPECT_NEAR(c.rows[1].weights[1], 0.9 * 1.5 + 0.1 * 0.25, 1e-15);
  // H_res1 H_post0 = (0.5 * 1.5 + 0.5 * 0.25, 0.9 * 1.5 + 0.1 * 0.25) = (0.875, 1.375).
  EXPECT_NEAR(c.rows[2].weights[1], 0.875 + 1.375, 1e-15);
  // Rows of H_res summing to 1 carry the embedding's copies (1, 1) unchanged: the exit reads n = 2.
  EXPECT_NEAR(c.rows[2].weights[0], 2.0, 1e-15);
  EXPECT_NEAR(c.rows[1].weights[0], 1.0, 1e-15);  // H_pre1 . H_res0 (1, 1) = 0.9 + 0.1
}

}  // namespace
}  // namespace attnres::experiment
