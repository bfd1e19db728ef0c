// The residual topology (model/topology.hpp) of every mode at small sizes, against wiring written
// out by hand from docs/model.md: the sources of each read, the input and write base of each
// sublayer, the routes of RD's controls, and which parameters each read uses.
#include <gtest/gtest.h>

#include <vector>

#include "common/model_util.hpp"
#include "model/param_layout.hpp"
#include "model/topology.hpp"
#include "model/weights.hpp"

using namespace attnres;
using namespace attnres::testing;

namespace {

constexpr int E = kEmbedding;
constexpr int none = kNoStream;

std::vector<std::vector<int>> sources_of(const Topology& t) {
  std::vector<std::vector<int>> out;
  for (const ReadPlan& p : t.reads()) out.push_back(p.sources);
  return out;
}

std::vector<int> write_bases(const Topology& t) {
  std::vector<int> out;
  for (int j = 0; j < t.n_sublayers(); ++j) out.push_back(t.write_base(j));
  return out;
}

}  // namespace

TEST(Topology, RoleHelpers) {
  EXPECT_TRUE(is_attention(0));
  EXPECT_FALSE(is_attention(1));
  EXPECT_TRUE(is_attention(4));
  EXPECT_EQ(layer_of(0), 0);
  EXPECT_EQ(layer_of(1), 0);
  EXPECT_EQ(layer_of(5), 2);
  EXPECT_NE(kEmbedding, kNoStream);
  EXPECT_LT(kEmbedding, 0);
  EXPECT_LT(kNoStream, 0);
}

TEST(Topology, PrenormIsARunningSumWithoutReads) {
  const Topology t(tiny_config(ResidualMode::prenorm));  // 2 layers: sublayers 0..3
  EXPECT_EQ(t.n_sublayers(), 4);
  EXPECT_FALSE(t.has_reads());
  EXPECT_TRUE(t.reads().empty());
  EXPECT_EQ(t.max_sources(), 1);
  EXPECT_FALSE(t.any_separate_value());
  // Each sublayer normalises the stream entering it and adds its output to that stream; the
  // final norm reads the last sublayer's output.
  EXPECT_EQ((std::vector<int>{t.input(0), t.input(1), t.input(2), t.input(3), t.input(4)}),
            (std::vector<int>{E, 0, 1, 2, 3}));
  EXPECT_EQ(write_bases(t), (std::vector<int>{E, 0, 1, 2}));
  EXPECT_TRUE(make_read_plans(tiny_config(ResidualMode::prenorm)).empty());
}

TEST(Topology, FullReadsEveryEarlierOutput) {
  const Topology t(tiny_config(ResidualMode::full));
  ASSERT_TRUE(t.has_reads());
  EXPECT_EQ(t.final_read(), 4);
  EXPECT_EQ(sources_of(t), (std::vector<std::vector<int>>{
                               {E}, {E, 0}, {E, 0, 1}, {E, 0, 1, 2}, {E, 0, 1, 2, 3}}));
  // Every sublayer is a block of its own: no partial sum to add to.
  EXPECT_EQ(write_bases(t), (std::vector<int>{none, none, none, none}));
  EXPECT_EQ(t.max_sources(), 5);
  for (const ReadPlan& p : t.reads()) {
    EXPECT_EQ(p.n_routes, 1);
    EXPECT_FALSE(p.average || p.uniform_value || p.separate_value);
  }
}

TEST(Topology, BlockReadsCompletedBlocksAndThePartialSum) {
  // 4 layers in 2 blocks of 4 sublayers: b_1 is sublayer 3's output, b_2 sublayer 7's.
  const Topology t(tiny_config(ResidualMode::block, ValueRoute::decoupled, 4, 2));
  EXPECT_EQ(sources_of(t), (std::vector<std::vector<int>>{{E},
                                                          {E, 0},
                                                          {E, 1},
                                                          {E, 2},
                                                          {E, 3},
                                                          {E, 3, 4},
                                                          {E, 3, 5},
                                                          {E, 3, 6},
                                                          {E, 3, 7}}));
  EXPECT_EQ(write_bases(t), (std::vector<int>{none, 0, 1, 2, none, 4, 5, 6}));
  EXPECT_EQ(t.max_sources(), 3);
  EXPECT_FALSE(t.any_separate_value());

  // 2 layers in 2 blocks of 2.
  const Topology small(tiny_config(ResidualMode::block));
  EXPECT_EQ(sources_of(small), (std::vector<std::vector<int>>{{E}, {E, 0}, {E, 1}, {E, 1, 2}, {E, 1, 3}}));
  EXPECT_EQ(write_bases(small), (std::vector<int>{none, 0, none, 2}));
}

