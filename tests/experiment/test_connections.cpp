// The static depth connections result.json records (model/diagnostics.hpp): DenseFormer's DWA
// weights and static HC's unfolded dense connections, read from a weights file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "analysis/plots.hpp"
#include "analysis/tables.hpp"
#include "model/diagnostics.hpp"
#include "model/param_layout.hpp"
#include "model/safetensors.hpp"
#include "results/run_result.hpp"

namespace attnres::experiment {
namespace {

namespace fs = std::filesystem;

ModelConfig hc_config(bool dynamic) {
  ModelConfig c;
  c.vocab_size = 16;
  c.d_model = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.mlp_hidden = 16;
  c.residual = ResidualMode::hc;
  c.hc_n = 3;
  c.hc_dynamic = dynamic;
  return c;
}

// The connections of `config` with initial weights, after `edit` changes them.
std::vector<results::Connections> connections_of(const ModelConfig& config,
                                                 const std::function<void(const ParamLayout&, std::vector<double>&)>& edit) {
  const ParamLayout layout(config);
  std::vector<double> params(static_cast<std::size_t>(layout.total()));
  init_params<double>(layout, 1, params);
  edit(layout, params);
  const std::string path =
      (fs::temp_directory_path() / ("attnres-connections-" + std::to_string(::getpid()) + ".safetensors")).string();
  save_weights<double>(path, config, layout, params);
  const SafetensorsFile file = read_safetensors(path);
  fs::remove(path);
  return static_connections(config, file, path);
}

TEST(Connections, HcAtInitIsThePreNormSum) {
  // A_m = e_home, A_r = I, B = 1: every earlier output reaches every sublayer with weight 1, as in
  // pre-norm's running sum, and the sum readout counts each n times.
  const ModelConfig c = hc_config(false);
  const auto all = connections_of(c, [](const ParamLayout&, std::vector<double>&) {});
  ASSERT_EQ(all.size(), 1u);
  const results::Connections& hc = all[0];
  EXPECT_EQ(hc.name, "hc");
  ASSERT_EQ(hc.rows.size(), 5u);  // 4 sublayers and the readout
  for (int k = 0; k < 5; ++k) {
    const results::ConnectionRow& row = hc.rows[static_cast<std::size_t>(k)];
    EXPECT_EQ(row.target, k);
    ASSERT_EQ(row.sources.size(), static_cast<std::size_t>(k + 1));  // emb, then sublayers 0 .. k-1
    for (double w : row.weights) EXPECT_DOUBLE_EQ(w, k == 4 ? 3.0 : 1.0);
  }
  // Dynamic HC's connections vary by token: the evaluation pass gives them (experiment::diagnose).
  EXPECT_TRUE(connections_of(hc_config(true), [](const ParamLayout&, std::vector<double>&) {}).empty());
}

TEST(Connections, HcUnfoldsThroughTheStreamMixing) {
  // Sublayer 0 writes its output with B = (2, 0, 0) into stream 0 only. Sublayer 1 reads stream 0
  // (A_m = e_0), then its write swaps streams 0 and 1 (A_r). Sublayer 2 reads its home stream 2,
  // which never held that output; sublayer 3 reads stream 1 (A_m = e_1), where the swap put it.
  const ModelConfig c = hc_config(false);
  const auto all = connections_of(c, [](const ParamLayout& layout, std::vector<double>& p) {
    double* B0 = p.data() + layout.at("hc.0.B").offset;
    B0[0] = 2, B0[1] = 0, B0[2] = 0;
    double* A1 = p.data() + layout.at("hc.1.A").offset;  // [3, 4]: column 0 A_m, columns 1..3 A_r
    for (int i = 0; i < 12; ++i) A1[i] = 0;
    A1[0 * 4 + 0] = 1;      // A_m = e_0
    A1[0 * 4 + 1 + 1] = 1;  // stream 0 -> new stream 1
    A1[1 * 4 + 1 + 0] = 1;  // stream 1 -> new stream 0
    A1[2 * 4 + 1 + 2] = 1;  // stream 2 stays
    double* A3 = p.data() + layout.at("hc.3.A").offset;
    A3[0 * 4 + 0] = 0, A3[1 * 4 + 0] = 1;  // A_m = e_1 instead of its home e_0
  });
  const results::Connections& hc = all[0];
  EXPECT_EQ(hc.rows[1].weights, (std::vector<double>{1, 2}));        // emb, sublayer 0
  EXPECT_EQ(hc.rows[2].weights, (std::vector<double>{1, 0, 1}));     // emb, sublayer 0, sublayer 1
  EXPECT_EQ(hc.rows[3].weights, (std::vector<double>{1, 2, 1, 1}));  // ... sublayer 2
  EXPECT_EQ(hc.rows[4].weights, (std::vector<double>{3, 2, 3, 3, 3}));  // the sum readout
}

TEST(Connections, DenseFormerRowsAreTheDwaWeights) {
  ModelConfig c = hc_config(false);
  c.residual = ResidualMode::denseformer;
  const auto all = connections_of(c, [](const ParamLayout& layout, std::vector<double>& p) {
    p[static_cast<std::size_t>(layout.at("dwa.2.alpha").offset)] = -0.25;
  });
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].name, "dwa");
  ASSERT_EQ(all[0].rows.size(), 2u);
  EXPECT_EQ(all[0].rows[1].target, 2);
  EXPECT_EQ(all[0].rows[1].sources, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(all[0].rows[1].weights, (std::vector<double>{-0.25, 0, 1}));
  c.residual = ResidualMode::block;
  EXPECT_TRUE(connections_of(c, [](const ParamLayout&, std::vector<double>&) {}).empty());
}

// The tables' columns are what the family's record says its connections are over: GR's gates
// over its branches (the committed report once labelled branch 0 "emb"), DenseFormer's DWAs over
// the embedding and the block outputs; the notes are the record's too.
TEST(Connections, TablesLabelColumnsByTheFamilysAxis) {
  analysis::ExperimentSummary s;
  const std::vector<ConnectionRow> rows = {{0, {0, 1, 2}, {0.5, 0.25, 0.25}}};
  s.connections = {{"gr", 3, {"gr.read", rows}}, {"denseformer", 3, {"dwa", rows}}};
  const std::vector<analysis::Table> tables = analysis::depth_tables(s, false);
  ASSERT_EQ(tables.size(), 2u);
  EXPECT_EQ(tables[0].header, (std::vector<std::string>{"target", "branch 0", "branch 1", "branch 2"}));
  EXPECT_TRUE(tables[0].notes.empty());
  EXPECT_EQ(tables[1].header, (std::vector<std::string>{"target", "emb", "1", "2"}));
  ASSERT_EQ(tables[1].notes.size(), 1u);
  EXPECT_EQ(tables[1].notes[0].rfind("DenseFormer: row i is the DWA after block i", 0), 0u);
  const std::string svg = analysis::plot_connections(s, s.connections[0]);
  EXPECT_NE(svg.find(">branch</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">emb</text>"), std::string::npos);
}

}  // namespace
}  // namespace attnres::experiment
