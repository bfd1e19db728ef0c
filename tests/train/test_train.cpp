// The training commands end to end: exact resume after SIGKILL, clean stop on SIGINT, the
// NaN guard, eval and sample, the experiment runner, and clear errors for bad input.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/cli_util.hpp"
#include "experiment/runner.hpp"
#include "kernels/gemm_f32.hpp"
#include "model/safetensors.hpp"
#include "results/instability.hpp"
#include "results/run_result.hpp"
#include "train/checkpoint.hpp"
#include "train/train_config.hpp"
#include "util/build_info.hpp"
#include "util/error.hpp"
#include "util/machine.hpp"
#include "util/process.hpp"
#include "util/rng.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;

extern char** environ;

namespace {

// A model small enough for tests; 48 steps of 4 x 32 tokens.
const std::string kTiny =
    "--preset tiny --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.mlp_hidden=64 "
    "--set model.n_blocks=2 --set train.seq_len=32 --set train.batch_size=4 --set train.tokens=6144 "
    "--set train.eval_tokens=512 --set train.checkpoint_every=4 --set train.threads=2 --set model.residual=rd";

// An experiment sets model.residual from each run's arm (and refuses it in --set).
std::string without_residual(std::string args) {
  const std::string setting = " --set model.residual=rd";
  const auto at = args.find(setting);
  if (at != std::string::npos) args.erase(at, setting.size());
  return args;
}

// Synthetic documents prepared with the bytes tokenizer (tests/common/cli_util.hpp).
class TrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("attnres_train_test");
    prepare_synthetic_data(dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->str("data"); }
  static TempDir* dir_;
};
TempDir* TrainTest::dir_ = nullptr;

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

// The grad_norm of each step's line of metrics.jsonl.
std::vector<double> grad_norms(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("grad_norm")) out.push_back(j["grad_norm"].get<double>());
  }
  return out;
}

// A checkpoint's tensor "params" scaled by `factor`, written back (its checksums updated).
void scale_checkpoint_params(const std::string& ckpt, float factor) {
  SafetensorsFile f = read_safetensors(ckpt);
  auto& params = f.tensors.at("params");
  for (std::size_t i = 0; i + 4 <= params.bytes.size(); i += 4) {
    float v;
    std::memcpy(&v, params.bytes.data() + i, 4);
    v *= factor;
    std::memcpy(params.bytes.data() + i, &v, 4);
  }
  std::vector<TensorRef> refs;
  for (const auto& [name, t] : f.tensors) refs.push_back({name, t.dtype, t.shape, t.bytes.data()});
  write_safetensors(ckpt, f.metadata, refs);
}