// Issue #49: the groups of the CUDA backend's batched read backward.
std::vector<std::vector<int>> groups_of(const Topology& t, int max_reads) {
  std::vector<std::vector<int>> out;
  for (const ReadGroup& g : t.read_groups(max_reads)) out.push_back({g.lo, g.hi, g.n_shared});
  return out;
}

TEST(Topology, ReadGroupsAreBlocksSharingTheirCompletedBlocks) {
  // 2 blocks of 4 (sources above): the final read joins the last block; {E, 3} and {E} shared.
  const Topology t(tiny_config(ResidualMode::block, ValueRoute::decoupled, 4, 2));
  EXPECT_EQ(groups_of(t, 8), (std::vector<std::vector<int>>{{4, 8, 2}, {0, 3, 1}}));
  // At most 3 reads a group: a block splits from the top; a group that does not start at the
  // block's first sublayer still shares only the completed blocks (read 5's partial sum 4 is
  // not read 6's).
  EXPECT_EQ(groups_of(t, 3), (std::vector<std::vector<int>>{{6, 8, 2}, {4, 5, 2}, {1, 3, 1}, {0, 0, 1}}));
  // One read a group: a read shares all its sources written before it (read 4: {E, 3}).
  EXPECT_EQ(groups_of(t, 1).front(), (std::vector<int>{8, 8, 3}));
  EXPECT_EQ(groups_of(t, 1)[4], (std::vector<int>{4, 4, 2}));
  // Full: one sublayer a block; the final read joins the last sublayer's read.
  const Topology full(tiny_config(ResidualMode::full));
  EXPECT_EQ(groups_of(full, 8), (std::vector<std::vector<int>>{{3, 4, 4}, {2, 2, 3}, {1, 1, 2}, {0, 0, 1}}));
  // RD: the same groups as block (its routes do not change the sources); none without reads.
  EXPECT_EQ(groups_of(Topology(tiny_config(ResidualMode::rd, ValueRoute::decoupled, 4, 2)), 8), groups_of(t, 8));
  EXPECT_TRUE(Topology(tiny_config(ResidualMode::prenorm)).read_groups(8).empty());
}

TEST(Topology, BlocksOfOneSublayerAreFull) {
  const ModelConfig c = tiny_config(ResidualMode::block, ValueRoute::decoupled, 2, 4);
  const Topology block(c), full(tiny_config(ResidualMode::full));
  EXPECT_EQ(sources_of(block), sources_of(full));
  EXPECT_EQ(write_bases(block), write_bases(full));
}

TEST(Topology, RdControlsShareBlocksSourcesAndDifferInTheValueRoute) {
  const std::vector<std::vector<int>> block_sources = sources_of(Topology(tiny_config(ResidualMode::block)));
  const std::vector<int> block_bases = write_bases(Topology(tiny_config(ResidualMode::block)));
  struct Expected {
    ValueRoute route;
    int n_routes;
    bool average, uniform_value, separate_value;
  };
  for (const Expected& e : {Expected{ValueRoute::decoupled, 2, false, false, true},
                            Expected{ValueRoute::tied, 1, false, false, false},
                            Expected{ValueRoute::average, 2, true, false, false},
                            Expected{ValueRoute::frozen, 2, false, true, true}}) {
    SCOPED_TRACE(to_string(e.route));
    const Topology t(tiny_config(ResidualMode::rd, e.route));
    EXPECT_EQ(sources_of(t), block_sources);
    EXPECT_EQ(write_bases(t), block_bases);
    EXPECT_EQ(t.any_separate_value(), e.separate_value);
    for (int r = 0; r <= t.final_read(); ++r) {
      const ReadPlan& p = t.read(r);
      const bool attention_read = r < t.final_read() && is_attention(r);
      // Only attention sublayers' reads get RD's second route; MLP and final reads are Block's.
      EXPECT_EQ(p.n_routes, attention_read ? e.n_routes : 1) << "read " << r;
      EXPECT_EQ(p.average, attention_read && e.average) << "read " << r;
      EXPECT_EQ(p.uniform_value, attention_read && e.uniform_value) << "read " << r;
      EXPECT_EQ(p.separate_value, attention_read && e.separate_value) << "read " << r;
    }
  }
}

