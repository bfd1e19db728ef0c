// Data-parallel training and experiment sweeps under `mpirun -np 2` (Open MPI, oversubscribed on
// a small machine): bit-identical equivalence with gradient accumulation in one process, resume
// with another rank count, a rank's missing data, a killed rank, and the experiment spread over ranks.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/cli_util.hpp"
#include "common/tiny_model.hpp"

using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

// 10 steps of 4 x 32 tokens; one thread per process, so runs compare bit for bit.
// kExperimentModel for `experiment`, which sets model.residual from each run's arm.
const std::string kExperimentModel =
    kTinyModel + " --set train.eval_tokens=512 --set train.threads=1 --set train.checkpoint_every=3";
const std::string kModel = kExperimentModel + " --set model.residual=rd";
const std::string kTen = kModel + " --set train.tokens=1280";

std::string mpirun(int ranks) {
  return std::string(ATTNRES_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " ";
}

CliResult mpi_cli(int ranks, const std::string& args) { return run_shell(mpirun(ranks) + ATTNRES_BINARY + " " + args); }

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

class MpiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("attnres_mpi_test");
    prepare_synthetic_data(dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->str("data"); }
  static TempDir* dir_;
};
TempDir* MpiTest::dir_ = nullptr;

}  // namespace

TEST_F(MpiTest, TwoRanksEqualOneProcessAccumulatingTwoMicroBatches) {
  TempDir runs("attnres_mpi_equiv");
  const std::string two = runs.str("two"), one = runs.str("one"), plain = runs.str("plain");
  const CliResult a = mpi_cli(2, "train " + kTen + " --data " + data() + " --out " + two);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("2 processes, 2 micro-batches of 2 sequences"), std::string::npos) << a.output;
  const CliResult b = run_cli("train " + kTen + " --set train.micro_batches=2 --data " + data() + " --out " + one);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  // Bit-identical: the same micro-batches, gradients summed in the same tree order.
  const auto l2 = losses(fs::path(two) / "metrics.jsonl");
  ASSERT_EQ(l2.size(), 10u);
  EXPECT_EQ(l2, losses(fs::path(one) / "metrics.jsonl"));
  EXPECT_EQ(read_file(fs::path(two) / "model.safetensors"), read_file(fs::path(one) / "model.safetensors"));
  // Against one process computing the whole batch at once: the same trajectory up to float
  // rounding (the bound: 1e-5 relative).
  const CliResult c = run_cli("train " + kTen + " --set train.micro_batches=1 --data " + data() + " --out " + plain);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const auto l1 = losses(fs::path(plain) / "metrics.jsonl");
  ASSERT_EQ(l1.size(), l2.size());
  double worst = 0;
  for (std::size_t i = 0; i < l1.size(); ++i) worst = std::max(worst, std::abs(l2[i] - l1[i]) / std::abs(l1[i]));
  EXPECT_LE(worst, 1e-5);
  EXPECT_GT(worst, 0.0) << "expected rounding differences from a different summation order";
}

TEST_F(MpiTest, ResumesWithAnotherRankCount) {
  TempDir runs("attnres_mpi_resume");
  const std::string full = runs.str("full"), split = runs.str("split");
  const std::string args = kTen + " --set train.micro_batches=2 --data " + data();
  ASSERT_EQ(run_cli("train " + args + " --out " + full).exit_code, 0);
  // Two ranks stop after step 4 (a checkpoint); one process finishes the run.
  const CliResult a = mpi_cli(2, "train " + args + " --out " + split + " --stop-at-step 4");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("stopped at step 4"), std::string::npos) << a.output;
  EXPECT_FALSE(fs::exists(fs::path(split) / "train_result.json"));
  const CliResult b = run_cli("train " + args + " --out " + split + " --resume");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(losses(fs::path(full) / "metrics.jsonl"), losses(fs::path(split) / "metrics.jsonl"));
  EXPECT_EQ(read_file(fs::path(full) / "model.safetensors"), read_file(fs::path(split) / "model.safetensors"));
  // And the other way: one process stops, two ranks resume.
  const std::string back = runs.str("back");
  ASSERT_EQ(run_cli("train " + args + " --out " + back + " --stop-at-step 6").exit_code, 0);
  const CliResult c = mpi_cli(2, "train " + args + " --out " + back + " --resume");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(read_file(fs::path(full) / "model.safetensors"), read_file(fs::path(back) / "model.safetensors"));
}