std::size_t line_count(const fs::path& p) {
  std::ifstream in(p);
  std::size_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

// Starts `attnres train` and sends `sig` once metrics.jsonl has `lines` lines.
int train_and_signal(const std::string& args, const fs::path& out, std::size_t lines, int sig) {
  std::vector<std::string> argv_s = {ATTNRES_BINARY, "train"};
  std::istringstream in(args);
  for (std::string a; in >> a;) argv_s.push_back(a);
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  if (posix_spawn(&pid, ATTNRES_BINARY, &fa, nullptr, argv.data(), environ) != 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(out / "metrics.jsonl") && line_count(out / "metrics.jsonl") >= lines) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, sig);
  int status = 0;
  ::waitpid(pid, &status, 0);
  posix_spawn_file_actions_destroy(&fa);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_F(TrainTest, ResumeAfterSigkillIsBitIdentical) {
  TempDir runs("attnres_resume");
  const CliResult full = run_cli("train " + kTiny + " --data " + data() + " --out " + runs.str("full"));
  ASSERT_EQ(full.exit_code, 0) << full.output;

  const fs::path killed = runs.path() / "killed";
  const int rc = train_and_signal(kTiny + " --data " + data() + " --out " + killed.string(), killed, 10, SIGKILL);
  ASSERT_EQ(rc, 128 + SIGKILL);
  ASSERT_TRUE(has_checkpoint(killed)) << "killed before the first checkpoint";
  EXPECT_FALSE(fs::exists(killed / "train_result.json"));
  const CliResult resumed = run_cli("train " + kTiny + " --data " + data() + " --out " + killed.string() + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming"), std::string::npos);

  const auto a = read_safetensors(runs.str("full/model.safetensors"));
  const auto b = read_safetensors((killed / "model.safetensors").string());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) EXPECT_EQ(t.bytes, b.tensors.at(name).bytes) << name;
  EXPECT_EQ(losses(runs.path() / "full/metrics.jsonl"), losses(killed / "metrics.jsonl"));
  EXPECT_EQ(losses(killed / "metrics.jsonl").size(), 48u);
  // The curve, with each step's gradient norm (as metrics.jsonl logged it), and its instability
  // are the uninterrupted run's: the checkpoint carried the norms of the steps before it.
  const auto full_result = nlohmann::json::parse(read_file(runs.path() / "full/train_result.json"));
  const auto killed_result = nlohmann::json::parse(read_file(killed / "train_result.json"));
  EXPECT_EQ(full_result.at("curve"), killed_result.at("curve"));
  EXPECT_EQ(full_result.at("instability"), killed_result.at("instability"));
  const std::vector<double> norms = grad_norms(killed / "metrics.jsonl");
  ASSERT_EQ(killed_result["curve"].size(), norms.size());
  for (std::size_t i = 0; i < norms.size(); ++i) EXPECT_EQ(killed_result["curve"][i]["grad_norm"], norms[i]) << i;
  EXPECT_EQ(killed_result["instability"]["grad_norm_steps"], 48);
}

// A run's peak memory is its own, not its parent's: `experiment` starts each run from a worker
// holding a model (getrusage's ru_maxrss kept the parent's footprint across fork + exec).
TEST_F(TrainTest, PeakMemoryIsTheRunsOwnNotItsParents) {
  TempDir runs("attnres_rss");
  const std::vector<char> ballast(std::size_t{512} << 20, 1);  // 512 MiB, every page touched
  ASSERT_EQ(ballast[ballast.size() / 2], 1);
  ChildProcess child;
  child.argv = {ATTNRES_BINARY};
  std::istringstream args(kTiny + " --data " + data() + " --out " + runs.str("run") + " --set train.tokens=4096");
  for (std::string a; args >> a;) child.argv.push_back(a);
  child.argv.insert(child.argv.begin() + 1, "train");
  child.capture_stdout = true;
  ASSERT_EQ(run_child(child).status, 0);
  const auto peak = nlohmann::json::parse(read_file(runs.path() / "run/train_result.json")).at("peak_rss_bytes");
  EXPECT_GT(peak.get<std::int64_t>(), 0);
  EXPECT_LT(peak.get<std::int64_t>(), std::int64_t{256} << 20) << "the parent's 512 MiB counted as the run's";
  // Its CPU time per step is recorded (what plan prices a core-second with), and no thread runs
  // longer than the step did.
  const auto result = nlohmann::json::parse(read_file(runs.path() / "run/train_result.json"));
  const double cpu = result.at("cpu_seconds_per_step").get<double>(), wall = result.at("step_time_ms").get<double>() / 1e3;
  EXPECT_GT(cpu, 0);
  EXPECT_LE(cpu, wall * std::max(1u, std::thread::hardware_concurrency()) * 1.1 + 1e-3);
}

TEST_F(TrainTest, SigintSavesACheckpointAndExitsCleanly) {
  TempDir runs("attnres_sigint");
  const fs::path out = runs.path() / "run";
  const int rc = train_and_signal(kTiny + " --data " + data() + " --out " + out.string(), out, 6, SIGINT);
  EXPECT_EQ(rc, 130);  // interrupted, resumable
  EXPECT_TRUE(has_checkpoint(out));
  EXPECT_FALSE(fs::exists(out / "train_result.json"));
  const CliResult again = run_cli("train " + kTiny + " --data " + data() + " --out " + out.string());
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.output.find("--resume"), std::string::npos) << again.output;  // nothing overwritten
  const CliResult resumed = run_cli("train " + kTiny + " --data " + data() + " --out " + out.string() + " --resume");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(fs::exists(out / "train_result.json"));
}

TEST_F(TrainTest, NonFiniteLossStopsWithTheLastGoodCheckpoint) {
  TempDir runs("attnres_nan");
  const fs::path out = runs.path() / "run";
  const int rc = train_and_signal(kTiny + " --data " + data() + " --out " + out.string(), out, 6, SIGINT);
  ASSERT_EQ(rc, 130);
  // Poison the weights in the newest checkpoint: finite (a NaN would be refused at load), but so
  // large that the next step's loss overflows.
  const std::string ckpt = newest_checkpoint(out).string();
  scale_checkpoint_params(ckpt, 3e37f);
  const std::string before = read_file(ckpt);
  const CliResult r = run_cli("train " + kTiny + " --data " + data() + " --out " + out.string() + " --resume");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("the training loss became"), std::string::npos) << r.output;
  EXPECT_EQ(read_file(ckpt), before);  // the last good checkpoint is kept
}

