// The fixed summation order shared by gradient accumulation and the MPI reduction.
#include <gtest/gtest.h>

#include <vector>

#include "dist/communicator.hpp"
#include "dist/tree_sum.hpp"
#include "util/rng.hpp"

using namespace attnres;

namespace {

std::vector<std::vector<float>> random_leaves(std::size_t n, std::size_t size, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<float>> leaves(n, std::vector<float>(size));
  // Mixed magnitudes, so different summation orders round differently.
  for (auto& l : leaves)
    for (auto& x : l) x = static_cast<float>((rng.uniform() - 0.5) * (rng.below(2) ? 1e4 : 1e-3));
  return leaves;
}

std::vector<float> streamed(const std::vector<std::vector<float>>& leaves) {
  const std::size_t size = leaves[0].size();
  dist::PairwiseSum<float> sum(size, leaves.size());
  for (auto leaf : leaves) sum.add(leaf);  // a copy: add() uses its argument as scratch
  std::vector<float> out(size);
  sum.result(out);
  return out;
}

}  // namespace

TEST(TreeSum, SplitPointIsTheLargestPowerOfTwoBelow) {
  EXPECT_EQ(dist::split_point(2), 1u);
  EXPECT_EQ(dist::split_point(3), 2u);
  EXPECT_EQ(dist::split_point(4), 2u);
  EXPECT_EQ(dist::split_point(5), 4u);
  EXPECT_EQ(dist::split_point(8), 4u);
  EXPECT_EQ(dist::split_point(9), 8u);
}

TEST(TreeSum, StreamingEqualsTheTreeBitForBit) {
  for (std::size_t n = 1; n <= 13; ++n) {
    const auto leaves = random_leaves(n, 257, n);
    std::vector<const float*> parts;
    for (const auto& l : leaves) parts.push_back(l.data());
    const auto got = streamed(leaves);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], dist::tree_sum_at<float>(parts, 0, n, i)) << "n=" << n << " i=" << i;
  }
}

TEST(TreeSum, RankSubtotalsReproduceOneProcess) {
  // 8 micro-batches: one process streaming all 8, against K ranks each streaming 8/K
  // consecutive ones and a tree over the K subtotals (what Communicator::sum does).
  const auto leaves = random_leaves(8, 1000, 7);
  const auto whole = streamed(leaves);
  for (std::size_t ranks : {2u, 4u, 8u}) {
    std::vector<std::vector<float>> subtotals;
    for (std::size_t r = 0; r < ranks; ++r)
      subtotals.push_back(streamed({leaves.begin() + r * 8 / ranks, leaves.begin() + (r + 1) * 8 / ranks}));
    std::vector<const float*> parts;
    for (const auto& s : subtotals) parts.push_back(s.data());
    for (std::size_t i = 0; i < whole.size(); ++i)
      ASSERT_EQ(whole[i], dist::tree_sum_at<float>(parts, 0, ranks, i)) << ranks << " ranks, i=" << i;
  }
}

TEST(TreeSum, OrderMattersSoTheTestCanFail) {
  // A left-to-right sum differs from the tree somewhere: the checks above are not vacuous.
  const auto leaves = random_leaves(8, 1000, 7);
  const auto tree = streamed(leaves);
  int differ = 0;
  for (std::size_t i = 0; i < tree.size(); ++i) {
    float seq = 0;
    for (const auto& l : leaves) seq += l[i];
    differ += seq != tree[i];
  }
  EXPECT_GT(differ, 0);
}

TEST(TreeSum, TooManyLeavesIsAnError) {
  dist::PairwiseSum<float> sum(3, 2);
  std::vector<float> leaf(3, 1.0f);
  sum.add(leaf);
  sum.add(leaf);
  EXPECT_THROW(sum.add(leaf), Error);
}

TEST(Communicator, SingleProcessIsANoOp) {
  dist::Communicator comm;
  EXPECT_EQ(comm.world(), 1);
  EXPECT_TRUE(comm.is_root());
  std::vector<float> x = {1.5f, -2.0f};
  comm.sum(x);
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(comm.sum(3.25), 3.25);
  EXPECT_TRUE(comm.any(true));
  EXPECT_FALSE(comm.any(false));
  EXPECT_EQ(comm.describe(), "");
}