TEST(Topology, ReadParamsAndInputNormsNameTheRightTensors) {
  for (const ValueRoute route : {ValueRoute::decoupled, ValueRoute::tied, ValueRoute::average, ValueRoute::frozen}) {
    SCOPED_TRACE(to_string(route));
    const ModelConfig c = tiny_config(ResidualMode::rd, route);
    const ParamLayout layout(c);
    std::vector<float> flat(static_cast<std::size_t>(layout.total()));
    const ModelWeights<float> w = bind_weights<float>(c, layout, flat);
    const Topology t(c);
    auto at = [&](const std::string& name) -> float* {
      const ParamInfo* p = layout.find(name);
      return p == nullptr ? nullptr : flat.data() + p->offset;
    };
    // Layer 1's attention read (sublayer 2) and MLP read (sublayer 3), and the final read.
    const ReadParams<float> attn = read_params(w, t, 2);
    EXPECT_EQ(attn.query, at("layers.1.attn_res.query"));
    EXPECT_EQ(attn.key_norm, at("layers.1.attn_res.key_norm.weight"));
    const bool has_value_query = route == ValueRoute::decoupled || route == ValueRoute::average;
    EXPECT_EQ(attn.value_query, has_value_query ? at("layers.1.attn_res.value_query") : nullptr);
    const bool separate = route == ValueRoute::decoupled || route == ValueRoute::frozen;
    EXPECT_EQ(attn.value_norm, separate ? at("layers.1.attn_norm.weight") : nullptr);
    const ReadParams<float> mlp = read_params(w, t, 3);
    EXPECT_EQ(mlp.query, at("layers.1.mlp_res.query"));
    EXPECT_EQ(mlp.key_norm, at("layers.1.mlp_res.key_norm.weight"));
    EXPECT_EQ(mlp.value_query, nullptr);
    EXPECT_EQ(mlp.value_norm, nullptr);
    const ReadParams<float> fin = read_params(w, t, t.final_read());
    EXPECT_EQ(fin.query, at("final_res.query"));
    EXPECT_EQ(fin.key_norm, at("final_res.key_norm.weight"));
    EXPECT_EQ(fin.value_query, nullptr);
    EXPECT_EQ(fin.value_norm, nullptr);
    ASSERT_NE(fin.query, nullptr);

    EXPECT_EQ(input_norm(w, t.n_sublayers(), 2), at("layers.1.attn_norm.weight"));
    EXPECT_EQ(input_norm(w, t.n_sublayers(), 3), at("layers.1.mlp_norm.weight"));
    EXPECT_EQ(input_norm(w, t.n_sublayers(), t.n_sublayers()), at("final_norm.weight"));
  }
}

TEST(Topology, DenseFormerFeedsEachBlockItsDwaOutput) {
  // 4 layers, 2 x 2: DWAs after blocks 2 (X_0, X_2) and 4 (X_0, X_2, X_4); blocks 1 and 3 pass
  // their output on. X_i is sublayer 2i-1's output; Y_i is stream n_sublayers + i - 1.
  ModelConfig c = tiny_config(ResidualMode::denseformer, ValueRoute::decoupled, 4);
  c.dwa_dilation = 2;
  c.dwa_period = 2;
  const Topology t(c);
  EXPECT_FALSE(t.has_reads());
  ASSERT_EQ(t.dwas().size(), 2u);
  EXPECT_EQ(t.dwas()[0].block, 2);
  EXPECT_EQ(t.dwas()[0].sources, (std::vector<int>{E, 3}));
  EXPECT_EQ(t.dwas()[0].output, 9);
  EXPECT_EQ(t.dwas()[1].block, 4);
  EXPECT_EQ(t.dwas()[1].sources, (std::vector<int>{E, 3, 7}));
  EXPECT_EQ(t.dwas()[1].output, 11);
  EXPECT_TRUE(t.is_dwa_stream(9));
  EXPECT_FALSE(t.is_dwa_stream(7));
  std::vector<int> inputs;
  for (int j = 0; j <= 8; ++j) inputs.push_back(t.input(j));
  EXPECT_EQ(inputs, (std::vector<int>{E, 0, 1, 2, 9, 4, 5, 6, 11}));
  EXPECT_EQ(write_bases(t), (std::vector<int>{E, 0, 1, 2, 9, 4, 5, 6}));
  std::vector<int> ending;
  for (int j = 0; j < 8; ++j) ending.push_back(t.dwa_ending_at(j) ? t.dwa_ending_at(j)->block : 0);
  EXPECT_EQ(ending, (std::vector<int>{0, 0, 0, 2, 0, 0, 0, 4}));
  // 1 x 1: a DWA after every block, over all earlier outputs.
  c.dwa_dilation = c.dwa_period = 1;
  const Topology full(c);
  ASSERT_EQ(full.dwas().size(), 4u);
  EXPECT_EQ(full.dwas()[2].sources, (std::vector<int>{E, 1, 3, 5}));
  EXPECT_EQ(full.input(2), 8);
  // Other modes have none.
  EXPECT_TRUE(Topology(tiny_config(ResidualMode::prenorm)).dwas().empty());
  EXPECT_TRUE(Topology(tiny_config(ResidualMode::block)).dwas().empty());
}
