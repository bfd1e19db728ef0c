// The result file schemas (src/results). Files that attnres wrote before the schemas existed
// (tests/results/data/old-format: a paired experiment of the runner and report of that time) read
// and write back byte for byte; what a schema writes it reads back; a malformed file is refused with
// an error that names the file and the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string_view>

#include "kernels/gemm_bf16.hpp"
#include "kernels/gemm_f32.hpp"
#include "results/experiment_spec.hpp"
#include "results/provenance.hpp"
#include "results/run_result.hpp"
#include "results/summary.hpp"
#include "results/train_result.hpp"
#include "util/atomic_file.hpp"
#include "util/build_info.hpp"
#include "util/error.hpp"
#include "util/machine.hpp"
#include "util/threads.hpp"

namespace attnres::results {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kOldFormat = fs::path(ATTNRES_SOURCE_DIR) / "tests/results/data/old-format";

// A fresh directory under the system's temporary directory, removed with the object.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("attnres-results-" + std::to_string(::getpid()) + "-" + info->test_suite_name() + "-" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// The Error `f` throws; fails the test when it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

// `text` with one edit applied to its JSON, written to `path`.
void write_edited(const std::string& path, const std::string& text, const std::function<void(json&)>& edit) {
  json j = json::parse(text);
  edit(j);
  std::ofstream(path) << j.dump(1);
}

std::vector<fs::path> old_run_results() {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(kOldFormat / "runs"))
    if (e.path().filename() == "result.json") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(OldFormat, EveryFileReadsAndWritesBackByteForByte) {
  TempDir tmp;
  const std::string spec_text = read_text_file((kOldFormat / "experiment.json").string());
  const ExperimentSpec spec = read_experiment_spec((kOldFormat / "experiment.json").string());
  write_experiment_spec(tmp.file("experiment.json"), spec);
  EXPECT_EQ(read_text_file(tmp.file("experiment.json")), spec_text);
  EXPECT_EQ(read_experiment_spec(tmp.file("experiment.json")), spec);  // what a resumed runner compares
  EXPECT_FALSE(spec.data.empty());

  const auto runs = old_run_results();
  ASSERT_EQ(runs.size(), 6u);
  bool routed = false, unrouted = false;
  for (const auto& path : runs) {
    SCOPED_TRACE(path.string());
    const RunResult r = read_run_result(path.string());
    (r.routing.empty() ? unrouted : routed) = true;
    ASSERT_FALSE(r.milestones.empty());
    EXPECT_TRUE(r.milestones.front().step.has_value());  // the runner copied train_result.json's
    write_run_result(tmp.file("result.json"), r);
    EXPECT_EQ(read_text_file(tmp.file("result.json")), read_text_file(path.string()));
  }
  EXPECT_TRUE(routed && unrouted);  // rd and block, and prenorm

  const fs::path train = kOldFormat / "runs/rd/seed-1/train_result.json";
  write_train_result(tmp.file("train_result.json"), read_train_result(train.string()));
  EXPECT_EQ(read_text_file(tmp.file("train_result.json")), read_text_file(train.string()));

  const fs::path summary = kOldFormat / "summary.json";
  write_summary(tmp.file("summary.json"), read_summary(summary.string()));
  EXPECT_EQ(read_text_file(tmp.file("summary.json")), read_text_file(summary.string()));
}

// A dynamic `hc` run's result.json as the runner wrote it before the per-token connections and the
// Amax gains (a copy of docs/results/baselines/runs/hc/seed-1's, the matched-baselines study): its
// connections are "hc_static_part" (the unfolding of A and B alone, without the per-token terms)
// and there is no "amax_gain".
TEST(OldFormat, HcStaticPartReadsAndWritesBackByteForByte) {
  TempDir tmp;
  const std::string path = (fs::path(ATTNRES_SOURCE_DIR) / "tests/results/data/hc-static-part/result.json").string();
  const RunResult r = read_run_result(path);
  EXPECT_EQ(r.arm, "hc");
  ASSERT_EQ(r.connections.size(), 1u);
  EXPECT_EQ(r.connections[0].name, "hc_static_part");
  ASSERT_EQ(r.connections[0].rows.size(), 9u);  // the tiny preset's 8 sublayers and the readout
  EXPECT_FALSE(r.amax_gain.has_value());
  write_run_result(tmp.file("result.json"), r);
  EXPECT_EQ(read_text_file(tmp.file("result.json")), read_text_file(path));
}

TEST(Schemas, ReadBackWhatTheyWrite) {
  TempDir tmp;
  TrainResult t;
  t.params = 9814784;
  t.steps = 3;
  t.milestones = {{1, 128, 5.5}, {3, 384, 5.25}};
  t.curve = {{128, 6.0}, {256, 5.75}, {384, 5.5}};
  t.tokens_per_sec = 0;  // no step ran in this process (resumed at the end)
  t.step_time_ms = 0;
  t.peak_rss_bytes = 2050000000;
  t.processes = 2;
  t.reduce_fraction = 0.125;
  t.micro_batches = 4;
  write_train_result(tmp.file("t.json"), t);
  EXPECT_EQ(to_json(read_train_result(tmp.file("t.json"))), to_json(t));
  EXPECT_FALSE(json::parse(read_text_file(tmp.file("t.json"))).contains("cpu_seconds_per_step"));  // not recorded
  t.cpu_seconds_per_step = 0.236;
  write_train_result(tmp.file("t.json"), t);
  EXPECT_EQ(read_train_result(tmp.file("t.json")).cpu_seconds_per_step, 0.236);

  RunResult r;
  r.arm = "rd";
  r.seed = 2;
  r.params = 1064;
  r.milestones = {{std::nullopt, 1000, 5.0}, {std::nullopt, 2000, 4.5}};
  r.test_nll = 4.4;
  r.peak_rss_bytes = 1 << 20;
  r.routing = {{0, 1, {1.0}, {1.0}, 0.0, {}, kNotAvailable}, {1, 2, {0.25, 0.75}, {0.5, 0.5}, 0.1, {}, kNotAvailable}};
  r.connections = {{"dwa", {{1, {0, 1}, {0.125, 1.5}}, {2, {0, 2}, {-0.25, 1.0}}}}};
  r.cpu_seconds_per_step = 0.125;
  write_run_result(tmp.file("r.json"), r);
  const RunResult back = read_run_result(tmp.file("r.json"));
  EXPECT_EQ(to_json(back), to_json(r));
  EXPECT_EQ(back.cpu_seconds_per_step, 0.125);
  r.cpu_seconds_per_step = 0;
  EXPECT_FALSE(back.amax_gain.has_value());
  EXPECT_FALSE(json::parse(read_text_file(tmp.file("r.json"))).contains("amax_gain"));
  // An n-stream arm's: per-token connections and the Amax gains.
  r.routing.clear();
  r.connections = {{"mhc", {{0, {0}, {1.0}}, {1, {0, 1}, {0.5, 1.25}}}}};
  r.amax_gain = AmaxGain{1.0, 1.0000002, 1.25, 1.5, 1.0, 1.75};
  write_run_result(tmp.file("r.json"), r);
  const std::string text = read_text_file(tmp.file("r.json"));
  const RunResult gain = read_run_result(tmp.file("r.json"));
  ASSERT_TRUE(gain.amax_gain.has_value());
  EXPECT_EQ(gain.amax_gain->composite_forward_max, 1.0000002);
  EXPECT_EQ(gain.amax_gain->composite_backward_mean, 1.25);
  EXPECT_EQ(gain.amax_gain->layer_backward_max, 1.75);
  write_run_result(tmp.file("r.json"), gain);
  EXPECT_EQ(read_text_file(tmp.file("r.json")), text);
  // Delta AttnRes's: the routing-collapse statistic beside its routing; at most 1.
  r.amax_gain.reset();
  r.connections.clear();
  r.routing = {{1, 2, {0.25, 0.75}, {}, kNotAvailable, {}, kNotAvailable}};
  r.routing_max_weight = 0.625;
  write_run_result(tmp.file("r.json"), r);
  const RunResult delta = read_run_result(tmp.file("r.json"));
  ASSERT_TRUE(delta.routing_max_weight.has_value());
  EXPECT_EQ(*delta.routing_max_weight, 0.625);
  EXPECT_EQ(to_json(delta), to_json(r));
  json bad = to_json(r);
  bad["routing_max_weight"] = 1.5;
  write_text_atomically(tmp.file("bad.json"), bad.dump());
  EXPECT_THROW(read_run_result(tmp.file("bad.json")), Error);
  r.routing_max_weight.reset();
  EXPECT_FALSE(json::parse(read_text_file(tmp.file("r.json")))["milestones"][0].contains("step"));

  ExperimentSpec s;
  s.arms = {"block", "rd"};
  s.baseline = "block";
  s.seeds = {1, 2};
  s.tokens = 4000;
  s.milestones = {2000, 4000};
  s.train = {{"lr", 0.003}};
  write_experiment_spec(tmp.file("e.json"), s);
  EXPECT_EQ(read_experiment_spec(tmp.file("e.json")), s);
  ExperimentSpec other = s;
  other.seeds = {1, 3};
  EXPECT_NE(read_experiment_spec(tmp.file("e.json")), other);
  EXPECT_FALSE(json::parse(read_text_file(tmp.file("e.json"))).contains("data"));  // "" is left out
}

// What plan and experiment --dry-run price a core-second with: the CPU time where recorded, so a
// measurement taken while other work shared the cores is not read as a cheaper core (cpu-v3's
// first throughput measurement: 2,452 tokens/s by the wall clock, 835 ms a step of 2,048 tokens).
TEST(Schemas, TokensPerCoreSecondComesFromTheCpuTime) {
  const double wall_rate = 2048 / 0.835;
  // 0.236 CPU seconds a step: the run was waiting for a core the rest of the time.
  EXPECT_NEAR(tokens_per_core_second(wall_rate, 835, 0.236, 1), 2048 / 0.236, 1e-6);
  // Not recorded (files of earlier builds): the wall-clock rate over the threads, as before.
  EXPECT_NEAR(tokens_per_core_second(wall_rate, 835, 0, 2), wall_rate / 2, 1e-9);
  // Four threads busy for the whole step: CPU time 4x the wall clock, a quarter of the rate per core.
  EXPECT_NEAR(tokens_per_core_second(wall_rate, 835, 4 * 0.835, 4), wall_rate / 4, 1e-9);
  // Two ranks, each spending its CPU time on the step of the whole batch.
  EXPECT_NEAR(tokens_per_core_second(wall_rate, 835, 0.835, 1, 2), wall_rate / 2, 1e-9);
}

// result.json and train_result.json carry their schema version from this build on; files without
// one (earlier builds: the old-format tests above) read as before, an unknown version is an error.
TEST(Schemas, ResultFilesCarryTheirVersion) {
  TempDir tmp;
  RunResult r;
  r.arm = "rd";
  r.seed = 1;
  r.params = 10;
  const std::string result = tmp.file("result.json");
  write_run_result(result, r);
  const json written = json::parse(read_text_file(result));
  EXPECT_EQ(written.at("version"), kRunResultVersion);
  EXPECT_EQ(read_run_result(result).version, kRunResultVersion);
  const std::string train = tmp.file("train_result.json");
  write_train_result(train, TrainResult{});
  EXPECT_EQ(json::parse(read_text_file(train)).at("version"), kTrainResultVersion);
  EXPECT_EQ(read_train_result(train).version, kTrainResultVersion);

  const std::string text = read_text_file(result), train_text = read_text_file(train);
  for (const int bad : {kRunResultVersion + 1, 0}) {
    write_edited(result, text, [&](json& j) { j["version"] = bad; });
    const std::string msg = error_of([&] { read_run_result(result); });
    EXPECT_NE(msg.find(result + ": key 'version' is " + std::to_string(bad) + "; this build reads version 1"),
              std::string::npos)
        << msg;
    write_edited(train, train_text, [&](json& j) { j["version"] = bad; });
    EXPECT_NE(error_of([&] { read_train_result(train); }).find(train + ": key 'version' is "), std::string::npos);
  }
  const RunResult old = read_run_result((kOldFormat / "runs/rd/seed-1/result.json").string());
  EXPECT_EQ(old.version, kUnversioned);
}

// MUDD's routing (a K route of its own, JS(K, V)): written, read back byte for byte, and checked;
// files without it (every file written before it existed) read as before, with no K route.
TEST(Schemas, MuddRoutingReadsBackAndIsChecked) {
  TempDir tmp;
  RunResult r;
  r.arm = "mudd";
  r.seed = 1;
  r.params = 1100;
  r.milestones = {{std::nullopt, 1000, 5.0}};
  r.routing = {{0, 1, {1.0}, {1.0}, 0.0, {1.0}, 0.0}, {1, 2, {0.25, 0.75}, {0.5, 0.5}, 0.1, {0.125, 0.875}, 0.2}};
  const std::string path = tmp.file("result.json");
  write_run_result(path, r);
  const std::string text = read_text_file(path);
  const RunResult back = read_run_result(path);
  EXPECT_EQ(back.routing[1].k_mean, (std::vector<double>{0.125, 0.875}));
  EXPECT_EQ(back.routing[1].js_k_nats, 0.2);
  write_run_result(path, back);
  EXPECT_EQ(read_text_file(path), text);
  // A single-source layer may leave its K route out, like its V route.
  write_edited(path, text, [](json& j) {
    j["routing"]["layers"][0].erase("k_mean");
    j["routing"]["layers"][0].erase("js_k_nats");
  });
  EXPECT_EQ(read_run_result(path).routing[0].k_mean, std::vector<double>{1.0});

  for (const auto& old : old_run_results()) {
    for (const LayerRouting& l : read_run_result(old.string()).routing) {
      EXPECT_TRUE(l.k_mean.empty()) << old;
      EXPECT_TRUE(std::isnan(l.js_k_nats)) << old;
    }
  }

  struct Case {
    std::function<void(json&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["routing"]["layers"][1]["k_mean"] = {0.5, 0.25, 0.25}; },
       "key 'routing.layers[1].k_mean' has 3 entries but 'sources' is 2"},
      {[](json& j) { j["routing"]["layers"][1]["k_mean"] = {0.5, 0.75}; },
       "key 'routing.layers[1].k_mean' must sum to 1"},
      {[](json& j) { j["routing"]["layers"][1]["k_mean"] = "q"; }, "key 'routing.layers[1].k_mean' must be an array"},
      {[](json& j) { j["routing"]["layers"][1]["js_k_nats"] = 0.7; },
       "key 'routing.layers[1].js_k_nats' must lie in [0, ln 2]"},
      {[](json& j) { j["routing"]["layers"][1]["js_k_nats"] = "high"; },
       "key 'routing.layers[1].js_k_nats' must be a number"},
      {[](json& j) { j["routing"]["layers"][1].erase("k_mean"); },
       "key 'routing.layers[1].js_k_nats' is given without 'k_mean'"},
      {[](json& j) { j["routing"]["layers"][1].erase("k_mean"), j["routing"]["layers"][1].erase("js_k_nats"); },
       "key 'routing.layers' gives 'k_mean' for some layers but not for layer 1"},
      {[](json& j) {
         for (auto& l : j["routing"]["layers"]) l.erase("v_mean"), l.erase("js_nats");
       },
       "key 'routing.layers' gives 'k_mean' without 'v_mean'"},
      {[](json& j) { j["routing"]["layers"][1]["js_k_bits"] = 0.3; },
       "key 'routing.layers[1].js_k_bits' is not part"},
  };
  for (const auto& c : cases) {
    write_edited(path, text, c.edit);
    const std::string msg = error_of([&] { read_run_result(path); });
    EXPECT_NE(msg.find(path + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.want), std::string::npos) << msg;
  }
}

