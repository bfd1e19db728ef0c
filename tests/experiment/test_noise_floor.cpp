// Studies that can answer (issue #27): the twin of the baseline and the noise floor it measures,
// sequential seeds run look by look, experiments that grow, and `attnres plan` end to end, with
// the errors each refuses before any training.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "common/cli_util.hpp"
#include "experiment/protocol_util.hpp"
#include "experiment/plan.hpp"
#include "experiment/protocol.hpp"
#include "experiment/runner.hpp"
#include "analysis/sequential.hpp"
#include "analysis/summary.hpp"
#include "model/param_layout.hpp"
#include "train/train_config.hpp"
#include "results/summary.hpp"
#include "util/error.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

const std::string kModelTrain = tiny_model_train("[0.5, 1.0]");

class NoiseFloorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("attnres_noise_floor");
    prepare_synthetic_data(dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->str("data"); }
  static TempDir* dir_;
};
TempDir* NoiseFloorTest::dir_ = nullptr;

}  // namespace

// A twin's initial weights: each value times (1 + ε·ξ) from a stream of its own; zeros stay zero,
// the unperturbed initialisation is unchanged, and ε = 0 is the original bit for bit.
TEST(Twin, InitialWeightsArePerturbedAtTheStatedRelativeSize) {
  ModelConfig c;
  c.vocab_size = 50;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.mlp_hidden = 32;
  c.residual = ResidualMode::rd;
  c.n_blocks = 2;
  const ParamLayout layout(c);
  std::vector<double> a(static_cast<std::size_t>(layout.total())), b(a.size()), z(a.size());
  init_params<double>(layout, 7, a);
  init_params<double>(layout, 7, b, 1e-6);
  init_params<double>(layout, 7, z, 0.0);
  EXPECT_EQ(a, z);
  double sum_sq = 0;
  std::size_t moved = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == 0) {
      EXPECT_EQ(b[i], 0.0) << i;  // pseudo-queries start at zero in the twin too
      continue;
    }
    const double r = b[i] / a[i] - 1;
    sum_sq += r * r;
    ++moved;
    EXPECT_LT(std::abs(r), 6e-6) << i;  // six standard deviations
  }
  ASSERT_GT(moved, a.size() / 2);
  EXPECT_NEAR(std::sqrt(sum_sq / double(moved)), 1e-6, 0.1e-6);  // its relative size is the stated one
  std::vector<double> other(a.size());
  init_params<double>(layout, 8, other, 1e-6);  // another seed, another perturbation
  EXPECT_NE(other, b);
}

TEST(Twin, ArmsAndProtocolKeys) {
  EXPECT_TRUE(is_twin("block~"));
  EXPECT_FALSE(is_twin("block"));
  EXPECT_FALSE(is_twin("~"));
  EXPECT_EQ(twin_original("block~"), "block");
  EXPECT_EQ(apply_arm(ModelConfig{}, "rd~").residual, ResidualMode::rd);
  TrainConfig base = preset("tiny");
  const TrainConfig twin = experiment::run_config(base, nullptr, "block~", 3, 2e-6);
  const TrainConfig original = experiment::run_config(base, nullptr, "block", 3, 2e-6);
  EXPECT_EQ(twin.init_perturbation, 2e-6);
  EXPECT_EQ(original.init_perturbation, 0.0);
  EXPECT_EQ(twin.seed, original.seed);
  EXPECT_EQ(twin.data_seed, original.data_seed);
  EXPECT_EQ(to_string(twin.model.residual), to_string(original.model.residual));
  // "@bf16": the same model trained with bf16 matmuls; with "+vres" and a twin's "~".
  const TrainConfig bf16 = experiment::run_config(base, nullptr, "rd+vres@bf16~", 3, 2e-6);
  EXPECT_EQ(bf16.precision, kernels::MatmulPrecision::bf16);
  EXPECT_EQ(bf16.model.residual, ResidualMode::rd);
  EXPECT_TRUE(bf16.model.value_residual);
  EXPECT_EQ(bf16.init_perturbation, 2e-6);
  EXPECT_EQ(experiment::run_config(base, nullptr, "rd", 3).precision, base.precision);
  EXPECT_THROW(apply_arm(ModelConfig{}, "rd@bf8"), Error);
}