// A loss spike (here: the weights scaled up in the checkpoint a run resumes from) makes the run
// unstable by the rule: recorded in train_result.json and said once at its end.
TEST_F(TrainTest, AnUnstableRunIsRecordedAndSaysSo) {
  TempDir runs("attnres_unstable");
  const fs::path out = runs.path() / "run";
  const std::string base = kTiny + " --set train.tokens=7680 --data " + data();  // 60 steps
  const std::string args = base + " --out " + out.string();
  CliResult r = run_cli("train " + args + " --stop-at-step 56");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  scale_checkpoint_params(newest_checkpoint(out).string(), 4.0f);
  r = run_cli("train " + args + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto result = nlohmann::json::parse(read_file(out / "train_result.json"));
  const auto& s = result.at("instability");
  EXPECT_EQ(s.at("unstable"), true) << s;
  EXPECT_EQ(s.at("tested_steps"), 10) << s;
  EXPECT_EQ(s.at("spike_events"), 1) << s;  // steps 57 to 60, or some of them
  EXPECT_EQ(s.at("sustained_spike_events"), 1) << s;
  EXPECT_GE(s.at("largest_spike_step"), 57) << s;
  EXPECT_EQ(s.at("grad_norm_steps"), 60) << s;
  const std::string said =
      "unstable run: 1 sustained loss spike, the largest at step " + s.at("largest_spike_step").dump() + ", ";
  EXPECT_NE(r.output.find(said), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(results::kUnstableRule), std::string::npos) << r.output;
  // A stable run says nothing of it.
  const CliResult stable = run_cli("train " + base + " --out " + runs.str("stable"));
  ASSERT_EQ(stable.exit_code, 0) << stable.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(runs.path() / "stable/train_result.json"))["instability"]["unstable"], false);
  EXPECT_EQ(stable.output.find("unstable run"), std::string::npos) << stable.output;
}

TEST_F(TrainTest, BadConfigurationsNameTheKey) {
  TempDir runs("attnres_badcfg");
  auto expect_error = [&](const std::string& args, const std::string& needle) {
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
  };
  const std::string base = "train " + kTiny + " --data " + data() + " --out " + runs.str("x");
  expect_error(base + " --set train.lrr=1", "train.lrr");
  expect_error(base + " --set train.batch_size=0", "train.batch_size");
  expect_error(base + " --set model.n_blocks=3", "model.n_blocks");
  expect_error(base + " --set model.residual=blocky", "blocky");
  expect_error(base + " --set train.lr=abc", "train.lr");
  // Integers out of range are errors, not silently wrapped (4294967304 = 2^32 + 8 would become 8).
  expect_error(base + " --set train.batch_size=4294967304", "'train.batch_size': must be an integer from");
  expect_error(base + " --set train.seed=-1", "'train.seed': must be an integer from 0 to");
  std::ofstream(runs.path() / "bad.toml") << "[train]\nlr = 1e-3\nunknown_key = 4\n";
  expect_error("train --config " + runs.str("bad.toml") + " --data " + data() + " --out " + runs.str("y"),
               "unknown_key");
  expect_error("train --preset tiny --data " + runs.str("no-such-dir") + " --out " + runs.str("z"), "no-such-dir");
  expect_error(base + " --set train.micro_batches=3", "train.micro_batches (3)");
  expect_error(base + " --device tpu", "--device must be cpu, cuda or cuda:N");
  expect_error(base + " --device cuda:x", "cuda:N");
  // Without the CUDA backend, or without a GPU, --device cuda is a clear error, not a crash.
  expect_error(base + " --device cuda", "cuda");
  EXPECT_FALSE(has_checkpoint(runs.path() / "x"));
}