// A well-formed "amax_gain" for the malformed variants below.
const json kGain = {{"composite_forward_mean", 1.0},  {"composite_forward_max", 1.0},
                    {"composite_backward_mean", 1.25}, {"composite_backward_max", 1.5},
                    {"layer_forward_max", 1.0},        {"layer_backward_max", 1.75}};

TEST(Strict, UnknownMissingAndMistypedKeysNameTheFileAndKey) {
  TempDir tmp;
  const std::string path = tmp.file("result.json");
  const std::string text = read_text_file(old_run_results().back().string());  // runs/rd/seed-2
  struct Case {
    std::function<void(json&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](json& r) { r["tokens_per_second"] = 1.0; }, "key 'tokens_per_second' is not part of this file's format"},
      {[](json& r) { r["milestones"][0]["val_loss"] = 1.0; }, "key 'milestones[0].val_loss' is not part"},
      {[](json& r) { r["routing"]["layers"][1]["js_bits"] = 0.1; }, "key 'routing.layers[1].js_bits' is not part"},
      {[](json& r) { r["routing"]["mean"] = 0.1; }, "key 'routing.mean' is not part"},
      {[](json& r) { r["curve"][2]["train_loss"] = "high"; }, "key 'curve[2].train_loss' must be a number"},
      {[](json& r) { r["milestones"][1]["step"] = 1.5; }, "key 'milestones[1].step' must be an integer"},
      {[](json& r) { r["peak_rss_bytes"] = -1; }, "key 'peak_rss_bytes' must not be negative"},
      {[](json& r) { r.erase("step_time_ms"); }, "key 'step_time_ms' is missing"},
      {[](json& r) { r["routing"] = 3; }, "key 'routing' must be an object"},
      {[](json& r) { r["connections"] = {{{"name", "dwa"}, {"rows", {{{"target", 1}, {"sources", {0, 1}}, {"weights", {1.0}}}}}}}; },
       "key 'connections[0].rows[0].weights' has 1 entries but 'sources' has 2"},
      {[](json& r) { r["connections"] = {{{"name", "dwa"}, {"rows", {{{"target", 1}, {"sources", {1, 0}}, {"weights", {1.0, 1.0}}}}}}}; },
       "key 'connections[0].rows[0].sources[1]' must be larger than the source before"},
      {[](json& r) {
         const json c = {{"name", "dwa"}, {"rows", {{{"target", 1}, {"sources", {0}}, {"weights", {1.0}}}}}};
         r["connections"] = {c, c};
       },
       "key 'connections[1]' repeats the connections 'dwa'"},
      {[](json& r) { r["connections"] = {{{"name", "dwa"}, {"rows", json::array()}, {"mean", 1}}}; },
       "key 'connections[0].mean' is not part"},
      {[](json& r) { r["amax_gain"] = 3; }, "key 'amax_gain' must be an object"},
      {[](json& r) {
         r["amax_gain"] = kGain;
         r["amax_gain"].erase("composite_backward_max");
       },
       "key 'amax_gain.composite_backward_max' is missing"},
      {[](json& r) {
         r["amax_gain"] = kGain;
         r["amax_gain"]["layer_forward_max"] = -1.0;
       },
       "key 'amax_gain.layer_forward_max' must not be negative"},
      {[](json& r) {
         r["amax_gain"] = kGain;
         r["amax_gain"]["composite_forward_mean"] = "1";
       },
       "key 'amax_gain.composite_forward_mean' must be a number"},
      {[](json& r) {
         r["amax_gain"] = kGain;
         r["amax_gain"]["composite_backward_mean"] = 2.0;
       },
       "key 'amax_gain.composite_backward_mean' is 2, larger than 'composite_backward_max' (1.5)"},
      {[](json& r) {
         r["amax_gain"] = kGain;
         r["amax_gain"]["layer_max"] = 1.0;
       },
       "key 'amax_gain.layer_max' is not part"},
      {[](json& r) { r = json::array(); }, "key '(top level)' must be an object"},
  };
  for (const auto& c : cases) {
    write_edited(path, text, c.edit);
    const std::string msg = error_of([&] { read_run_result(path); });
    EXPECT_NE(msg.find(path + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.want), std::string::npos) << msg;
  }
  std::ofstream(path) << "{\"arm\": ";
  EXPECT_NE(error_of([&] { read_run_result(path); }).find(path + ": invalid JSON"), std::string::npos);

  const std::string train = tmp.file("train_result.json");
  const std::string train_text = read_text_file((kOldFormat / "runs/rd/seed-1/train_result.json").string());
  write_edited(train, train_text, [](json& t) { t.erase("micro_batches"); });
  EXPECT_NE(error_of([&] { read_train_result(train); }).find("key 'micro_batches' is missing"), std::string::npos);
  write_edited(train, train_text, [](json& t) { t["processes"] = "2"; });
  EXPECT_NE(error_of([&] { read_train_result(train); }).find("key 'processes' must be an integer"), std::string::npos);

  const std::string spec = tmp.file("experiment.json");
  const std::string spec_text = read_text_file((kOldFormat / "experiment.json").string());
  write_edited(spec, spec_text, [](json& s) { s["armz"] = s["arms"]; });
  EXPECT_NE(error_of([&] { read_experiment_spec(spec); }).find("key 'armz' is not part"), std::string::npos);
  write_edited(spec, spec_text, [](json& s) { s["model"] = "tiny"; });
  EXPECT_NE(error_of([&] { read_experiment_spec(spec); }).find("key 'model' must be an object"), std::string::npos);
  write_edited(spec, spec_text, [](json& s) { s["version"] = 3; });
  EXPECT_NE(error_of([&] { read_experiment_spec(spec); }).find("key 'version' is 3; this build reads versions 1 and 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_experiment_spec(tmp.file("none.json")); }).find("none.json: not found"),
            std::string::npos);

  const std::string summary = tmp.file("summary.json");
  const std::string summary_text = read_text_file((kOldFormat / "summary.json").string());
  write_edited(summary, summary_text, [](json& s) { s["validation"][0]["arms"][1]["paired"]["median"] = 0; });
  EXPECT_NE(error_of([&] { read_summary(summary); }).find("key 'validation[0].arms[1].paired.median' is not part"),
            std::string::npos);
  write_edited(summary, summary_text, [](json& s) { s["routing"][1]["js_estimate"] = "per_layer"; });
  EXPECT_NE(error_of([&] { read_summary(summary); }).find("key 'routing[1].js_estimate' must be"), std::string::npos);
  // A K route (MUDD) needs its fields, and a V route to be compared with.
  write_edited(summary, summary_text, [](json& s) { s["routing"][1]["k_route"] = true; });
  EXPECT_NE(error_of([&] { read_summary(summary); }).find("key 'routing[1].layers[0].k_mean' is missing"),
            std::string::npos);
  write_edited(summary, summary_text, [](json& s) { s["routing"][0]["k_route"] = true; });
  EXPECT_NE(error_of([&] { read_summary(summary); }).find("key 'routing[0].k_route' is true but 'two_routes' is false"),
            std::string::npos);
  write_edited(summary, summary_text, [](json& s) { s["routing"][1]["k_route"] = false; });
  EXPECT_NE(error_of([&] { read_summary(summary); }).find("key 'routing[1].k_route' must be true or left out"),
            std::string::npos);
  write_edited(summary, summary_text, [](json& s) { s["routing"][1]["layers"][1]["js_k_nats"] = 0.1; });
  EXPECT_NE(error_of([&] { read_summary(summary); }).find("key 'routing[1].layers[1].js_k_nats' is not part"),
            std::string::npos);
  write_edited(summary, summary_text, [](json& s) {
    s["amax_gain"] = json::array({kGain});  // (not {kGain}: clang reads that as a copy)
    s["amax_gain"][0]["arm"] = "hc";
  });
  EXPECT_NE(error_of([&] { read_summary(summary); }).find("key 'amax_gain[0].seeds' is missing"), std::string::npos);
  write_edited(summary, summary_text, [](json& s) {
    s["amax_gain"] = json::array({kGain});  // (not {kGain}: clang reads that as a copy)
    s["amax_gain"][0]["arm"] = "hc";
    s["amax_gain"][0]["seeds"] = 2;
    s["amax_gain"][0]["composite_forward_mean"] = 3.0;
  });
  EXPECT_NE(error_of([&] { read_summary(summary); }).find("key 'amax_gain[0].composite_forward_mean' is 3, larger"),
            std::string::npos);
}


