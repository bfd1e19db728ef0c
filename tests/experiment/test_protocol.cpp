// Protocol files (experiment --protocol): parsing and its errors, the rule that lets controls
// reuse the main baseline, and whole studies with controls and a probe run end to end.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/cli_util.hpp"
#include "experiment/protocol_util.hpp"
#include "experiment/protocol.hpp"
#include "experiment/plan.hpp"
#include "experiment/runner.hpp"
#include "analysis/summary.hpp"
#include "util/error.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

const std::string kModelTrain = tiny_model_train("[0.25, 0.5, 1.0]");

}  // namespace

TEST(Protocol, ReadsMainArmsControlsAndProbes) {
  TempDir dir("attnres_protocol_read");
  const std::string path = write_file(dir, "p.toml", std::string(R"(
[experiment]
name = "study"
description = "a test"
data = "data/x"
seeds = [1, 2, 3]
arms = ["block", "prenorm", "rd"]
effect = 0.01

[experiment.prepare]
input = ["corpus"]
vocab_size = 512

[controls]
arms = ["rd-tied", "rd-frozen"]
budget = 0.25

[[probe]]
name = "shallow"
arms = ["block", "rd"]
set = ["model.n_layers=1", "model.n_blocks=1"]
)") + kModelTrain);
  const experiment::ProtocolFile p = experiment::read_protocol(path);
  const experiment::ExperimentOptions& o = p.options;
  EXPECT_EQ(o.name, "study");
  EXPECT_EQ(o.description, "a test");
  EXPECT_EQ(o.data_dir, "data/x");
  EXPECT_EQ(o.seeds, (std::vector<std::uint64_t>{1, 2, 3}));
  EXPECT_EQ(o.arms, (std::vector<std::string>{"block", "prenorm", "rd"}));
  EXPECT_EQ(o.base.model.d_model, 32);
  EXPECT_EQ(o.base.tokens, 2048);
  EXPECT_EQ(o.base.threads, 1);
  EXPECT_DOUBLE_EQ(p.effect, 0.01);
  ASSERT_TRUE(p.prepare.has_value());
  EXPECT_EQ(p.prepare->inputs, std::vector<std::string>{"corpus"});
  EXPECT_EQ(p.prepare->vocab_size, 512);
  ASSERT_EQ(o.groups.size(), 2u);
  EXPECT_EQ(o.groups[0].name, "controls");
  EXPECT_EQ(o.groups[0].kind, "controls");
  // The main baseline is the controls' baseline, put first.
  EXPECT_EQ(o.groups[0].arms, (std::vector<std::string>{"block", "rd-tied", "rd-frozen"}));
  EXPECT_EQ(o.groups[0].tokens, 512);
  EXPECT_EQ(o.groups[1].name, "shallow");
  EXPECT_EQ(o.groups[1].kind, "probe");
  EXPECT_EQ(o.groups[1].arms, (std::vector<std::string>{"block", "rd"}));
  EXPECT_EQ(o.groups[1].settings, (std::vector<std::string>{"model.n_layers=1", "model.n_blocks=1"}));
  EXPECT_EQ(o.groups[1].tokens, 0);  // the main budget
}

TEST(Protocol, ErrorsNameTheFileLineAndKey) {
  TempDir dir("attnres_protocol_errors");
  const std::string head = "[experiment]\nname = \"s\"\ndata = \"d\"\nseeds = [1]\narms = [\"block\", \"rd\"]\n";
  struct Case {
    std::string text, expected;
  };
  const Case cases[] = {
      {head + "sedes = [2]\n", "p.toml:6: unknown key 'experiment.sedes'"},
      {head + "[model]\nd_model = \"wide\"\n", "p.toml:7"},
      {head + "[model]\nd_modl = 3\n", "model.d_modl"},
      {head + "[controls]\narms = [\"rd-tied\"]\ntokens = 100\nbudget = 0.5\n", "both 'tokens' and 'budget'"},
      {head + "[controls]\narms = [\"rd-tied\"]\nbudget = 2\n", "p.toml:8: 'controls.budget' must be a fraction"},
      {head + "[controls]\nbaseline = \"block\"\n", "needs 'arms' besides its baseline"},
      {head + "[[probe]]\narms = [\"block\", \"rd\"]\n", "every [[probe]] needs a 'name'"},
      {head + "[[probe]]\nname = \"a/b\"\narms = [\"rd\"]\n", "'a/b' is not a valid group name"},
      {head + "[[probe]]\nname = \"x\"\narms = [\"rd\"]\n[[probe]]\nname = \"x\"\narms = [\"rd\"]\n",
       "two groups are named 'x'"},
      {head + "[extra]\nkey = 1\n", "p.toml:6: unknown table 'extra'"},
      {"[experiment]\nname = \"s\"\ndata = \"d\"\narms = [\"block\"]\n", "needs 'seeds'"},
      {"[experiment]\nname = \"s\"\ndata = \"d\"\nseeds = [-1]\narms = [\"block\"]\n", "non-negative integers"},
      {"[model]\nd_model = 32\n", "needs an [experiment] table"},
      {"[experiment\n", "p.toml:1"},
      // Issue #47: unknown keys and tables get the closest known one; a bad arm its file and line.
      {head + "sedes = [2]\n", "unknown key 'experiment.sedes'; did you mean 'experiment.seeds'?"},
      {head + "[controls]\narms = [\"rd-tied\"]\nbudjet = 0.5\n", "p.toml:8: unknown key 'controls.budjet'; did you "
                                                                  "mean 'controls.budget'?"},
      {head + "[experiment.sequentail]\nlooks = [2]\n", "did you mean 'experiment.sequential'?"},
      {head + "[probes]\nname = \"x\"\n", "p.toml:6: unknown table 'probes'; did you mean 'probe'?"},
      {"[experiment]\nname = \"s\"\ndata = \"d\"\nseeds = [1]\narms = [\"block\", \"rdd\"]\n",
       "p.toml:5: [experiment] arms: unknown arm 'rdd'"},
      {head + "[[probe]]\nname = \"x\"\narms = [\"rd-tide\"]\n", "p.toml:8: [probe] 'x' arms: unknown arm 'rd-tide'"},
  };
  for (const Case& c : cases) {
    const std::string path = write_file(dir, "p.toml", c.text);
    const std::string error = protocol_error(path);
    EXPECT_NE(error.find(c.expected), std::string::npos) << "protocol:\n" << c.text << "\nerror: " << error;
  }
}

TEST(Protocol, ReuseOfTheMainBaselineNeedsTheSameRunPrefix) {
  TrainConfig main = preset("tiny");
  main.tokens = 64 * main.tokens_per_step();
  main.milestones = {0.25, 0.5, 1.0};
  main.decay = LrDecay::constant;
  main.warmup_fraction = 0;
  TrainConfig group = main;
  group.tokens = 16 * main.tokens_per_step();  // 16 steps: main evaluates at step 16
  EXPECT_TRUE(experiment::same_run_prefix(main, group));
  group.milestones = {0.5, 1.0};  // where a run evaluates does not change it
  group.checkpoint_every = 3;
  group.keep_checkpoints = 5;  // nor how many checkpoints it keeps
  EXPECT_TRUE(experiment::same_run_prefix(main, group));
  group.tokens = 24 * main.tokens_per_step();  // main does not evaluate at step 24
  EXPECT_FALSE(experiment::same_run_prefix(main, group));
  group.tokens = 16 * main.tokens_per_step();
  group.lr = main.lr / 2;  // another run
  EXPECT_FALSE(experiment::same_run_prefix(main, group));
  // Warm-up is a fraction of each run's own steps: a shorter run warms up faster.
  TrainConfig warm_main = main, warm_group = group;
  warm_main.warmup_fraction = warm_group.warmup_fraction = 0.1;
  warm_group.lr = main.lr;
  EXPECT_FALSE(experiment::same_run_prefix(warm_main, warm_group));
  // Cosine decays over each run's own budget.
  TrainConfig cos_main = main, cos_group = main;
  cos_main.decay = cos_group.decay = LrDecay::cosine;
  cos_group.tokens = 16 * main.tokens_per_step();
  EXPECT_FALSE(experiment::same_run_prefix(cos_main, cos_group));
  EXPECT_TRUE(experiment::same_run_prefix(cos_main, cos_main));
}

namespace {

class StudyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("attnres_study_test");
    prepare_synthetic_data(dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->str("data"); }
  static TempDir* dir_;
};
TempDir* StudyTest::dir_ = nullptr;

const nlohmann::json& group_named(const nlohmann::json& groups, const std::string& name) {
  for (const auto& g : groups)
    if (g.at("name") == name) return g;
  throw std::runtime_error("no group " + name);
}

}  // namespace

