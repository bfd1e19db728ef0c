// summarize() on a synthetic experiment directory: paired statistics, missing runs, routing, systems,
// and clear errors for malformed files.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "experiment/fixture.hpp"
#include "analysis/format.hpp"
#include "analysis/provenance.hpp"
#include "analysis/stats.hpp"
#include "analysis/summary.hpp"
#include "analysis/verdict.hpp"
#include "analysis/tables.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::experiment {
using namespace analysis;  // these tests drive the analysis with the experiment's fixtures
namespace {

using testing::SyntheticExperiment;
using testing::make_result;
using testing::write_json;
using nlohmann::json;

// The Error thrown by compute_summary(dir); fails the test when none is thrown.
std::string summary_error(const std::string& dir) {
  try {
    compute_summary(dir);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "compute_summary did not throw";
  return "";
}

TEST(Summary, PairedStatisticsPerMilestone) {
  SyntheticExperiment exp;
  const ExperimentSummary s = compute_summary(exp.dir());
  ASSERT_EQ(s.milestones.size(), 4u);
  EXPECT_EQ(s.runs.size(), 11u);
  ASSERT_EQ(s.missing.size(), 1u);
  EXPECT_EQ(s.missing[0].arm, "rd");
  EXPECT_EQ(s.missing[0].seed, 3);

  for (const Comparison* c : {&s.milestones[0], &s.milestones[3], &s.test}) {
    SCOPED_TRACE(c->split + " " + std::to_string(c->tokens));
    const ArmComparison* base = c->find("block");
    ASSERT_NE(base, nullptr);
    EXPECT_TRUE(base->is_baseline);
    EXPECT_EQ(base->values.size(), 3u);
    EXPECT_TRUE(base->deltas.empty());

    // rd: seeds 1 and 2 only (seed 3 missing); deltas −0.02, −0.03.
    const ArmComparison* rd = c->find("rd");
    ASSERT_NE(rd, nullptr);
    EXPECT_EQ(rd->values.size(), 2u);
    EXPECT_EQ(rd->stats.n, 2);
    EXPECT_EQ(rd->stats.wins, 2);
    EXPECT_NEAR(rd->stats.mean, -0.025, 1e-12);
    EXPECT_NEAR(rd->stats.sd, std::sqrt(0.00005), 1e-12);
    EXPECT_NEAR(rd->stats.t, -5.0, 1e-9);
    EXPECT_NEAR(rd->stats.p_value, 1 - 2 / std::numbers::pi * std::atan(5.0), 1e-10);
    EXPECT_NEAR(rd->stats.ci_low, -0.025 - 12.7062047 * 0.005, 1e-8);
    EXPECT_NEAR(rd->stats.ci_high, -0.025 + 12.7062047 * 0.005, 1e-8);
    EXPECT_NEAR(rd->ppl_change, std::expm1(-0.025), 1e-12);

    // rd-tied reproduces block exactly.
    const ArmComparison* tied = c->find("rd-tied");
    EXPECT_EQ(tied->stats.mean, 0.0);
    EXPECT_EQ(tied->stats.p_value, 1.0);
    EXPECT_EQ(tied->stats.wins, 0);

    // prenorm: +0.06, +0.07, +0.08.
    const ArmComparison* pre = c->find("prenorm");
    EXPECT_EQ(pre->stats.n, 3);
    EXPECT_EQ(pre->stats.wins, 0);
    EXPECT_NEAR(pre->stats.mean, 0.07, 1e-12);
    EXPECT_NEAR(pre->stats.sd, 0.01, 1e-12);
    const double t = 0.07 / (0.01 / std::sqrt(3.0));
    EXPECT_NEAR(pre->stats.t, t, 1e-8);
    EXPECT_NEAR(pre->stats.p_value, 1 - t / std::sqrt(t * t + 2), 1e-10);  // dof 2 closed form
  }
  EXPECT_EQ(s.test.split, "test");
  EXPECT_EQ(s.test.tokens, 8000);
  EXPECT_NEAR(s.milestones[2].find("block")->mean, testing::base_nll(4000, 2), 1e-12);
}

TEST(Summary, RoutingAndJensenShannon) {
  SyntheticExperiment exp;
  const ExperimentSummary s = compute_summary(exp.dir());
  ASSERT_EQ(s.routing.size(), 3u);  // prenorm has no depth routing
  EXPECT_EQ(s.routing[0].arm, "block");
  EXPECT_FALSE(s.routing[0].two_routes);
  EXPECT_TRUE(std::isnan(s.routing[0].all_layers.nats));
  EXPECT_NEAR(s.routing[0].layers[1].qk_mean[0], (0.2 + 0.4 + 0.4) / 3, 1e-12);  // mean over seeds 1–3
  const ArmRouting& rd = s.routing[1];
  EXPECT_EQ(rd.arm, "rd");
  EXPECT_TRUE(rd.two_routes);
  EXPECT_TRUE(rd.per_token_js);
  EXPECT_EQ(rd.n_seeds, 2);
  ASSERT_EQ(rd.layers.size(), 2u);
  EXPECT_EQ(rd.layers[0].js_nats, 0.0);
  EXPECT_NEAR(rd.layers[1].qk_mean[0], 0.3, 1e-12);
  EXPECT_NEAR(rd.layers[1].v_mean[0], 0.8, 1e-12);
  EXPECT_NEAR(rd.layers[1].js_nats, 0.15, 1e-12);  // per-token JS 0.1 and 0.2
  const std::vector<double> p = {0.3, 0.7}, q = {0.8, 0.2};
  EXPECT_NEAR(rd.layers[1].js_of_means_nats, js_divergence_nats(p, q), 1e-12);
  EXPECT_NEAR(rd.all_layers.nats, 0.075, 1e-12);
  EXPECT_EQ(rd.all_layers.layers, 2);
  EXPECT_NEAR(rd.multi_source_layers.nats, 0.15, 1e-12);
  EXPECT_EQ(rd.multi_source_layers.layers, 1);
  EXPECT_NEAR(rd.multi_source_layers.bits, 0.15 / std::log(2.0), 1e-12);
  EXPECT_FALSE(s.routing[2].two_routes);  // rd-tied: one route
}

// DenseFormer-style connections (signed weights per target and source) on prenorm's runs.
json dwa_connections(double first) {
  return json::array({{{"name", "dwa"},
                       {"rows", {{{"target", 1}, {"sources", {0, 1}}, {"weights", {first, 1.0}}},
                                 {{"target", 2}, {"sources", {0, 1, 2}}, {"weights", {-0.5, 0.25, 1.0}}}}}}});
}

TEST(Summary, ConnectionsAreMeanOverSeedsAndReported) {
  SyntheticExperiment exp;
  for (int seed : {1, 2, 3}) {
    json r = make_result("prenorm", seed);
    r["connections"] = dwa_connections(0.1 * seed);
    write_json(exp.result_path("prenorm", seed), r);
  }
  const ExperimentSummary s = compute_summary(exp.dir());
  ASSERT_EQ(s.connections.size(), 1u);  // the other arms record none
  const ArmConnections& c = s.connections[0];
  EXPECT_EQ(c.arm, "prenorm");
  EXPECT_EQ(c.n_seeds, 3);
  EXPECT_EQ(c.connections.name, "dwa");
  ASSERT_EQ(c.connections.rows.size(), 2u);
  EXPECT_NEAR(c.connections.rows[0].weights[0], 0.2, 1e-12);  // (0.1 + 0.2 + 0.3) / 3
  EXPECT_NEAR(c.connections.rows[1].weights[0], -0.5, 1e-12);
  EXPECT_EQ(c.connections.rows[1].sources, (std::vector<int>{0, 1, 2}));
  const results::Summary file = summary_file(s);
  const json j = results::to_json(file);
  EXPECT_EQ(j["connections"][0]["arm"], "prenorm");
  EXPECT_NEAR(j["connections"][0]["rows"][0]["weights"][0].get<double>(), 0.2, 1e-12);

  json r = make_result("prenorm", 3);  // a seed with other rows: named, with the seed it disagrees with
  r["connections"] = dwa_connections(0.3);
  r["connections"][0]["rows"][1]["sources"] = {0, 2};
  r["connections"][0]["rows"][1]["weights"] = {0.5, 0.5};
  write_json(exp.result_path("prenorm", 3), r);
  const std::string msg = summary_error(exp.dir());
  EXPECT_NE(msg.find("runs/prenorm/seed-3/result.json: key 'connections' entry 'dwa'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("runs/prenorm/seed-1/result.json"), std::string::npos) << msg;
}

// An n-stream arm's Amax gains (here on prenorm's runs): seed s has composite forward mean s,
// max 2s, backward mean 1 + s/4, max 5 - s, single-sublayer maxima 1 + s/8 and 3 - s/2.
json amax_gain(int seed) {
  return {{"composite_forward_mean", 1.0 * seed},     {"composite_forward_max", 2.0 * seed},
          {"composite_backward_mean", 1 + seed / 4.0}, {"composite_backward_max", 5.0 - seed},
          {"layer_forward_max", 1 + seed / 8.0},       {"layer_backward_max", 3 - seed / 2.0}};
}

TEST(Summary, AmaxGainIsTheMeanOfMeansAndTheMaxOfMaxima) {
  SyntheticExperiment exp;
  for (int seed : {1, 2, 3}) {
    json r = make_result("prenorm", seed);
    r["amax_gain"] = amax_gain(seed);
    write_json(exp.result_path("prenorm", seed), r);
  }
  const ExperimentSummary s = summarize(exp.dir());
  ASSERT_EQ(s.amax_gain.size(), 1u);  // the other arms record none
  const ArmGain& a = s.amax_gain[0];
  EXPECT_EQ(a.arm, "prenorm");
  EXPECT_EQ(a.n_seeds, 3);
  EXPECT_NEAR(a.gain.composite_forward_mean, 2.0, 1e-12);  // (1 + 2 + 3) / 3
  EXPECT_EQ(a.gain.composite_forward_max, 6.0);
  EXPECT_NEAR(a.gain.composite_backward_mean, 1.5, 1e-12);
  EXPECT_EQ(a.gain.composite_backward_max, 4.0);  // seed 1's
  EXPECT_EQ(a.gain.layer_forward_max, 1.375);
  EXPECT_EQ(a.gain.layer_backward_max, 2.5);
  // summary.json holds them and reads back byte for byte.
  const std::string path = results::summary_path(exp.dir());
  const std::string text = read_text_file(path);
  const json j = json::parse(text);
  EXPECT_EQ(j["amax_gain"][0]["arm"], "prenorm");
  EXPECT_EQ(j["amax_gain"][0]["seeds"], 3);
  EXPECT_EQ(j["amax_gain"][0]["composite_forward_max"], 6.0);
  results::write_summary(path, results::read_summary(path));
  EXPECT_EQ(read_text_file(path), text);

  json r = make_result("prenorm", 2);  // a seed without them, beside seeds with: named
  write_json(exp.result_path("prenorm", 2), r);
  const std::string msg = summary_error(exp.dir());
  EXPECT_NE(msg.find("runs/prenorm/seed-2/result.json: key 'amax_gain' is missing but "), std::string::npos) << msg;
  EXPECT_NE(msg.find("runs/prenorm/seed-1/result.json has it"), std::string::npos) << msg;
}

TEST(Summary, JsFallsBackToMeanDistributionsWithoutPerTokenValues) {
  SyntheticExperiment exp;
  for (int seed : {1, 2}) {
    json r = make_result("rd", seed);
    for (auto& l : r["routing"]["layers"]) l.erase("js_nats");
    write_json(exp.result_path("rd", seed), r);
  }
  const ExperimentSummary s = compute_summary(exp.dir());
  const ArmRouting& rd = s.routing[1];
  EXPECT_FALSE(rd.per_token_js);
  EXPECT_NEAR(rd.layers[1].js_nats, js_divergence_nats(std::vector<double>{0.3, 0.7}, std::vector<double>{0.8, 0.2}),
              1e-12);
}

TEST(Summary, SingleSourceLayerMayOmitTheValueRoute) {
  SyntheticExperiment exp;
  json r = make_result("rd", 1);
  r["routing"]["layers"][0].erase("v_mean");
  r["routing"]["layers"][0].erase("js_nats");
  write_json(exp.result_path("rd", 1), r);
  const ExperimentSummary s = compute_summary(exp.dir());
  EXPECT_EQ(s.routing[1].layers[0].v_mean, std::vector<double>{1.0});
  EXPECT_TRUE(s.routing[1].per_token_js);  // single-source layers need no per-token JS
  EXPECT_NEAR(s.routing[1].all_layers.nats, 0.075, 1e-12);
}

// MUDD's Q, K and V routes (baselines-spec §6.5): Q ~ V and K ~ V, each averaged over seeds per
// layer and then over layers with and without the single-source block 0.
TEST(Summary, MuddRoutingGivesQvAndKvMeans) {
  SyntheticExperiment exp(true);
  const ExperimentSummary s = compute_summary(exp.dir());
  ASSERT_EQ(s.routing.size(), 4u);
  const ArmRouting& m = s.routing[3];
  ASSERT_EQ(m.arm, "mudd");
  EXPECT_TRUE(m.two_routes);
  EXPECT_TRUE(m.k_route);
  EXPECT_TRUE(m.per_token_js);
  EXPECT_EQ(m.n_seeds, 3);
  ASSERT_EQ(m.layers.size(), 3u);
  EXPECT_EQ(m.layers[0].k_mean, std::vector<double>{1.0});
  EXPECT_EQ(m.layers[0].js_k_nats, 0.0);
  EXPECT_NEAR(m.layers[1].k_mean[0], 0.2, 1e-12);  // (0.1 + 0.2 + 0.3) / 3
  EXPECT_NEAR(m.layers[1].js_nats, 0.1, 1e-12);
  EXPECT_NEAR(m.layers[1].js_k_nats, 0.2, 1e-12);
  EXPECT_NEAR(m.layers[1].js_k_bits, 0.2 / std::numbers::ln2, 1e-12);
  EXPECT_NEAR(m.layers[1].js_k_of_means_nats,
              js_divergence_nats(std::vector<double>{0.2, 0.8}, std::vector<double>{0.8, 0.2}), 1e-12);
  EXPECT_NEAR(m.layers[2].js_k_nats, 0.3, 1e-12);
  EXPECT_NEAR(m.all_layers.nats, (0 + 0.1 + 0.2) / 3, 1e-12);
  EXPECT_EQ(m.all_layers.layers, 3);
  EXPECT_NEAR(m.multi_source_layers.nats, 0.15, 1e-12);
  EXPECT_NEAR(m.k_all_layers.nats, (0 + 0.2 + 0.3) / 3, 1e-12);
  EXPECT_EQ(m.k_all_layers.layers, 3);
  EXPECT_NEAR(m.k_multi_source_layers.nats, 0.25, 1e-12);
  EXPECT_EQ(m.k_multi_source_layers.layers, 2);
  EXPECT_NEAR(m.k_multi_source_layers.bits, 0.25 / std::numbers::ln2, 1e-12);
  EXPECT_FALSE(s.routing[1].k_route);  // rd: Q/K and V

  // summary.json: the K fields for mudd only, and they read back byte for byte.
  summarize(exp.dir());
  const std::string path = results::summary_path(exp.dir());
  const std::string text = read_text_file(path);
  const json j = json::parse(text);
  EXPECT_EQ(j["routing"][3]["k_route"], true);
  EXPECT_NEAR(j["routing"][3]["js_k_mean_multi_source_layers"]["nats"].get<double>(), 0.25, 1e-12);
  EXPECT_NEAR(j["routing"][3]["layers"][1]["js_k_nats"].get<double>(), 0.2, 1e-12);
  EXPECT_FALSE(j["routing"][1].contains("k_route"));
  EXPECT_FALSE(j["routing"][1]["layers"][1].contains("k_mean"));
  results::write_summary(path, results::read_summary(path));
  EXPECT_EQ(read_text_file(path), text);

  // Without per-token K~V in one run: JS of the seed-mean distributions, for both pairs.
  json r = make_result("mudd", 2);
  for (auto& l : r["routing"]["layers"]) l.erase("js_k_nats");
  write_json(exp.result_path("mudd", 2), r);
  const ExperimentSummary without = compute_summary(exp.dir());
  const ArmRouting& of_means = without.routing[3];
  EXPECT_FALSE(of_means.per_token_js);
  EXPECT_NEAR(of_means.layers[1].js_k_nats, of_means.layers[1].js_k_of_means_nats, 1e-15);
  EXPECT_NEAR(of_means.layers[1].js_nats, of_means.layers[1].js_of_means_nats, 1e-15);
  EXPECT_EQ(of_means.layers[0].js_k_nats, 0.0);

  // A seed without the K route does not match the others.
  r = make_result("mudd", 3);
  for (auto& l : r["routing"]["layers"]) l.erase("k_mean"), l.erase("js_k_nats");
  write_json(exp.result_path("mudd", 3), r);
  const std::string msg = summary_error(exp.dir());
  EXPECT_NE(msg.find("runs/mudd/seed-3/result.json: key 'routing.layers' entry for layer 0"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("v_mean, k_mean"), std::string::npos) << msg;
}

TEST(Summary, SystemsAgainstBaseline) {
  SyntheticExperiment exp;
  const ExperimentSummary s = compute_summary(exp.dir());
  ASSERT_EQ(s.systems.size(), 4u);
  const ArmSystems& rd = s.systems[1];
  EXPECT_EQ(rd.arm, "rd");
  EXPECT_EQ(rd.runs, 2);
  EXPECT_EQ(rd.params, 1064);
  EXPECT_NEAR(rd.params_overhead, 0.064, 1e-12);
  EXPECT_NEAR(rd.tokens_per_sec_ratio, 0.9, 1e-12);
  EXPECT_NEAR(rd.step_time_ratio, 1.1, 1e-12);
  EXPECT_NEAR(rd.peak_rss_ratio, 1.1, 1e-12);
  EXPECT_NEAR(s.systems[0].tokens_per_sec_ratio, 1.0, 0);
}

// Where the runs came from: summary.json lists each distinct binary/CPU/GEMM setup with its run
// count, and the note says when the runs of a comparison differ.
TEST(Summary, ProvenanceListsTheOriginsAndNotesDifferentBinaries) {
  SyntheticExperiment exp;
  // The fixture's runs record no provenance (files of earlier builds): no list, no note.
  EXPECT_FALSE(provenance_note(compute_summary(exp.dir())).has_value());
  EXPECT_FALSE(json::parse(read_text_file(summarize(exp.dir()).dir + "/summary.json")).contains("provenance"));

  const json provenance = {{"attnres_version", "0.9.0"}, {"commit", "0123456789ab"}, {"dirty", false},
                           {"device", "cpu"},           {"gemm_backend", "avx2"},   {"blas_core", "Haswell"},
                           {"cpu_model", "AMD EPYC 7B13"}, {"cpu_flags", {"avx2", "fma"}}, {"threads", 4}};
  const auto set_provenance = [&](const std::string& arm, int seed, const json& p) {
    json r = json::parse(read_text_file(exp.result_path(arm, seed).string()));
    r["provenance"] = p;
    write_json(exp.result_path(arm, seed), r);
  };
  for (const char* arm : {"block", "rd", "rd-tied", "prenorm"})
    for (int seed : {1, 2, 3})
      if (std::filesystem::exists(exp.result_path(arm, seed))) set_provenance(arm, seed, provenance);
  EXPECT_FALSE(provenance_note(compute_summary(exp.dir())).has_value());  // one binary, one CPU

  json other = provenance;
  other["commit"] = "ba9876543210";
  other["dirty"] = true;
  set_provenance("prenorm", 2, other);
  const ExperimentSummary s = summarize(exp.dir());
  const std::optional<std::string> note = provenance_note(s);
  ASSERT_TRUE(note.has_value());
  EXPECT_EQ(*note, "the runs came from 2 binaries: 0123456789ab (10 runs), ba9876543210-dirty (1 run)");
  const json j = json::parse(read_text_file(exp.dir() + "/summary.json"));
  ASSERT_EQ(j.at("provenance").size(), 2u) << j["provenance"];
  EXPECT_EQ(j["provenance"][0],
            (json{{"commit", "0123456789ab"}, {"dirty", false}, {"cpu_model", "AMD EPYC 7B13"},
                  {"gemm_backend", "avx2"}, {"blas_core", "Haswell"}, {"runs", 10}}));
  EXPECT_EQ(j["provenance"][1]["commit"], "ba9876543210");
  EXPECT_EQ(j["provenance"][1]["dirty"], true);
  EXPECT_EQ(j["provenance"][1]["runs"], 1);

  // Another CPU and GEMM backend; and a run without a provenance among runs with one.
  other = provenance;
  other["cpu_model"] = "Intel Xeon Platinum 8481C";
  other["gemm_backend"] = "avx512";
  set_provenance("prenorm", 2, other);
  json r = json::parse(read_text_file(exp.result_path("block", 3).string()));
  r.erase("provenance");
  write_json(exp.result_path("block", 3), r);
  EXPECT_EQ(provenance_note(compute_summary(exp.dir())),
            "the runs came from 2 CPUs: AMD EPYC 7B13 (9 runs), Intel Xeon Platinum 8481C (1 run); 2 GEMM setups: "
            "avx2 on OpenBLAS Haswell (9 runs), avx512 on OpenBLAS Haswell (1 run); 1 of the 11 runs records no "
            "provenance (written by an earlier attnres)");
}

TEST(Summary, MissingBaselineSeedLeavesOnePair) {
  SyntheticExperiment exp;
  std::filesystem::remove(exp.result_path("block", 2));
  const ExperimentSummary s = compute_summary(exp.dir());
  const ArmComparison* rd = s.milestones.back().find("rd");
  EXPECT_EQ(rd->values.size(), 2u);  // the arm's own mean still uses both of its seeds
  EXPECT_EQ(rd->stats.n, 1);         // but only seed 1 is paired
  EXPECT_NEAR(rd->stats.mean, -0.02, 1e-12);
  EXPECT_TRUE(std::isnan(rd->stats.ci_low));
  EXPECT_TRUE(std::isnan(rd->stats.p_value));
  EXPECT_EQ(s.milestones.back().find("prenorm")->stats.n, 2);
  const std::string table = format_summary_table(s);
  EXPECT_NE(table.find("n/a"), std::string::npos) << table;
  EXPECT_NE(table.find("block/seed-2"), std::string::npos) << table;
}

TEST(Summary, WritesSummaryJsonAndTable) {
  SyntheticExperiment exp;
  const ExperimentSummary s = summarize(exp.dir());
  const json j = json::parse(read_text_file(exp.dir() + "/summary.json"));
  EXPECT_EQ(j["missing_runs"].size(), 1u);
  EXPECT_EQ(j["missing_runs"][0]["arm"], "rd");
  ASSERT_EQ(j["validation"].size(), 4u);
  const json& rd = j["validation"][3]["arms"][1];
  EXPECT_EQ(rd["arm"], "rd");
  EXPECT_NEAR(rd["paired"]["mean"].get<double>(), -0.025, 1e-12);
  EXPECT_EQ(rd["paired"]["wins"], 2);
  EXPECT_NEAR(rd["ppl_reduction"].get<double>(), -std::expm1(-0.025), 1e-12);
  EXPECT_FALSE(j["validation"][3]["arms"][0].contains("paired"));  // baseline: no pairing
  EXPECT_NEAR(j["routing"][1]["js_mean_all_layers"]["nats"].get<double>(), 0.075, 1e-12);
  EXPECT_EQ(j["routing"][1]["js_estimate"], "per_token_mean");

  const std::string table = format_summary_table(s);
  for (const char* want : {"Validation NLL", "Test NLL", "rd-tied", "2/2", "0/3", "-2.47%", "+7.25%", "rd/seed-3",
                           "-0.0250 ± 0.0071", "0.126", "per-token", "0.900×", "+6.400%"})
    EXPECT_NE(table.find(want), std::string::npos) << "missing '" << want << "' in\n" << table;
}

TEST(Summary, PowerOfEveryComparison) {
  SyntheticExperiment exp;
  const ExperimentSummary s = compute_summary(exp.dir(), {0.05});
  const Comparison& last = s.milestones.back();
  // prenorm − block = 0.05 + 0.01 s for seeds 1..3: sd 0.01 over 3 seeds.
  const ArmComparison& pre = *last.find("prenorm");
  ASSERT_TRUE(pre.power.available) << pre.power.reason;
  EXPECT_NEAR(pre.power.mde, 3.2640435497 * 0.01, 1e-9);
  EXPECT_EQ(pre.power.seeds_for_paper, pairs_needed(kPaperEffectNats, 0.01));
  EXPECT_EQ(pre.power.seeds_for_user, pairs_needed(0.05, 0.01));
  EXPECT_EQ(pre.power.seeds_for_user, 3);  // d = 5
  // rd has two paired seeds; rd-tied does not vary.
  EXPECT_FALSE(last.find("rd")->power.available);
  EXPECT_NE(last.find("rd")->power.reason.find("at least 3 paired seeds for a usable spread (have 2)"), std::string::npos);
  EXPECT_FALSE(last.find("rd-tied")->power.available);
  EXPECT_NE(last.find("rd-tied")->power.reason.find("sd = 0"), std::string::npos);
  // Written to summary.json and shown in a table.
  const results::Summary file = summary_file(s);
  EXPECT_DOUBLE_EQ(file.user_effect, 0.05);
  EXPECT_DOUBLE_EQ(file.paper_effect, kPaperEffectNats);
  const std::string table = format_summary_table(s);
  EXPECT_NE(table.find("Power: what these seeds can detect"), std::string::npos) << table;
  EXPECT_NE(table.find("seeds for 0.0500"), std::string::npos) << table;
}

TEST(Summary, AnswerLine) {
  SyntheticExperiment exp;
  const ExperimentSummary s = compute_summary(exp.dir());
  // prenorm: +0.07 ± 0.01/√3 over 3 seeds, t = 12.1, p = 0.0067: resolved.
  const std::string pre = answer_line(s, "prenorm");
  // It names the split and the budget (finding 9 of issue #31).
  EXPECT_EQ(pre.rfind("prenorm vs block, validation NLL at 8K tokens: ΔNLL +0.0700 ± 0.0058 (s.e.) over 3 seeds, "
                      "p = 0.0067",
                      0),
            0u)
      << pre;
  EXPECT_NE(pre.find("prenorm worse in 3/3 seeds"), std::string::npos) << pre;
  // rd: −0.025 over 2 seeds, p = 0.126: not resolved, and no power estimate from 2 seeds.
  const std::string rd = answer_line(s, "rd");
  EXPECT_EQ(rd.rfind("rd vs block, validation NLL at 8K tokens: not resolved at this size: ΔNLL -0.0250 ± 0.0050 "
                     "(s.e.) over 2 seeds",
                     0),
            0u)
      << rd;
  EXPECT_NE(rd.find("no power estimate: needs at least 3 paired seeds"), std::string::npos) << rd;
  EXPECT_NE(answer_line(s, "rd-tied").find("identical to the baseline in all 3 seeds"), std::string::npos);
  EXPECT_THROW(answer_line(s, "block"), Error);
  EXPECT_THROW(answer_line(s, "nope"), Error);
}

TEST(Summary, AnswerLineGivesTheSeedsNeededWhenNotResolved) {
  SyntheticExperiment exp;
  // prenorm's differences made noisy: +0.01, −0.01, +0.03 (mean 0.01, sd 0.02, p = 0.48).
  for (int seed : {1, 2, 3}) {
    json r = make_result("prenorm", seed);
    const double delta = seed == 1 ? 0.01 : seed == 2 ? -0.01 : 0.03;
    for (auto& m : r["milestones"]) m["val_nll"] = testing::base_nll(m["tokens"].get<std::int64_t>(), seed) + delta;
    write_json(exp.result_path("prenorm", seed), r);
  }
  const std::string line = answer_line(compute_summary(exp.dir()), "prenorm");
  EXPECT_NE(line.find("not resolved at this size"), std::string::npos) << line;
  EXPECT_NE(line.find(concat("about ", pairs_needed(0.01, 0.02), " seeds would be needed")), std::string::npos) << line;
  EXPECT_NE(line.find(concat(pairs_needed(kPaperEffectNats, 0.02), " for the paper's 0.030")), std::string::npos)
      << line;
}

TEST(SummaryErrors, MalformedResultNamesTheFile) {
  SyntheticExperiment exp;
  std::ofstream(exp.result_path("rd", 1)) << "{\"arm\": \"rd\", \"seed\": 1,";
  const std::string msg = summary_error(exp.dir());
  EXPECT_NE(msg.find("runs/rd/seed-1/result.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg;
}

TEST(SummaryErrors, MissingOrMistypedKeysAreNamed) {
  struct Case {
    std::function<void(json&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](json& r) { r["milestones"][1].erase("val_nll"); }, "key 'milestones[1].val_nll' is missing"},
      {[](json& r) { r["test_nll"] = "low"; }, "key 'test_nll' must be a number"},
      {[](json& r) { r.erase("params"); }, "key 'params' is missing"},
      {[](json& r) { r["arm"] = "block"; }, "key 'arm' is 'block' but the file is in the directory of arm 'rd'"},
      {[](json& r) { r["milestones"].erase(2); }, "has no entry at 4000 tokens"},
      {[](json& r) { r["routing"]["layers"][1]["qk_mean"] = {0.5, 0.25, 0.25}; },
       "key 'routing.layers[1].qk_mean' has 3 entries but 'sources' is 2"},
      {[](json& r) { r["routing"]["layers"][1]["v_mean"] = {3.0, -2.0}; }, "routing.layers[1].v_mean[1]' must not be"},
      {[](json& r) { r["routing"]["layers"][1]["js_nats"] = 0.9; }, "must lie in [0, ln 2]"},
      {[](json& r) { r["routing"]["layers"][1].erase("v_mean"), r["routing"]["layers"][1].erase("js_nats"); }, "gives 'v_mean' for some layers but not for layer 1"},
  };
  for (const auto& c : cases) {
    SyntheticExperiment exp;
    json r = make_result("rd", 2);
    c.edit(r);
    write_json(exp.result_path("rd", 2), r);
    const std::string msg = summary_error(exp.dir());
    EXPECT_NE(msg.find("runs/rd/seed-2/result.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.want), std::string::npos) << msg;
  }
}

TEST(SummaryErrors, SeedsDisagreeOnLayerStructure) {
  SyntheticExperiment exp;
  json r = make_result("block", 3);
  r["routing"]["layers"][1] = {{"layer", 1}, {"sources", 3}, {"qk_mean", {0.2, 0.3, 0.5}}};
  write_json(exp.result_path("block", 3), r);
  const std::string msg = summary_error(exp.dir());
  EXPECT_NE(msg.find("runs/block/seed-3/result.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("runs/block/seed-1/result.json"), std::string::npos) << msg;
}

TEST(SummaryErrors, ExperimentFile) {
  SyntheticExperiment exp;
  const std::string path = exp.dir() + "/experiment.json";
  json spec = json::parse(read_text_file(path));
  spec["baseline"] = "full";
  write_json(path, spec);
  std::string msg = summary_error(exp.dir());
  EXPECT_NE(msg.find("experiment.json: key 'baseline' 'full' is not one of 'arms'"), std::string::npos) << msg;

  spec["baseline"] = "block";
  spec["milestones"] = {1000, 4000, 2000};
  write_json(path, spec);
  msg = summary_error(exp.dir());
  EXPECT_NE(msg.find("key 'milestones[2]' must be larger"), std::string::npos) << msg;

  std::filesystem::remove(path);
  msg = summary_error(exp.dir());
  EXPECT_NE(msg.find("experiment.json: not found"), std::string::npos) << msg;
  EXPECT_THROW(compute_summary(exp.dir() + "/nope"), Error);
}

TEST(SummaryFormat, Numbers) {
  EXPECT_EQ(format_number(NAN, 3), "n/a");
  EXPECT_EQ(format_signed(-0.0301, 4), "-0.0301");
  EXPECT_EQ(format_signed(0.5, 2), "+0.50");
  // A difference in nats never prints a non-zero value as zero (a floor of 1.2e-05 is not 0.0000).
  EXPECT_EQ(format_nats(0.0201), "0.0201");
  EXPECT_EQ(format_nats(1.234e-5), "1.2e-05");
  EXPECT_EQ(format_nats(0.00005), "0.0001");
  EXPECT_EQ(format_nats(0), "0.0000");
  EXPECT_EQ(format_nats(NAN), "n/a");
  EXPECT_EQ(format_signed_nats(-6.7e-6), "-6.7e-06");
  EXPECT_EQ(format_signed_nats(0.0016), "+0.0016");
  EXPECT_EQ(format_percent(-0.029651, 2), "-2.97%");
  EXPECT_EQ(format_p_value(0.06677), "0.067");
  EXPECT_EQ(format_p_value(0.0042), "0.0042");
  EXPECT_EQ(format_p_value(0.0004), "4.0e-04");
  EXPECT_EQ(format_count(9812736), "9,812,736");
  EXPECT_EQ(format_count(-990), "-990");
  EXPECT_EQ(format_p_value(3e-6), "3.0e-06");
  EXPECT_EQ(format_tokens(2e9), "2B");
  EXPECT_EQ(format_tokens(250e6), "250M");
  EXPECT_EQ(format_tokens(1.5e6), "1.5M");
  EXPECT_EQ(format_tokens(512), "512");
}

// The throughput-adjusted view: the equal-compute multiplier from the baseline's mean validation
// NLL against log tokens at budgets it was trained to, and its worth at equal wall-clock time,
// against hand computation. The main runs' mid-run milestones are never read as such budgets
// (issue #46: a cosine schedule's mid-run point is not a run annealed to that budget).
TEST(Summary, ThroughputAdjustedMultiplierAndEqualTime) {
  SyntheticExperiment exp;
  ExperimentSummary s = compute_summary(exp.dir());
  const auto row_of = [](const Table& t, const std::string& arm) {
    for (const auto& r : t.rows)
      if (r[0] == arm) return r;
    ADD_FAILURE() << "no row " << arm;
    return std::vector<std::string>(6);
  };
  // One budget point (the main runs' end): no multiplier, and the table says why.
  std::optional<Table> t = throughput_table(s);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(row_of(*t, "prenorm")[3], "n/a");
  bool why = false;
  for (const auto& n : t->notes) why = why || n.find("one budget point of block only") != std::string::npos;
  EXPECT_TRUE(why);
  // rd's steps take 1.1 times block's in each of its seeds: the paired ratio and its interval.
  EXPECT_EQ(row_of(*t, "rd")[2], "1.100 [1.100, 1.100]");
  // Groups that trained block again to earlier budgets give the curve: here the synthetic runs'
  // earlier milestones stand in for them (block's mean NLL over seeds 1-3 is 6.02 - 0.3 log2(T / 1000)).
  for (std::size_t k = 0; k + 1 < s.milestones.size(); ++k) {
    GroupResults g;
    g.spec.name = concat("short-", k);
    g.spec.baseline = "block";
    g.summary.spec.baseline = "block";
    g.summary.milestones = {s.milestones[k]};
    s.groups.push_back(std::move(g));
  }
  t = throughput_table(s);
  ASSERT_TRUE(t.has_value());
  // prenorm's final mean is 0.07 above block's: block reaches it at 2^(-0.07 / 0.3) of the budget;
  // equal step times.
  EXPECT_EQ(row_of(*t, "prenorm")[3], format_number(std::pow(2.0, -0.07 / 0.3), 3));
  EXPECT_EQ(row_of(*t, "prenorm")[4], format_number(std::pow(2.0, -0.07 / 0.3), 3));
  EXPECT_NE(row_of(*t, "prenorm")[5].find("behind at equal time"), std::string::npos);
  // rd (seeds 1, 2) is 0.03 below block's final mean: beyond the budget points, along the last
  // segment, 2^(0.03 / 0.3); its steps take 1.1 times block's.
  EXPECT_EQ(row_of(*t, "rd")[3], format_number(std::pow(2.0, 0.1), 3) + "*");
  EXPECT_EQ(row_of(*t, "rd")[4], format_number(std::pow(2.0, 0.1) / 1.1, 3));
  // A group with another setting (a probe) is no budget point of the baseline.
  for (GroupResults& g : s.groups) g.spec.settings = {"model.n_layers=2"};
  EXPECT_EQ(row_of(*throughput_table(s), "prenorm")[3], "n/a");
}

// The ranking: every arm compared with the baseline, best first, the baseline in its place, with
// the p-values Holm-adjusted over the family (an arm identical to the baseline counts as p = 1).
TEST(Summary, RankingOrdersTheArmsAndAdjustsForTheFamily) {
  SyntheticExperiment exp;
  const ExperimentSummary s = compute_summary(exp.dir());
  const std::optional<Table> t = ranking_table(s);
  ASSERT_TRUE(t.has_value());
  std::vector<std::string> order;
  for (const auto& r : t->rows) order.push_back(r[1]);
  // rd below block (-0.025 paired over its seeds 1 and 2), rd-tied identical to it (after the baseline: a stable order), prenorm above.
  EXPECT_EQ(order, (std::vector<std::string>{"rd", "block", "rd-tied", "prenorm"}));
  EXPECT_EQ(t->rows[1][2], "baseline");
  const Comparison& last = s.milestones.back();
  const double p_rd = last.find("rd")->stats.p_value, p_prenorm = last.find("prenorm")->stats.p_value;
  // The family in experiment order: rd, rd-tied, prenorm.
  const std::vector<double> holm = holm_adjusted(std::vector<double>{p_rd, 1.0, p_prenorm});
  EXPECT_EQ(t->rows[0][5], format_p_value(holm[0]));
  EXPECT_EQ(t->rows[2][5], format_p_value(holm[1]));
  EXPECT_EQ(t->rows[3][5], format_p_value(holm[2]));
  EXPECT_EQ(t->rows[2][6], "not resolved");
  EXPECT_EQ(t->rows[3][6], holm[2] < 0.05 ? "worse" : p_prenorm < 0.05 ? "not resolved (p < 0.05 alone)" : "not resolved");
  const int resolved = int(holm[0] < 0.05) + int(holm[2] < 0.05);
  const std::optional<std::string> sentence = ranking_sentence(s);
  ASSERT_TRUE(sentence.has_value());
  EXPECT_NE(sentence->find(std::to_string(resolved) + " of 3 arms differ from block"), std::string::npos) << *sentence;
  EXPECT_NE(sentence->find("rd -0.025, block, rd-tied +0.000, prenorm +0.070"), std::string::npos) << *sentence;
}

}  // namespace
}  // namespace attnres::experiment