// A provenance (results/provenance.hpp): written into train_result.json and result.json, read
// back byte for byte, and checked strictly; files without one (earlier builds) read and write back
// as before; summary.json lists the distinct origins.
Provenance example_provenance() {
  Provenance p;
  p.attnres_version = "0.9.0";
  p.commit = "0123456789ab";
  p.dirty = true;
  p.device = "cpu";
  p.gemm_backend = "avx512";
  p.bf16_backend = "avx512-bf16";
  p.blas_core = "SkylakeX";
  p.cpu_model = "AMD EPYC 9B45";
  p.cpu_flags = {"avx2", "fma", "avx512f", "avx512_bf16"};
  p.threads = 8;
  return p;
}

TEST(Schemas, ProvenanceReadsBackAndIsChecked) {
  TempDir tmp;
  TrainResult t;
  t.provenance = example_provenance();
  write_train_result(tmp.file("t.json"), t);
  const std::string train_text = read_text_file(tmp.file("t.json"));
  const TrainResult t_back = read_train_result(tmp.file("t.json"));
  ASSERT_TRUE(t_back.provenance.has_value());
  EXPECT_EQ(to_json(*t_back.provenance), to_json(example_provenance()));
  write_train_result(tmp.file("t.json"), t_back);
  EXPECT_EQ(read_text_file(tmp.file("t.json")), train_text);

  RunResult r;
  r.arm = "rd";
  r.seed = 1;
  r.params = 10;
  r.provenance = example_provenance();
  r.provenance->dirty.reset();  // unknown: null
  r.provenance->bf16_backend.reset();  // an fp32 run: no key
  write_run_result(tmp.file("r.json"), r);
  const std::string text = read_text_file(tmp.file("r.json"));
  const json written = json::parse(text).at("provenance");
  EXPECT_EQ(written.at("commit"), "0123456789ab");
  EXPECT_TRUE(written.at("dirty").is_null());
  EXPECT_FALSE(written.contains("bf16_backend"));
  const RunResult back = read_run_result(tmp.file("r.json"));
  ASSERT_TRUE(back.provenance.has_value());
  EXPECT_FALSE(back.provenance->dirty.has_value());
  EXPECT_EQ(back.provenance->cpu_flags, example_provenance().cpu_flags);
  EXPECT_EQ(back.provenance->threads, 8);
  write_run_result(tmp.file("r.json"), back);
  EXPECT_EQ(read_text_file(tmp.file("r.json")), text);

  // Files of earlier builds have none, and are written back without one.
  for (const auto& path : old_run_results()) EXPECT_FALSE(read_run_result(path.string()).provenance.has_value());
  const fs::path old_train = kOldFormat / "runs/rd/seed-1/train_result.json";
  EXPECT_FALSE(read_train_result(old_train.string()).provenance.has_value());
  EXPECT_EQ(read_text_file(old_train.string()).find("provenance"), std::string::npos);

  const std::string path = tmp.file("bad.json");
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& j) { j["provenance"]["compiler"] = "gcc"; }, "key 'provenance.compiler' is not part"},
      {[](json& j) { j["provenance"].erase("commit"); }, "key 'provenance.commit' is missing"},
      {[](json& j) { j["provenance"]["commit"] = "HEAD"; }, "key 'provenance.commit' is 'HEAD'; expected a commit hash"},
      {[](json& j) { j["provenance"]["dirty"] = "yes"; }, "key 'provenance.dirty' must be true or false"},
      {[](json& j) { j["provenance"]["gemm_backend"] = "automatic"; },
       "key 'provenance.gemm_backend' is 'automatic', not a fp32 GEMM backend"},
      {[](json& j) { j["provenance"]["bf16_backend"] = "avx2"; },
       "key 'provenance.bf16_backend' is 'avx2', not a bf16 GEMM backend"},
      {[](json& j) { j["provenance"]["cpu_flags"] = {"avx2", "sse2"}; },
       "key 'provenance.cpu_flags[1]' is 'sse2', not one of the flags attnres records"},
      {[](json& j) { j["provenance"]["cpu_flags"] = {"fma", "fma"}; }, "key 'provenance.cpu_flags[1]' repeats 'fma'"},
      {[](json& j) { j["provenance"]["threads"] = 0; }, "key 'provenance.threads' must be an integer from 1"},
      {[](json& j) { j["provenance"]["cpu_model"] = ""; }, "key 'provenance.cpu_model' must not be empty"},
  };
  for (const auto& [edit, want] : cases) {
    write_edited(path, text, edit);
    const std::string msg = error_of([&] { read_run_result(path); });
    EXPECT_NE(msg.find(path + ": " + want), std::string::npos) << msg;
    write_edited(path, train_text, edit);
    EXPECT_NE(error_of([&] { read_train_result(path); }).find(path + ": " + want), std::string::npos);
  }

  // summary.json's list of origins: read back; absent from summaries of runs without one.
  Summary summary = read_summary((kOldFormat / "summary.json").string());
  EXPECT_TRUE(summary.provenance.empty());
  summary.provenance = {{"0123456789ab", false, "AMD EPYC 9B45", "avx512", "SkylakeX", 3},
                        {"ba9876543210", true, "AMD EPYC 9B45", "avx512", "SkylakeX", 1}};
  write_summary(tmp.file("summary.json"), summary);
  const json s = json::parse(read_text_file(tmp.file("summary.json")));
  ASSERT_EQ(s.at("provenance").size(), 2u);
  EXPECT_EQ(s["provenance"][1]["commit"], "ba9876543210");
  EXPECT_EQ(s["provenance"][1]["runs"], 1);
  EXPECT_EQ(to_json(read_summary(tmp.file("summary.json"))), to_json(summary));
  write_edited(tmp.file("summary.json"), s.dump(), [](json& j) { j["provenance"][0]["threads"] = 2; });
  EXPECT_NE(error_of([&] { read_summary(tmp.file("summary.json")); }).find("key 'provenance[0].threads' is not part"),
            std::string::npos);
}