TEST_F(StudyTest, ControlsAndProbeRunResumeAndReport) {
  TempDir runs("attnres_study_runs");
  const std::string protocol = std::string(R"(
[experiment]
name = "mini"
data = ")") + data() + R"("
seeds = [1, 2]
arms = ["block", "rd", "prenorm"]

[controls]
arms = ["rd-tied", "rd-frozen"]
budget = 0.5

[[probe]]
name = "shallow"
arms = ["block", "rd"]
set = ["model.n_layers=1", "model.n_blocks=1"]
)" + kModelTrain;
  const std::string path = write_file(runs, "mini.toml", protocol);
  const std::string out = runs.str("exp");
  CliResult r = run_cli("experiment --protocol " + path + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path dir(out);

  const nlohmann::json spec = read_json(dir / "experiment.json");
  EXPECT_EQ(spec.at("version"), 2);
  EXPECT_EQ(spec.at("name"), "mini");
  EXPECT_EQ(spec.at("data"), data());  // as given: nothing machine-specific is added
  EXPECT_TRUE(spec.at("dataset").contains("tokenizer_hash"));
  const auto& controls = group_named(spec.at("groups"), "controls");
  EXPECT_EQ(controls.at("tokens"), 1024);
  EXPECT_EQ(controls.at("baseline_from_main"), false);  // cosine decays over each run's own budget
  EXPECT_EQ(group_named(spec.at("groups"), "shallow").at("model").at("n_layers"), 1);

  for (int seed : {1, 2}) {
    const std::string s = "seed-" + std::to_string(seed);
    for (const char* arm : {"block", "rd", "prenorm"}) EXPECT_TRUE(fs::exists(dir / "runs" / arm / s / "result.json"));
    for (const char* arm : {"block", "rd-tied", "rd-frozen"})
      EXPECT_TRUE(fs::exists(dir / "runs/controls" / arm / s / "result.json")) << arm;
    for (const char* arm : {"block", "rd"}) EXPECT_TRUE(fs::exists(dir / "runs/shallow" / arm / s / "result.json"));
    // The controls' baseline trained to their budget (half the steps), the probe's at one layer.
    const auto block_half = read_json(dir / "runs/controls/block" / s / "train_result.json");
    EXPECT_EQ(block_half.at("steps"), 8);
  }

  const nlohmann::json summary = read_json(dir / "summary.json");
  const auto& cs = group_named(summary.at("groups"), "controls");
  // rd-tied reproduces block bit for bit at the controls' budget too.
  for (const auto& arm : cs.at("validation").back().at("arms")) {
    if (arm.at("arm") != "rd-tied") continue;
    for (const auto& d : arm.at("delta_nll")) EXPECT_EQ(d.at("value"), 0.0);
  }
  EXPECT_EQ(group_named(summary.at("groups"), "shallow").at("kind"), "probe");
  EXPECT_NE(r.output.find("Probes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Controls 'controls'"), std::string::npos) << r.output;
  // The headline names the protocol and its model, not the preset its unset keys came from.
  EXPECT_NE(r.output.find("protocol mini · 2 layers × 32; baseline block"), std::string::npos) << r.output;

  // Rerunning skips every finished run; a changed protocol is refused.
  const auto stamp = fs::last_write_time(dir / "runs/shallow/rd/seed-2/result.json");
  r = run_cli("experiment --protocol " + path + " --out " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(fs::last_write_time(dir / "runs/shallow/rd/seed-2/result.json"), stamp);
  std::string changed = protocol;
  changed.replace(changed.find("budget = 0.5"), 12, "budget = 0.25");
  const std::string changed_path = write_file(runs, "changed.toml", changed);
  r = run_cli("experiment --protocol " + changed_path + " --out " + out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("different experiment"), std::string::npos) << r.output;

  // The one-line answer, and the report of the directory alone.
  r = run_cli("report --experiment " + out + " --answer rd");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("rd vs block, validation NLL at ", 0), 0u) << r.output;
  r = run_cli("report --experiment " + out + " --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(read_file(dir / "report.md").find("Controls 'controls'"), std::string::npos);
  // Options a protocol fixes are refused beside it.
  r = run_cli("experiment --protocol " + path + " --arms block,rd --out " + out);
  EXPECT_NE(r.exit_code, 0);
}

TEST_F(StudyTest, ControlsReuseTheMainBaselineWhenTheScheduleAllows) {
  TempDir runs("attnres_study_reuse");
  std::string protocol = std::string(R"(
[experiment]
name = "reuse"
data = ")") + data() + R"("
seeds = [1, 2]
arms = ["block", "rd"]

[[controls]]
arms = ["rd-tied"]
budget = 0.5

[[controls]]
name = "against-rd"
baseline = "rd"
arms = ["rd-average"]
budget = 0.5
)" + kModelTrain + "decay = \"constant\"\nwarmup_fraction = 0.0\n";
  const std::string path = write_file(runs, "reuse.toml", protocol);
  const std::string out = runs.str("exp");
  // --dry-run lists the runs (the reused baselines are not among them) and writes nothing.
  CliResult dry = run_cli("experiment --protocol " + path + " --out " + out + " --dry-run");
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("8 runs in '" + out + "': 0 done, 8 to train"), std::string::npos) << dry.output;
  EXPECT_NE(dry.output.find("against-rd/rd-average seed 2"), std::string::npos) << dry.output;
  EXPECT_EQ(dry.output.find("against-rd/rd seed"), std::string::npos) << dry.output;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_NE(dry.output.find("cost: unknown until a run finishes here"), std::string::npos) << dry.output;
  // A protocol whose data is not prepared yet is costed from the protocol (its vocabulary from
  // [experiment.prepare], its throughput planned), nothing written.
  std::string unprepared = protocol;
  unprepared.replace(unprepared.find(data()), data().size(), runs.str("no-data"));
  unprepared.insert(unprepared.find("\n", unprepared.find("[experiment]")) + 1,
                    "planned_tokens_per_core_second = 1000\n");
  unprepared += "\n[experiment.prepare]\ninput = [\"corpus\"]\nvocab_size = 300\n";
  const std::string unprepared_path = write_file(runs, "unprepared.toml", unprepared);
  dry = run_cli("experiment --protocol " + unprepared_path + " --out " + out + " --dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("is not prepared yet: the runs are costed from the protocol"), std::string::npos)
      << dry.output;
  EXPECT_NE(dry.output.find("planned: the protocol's planned_tokens_per_core_second: 1,000 tokens per core-second"),
            std::string::npos) << dry.output;
  // On a GPU, an arm the CUDA backend cannot train (its family's record, model/family.hpp) would be
  // refused by name before any run; every family now runs there with every option (issue #48):
  // DenseFormer, the value residual, Delta AttnRes, the Gated Residual, hyper-connections, mHC and
  // MUDDFormer (the options: ResidualModes.*OnCuda* in test_arms.cpp).
  dry = run_cli("experiment --preset tiny --data " + data() +
                " --arms block,rd+vres,denseformer-4x5+vres,delta,delta-block,gr,hc,hc-static,mhc,mudd,mudd-static,"
                "mudd-r --device cuda --out " + out + " --dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(runs.str("no-data")));
  const CliResult r = run_cli("experiment --protocol " + path + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  dry = run_cli("experiment --protocol " + path + " --out " + out + " --dry-run");
  EXPECT_NE(dry.output.find("8 runs in '" + out + "': 8 done, 0 to train (0 tokens)"), std::string::npos) << dry.output;
  // The real command's checks of the recorded experiment: a changed learning rate is refused by the
  // dry run too; more seeds are a growth, priced from the runs' own throughput.
  std::string changed = protocol;
  changed += "lr = 0.0123\n";
  dry = run_cli("experiment --protocol " + write_file(runs, "changed.toml", changed) + " --out " + out + " --dry-run");
  EXPECT_EQ(dry.exit_code, 1) << dry.output;
  EXPECT_NE(dry.output.find("holds a different experiment"), std::string::npos) << dry.output;
  std::string more = protocol;
  more.replace(more.find("seeds = [1, 2]"), 14, "seeds = [1, 2, 3]");
  dry = run_cli("experiment --protocol " + write_file(runs, "more.toml", more) + " --out " + out + " --dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("12 runs in '" + out + "': 8 done, 4 to train"), std::string::npos) << dry.output;
  EXPECT_NE(dry.output.find("the experiment grows: seeds 3"), std::string::npos) << dry.output;
  EXPECT_NE(dry.output.find("measured by 8 finished runs here"), std::string::npos) << dry.output;
  // A core-second is priced from the runs' CPU time (cpu_seconds_per_step), not their wall clock:
  // with each run's CPU time set to buy 12,345 tokens per core-second, the dry run says so.
  for (const auto& e : fs::recursive_directory_iterator(out))
    if (e.path().filename() == "result.json") {
      nlohmann::json j = read_json(e.path());
      const double tokens_per_step = j.at("tokens_per_sec").get<double>() * j.at("step_time_ms").get<double>() / 1000;
      j["cpu_seconds_per_step"] = tokens_per_step / 12345.0;
      std::ofstream(e.path()) << j.dump();
    }
  dry = run_cli("experiment --protocol " + write_file(runs, "more.toml", more) + " --out " + out + " --dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("12,345 tokens per core-second"), std::string::npos) << dry.output;
  const fs::path dir(out);
  const nlohmann::json spec = read_json(dir / "experiment.json");
  const auto& controls = group_named(spec.at("groups"), "controls");
  EXPECT_EQ(controls.at("baseline_from_main"), true);
  EXPECT_FALSE(fs::exists(dir / "runs/controls/block"));  // not trained again
  EXPECT_TRUE(fs::exists(dir / "runs/controls/rd-tied/seed-1/result.json"));
  // A group whose baseline is another main arm reuses that arm's runs the same way.
  EXPECT_EQ(group_named(spec.at("groups"), "against-rd").at("baseline_from_main"), true);
  EXPECT_FALSE(fs::exists(dir / "runs/against-rd/rd"));
  EXPECT_NE(r.output.find("run 8/8"), std::string::npos) << r.output;  // 2 seeds x block, rd, rd-tied, rd-average

  const analysis::ExperimentSummary s = analysis::compute_summary(out);
  ASSERT_EQ(s.groups.size(), 2u);
  {
    const analysis::ExperimentSummary& g = s.groups[1].summary;
    ASSERT_FALSE(g.milestones.empty());
    const analysis::Comparison* main_at = nullptr;
    for (const auto& c : s.milestones)
      if (c.tokens == g.milestones.back().tokens) main_at = &c;
    ASSERT_NE(main_at, nullptr);
    ASSERT_EQ(g.milestones.back().find("rd")->values.size(), 2u);
    for (std::size_t i = 0; i < 2; ++i)
      EXPECT_EQ(g.milestones.back().find("rd")->values[i].value, main_at->find("rd")->values[i].value);
  }
  const analysis::ExperimentSummary& g = s.groups[0].summary;
  ASSERT_FALSE(g.milestones.empty());
  const auto& last = g.milestones.back();
  EXPECT_EQ(last.tokens, 1024);
  // The baseline's values are the main block runs' at 1024 tokens; rd-tied equals them exactly,
  // which also shows that a run stopped at the milestone equals the longer run there.
  const analysis::Comparison* main_at = nullptr;
  for (const auto& c : s.milestones)
    if (c.tokens == 1024) main_at = &c;
  ASSERT_NE(main_at, nullptr);
  EXPECT_EQ(last.find("block")->values.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i)
    EXPECT_EQ(last.find("block")->values[i].value, main_at->find("block")->values[i].value);
  for (const auto& d : last.find("rd-tied")->deltas) EXPECT_EQ(d.value, 0.0);
  // No test NLL of the baseline at this budget: nothing is paired on the test split.
  EXPECT_TRUE(g.test.find("block")->values.empty());
  EXPECT_TRUE(g.test.find("rd-tied")->deltas.empty());
}
