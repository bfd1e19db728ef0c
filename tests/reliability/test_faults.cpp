// Full disks and I/O errors while attnres writes a checkpoint (train), a shard (prepare) and a
// result file (report's summary.json): each fault on write, fsync and rename gives a clear error
// naming the file and a non-zero exit, leaves the previous file whole and no temporaries, and the
// work redone afterwards (--resume, a rerun) gives exactly what an undisturbed run gives.
#include <cstring>
#include <fstream>

#include "experiment/fixture.hpp"
#include "reliability/reliability_util.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

struct Fault {
  std::string op;     // write | fsync | rename
  std::string error;  // ENOSPC | EIO
  std::string message() const { return std::strerror(error == "ENOSPC" ? ENOSPC : EIO); }
  std::string rule(const std::string& path, int nth) const {
    return "op=" + op + ",errno=" + error + ",path=" + path + ",nth=" + std::to_string(nth);
  }
};

void PrintTo(const Fault& f, std::ostream* os) { *os << f.op << " " << f.error; }

std::string fault_name(const ::testing::TestParamInfo<Fault>& info) { return info.param.op + "_" + info.param.error; }

const auto kFaults = ::testing::Values(Fault{"write", "ENOSPC"}, Fault{"write", "EIO"}, Fault{"fsync", "ENOSPC"},
                                       Fault{"fsync", "EIO"}, Fault{"rename", "ENOSPC"}, Fault{"rename", "EIO"});

class CheckpointFault : public ::testing::TestWithParam<Fault> {};
class ShardFault : public ::testing::TestWithParam<Fault> {};
class ResultFault : public ::testing::TestWithParam<Fault> {};

}  // namespace

TEST_P(CheckpointFault, ErrorNamesTheFileKeepsThePreviousCheckpointAndResumesExactly) {
  const Fault fault = GetParam();
  const TinyRun& s = TinyRun::get();
  TempDir runs("attnres_ckpt_fault");
  const fs::path run = runs.path() / "run";
  const std::string train = s.train(run);
  // The second checkpoint (step 4) fails; the first (step 2) must survive it.
  const CliResult r = run_cli_with(fault_env(fault.rule("checkpoint-", 2)), train);
  ASSERT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find((run / checkpoint_file_name(4)).string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(fault.message()), std::string::npos) << r.output;
  EXPECT_EQ(checkpoint_step(run), 2);
  EXPECT_TRUE(read_safetensors((run / "model.safetensors").string()).checksummed);
  EXPECT_EQ(hidden_files(run), std::vector<std::string>{}) << "a temporary was left behind";
  EXPECT_FALSE(fs::exists(run / "train_result.json"));

  const CliResult resumed = run_cli(train + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_weights(s.run / "model.safetensors", run / "model.safetensors");
  EXPECT_EQ(metrics_without_timing(s.run / "metrics.jsonl"), metrics_without_timing(run / "metrics.jsonl"));
}
INSTANTIATE_TEST_SUITE_P(Faults, CheckpointFault, kFaults, fault_name);

TEST_P(ShardFault, ErrorNamesTheShardLeavesNoHalfDatasetAndARerunMatches) {
  const Fault fault = GetParam();
  const TinyRun& s = TinyRun::get();
  TempDir dirs("attnres_shard_fault");
  const fs::path out = dirs.path() / "data";
  const std::string prepare = "prepare --input " + s.corpus() +
                              " --tokenizer bytes --val-fraction 0.15 --test-fraction 0.15 --out " + out.string();
  // Over a directory prepared before: prepare removes the old dataset first (docs/data.md), so a
  // failure must leave a directory that does not look prepared, with no stray shard.
  ASSERT_EQ(run_cli(prepare).exit_code, 0);
  const CliResult r = run_cli_with(fault_env(fault.rule("train-00000.bin", 1)), prepare);
  ASSERT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find((out / "train-00000.bin").string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(fault.message()), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out / "manifest.json"));
  for (const auto& e : fs::directory_iterator(out)) ADD_FAILURE() << "left behind: " << e.path();

  ASSERT_EQ(run_cli(prepare).exit_code, 0);
  for (const std::string name : {"manifest.json", "train-00000.bin", "val-00000.bin", "test-00000.bin"})
    EXPECT_EQ(read_file(out / name), read_file(fs::path(s.data) / name)) << name;
}
INSTANTIATE_TEST_SUITE_P(Faults, ShardFault, kFaults, fault_name);

TEST_P(ResultFault, ErrorNamesTheFileAndKeepsThePreviousSummary) {
  const Fault fault = GetParam();
  experiment::testing::SyntheticExperiment exp;
  const std::string report = "report --experiment " + exp.dir();
  const fs::path summary = fs::path(exp.dir()) / "summary.json";
  ASSERT_EQ(run_cli(report).exit_code, 0);
  const std::string before = read_file(summary);
  fs::remove(exp.result_path("prenorm", 2));  // the next summary differs
  const CliResult r = run_cli_with(fault_env(fault.rule("summary.json", 1)), report);
  ASSERT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(summary.string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(fault.message()), std::string::npos) << r.output;
  EXPECT_EQ(read_file(summary), before);
  EXPECT_EQ(hidden_files(exp.dir()), std::vector<std::string>{});

  ASSERT_EQ(run_cli(report).exit_code, 0);
  EXPECT_NE(read_file(summary), before);
  EXPECT_NO_THROW(nlohmann::json::parse(read_file(summary)));
}
INSTANTIATE_TEST_SUITE_P(Faults, ResultFault, kFaults, fault_name);

// The order that makes a write atomic and durable: data synced, then renamed over the target,
// then the directory synced (so the rename survives a crash).
TEST(AtomicWrite, SyncsTheFileRenamesThenSyncsTheDirectory) {
  const TinyRun& s = TinyRun::get();
  TempDir runs("attnres_trace");
  const fs::path run = fs::weakly_canonical(runs.path()) / "run";
  const std::string trace = runs.str("trace.txt");
  const CliResult r = run_cli_with("ATTNRES_FAULT_TRACE=" + trace + " " + fault_env(""),
                                   s.train(run));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> lines;
  std::ifstream in(trace);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  for (const std::string& name : std::vector<std::string>{checkpoint_file_name(2), checkpoint_file_name(8),
                                                          "model.safetensors", "train_result.json", "config.toml"}) {
    const std::string target = (run / name).string();
    const std::string tmp_prefix = (run / ("." + name + ".tmp.")).string();
    bool found = false;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (!lines[i].starts_with("rename " + tmp_prefix) || !lines[i].ends_with(" " + target)) continue;
      found = true;
      const std::string tmp = lines[i].substr(7, lines[i].size() - 8 - target.size());
      EXPECT_TRUE(i > 0 && lines[i - 1] == "fsync " + tmp) << name << ": no fsync of " << tmp << " just before its rename";
      EXPECT_TRUE(i + 1 < lines.size() && lines[i + 1] == "fsync " + run.string())
          << name << ": the directory is not synced right after the rename";
    }
    EXPECT_TRUE(found) << "no atomic write of " << target;
  }
}