// This process's provenance: this build, the backends it runs, its CPU.
TEST(Schemas, ProcessProvenanceNamesThisBuildAndMachine) {
  set_num_threads(2);
  const Provenance p = process_provenance("cpu", true);
  EXPECT_EQ(p.attnres_version, build_info().version);
  EXPECT_FALSE(p.attnres_version.empty());
  EXPECT_EQ(p.commit, build_info().commit);
  EXPECT_EQ(p.commit.size(), 12u) << "built without git?";
  EXPECT_EQ(p.dirty, build_info().dirty);
  EXPECT_EQ(p.device, "cpu");
  EXPECT_EQ(p.gemm_backend, kernels::to_string(kernels::fp32_gemm_backend()));
  EXPECT_EQ(p.bf16_backend, std::string(kernels::to_string(kernels::bf16_backend())));
  EXPECT_EQ(p.blas_core, openblas_core());
  EXPECT_EQ(p.cpu_model, cpu_model());
  EXPECT_EQ(p.threads, 2);
  const std::vector<std::string> flags = cpu_flags();
  for (const std::string_view flag : kProvenanceCpuFlags)
    EXPECT_EQ(std::find(p.cpu_flags.begin(), p.cpu_flags.end(), flag) != p.cpu_flags.end(),
              std::find(flags.begin(), flags.end(), flag) != flags.end())
        << flag;
  if (__builtin_cpu_supports("avx2")) {
    ASSERT_FALSE(p.cpu_flags.empty());
    EXPECT_EQ(p.cpu_flags.front(), "avx2");
  }
  // A CUDA run's bf16 matmuls run on the GPU: no CPU bf16 backend.
  EXPECT_FALSE(process_provenance("cuda", true).bf16_backend.has_value());
  EXPECT_FALSE(process_provenance("cpu", false).bf16_backend.has_value());
}

}  // namespace
}  // namespace attnres::results