// The errors of issue #27, item 5, before any training: each names its key.
TEST(NoiseFloorErrors, ARefusedDesignNamesTheKey) {
  TempDir dir("attnres_noise_floor_errors");
  const std::string head = "[experiment]\nname = \"s\"\ndata = \"d\"\n";
  struct Case {
    std::string text, expected;
  };
  const Case cases[] = {
      // a twin without its baseline
      {head + "seeds = [1, 2]\narms = [\"block\", \"rd~\"]\n", "'rd~' is a twin (suffix ~) of 'rd', which is not among the arms"},
      {head + "seeds = [1, 2]\narms = [\"block\", \"rd\"]\n[experiment.noise]\nseeds = 1\n",
       "'experiment.noise.seeds' must be at least 2"},
      {head + "seeds = [1, 2]\narms = [\"block\", \"rd\"]\n[experiment.failure]\nclipped_fraction = 0\n",
       "'experiment.failure.clipped_fraction' must be in (0, 1]"},
      {head + "seeds = [1, 2]\narms = [\"block\", \"rd\"]\n[experiment.failure]\nstal_steps = 3\n", "stal_steps"},
      {head + "seeds = [1, 2]\narms = [\"block~\", \"rd\"]\n", "the baseline 'block~' cannot be a twin"},
      // sequential looks that do not increase or exceed max_seeds
      {head + "arms = [\"block\", \"rd\"]\neffect = 0.02\n[experiment.sequential]\nlooks = [5, 4]\n",
       "'experiment.sequential.looks' must increase: 4 follows 5"},
      {head + "arms = [\"block\", \"rd\"]\neffect = 0.02\n[experiment.sequential]\nlooks = [5, 12]\nmax_seeds = 10\n",
       "go up to 12 seeds, beyond max_seeds = 10"},
      {head + "seeds = [1, 2, 3]\narms = [\"block\", \"rd\"]\neffect = 0.02\n[experiment.sequential]\nlooks = [3, 5]\n",
       "'seeds' lists 3 seeds but [experiment.sequential] max_seeds is 5"},
      // an effect of interest <= 0
      {head + "arms = [\"block\", \"rd\"]\n[experiment.sequential]\nlooks = [3, 5]\neffect = 0\n",
       "'experiment.sequential.effect' must be a positive number"},
      {head + "arms = [\"block\", \"rd\"]\neffect = -0.02\nseeds = [1]\n", "'experiment.effect' must be a positive number"},
      {head + "arms = [\"block\", \"rd\"]\n[experiment.sequential]\nlooks = [3, 5]\n", "needs 'effect'"},
      {head + "arms = [\"block\", \"rd\"]\neffect = 0.02\n[experiment.sequential]\nlooks = [3, 5]\nprimary = \"hc\"\n",
       "'experiment.sequential.primary' is 'hc', which is not a compared arm"},
      {head + "seeds = [1]\narms = [\"block\", \"rd\"]\n[experiment.noise]\nperturbation = 0.5\n",
       "'experiment.noise.perturbation' must be in (0, 0.01]"},
      // pilots
      {head + "arms = [\"block\", \"rd\"]\n[pilot]\nseeds = [1, 2, 3]\nlr = [1e-3]\nrun_core_seconds = 1\n"
              "budget_core_hours = 1\npilot_core_hours = 1\neffect = 0.02\nout = \"x.toml\"\n",
       "the study needs the baseline's twin 'block~'"},
      {head + "arms = [\"block\", \"block~\", \"rd\"]\n[pilot]\nseeds = [1, 2]\nlr = [1e-3]\n",
       "a pilot needs at least 3"},
      {head + "arms = [\"block\", \"block~\", \"rd\"]\n[pilot]\nseeds = [1, 2, 3]\nlr = [1e-3]\nrun_core_seconds = 1\n"
              "budget_core_hours = 1\npilot_core_hours = 1\nout = \"x.toml\"\n",
       "[pilot] needs 'effect'"},
      {head + "arms = [\"block\", \"block~\", \"rd\"]\n[pilot]\nseeds = [1, 2, 3]\nlr = [1e-3]\nshapes = [[\"model.d_modl=3\"]]\n",
       "model.d_modl"},
  };
  for (const Case& c : cases) {
    const std::string path = write_file(dir, "p.toml", c.text);
    const std::string error = protocol_error(path);
    EXPECT_NE(error.find(c.expected), std::string::npos) << "protocol:\n" << c.text << "\nerror: " << error;
  }
}

