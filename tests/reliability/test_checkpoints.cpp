// The last train.keep_checkpoints checkpoints (docs/reliability.md, "Checkpoints kept"): how many
// stay, that --resume falls back to the newest one that verifies and ends bit for bit as an
// undisturbed run, that a run with none verifying is a clear error, and that each kept
// checkpoint reads as the weights of its own step.
#include <fstream>
#include <nlohmann/json.hpp>

#include "reliability/reliability_util.hpp"
#include "train/checkpoint.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

std::vector<std::int64_t> checkpoint_steps(const fs::path& run) {
  std::vector<std::int64_t> steps;
  for (const CheckpointFile& c : list_checkpoints(run.string())) steps.push_back(c.step);
  return steps;
}

// A copy of the undisturbed (finished) run that --resume continues from its checkpoints.
fs::path unfinished_copy(const TempDir& dir) {
  const fs::path copy = dir.path() / "run";
  fs::copy(TinyRun::get().run, copy);
  fs::remove(copy / "train_result.json");
  return copy;
}

void flip_last_tensor_byte(const fs::path& file) {
  std::string bytes = read_file(file);
  bytes[bytes.size() - 5] ^= 0x01;  // in adam.v, the last tensor
  std::ofstream(file, std::ios::binary) << bytes;
}

}  // namespace

TEST(Checkpoints, FileNamesSortByStep) {
  EXPECT_EQ(checkpoint_file_name(6), "checkpoint-000006.safetensors");
  EXPECT_EQ(checkpoint_file_name(12345678), "checkpoint-12345678.safetensors");
  TempDir dir("attnres_checkpoint_names");
  for (const std::string name : {"checkpoint-000006.safetensors", "checkpoint-12345678.safetensors",
                                 "checkpoint-000010.safetensors", "checkpoint.safetensors", "checkpoint-.safetensors",
                                 "checkpoint-12x.safetensors", "checkpoint-000011.safetensors.tmp",
                                 ".checkpoint-000012.safetensors.tmp.99", "model.safetensors"})
    std::ofstream(dir.path() / name) << "x";
  const std::vector<CheckpointFile> all = list_checkpoints(dir.str());
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].step, 12345678);
  EXPECT_EQ(all[1].step, 10);
  EXPECT_EQ(all[2].step, 6);
  EXPECT_EQ(all[3].step, CheckpointFile::kLegacyStep);  // the one checkpoint of an older run: the oldest
  EXPECT_EQ(fs::path(all[3].path).filename(), "checkpoint.safetensors");
  EXPECT_TRUE(list_checkpoints(dir.str("no-such-directory")).empty());
}

