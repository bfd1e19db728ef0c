// The model FLOP count (bench/flops.hpp) against counts worked out by hand for one small model
// in every residual mode and value route, and the baselines' against baselines-spec §6.3.
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

// The S and M presets of baselines-spec §6.3 (16 x 576 and 24 x 832), in `mode` (n = 4 streams for hc, mhc).
ModelConfig preset(int layers, int d, ResidualMode mode) {
  ModelConfig s = small(mode);
  s.n_layers = layers;
  s.d_model = d;
  s.n_heads = d / 64;
  return s;
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
    const ModelConfig s = preset(layers, d, ResidualMode::mudd);
    EXPECT_DOUBLE_EQ(training_flops_per_token(s, kSeq).depth_reads, 3 * forward);
  }
}

TEST(FlopCount, Delta) {
  // delta: reads 1-3 over 2, 3, 4 sources: 4 d (2 + 3 + 4) + 3 (2 d) = 336; RMS of emb, f_0, f_1,
  // f_2: 4 (2 d) = 64. x3.
  ModelConfig c = small(ResidualMode::delta);
  expect_counts(c, 3 * 400.0);
  // delta_block (blocks of 2): reads over 2, 2, 3 sources: 224 + 48; the same four tensors.
  c.residual = ResidualMode::delta_block;
  expect_counts(c, 3 * 336.0);
  // The null source: every read (sublayer 0's too) one more source, one more tensor: 4 reads.
  c.residual = ResidualMode::delta;
  c.delta_null_source = true;
  expect_counts(c, 3 * (4 * 8 * (1 + 3 + 4 + 5) + 4 * 2 * 8 + 8 * 2 * 8.0));
  // docs/delta-gated-spec.md §1.6 at S: delta 1,287,936 and delta_block N = 8 458,496 forward FLOPs,
  // which count 2 d for sublayer 0 as well (it has no read here).
  ModelConfig s = preset(16, 576, ResidualMode::delta);
  EXPECT_DOUBLE_EQ(training_flops_per_token(s, kSeq).depth_reads, 3 * (1287936.0 - 2 * 576));
  s.residual = ResidualMode::delta_block;
  s.n_blocks = 8;
  EXPECT_DOUBLE_EQ(training_flops_per_token(s, kSeq).depth_reads, 3 * (458496.0 - 2 * 576));
}

TEST(FlopCount, HyperConnections) {
  // n = 4 (the default), d = 8, 4 sublayers. Static module 2 n d (n + 2) = 384, dynamic
  // 4 n d (n + 3) = 896; the exit's sum 2 (n - 1) d = 48. x3.
  ModelConfig c = small(ResidualMode::hc);
  ASSERT_EQ(c.hc_n, 4);
  expect_counts(c, 3 * (4 * 896 + 48));
  c.hc_dynamic = false;
  expect_counts(c, 3 * (4 * 384 + 48));
  c.hc_n = 2;  // module 2 * 2 * 8 * 4 = 128, exit 16
  expect_counts(c, 3 * (4 * 128 + 16));
  // baselines-spec §6.3: dynamic +2,067,840 forward FLOPs per token at S, +4,477,824 at M; static
  // +888,192 and +1,921,920 (each with the exit's 2 (n - 1) d).
  for (auto [layers, d, dynamic, forward] :
       {std::tuple{16, 576, true, 2067840.0}, std::tuple{24, 832, true, 4477824.0},
        std::tuple{16, 576, false, 888192.0}, std::tuple{24, 832, false, 1921920.0}}) {
    ModelConfig s = preset(layers, d, ResidualMode::hc);
    s.hc_dynamic = dynamic;
    EXPECT_DOUBLE_EQ(training_flops_per_token(s, kSeq).depth_reads, 3 * forward) << layers << " x " << d;
  }
}

TEST(FlopCount, Mhc) {
  // n = 4, d = 8, t_max = 20: 2 n d (n^2 + 2n) = 1536, 2 n^2 d = 256, 7 n d = 224, 4 n^2 t_max =
  // 1280: 3296 per module; the exit's sum 48. x3.
  ModelConfig c = small(ResidualMode::mhc);
  ASSERT_EQ(c.mhc_n, 4);
  ASSERT_EQ(c.mhc_sinkhorn_iters, 20);
  expect_counts(c, 3 * (4 * 3296 + 48));
  c.mhc_sinkhorn_iters = 5;  // Sinkhorn 320
  expect_counts(c, 3 * (4 * 2336 + 48));
  // baselines-spec §6.3: +4,685,824 forward FLOPs per token at S, +10,125,312 at M. Its mHC row
  // leaves out the exit's sum of the streams that its HC rows count (2 (n - 1) d); the trunk
  // has the same exit in both modes, so it is counted here too.
  for (auto [layers, d, forward] : {std::tuple{16, 576, 4685824.0}, std::tuple{24, 832, 10125312.0}}) {
    const ModelConfig s = preset(layers, d, ResidualMode::mhc);
    EXPECT_DOUBLE_EQ(training_flops_per_token(s, kSeq).depth_reads, 3 * (forward + 2 * 3 * d)) << layers << " x " << d;
  }
}

TEST(FlopCount, GatedResidual) {
  // n = 4, d = 8, r = d / 8 = 1: per sublayer module 4 n d r = 128 (W_down, W_up), 2 n² d = 256
  // (W_inject), 8 n d = 256 (norms, gated mean, write): 640; the final mixer 128 + 6 n d = 320. x3.
  ModelConfig c = small(ResidualMode::gr);
  expect_counts(c, 3 * (4 * 640 + 320));
  c.gr_n = 2;
  c.gr_rank = 3;  // module 4 * 2 * 8 * 3 = 192 + 64 + 128 = 384; mixer 192 + 96 = 288
  expect_counts(c, 3 * (4 * 384 + 288));
  // docs/delta-gated-spec.md §2.6: 23,033,664 forward FLOPs per token at S (r = 72) net of the 2L + 1
  // norms of 3d that GR drops, which the bench never counts; at M (r = 104) the same formula.
  for (auto [layers, d, net] : {std::tuple{16, 576, 23033664.0}, std::tuple{24, 832, 70291520.0}}) {
    const ModelConfig s = preset(layers, d, ResidualMode::gr);
    EXPECT_DOUBLE_EQ(training_flops_per_token(s, kSeq).depth_reads, 3 * (net + (2 * layers + 1) * 3.0 * d))
        << layers << " x " << d;
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