TEST_F(MpiTest, MicroBatchesMustSplitOverTheRanks) {
  TempDir runs("attnres_mpi_geometry");
  const CliResult r = mpi_cli(2, "train " + kTen + " --set train.micro_batches=1 --data " + data() + " --out " +
                                     runs.str("run"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("train.micro_batches (1) must be a multiple of the number of processes (2)"),
            std::string::npos)
      << r.output;
}

TEST_F(MpiTest, MissingDataOnOneRankStopsTheJobNamingTheRank) {
  TempDir runs("attnres_mpi_missing");
  // Rank 0 reads data0 (the real data), rank 1 reads data1, which does not exist.
  fs::create_directory_symlink(data(), runs.path() / "data0");
  const std::string cmd = mpirun(2) + "sh -c 'exec " + ATTNRES_BINARY + " train " + kTen + " --data " +
                          runs.str("data") + "$OMPI_COMM_WORLD_RANK --out " + runs.str("run") + "'";
  const CliResult r = run_shell(cmd);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("error on rank 1 of 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("data1"), std::string::npos) << r.output;
  EXPECT_FALSE(has_checkpoint(runs.path() / "run"));
}

TEST_F(MpiTest, AKilledRankEndsTheJobAndLeavesAResumableCheckpoint) {
  TempDir runs("attnres_mpi_kill");
  const fs::path out = runs.path() / "run";
  const std::string log = runs.str("log");
  // A long run in the background; rank 1 is killed once a few checkpoints exist.
  const std::string cmd = "(" + mpirun(2) + ATTNRES_BINARY + " train " + kModel + " --set train.tokens=1000000 " +
                          "--data " + data() + " --out " + out.string() + " > " + log + " 2>&1; echo \"rc=$?\" >> " +
                          log + ") &";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  pid_t victim = 0;
  while (std::chrono::steady_clock::now() < deadline && victim == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!has_checkpoint(out) || !fs::exists(out / "metrics.jsonl") ||
        fs::file_size(out / "metrics.jsonl") < 2000)
      continue;
    for (const auto& entry : fs::directory_iterator("/proc")) {
      const std::string env = read_file(entry.path() / "environ");
      const std::string cmdline = read_file(entry.path() / "cmdline");
      if (cmdline.find(out.string()) != std::string::npos &&
          env.find(std::string("OMPI_COMM_WORLD_RANK=1") + '\0') != std::string::npos &&
          cmdline.rfind(ATTNRES_BINARY, 0) == 0) {
        victim = static_cast<pid_t>(std::stol(entry.path().filename().string()));
        break;
      }
    }
  }
  ASSERT_NE(victim, 0) << "rank 1 not found";
  ::kill(victim, SIGKILL);
  std::string text;
  while (std::chrono::steady_clock::now() < deadline && text.find("rc=") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    text = read_file(log);
  }
  ASSERT_NE(text.find("rc="), std::string::npos) << "mpirun did not end after a rank died:\n" << text;
  EXPECT_EQ(text.find("rc=0"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1"), std::string::npos) << text;
  // The checkpoint is whole: one process resumes from it (and stops right away).
  const CliResult r = run_cli("train " + kModel + " --set train.tokens=1000000 --data " + data() + " --out " +
                              out.string() + " --resume --stop-at-step 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming"), std::string::npos) << r.output;
}

TEST_F(MpiTest, ExperimentOverTwoRanksMatchesOneProcess) {
  TempDir runs("attnres_mpi_experiment");
  const std::string args = kExperimentModel + " --set train.tokens=1024 --arms block,rd --seeds 1,2 --data " + data();
  const CliResult one = run_cli("experiment " + args + " --out " + runs.str("one"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const CliResult two = mpi_cli(2, "experiment " + args + " --out " + runs.str("two"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  // The summary is printed once, by rank 0.
  const auto count = [](const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(two.output, "summary: "), 1u) << two.output;
  for (const std::string arm : {"block", "rd"}) {
    for (const std::string seed : {"1", "2"}) {
      const fs::path rel = fs::path("runs") / arm / ("seed-" + seed) / "result.json";
      const auto a = nlohmann::json::parse(read_file(runs.path() / "one" / rel));
      const auto b = nlohmann::json::parse(read_file(runs.path() / "two" / rel));
      for (const char* key : {"milestones", "test_nll", "curve", "params"}) EXPECT_EQ(a[key], b[key]) << rel << " " << key;
      EXPECT_EQ(a.contains("routing"), b.contains("routing"));
      if (a.contains("routing")) {
        EXPECT_EQ(a["routing"], b["routing"]) << rel;
      }
    }
  }
}