// A study with the baseline's twin and sequential seeds: the looks are taken as the seeds come in,
// the noise floor stands beside every comparison, and the report and answer say both.
// A resumed sequential experiment whose files already reach a later look (a worker stopped while
// the last look's probe runs were training, after its main runs had decided) does not stop at the
// first look: it goes on to the deciding look, so the runs of its seeds are finished first.
TEST(SequentialRunner, ADecisionStopsOnlyAtTheLookThatMadeIt) {
  results::SequentialSummary s;
  s.looks.resize(3);
  s.looks[0].n = 4;
  s.looks[1].n = 7;
  s.looks[2].n = 13;
  s.look = 2;
  s.outcome = "not resolved";
  EXPECT_FALSE(experiment::sequential_decided_at(s, 4));
  EXPECT_FALSE(experiment::sequential_decided_at(s, 7));
  EXPECT_TRUE(experiment::sequential_decided_at(s, 13));
  s.look = 1;
  s.outcome = "resolved";
  EXPECT_FALSE(experiment::sequential_decided_at(s, 4));
  EXPECT_TRUE(experiment::sequential_decided_at(s, 7));
  EXPECT_TRUE(experiment::sequential_decided_at(s, 13));
  s.outcome = "continuing";
  EXPECT_FALSE(experiment::sequential_decided_at(s, 7));
  s.look = -1;
  s.outcome = "futile";
  EXPECT_FALSE(experiment::sequential_decided_at(s, 13));
}

