// The model FLOP count (bench/flops.hpp) against counts worked out by hand for one small model
// in every residual mode and value route.
#include <gtest/gtest.h>

#include <tuple>

#include "bench/flops.hpp"

namespace attnres::bench {
namespace {

// V = 100, d = 8, 2 layers (4 sublayers), F = 16, 2 blocks of 2 sublayers, T = 5.
ModelConfig small(ResidualMode residual, ValueRoute route = ValueRoute::decoupled) {
  ModelConfig c;
  c.vocab_size = 100;
  c.d_model = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.mlp_hidden = 16;
  c.n_blocks = 2;
  c.residual = residual;
  c.value_route = route;
  c.validate();
  return c;
}

constexpr int kSeq = 5;
// Every mode: dense 6 L (4 d^2 + 3 d F) = 12 (256 + 384) = 7680; LM head 6 V d = 4800;
// attention 6 L d (T + 1) = 6 * 2 * 8 * 6 = 576.
constexpr double kDense = 7680, kLmHead = 4800, kAttention = 576;

void expect_counts(const ModelConfig& c, double depth_reads) {
  const FlopCount f = training_flops_per_token(c, kSeq);
  EXPECT_DOUBLE_EQ(f.dense, kDense);
  EXPECT_DOUBLE_EQ(f.lm_head, kLmHead);
  EXPECT_DOUBLE_EQ(f.attention, kAttention);
  EXPECT_DOUBLE_EQ(f.depth_reads, depth_reads);
  EXPECT_DOUBLE_EQ(f.total(), kDense + kLmHead + kAttention + depth_reads);
}

TEST(FlopCount, Mudd) {
  // DA 0: C = 4 ways over S = 2 sources, K = 64 (8 rounds up to 64): d K + K C S + C S d = 512 +
  // 512 + 64; DA 1 (the last: R alone, e = 4): S = 3, K = 64 (12 -> 64): 512 + 192 + 24. x6.
  ModelConfig c = small(ResidualMode::mudd);
  expect_counts(c, 6 * (1088 + 728));
  c.mudd_dynamic = false;  // the mixes alone
  expect_counts(c, 6 * (64 + 24));
  // baselines-spec §6.3: +2,050,432 forward FLOPs per token at S (16 x 576), 5,904,256 at M.
  for (auto [layers, d, forward] : {std::tuple{16, 576, 2050432.0}, std::tuple{24, 832, 5904256.0}}) {
    ModelConfig s = small(ResidualMode::mudd);
    s.n_layers = layers;
    s.d_model = d;
    s.n_heads = d / 64;
    EXPECT_DOUBLE_EQ(training_flops_per_token(s, kSeq).depth_reads, 3 * forward);
  }
}

TEST(FlopCount, PrenormHasNoDepthReads) { expect_counts(small(ResidualMode::prenorm), 0); }

TEST(FlopCount, Block) {
  // Reads 0..4 (4 = the final read) see 1, 2, 2, 3, 3 sources: embedding, completed blocks, the
  // current block's partial sum. One route with a query, one output: 6 d (1 + 1 + 1) per source,
  // 6 * 8 * 3 * 11 = 1584.
  expect_counts(small(ResidualMode::block), 1584);
}

TEST(FlopCount, Full) {
  // One block per sublayer: reads see 1, 2, 3, 4, 5 sources (15); 6 * 8 * 3 * 15 = 2160.
  expect_counts(small(ResidualMode::full), 2160);
}

TEST(FlopCount, RdValueRoutes) {
  // Block's sources (1, 2, 2, 3, 3); the attention reads 0 and 2 have two routes.
  // decoupled: two queries, two outputs (factor 5): 1*5 + 2*3 + 2*5 + 3*3 + 3*3 = 39 -> 48 * 39.
  expect_counts(small(ResidualMode::rd, ValueRoute::decoupled), 48 * 39);
  // tied: one query serves both routes, as block: 48 * 33.
  expect_counts(small(ResidualMode::rd, ValueRoute::tied), 48 * 33);
  // average: two queries, one output (factor 4): 4 + 6 + 8 + 9 + 9 = 36.
  expect_counts(small(ResidualMode::rd, ValueRoute::average), 48 * 36);
  // frozen: the value route is uniform (no query), two outputs (factor 4): 36.
  expect_counts(small(ResidualMode::rd, ValueRoute::frozen), 48 * 36);
}

TEST(FlopCount, AttentionGrowsWithSeqAndTyingChangesNothing) {
  ModelConfig c = small(ResidualMode::block);
  EXPECT_DOUBLE_EQ(training_flops_per_token(c, 11).attention, 6 * 2 * 8 * 12);
  c.tie_embeddings = false;  // the LM head's matrix is counted once either way
  EXPECT_DOUBLE_EQ(training_flops_per_token(c, kSeq).lm_head, kLmHead);
}

}  // namespace
}  // namespace attnres::bench