TEST(Checkpoints, TheNewestKAreKept) {
  const TinyRun& tiny = TinyRun::get();
  // 8 steps, a checkpoint every 2; the default keeps 2.
  EXPECT_EQ(checkpoint_steps(tiny.run), (std::vector<std::int64_t>{8, 6}));
  TempDir runs("attnres_keep_checkpoints");
  for (const int k : {1, 3}) {
    const fs::path out = runs.path() / ("keep-" + std::to_string(k));
    const CliResult r = run_cli(tiny.train(out) + " --set train.keep_checkpoints=" + std::to_string(k));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<std::int64_t> want = k == 1 ? std::vector<std::int64_t>{8} : std::vector<std::int64_t>{8, 6, 4};
    EXPECT_EQ(checkpoint_steps(out), want);
    EXPECT_TRUE(hidden_files(out).empty());
  }
  // A stop between checkpoints adds one (step 3); it ages out like the others.
  const fs::path stopped = runs.path() / "stopped";
  ASSERT_EQ(run_cli(tiny.train(stopped) + " --stop-at-step 3").exit_code, 0);
  EXPECT_EQ(checkpoint_steps(stopped), (std::vector<std::int64_t>{3, 2}));
  ASSERT_EQ(run_cli(tiny.train(stopped) + " --resume --stop-at-step 5").exit_code, 0);
  EXPECT_EQ(checkpoint_steps(stopped), (std::vector<std::int64_t>{5, 4}));
  const CliResult r = run_cli(tiny.train(stopped) + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(checkpoint_steps(stopped), (std::vector<std::int64_t>{8, 6}));
  expect_same_weights(tiny.run / "model.safetensors", stopped / "model.safetensors");

  const CliResult zero = run_cli(tiny.train(runs.path() / "zero") + " --set train.keep_checkpoints=0");
  EXPECT_EQ(zero.exit_code, 1) << zero.output;
  EXPECT_NE(zero.output.find("train.keep_checkpoints"), std::string::npos) << zero.output;
  EXPECT_FALSE(has_checkpoint(runs.path() / "zero"));
}

// A process stopped between a checkpoint and the pruning after it leaves one checkpoint too many;
// without pruning at --resume, each such stop of the resumed run would add one more (found by the
// signal-storm test under ASan, whose slower processes stop in that window more often).
TEST(Checkpoints, AResumePrunesWhatStopsBeforeThePruningLeft) {
  TempDir runs("attnres_resume_prunes");
  const fs::path run = unfinished_copy(runs);
  for (const std::int64_t step : {4, 2})  // as two stops in that window would have left them
    fs::copy_file(run / checkpoint_file_name(6), run / checkpoint_file_name(step));
  ASSERT_EQ(checkpoint_steps(run), (std::vector<std::int64_t>{8, 6, 4, 2}));
  const CliResult r = run_cli(TinyRun::get().train(run) + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(checkpoint_steps(run), (std::vector<std::int64_t>{8, 6}));
  EXPECT_TRUE(hidden_files(run).empty());
}

TEST(Checkpoints, ACorruptNewestCheckpointResumesFromThePreviousOneExactly) {
  TempDir runs("attnres_corrupt_newest");
  const fs::path run = unfinished_copy(runs);
  const fs::path newest = run / checkpoint_file_name(8);
  flip_last_tensor_byte(newest);
  const CliResult r = run_cli(TinyRun::get().train(run) + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Which one was skipped and why; which one was taken.
  EXPECT_NE(r.output.find("skipping checkpoint '" + newest.string() + "' (it does not verify): '" + newest.string() +
                          "': tensor 'adam.v' does not match its checksum"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("at step 6/8 from '" + (run / checkpoint_file_name(6)).string() + "'"), std::string::npos)
      << r.output;
  // Steps 7 and 8 again: the same weights, moments, losses and evaluations as the undisturbed run.
  const fs::path reference = TinyRun::get().run;
  expect_same_weights(reference / "model.safetensors", run / "model.safetensors");
  expect_same_weights(reference / checkpoint_file_name(8), newest);  // rewritten whole
  EXPECT_EQ(metrics_without_timing(reference / "metrics.jsonl"), metrics_without_timing(run / "metrics.jsonl"));
  EXPECT_EQ(checkpoint_steps(run), (std::vector<std::int64_t>{8, 6}));
}

TEST(Checkpoints, ACorruptNewerCheckpointGoesAtTheNextCheckpoint) {
  // Resumed from step 6 past a corrupt step 8 and stopped at step 7: the corrupt one is not kept
  // as "the newest" (this run recomputes its step), and the next resume takes step 7.
  TempDir runs("attnres_corrupt_newer");
  const fs::path run = unfinished_copy(runs);
  flip_last_tensor_byte(run / checkpoint_file_name(8));
  const CliResult r = run_cli(TinyRun::get().train(run) + " --resume --stop-at-step 7");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(checkpoint_steps(run), (std::vector<std::int64_t>{7, 6}));
  const CliResult again = run_cli(TinyRun::get().train(run) + " --resume");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(again.output.find("skipping"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("at step 7/8"), std::string::npos) << again.output;
  expect_same_weights(TinyRun::get().run / "model.safetensors", run / "model.safetensors");
}

TEST(Checkpoints, NoneVerifyingIsAnErrorListingEach) {
  TempDir runs("attnres_corrupt_all");
  const fs::path run = unfinished_copy(runs);
  const fs::path eight = run / checkpoint_file_name(8), six = run / checkpoint_file_name(6);
  flip_last_tensor_byte(eight);
  fs::resize_file(six, fs::file_size(six) / 2);
  const std::string eight_bytes = read_file(eight), six_bytes = read_file(six);
  const std::string metrics = read_file(run / "metrics.jsonl");
  const CliResult r = run_cli(TinyRun::get().train(run) + " --resume");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("'" + run.string() + "': none of its 2 checkpoints verifies, so the run cannot resume:\n  '" +
                          eight.string() + "': tensor 'adam.v' does not match its checksum"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("\n  '" + six.string() + "'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("skipping checkpoint '" + six.string() + "'"), std::string::npos) << r.output;
  // Nothing was written over them, nor over the metrics.
  EXPECT_EQ(read_file(eight), eight_bytes);
  EXPECT_EQ(read_file(six), six_bytes);
  EXPECT_EQ(read_file(run / "metrics.jsonl"), metrics);
  EXPECT_FALSE(fs::exists(run / "train_result.json"));
}

TEST(Checkpoints, AnotherConfigurationIsAnErrorNotASkip) {
  TempDir runs("attnres_checkpoint_config");
  const fs::path run = unfinished_copy(runs);
  const CliResult r = run_cli(TinyRun::get().train(run) + " --resume --set train.lr=0.001");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("'" + (run / checkpoint_file_name(8)).string() + "' was written with a different configuration"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("skipping"), std::string::npos) << r.output;
}

TEST(Checkpoints, EachKeptCheckpointEvaluatesAsTheWeightsOfItsStep) {
  const TinyRun& tiny = TinyRun::get();
  TempDir runs("attnres_checkpoint_eval");
  const fs::path at6 = runs.path() / "at6";
  ASSERT_EQ(run_cli(tiny.train(at6) + " --stop-at-step 6").exit_code, 0);
  const auto eval = [&](const fs::path& weights) {
    const CliResult r = run_cli("eval --checkpoint " + weights.string() + " --data " + tiny.data + " --max-tokens 256 --json");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output.substr(r.output.find('{')));
  };
  EXPECT_EQ(eval(tiny.run / checkpoint_file_name(6)), eval(at6 / "model.safetensors"));
  EXPECT_EQ(eval(tiny.run / checkpoint_file_name(8)), eval(tiny.run / "model.safetensors"));
  EXPECT_EQ(eval(tiny.run), eval(tiny.run / "model.safetensors"));  // a run directory: the newest
  EXPECT_NE(eval(tiny.run / checkpoint_file_name(6)), eval(tiny.run / "model.safetensors"));
  // sample finds the tokenizer in the checkpoint; info its model.
  const CliResult s = run_cli("sample --checkpoint " + (tiny.run / checkpoint_file_name(6)).string() +
                              " --prompt the --max-tokens 4 --seed 1");
  EXPECT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(s.output, run_cli("sample --checkpoint " + (at6 / "model.safetensors").string() +
                              " --prompt the --max-tokens 4 --seed 1")
                          .output);
  // info its model, tokenizer and step: those of model.safetensors written at that step (all but
  // the first line, which names the file read).
  const auto info = [](const fs::path& weights) {
    const CliResult r = run_cli("info " + weights.string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output.substr(r.output.find('\n') + 1);
  };
  EXPECT_EQ(info(tiny.run / checkpoint_file_name(6)), info(at6 / "model.safetensors"));
  EXPECT_NE(info(tiny.run / checkpoint_file_name(6)).find("\nstep: 6\n"), std::string::npos);
  EXPECT_NE(info(tiny.run / checkpoint_file_name(6)), info(tiny.run / "model.safetensors"));  // step 8's
}