TEST_F(NoiseFloorTest, ATwinAndSequentialSeedsRunAndReport) {
  TempDir runs("attnres_sequential_study");
  const std::string protocol = std::string(R"(
[experiment]
name = "seq"
data = ")") + data() + R"("
arms = ["block", "block~", "rd"]
effect = 5.0

[experiment.noise]
perturbation = 1e-4

[experiment.sequential]
looks = [3, 5]
)" + kModelTrain;
  const std::string path = write_file(runs, "seq.toml", protocol);
  const std::string out = runs.str("exp");
  // Two workers, as the studies run: each waits for the other's runs of a look.
  auto other = std::async(std::launch::async,
                          [&] { return run_cli("experiment --protocol " + path + " --out " + out + " --worker 1/2"); });
  const CliResult r = run_cli("experiment --protocol " + path + " --out " + out + " --worker 0/2");
  const CliResult r1 = other.get();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  // An effect of interest of 5 nats: the first look's interval lies inside ±5, so the study stops
  // there for futility, with seeds 4 and 5 never trained.
  EXPECT_NE(r.output.find("sequential seeds: look at 3 seeds"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(": futile"), std::string::npos) << r.output;
  const fs::path dir(out);
  EXPECT_TRUE(fs::exists(dir / "runs/block~/seed-3/result.json"));
  EXPECT_FALSE(fs::exists(dir / "runs/rd/seed-4"));
  const nlohmann::json spec = read_json(dir / "experiment.json");
  EXPECT_EQ(spec.at("seeds"), nlohmann::json({1, 2, 3, 4, 5}));  // 1 .. max_seeds
  EXPECT_EQ(spec.at("twin_perturbation"), 1e-4);
  EXPECT_EQ(spec.at("sequential").at("primary"), "rd");
  // The twin ran from the perturbed weights: its config says so, and it differs from block.
  EXPECT_EQ(parse_toml_config(read_file(dir / "runs/block~/seed-1/run.toml"), "run.toml").init_perturbation, 1e-4);
  EXPECT_EQ(parse_toml_config(read_file(dir / "runs/block/seed-1/run.toml"), "run.toml").init_perturbation, 0.0);

  const analysis::ExperimentSummary s = analysis::compute_summary(out);
  ASSERT_TRUE(s.milestones.back().noise_floor.has_value());
  const results::NoiseFloor& floor = *s.milestones.back().noise_floor;
  EXPECT_EQ(floor.twin, "block~");
  EXPECT_EQ(floor.n, 3);
  // An independent computation of the floor from the result files.
  std::vector<double> d;
  for (int seed = 1; seed <= 3; ++seed) {
    const auto b = read_json(dir / ("runs/block/seed-" + std::to_string(seed) + "/result.json"));
    const auto t = read_json(dir / ("runs/block~/seed-" + std::to_string(seed) + "/result.json"));
    d.push_back(t.at("milestones").back().at("val_nll").get<double>() - b.at("milestones").back().at("val_nll").get<double>());
  }
  const double mean = (d[0] + d[1] + d[2]) / 3;
  double ss = 0;
  for (double x : d) ss += (x - mean) * (x - mean);
  EXPECT_NEAR(floor.mean, mean, 1e-12);
  EXPECT_NEAR(floor.sd, std::sqrt(ss / 2), 1e-12);
  EXPECT_GT(floor.sd, 0);  // the perturbation made a difference
  const auto* rd = s.milestones.back().find("rd");
  ASSERT_TRUE(rd->floor.has_value());
  EXPECT_EQ(rd->floor->twins, std::vector<std::string>{"block~"});
  EXPECT_NEAR(rd->floor->pair_sd, floor.sd, 1e-12);
  EXPECT_NEAR(rd->floor->mean_sd, floor.sd / std::sqrt(3.0), 1e-12);
  // The primary of a sequential design is judged with its look's repeated CI.
  EXPECT_EQ(rd->floor->interval, "repeated 95% CI");
  EXPECT_EQ(rd->floor->interval_low, s.sequential->looks[0].ci_low);
  // Stopped futile at 3 seeds: the runs of seeds 4 and 5 are not needed, not missing.
  EXPECT_TRUE(s.missing.empty());
  EXPECT_EQ(s.not_needed.size(), 6u);
  // Drift: every seed's curves compared, the largest |Δ loss| positive.
  ASSERT_EQ(s.twin_drift.size(), 3u);
  for (const auto& drift : s.twin_drift) {
    EXPECT_EQ(drift.steps, 16);
    EXPECT_GT(drift.max_abs_delta, 0);
  }
  // The sequential record.
  ASSERT_TRUE(s.sequential.has_value());
  EXPECT_EQ(s.sequential->outcome, "futile");
  EXPECT_EQ(s.sequential->look, 0);
  ASSERT_EQ(s.sequential->looks.size(), 1u);
  EXPECT_EQ(s.sequential->looks[0].n, 3);
  EXPECT_NEAR(s.sequential->looks[0].mean, rd->stats.mean, 1e-12);
  // summary.json round-trips it all.
  const std::string summary_path = runs.str("summary.json");
  results::write_summary(summary_path, analysis::summary_file(s));
  const std::string written = read_file(summary_path);
  results::write_summary(summary_path, results::read_summary(summary_path));
  EXPECT_EQ(read_file(summary_path), written);
  EXPECT_NE(written.find("\"noise_floor\""), std::string::npos);
  EXPECT_NE(written.find("\"twin_drift\""), std::string::npos);
  EXPECT_NE(written.find("\"sequential\""), std::string::npos);

  // The answer names the split, the floor and the sequential outcome.
  CliResult a = run_cli("report --experiment " + out + " --answer rd");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("rd vs block, validation NLL at"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("noise floor ±"), std::string::npos) << a.output;
  // The sequential outcome leads the headline, with the repeated p and the calibrated level named.
  EXPECT_NE(a.output.find(" tokens: futile at 3 seeds"), std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find("repeated p = "), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("calibrated α* = "), std::string::npos) << a.output;
  EXPECT_EQ(a.output.find("seeds would be needed"), std::string::npos) << a.output;  // no fixed-sample advice
  // The dry run takes the same sequential decision: nothing to train, the later seeds not needed.
  a = run_cli("experiment --protocol " + path + " --out " + out + " --dry-run");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("0 to train"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("6 not needed: the study stopped futile at the look at 3 seeds"), std::string::npos)
      << a.output;
  a = run_cli("report --experiment " + out + " --quiet");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string html = read_file(dir / "report.html");
  EXPECT_NE(html.find("Sequential seeds"), std::string::npos);
  EXPECT_NE(html.find("Baseline and twin"), std::string::npos);
  const std::string md = read_file(dir / "report.md");
  EXPECT_NE(md.find("Noise floor"), std::string::npos);
}