TEST_F(TrainTest, EvalSampleAndMismatchedInputs) {
  TempDir runs("attnres_eval");
  ASSERT_EQ(run_cli("train " + kTiny + " --data " + data() + " --out " + runs.str("run")).exit_code, 0);
  const std::string ckpt = runs.str("run/model.safetensors");

  CliResult r = run_cli("eval --checkpoint " + ckpt + " --data " + data() + " --split test --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_GT(j["tokens"].get<long>(), 0);
  EXPECT_LT(j["nll"].get<double>(), std::log(257.0));  // better than uniform
  EXPECT_GT(j["bits_per_byte"].get<double>(), 0.0);

  // --text: every token after the leading end-of-text is scored once (bytes: one per byte).
  const std::string text(100, 'a');
  std::ofstream(runs.path() / "doc.txt") << text;
  r = run_cli("eval --checkpoint " + ckpt + " --text " + runs.str("doc.txt") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(j["tokens"].get<long>(), 100);
  // A device this binary or machine does not have is a clear error.
  r = run_cli("eval --checkpoint " + ckpt + " --text " + runs.str("doc.txt") + " --device tpu");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--device must be cpu, cuda or cuda:N"), std::string::npos) << r.output;
  r = run_cli("eval --checkpoint " + ckpt + " --text " + runs.str("doc.txt") + " --device cuda");
  EXPECT_EQ(r.exit_code, 1) << r.output;

  r = run_cli("sample --checkpoint " + ckpt + " --prompt \"the depth\" --max-tokens 20 --seed 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("the depth", 0), 0u) << r.output;
  EXPECT_EQ(run_cli("sample --checkpoint " + ckpt + " --prompt \"the depth\" --max-tokens 20 --seed 1").output,
            r.output);  // reproducible from the seed

  // A truncated checkpoint and a checkpoint of another model.
  fs::copy_file(ckpt, runs.path() / "cut.safetensors");
  fs::resize_file(runs.path() / "cut.safetensors", fs::file_size(ckpt) / 2);
  r = run_cli("eval --checkpoint " + runs.str("cut.safetensors") + " --data " + data());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("cut.safetensors"), std::string::npos) << r.output;
  // Resuming with another configuration.
  r = run_cli("train " + kTiny + " --set model.residual=block --data " + data() + " --out " + runs.str("run") +
              " --resume");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("different configuration"), std::string::npos) << r.output;
}

TEST_F(TrainTest, PairedExperimentRunsResumesAndSummarises) {
  TempDir runs("attnres_experiment");
  const std::string cmd = "experiment " + without_residual(kTiny) + " --set train.tokens=2048 --arms block,rd --seeds 1,2 --data " +
                          data() + " --out " + runs.str("exp");
  CliResult r = run_cli(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(runs.path() / "exp/summary.json"));
  for (const char* arm : {"block", "rd"})
    for (int seed : {1, 2}) EXPECT_TRUE(fs::exists(runs.path() / "exp/runs" / arm / ("seed-" + std::to_string(seed)) / "result.json"));
  // Same seed, same data order: identical first-step loss in both arms (RD starts as Block).
  const auto lb = losses(runs.path() / "exp/runs/block/seed-1/metrics.jsonl");
  const auto lr = losses(runs.path() / "exp/runs/rd/seed-1/metrics.jsonl");
  ASSERT_FALSE(lb.empty());
  EXPECT_EQ(lb.front(), lr.front());
  // The runner carries the run's curve, with its gradient norms, and its instability into result.json.
  const auto result = nlohmann::json::parse(read_file(runs.path() / "exp/runs/rd/seed-1/result.json"));
  const auto trained = nlohmann::json::parse(read_file(runs.path() / "exp/runs/rd/seed-1/train_result.json"));
  EXPECT_EQ(result.at("curve"), trained.at("curve"));
  EXPECT_TRUE(result["curve"][0].contains("grad_norm")) << result["curve"][0];
  EXPECT_EQ(result.at("instability"), trained.at("instability"));
  // And where the run came from: the binary that trained it (this build: the test links the same
  // build_info()), its backend, CPU and threads.
  ASSERT_TRUE(trained.contains("provenance")) << trained;
  EXPECT_EQ(result.at("provenance"), trained.at("provenance"));
  const auto& provenance = trained["provenance"];
  EXPECT_EQ(provenance.at("attnres_version"), build_info().version);
  EXPECT_EQ(provenance.at("commit"), build_info().commit);
  EXPECT_NE(provenance["commit"], "unknown");
  EXPECT_EQ(provenance.at("dirty"), build_info().dirty ? nlohmann::json(*build_info().dirty) : nlohmann::json());
  EXPECT_EQ(provenance.at("device"), "cpu");
  // (The CLI may run another OpenBLAS core than this test: its configure_runtimes in src/cli/main.cpp.)
  const auto backend = kernels::parse_fp32_gemm(provenance.at("gemm_backend").get<std::string>());
  EXPECT_TRUE(backend != kernels::Fp32Gemm::automatic && kernels::fp32_gemm_available(backend)) << provenance;
  EXPECT_FALSE(provenance.contains("bf16_backend"));  // fp32 matmuls
  EXPECT_NE(provenance.at("blas_core"), "unknown");
  EXPECT_EQ(provenance.at("cpu_model"), cpu_model());
  EXPECT_EQ(provenance.at("threads"), 2);  // train.threads
  EXPECT_EQ(results::read_run_result((runs.path() / "exp/runs/rd/seed-1/result.json").string()).provenance->commit,
            build_info().commit);
  // Rerunning skips finished runs; another protocol in the same directory is refused.
  const auto stamp = fs::last_write_time(runs.path() / "exp/runs/rd/seed-2/result.json");
  r = run_cli(cmd);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(fs::last_write_time(runs.path() / "exp/runs/rd/seed-2/result.json"), stamp);
  r = run_cli("experiment " + without_residual(kTiny) + " --arms block,rd,rd-frozen --seeds 1,2 --data " + data() + " --out " +
              runs.str("exp"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("different experiment"), std::string::npos) << r.output;
  // The differing key, with both values.
  EXPECT_NE(r.output.find("arms = [\"block\",\"rd\"] (experiment.json) vs [\"block\",\"rd\",\"rd-frozen\"] "
                          "(requested)"),
            std::string::npos)
      << r.output;
  r = run_cli("experiment " + without_residual(kTiny) + " --arms block,rd-wide --seeds 1 --data " + data() + " --out " + runs.str("e2"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("rd-wide"), std::string::npos) << r.output;
}

// An experiment whose run stopped part-way (here: its last checkpoint lost and its results not
// yet written) resumes that run from the newest checkpoint left when the command is rerun, and
// ends with the results of the undisturbed run.
TEST_F(TrainTest, ExperimentResumesAnUnfinishedRunFromItsNewestCheckpoint) {
  TempDir runs("attnres_experiment_resume");
  const std::string cmd = "experiment " + without_residual(kTiny) +
                          " --set train.tokens=2048 --arms block,rd --seeds 1 --data " + data() + " --out " + runs.str("exp");
  ASSERT_EQ(run_cli(cmd).exit_code, 0);
  const fs::path run = runs.path() / "exp/runs/rd/seed-1";
  // 16 steps, a checkpoint every 4: the newest two kept.
  const std::vector<CheckpointFile> kept = list_checkpoints(run.string());
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].step, 16);
  EXPECT_EQ(kept[1].step, 12);
  const nlohmann::json result = nlohmann::json::parse(read_file(run / "result.json"));
  const std::string weights = read_file(run / "model.safetensors");
  const std::vector<double> curve = losses(run / "metrics.jsonl");
  for (const fs::path& f : {run / "result.json", run / "train_result.json", fs::path(kept[0].path)}) fs::remove(f);

  const CliResult r = run_cli(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 12/16"), std::string::npos) << r.output;
  EXPECT_EQ(read_file(run / "model.safetensors"), weights);
  EXPECT_EQ(losses(run / "metrics.jsonl"), curve);
  const nlohmann::json again = nlohmann::json::parse(read_file(run / "result.json"));
  EXPECT_EQ(again.at("test_nll"), result.at("test_nll"));
  EXPECT_EQ(again.at("milestones"), result.at("milestones"));
  EXPECT_EQ(again.at("curve"), result.at("curve"));
  EXPECT_EQ(again.at("instability"), result.at("instability"));
}

namespace {

// A config text as the code before the key table wrote it: train.micro_batches and
// train.precision only when set (so not at their defaults), and no train.keep_checkpoints.
std::string without_newer_keys(std::string text) {
  for (const std::string line : {"micro_batches = 0\n", "precision = \"fp32\"\n", "keep_checkpoints = 2\n"}) {
    const auto at = text.find(line);
    EXPECT_NE(at, std::string::npos) << text;
    if (at != std::string::npos) text.erase(at, line.size());
  }
  return text;
}

}  // namespace

TEST_F(TrainTest, OldFormatRunResumesAndMismatchesNameTheKey) {
  TempDir runs("attnres_old_format");
  const fs::path out = runs.path() / "run";
  const std::string args = kTiny + " --data " + data() + " --out " + out.string();
  CliResult r = run_cli("train " + args + " --stop-at-step 8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Make the run directory one written before every key was written, with its one checkpoint
  // as checkpoints were then: checkpoint.safetensors, without the tokenizer's name.
  SafetensorsFile f = read_safetensors(newest_checkpoint(out).string());
  nlohmann::json state = nlohmann::json::parse(f.metadata.at("state"));
  state["config"] = without_newer_keys(state["config"].get<std::string>());
  for (auto& point : state["curve"]) {  // [tokens, loss]: no gradient norm
    ASSERT_EQ(point.size(), 3u);
    point.erase(2);
  }
  f.metadata["state"] = state.dump();
  ASSERT_EQ(f.metadata.erase("tokenizer"), 1u);
  std::vector<TensorRef> refs;
  for (const auto& [name, t] : f.tensors) refs.push_back({name, t.dtype, t.shape, t.bytes.data()});
  for (const CheckpointFile& c : list_checkpoints(out.string())) fs::remove(c.path);
  write_safetensors((out / "checkpoint.safetensors").string(), f.metadata, refs);
  const std::string config_toml = without_newer_keys(read_file(out / "config.toml"));
  std::ofstream(out / "config.toml") << config_toml;

  // A different configuration is refused, naming each differing key with both values.
  r = run_cli("train " + args + " --resume --set train.lr=0.002 --set train.micro_batches=2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("different configuration: train.micro_batches = 0 (checkpoint) vs 2 (requested); "
                          "train.lr = 0.003 (checkpoint) vs 0.002 (requested)"),
            std::string::npos)
      << r.output;
  // The same configuration resumes: the missing keys take their defaults.
  r = run_cli("train " + args + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming '" + out.string() + "' at step 8"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(out / "train_result.json"));
  EXPECT_EQ(losses(out / "metrics.jsonl").size(), 48u);
  // The steps before the resume have no gradient norm: said, left out of the curve, and not counted.
  EXPECT_NE(r.output.find("note: 8 of the checkpoint's 8 steps have no gradient norm"), std::string::npos) << r.output;
  const auto result = nlohmann::json::parse(read_file(out / "train_result.json"));
  ASSERT_EQ(result["curve"].size(), 48u);
  for (std::size_t i = 0; i < 48; ++i) EXPECT_EQ(result["curve"][i].contains("grad_norm"), i >= 8) << i;
  EXPECT_EQ(result["instability"]["grad_norm_steps"], 40);
  // The old checkpoint counted as the oldest: gone once two newer ones were written.
  const std::vector<CheckpointFile> kept = list_checkpoints(out.string());
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].step, 48);
  EXPECT_EQ(kept[1].step, 44);
}

TEST_F(TrainTest, ExperimentCreatedBeforeNewerKeysIsStillAccepted) {
  TempDir runs("attnres_old_experiment");
  const std::atomic<bool> stop{true};  // write experiment.json, train nothing
  experiment::ExperimentOptions o;
  o.base = preset("tiny");
  o.preset = "tiny";
  o.arms = {"block", "rd"};
  o.seeds = {1};
  o.data_dir = data();
  o.out_dir = runs.str("exp");
  o.stop = &stop;
  o.progress = false;
  EXPECT_FALSE(experiment::run_experiment(o));
  // As an older version wrote it: config_toml without the newer keys, a model config without a
  // key (at its default) that version did not have.
  const fs::path spec = runs.path() / "exp/experiment.json";
  nlohmann::json j = nlohmann::json::parse(read_file(spec));
  j["train"]["config_toml"] = without_newer_keys(j["train"]["config_toml"].get<std::string>());
  ASSERT_EQ(j["model"].erase("value_route"), 1u);
  std::ofstream(spec) << j.dump(1);
  EXPECT_NO_THROW(EXPECT_FALSE(experiment::run_experiment(o)));
  // Another configuration is still another experiment.
  o.base.lr = 1e-3;
  try {
    experiment::run_experiment(o);
    ADD_FAILURE() << "a different configuration was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different experiment"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.lr = "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(" (experiment.json) vs 0.001 (requested)"), std::string::npos) << e.what();
  }
}