// An experiment grows: more seeds and arms run beside the recorded runs, which stay as they are.
TEST_F(NoiseFloorTest, AnExperimentGrowsWithMoreSeedsAndArms) {
  TempDir runs("attnres_grow");
  const std::string base = "experiment --preset tiny --set model.d_model=32 --set model.n_layers=1 --set model.n_heads=1 "
                           "--set model.mlp_hidden=32 --set model.n_blocks=1 --set train.seq_len=32 "
                           "--set train.batch_size=2 --set train.eval_tokens=256 --set train.threads=1 "
                           "--tokens 512 --data " + data() + " --out " + runs.str("exp");
  CliResult r = run_cli(base + " --arms block,rd --seeds 1,2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path result = fs::path(runs.str("exp")) / "runs/rd/seed-1/result.json";
  const auto stamp = fs::last_write_time(result);
  r = run_cli(base + " --arms block,rd,block~ --seeds 1,2,3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("grows: arm block~; seeds 3; 4 recorded runs are reused unchanged"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("run 5/9"), std::string::npos) << r.output;
  EXPECT_EQ(fs::last_write_time(result), stamp);
  EXPECT_TRUE(fs::exists(fs::path(runs.str("exp")) / "runs/block~/seed-3/result.json"));
  EXPECT_EQ(read_json(fs::path(runs.str("exp")) / "experiment.json").at("arms"),
            nlohmann::json({"block", "rd", "block~"}));
  // A part of it runs without changing it; another experiment is refused.
  r = run_cli(base + " --arms block,rd --seeds 1,2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_cli(base + " --arms block,rd --seeds 2,1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("may only grow"), std::string::npos) << r.output;
}

// `attnres plan` end to end on a tiny grid: throughput, the grid, the rule, the primary arm, the
// seeds, the protocol file it writes (which reads back as a protocol), and its refusal of a grid
// over its compute cap before any run.
TEST_F(NoiseFloorTest, APilotPlansAndWritesTheProtocol) {
  TempDir runs("attnres_pilot");
  const std::string pilot = std::string(R"(
[experiment]
name = "planned"
data = ")") + data() + R"("
arms = ["block", "block~", "rd", "rd~"]

[experiment.noise]
perturbation = 1e-3
seeds = 2

[experiment.failure]
clipped_fraction = 0.5

[[probe]]
name = "one-layer"
arms = ["block", "rd"]
set = ["model.n_layers=1", "model.n_blocks=1"]
seeds = 3

[pilot]
seeds = [11, 12, 13]
lr = [1e-3, 3e-3]
run_core_seconds = 0.2
budget_core_hours = 1
pilot_core_hours = 0.01
effect = 0.5
throughput_steps = 6
out = ")" + runs.str("planned.toml") + "\"\n" + kModelTrain;
  const std::string path = write_file(runs, "pilot.toml", pilot);
  CliResult r = run_cli("plan --protocol " + path + " --out " + runs.str("pilot"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| shape0 | 0.001 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| shape0 | 0.003 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(chosen)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Sequential seeds: obrien-fleming looks at"), std::string::npos) << r.output;
  // The written protocol: the pilot's table in its header, the chosen learning rate, sequential seeds.
  const std::string written = read_file(runs.str("planned.toml"));
  EXPECT_EQ(written.rfind("# planned: planned by `attnres plan", 0), 0u) << written;
  EXPECT_NE(written.find("# | setting | lr | tokens |"), std::string::npos) << written;
  const experiment::ProtocolFile p = experiment::read_protocol(runs.str("planned.toml"));
  ASSERT_TRUE(p.options.sequential.has_value());
  EXPECT_EQ(p.options.sequential->primary, "rd");
  EXPECT_GE(p.options.sequential->max_seeds, 5);
  EXPECT_TRUE(p.options.base.lr == 1e-3 || p.options.base.lr == 3e-3);
  EXPECT_EQ(p.options.arms, (std::vector<std::string>{"block", "block~", "rd", "rd~"}));
  // The twins on their first seeds, the margin and the failure rule carried into the study.
  EXPECT_EQ(p.options.twin_seeds, 2);
  EXPECT_NEAR(p.options.floor_margin, 0.5 / 3, 1e-9);
  ASSERT_TRUE(p.options.failure.has_value());
  EXPECT_EQ(p.options.failure->clipped_fraction, 0.5);
  ASSERT_EQ(p.options.groups.size(), 1u);
  EXPECT_GT(p.options.groups[0].tokens, 0);  // equal compute: its own budget
  EXPECT_EQ(p.options.groups[0].seed_count, 3);
  EXPECT_NE(written.find("floor UCL"), std::string::npos) << written;
  // The grid's runs: the baseline, the primary arm and both twins at every point.
  const fs::path grid = fs::path(runs.str("pilot")) / "grid";
  for (const char* point : {"shape0-lr0.001", "shape0-lr0.003"})
    for (const char* arm : {"block", "block~", "rd", "rd~"})
      EXPECT_TRUE(fs::exists(grid / point / "runs" / arm / "seed-13/result.json")) << point << " " << arm;
  // Rerunning finds everything done and writes the same plan, also where the records were written
  // before the dataset's content hash existed.
  for (const char* point : {"shape0-lr0.001", "shape0-lr0.003"}) {
    const fs::path spec = grid / point / "experiment.json";
    nlohmann::json older = read_json(spec);
    ASSERT_TRUE(older.at("dataset").contains("content_hash")) << spec;
    older["dataset"].erase("content_hash");
    std::ofstream(spec) << older.dump(1);
  }
  r = run_cli("plan --protocol " + path + " --out " + runs.str("pilot"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_file(runs.str("planned.toml")), written);
  EXPECT_NE(r.output.find("planned.toml (unchanged: it already held this plan)"), std::string::npos) << r.output;
  // Issue #47: a protocol file of other contents there (a committed study, a hand edit) is not
  // replaced without --force; the refusal names it and both ways out.
  std::ofstream(runs.str("planned.toml"), std::ios::app) << "# edited by hand\n";
  const std::string edited = read_file(runs.str("planned.toml"));
  r = run_cli("plan --protocol " + path + " --out " + runs.str("pilot"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("'" + runs.str("planned.toml") + "' exists with other contents; not replaced"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--write PATH"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("plan: note: '" + runs.str("planned.toml") + "' exists"), std::string::npos) << r.output;
  EXPECT_EQ(read_file(runs.str("planned.toml")), edited);
  r = run_cli("plan --protocol " + path + " --out " + runs.str("pilot") + " --force");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_file(runs.str("planned.toml")), written);
  // A grid over the pilot's cap is refused before any run.
  std::string big = pilot;
  big.replace(big.find("run_core_seconds = 0.2"), 22, "run_core_seconds = 10");  // 15 runs: 150 s
  const std::string big_path = write_file(runs, "big.toml", big);
  r = run_cli("plan --protocol " + big_path + " --out " + runs.str("big"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("over pilot_core_hours = 0.01"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(runs.str("big") + "/grid"));
  // A study over its budget even at the fewest seeds is refused, and nothing is written.
  std::string poor = pilot;
  poor.replace(poor.find("budget_core_hours = 1"), 21, "budget_core_hours = 0.0001");
  poor.replace(poor.find("planned.toml"), 12, "poor.toml");
  const std::string poor_path = write_file(runs, "poor.toml.pilot", poor);
  r = run_cli("plan --protocol " + poor_path + " --out " + runs.str("pilot"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("pays for 0 seeds"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(runs.str("poor.toml")));
}
