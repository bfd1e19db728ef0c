// What a newcomer can do to a run or an experiment by mistake (issue #31): two writers of one
// directory, --out in the wrong place, resuming on other data, settings an experiment overrides,
// eval of compressed or JSONL text, a small single text to prepare.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_util.hpp"
#include "common/tiny_model.hpp"
#include "cli/cli_checks.hpp"
#include "data/dataset_identity.hpp"
#include "model/safetensors.hpp"
#include "util/dir_lock.hpp"
#include "util/rng.hpp"

using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Starts `attnres ARGS` (split at spaces) as a child of this process, its output in `log`.
pid_t start_cli(const std::string& args, const std::string& log) {
  std::vector<std::string> words = {ATTNRES_BINARY};
  std::istringstream in(args);
  for (std::string w; in >> w;) words.push_back(w);
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// A JSONL corpus of 60 documents with ids, prepared with the bytes tokenizer into `out`: the split
// goes by id, so `letters` (the words' alphabet) changes the tokens but not the split sizes.
void prepare_lettered(const fs::path& dir, const std::string& name, const std::string& letters) {
  const fs::path jsonl = dir / (name + ".jsonl");
  {
    std::ofstream out(jsonl);
    attnres::Rng rng(5);
    for (int d = 0; d < 60; ++d) {
      std::string text;
      for (int w = 0; w < 300; ++w) {
        for (int c = 0; c < 5; ++c) text += letters[rng.below(static_cast<std::uint64_t>(letters.size()))];
        text += ' ';
      }
      out << nlohmann::json{{"id", d}, {"text", text}}.dump() << "\n";
    }
  }
  const CliResult r = run_cli("prepare --input " + jsonl.string() + " --tokenizer bytes --val-fraction 0.15 "
                              "--test-fraction 0.15 --quiet --out " + (dir / name).string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

// Synthetic data shared by the tests of this file.
class CliSafety : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("attnres_cli_safety");
    prepare_synthetic_data(dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->str("data"); }
  static std::string corpus() { return dir_->str("corpus"); }
  static TempDir* dir_;
};
TempDir* CliSafety::dir_ = nullptr;

}  // namespace

// Finding 1: a second writer of a run directory is refused, naming the holder; a lock file left by
// a killed process does not block.
TEST_F(CliSafety, ASecondWriterOfARunIsRefused) {
  TempDir runs("attnres_safety_run_lock");
  const fs::path run = runs.path() / "run";
  const std::string train = "train " + kTiny + " --data " + data() + " --out " + run.string();
  fs::create_directories(run);
  {
    const attnres::DirLock held(run.string(), ".lock", "");
    expect_user_error(train, {"'" + run.string() + "' is in use by process " + std::to_string(::getpid()),
                              (run / ".lock").string(), "another 'attnres train'"});
    EXPECT_EQ(entries(run), std::vector<std::string>{".lock"}) << "the refused process wrote nothing";
  }
  // A lock file whose process is gone (here: its id is not a running process) is no obstacle.
  std::ofstream(run / ".lock") << "999999999\n";
  const CliResult r = run_cli(train + " --stop-at-step 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(run / ".lock")) << "a process removes its lock file when it ends";

  // A process killed while it trains leaves its lock file behind, which does not block either.
  const fs::path other = runs.path() / "long";
  const std::string long_run = "train " + kTiny + " --set train.tokens=10000000 --data " + data() + " --out " +
                               other.string();
  const std::string log = runs.str("killed.log");
  const pid_t trainer = start_cli(long_run, log);
  ASSERT_GT(trainer, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (attnres::lock_holder((other / ".lock").string()) != trainer &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(attnres::lock_holder((other / ".lock").string()), trainer) << read_file(log);
  expect_user_error(long_run + " --resume", {"in use by process " + std::to_string(trainer)});
  ::kill(trainer, SIGKILL);
  ::waitpid(trainer, nullptr, 0);
  ASSERT_TRUE(fs::exists(other / ".lock"));  // left behind by the killed process
  // (--resume only where there is a checkpoint: killed before its first, the run starts again.)
  const CliResult resumed = run_cli(long_run + (has_checkpoint(other) ? " --resume" : "") + " --stop-at-step 1");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}

// Finding 1: two `experiment` processes on one directory: the second is refused and pointed at
// --worker, while two workers of one experiment share it.
TEST_F(CliSafety, ASecondExperimentIsRefusedButWorkersShareOne) {
  TempDir runs("attnres_safety_exp_lock");
  const fs::path out = runs.path() / "exp";
  const std::string experiment =
      "experiment " + kTiny + " --arms block,rd --seeds 1,2 --data " + data() + " --out " + out.string();
  fs::create_directories(out);
  {
    const attnres::DirLock held(out.string(), ".lock-worker-0-of-1", "");
    expect_user_error(experiment, {"'" + out.string() + "' is in use by process " + std::to_string(::getpid()),
                                   "--worker 0/2 and --worker 1/2"});
    EXPECT_FALSE(fs::exists(out / "runs"));
  }
  {
    const attnres::DirLock held(out.string(), ".lock-worker-1-of-2", "");
    expect_user_error(experiment + " --worker 1/2", {"in use by process", "worker 1/2", "its own --worker"});
  }
  // Two workers at the same time, on the same directory: both run their share, together all.
  const CliResult both = run_shell("(" + std::string(ATTNRES_BINARY) + " " + experiment + " --worker 0/2 > " +
                                   runs.str("w0.log") + " 2>&1; echo w0=$? >> " + runs.str("w0.log") + ") & " +
                                   ATTNRES_BINARY + " " + experiment + " --worker 1/2 > " + runs.str("w1.log") +
                                   " 2>&1; echo w1=$?; wait; cat " + runs.str("w0.log"));
  EXPECT_TRUE(contains(both.output, "w0=0")) << both.output << read_file(runs.path() / "w1.log");
  EXPECT_TRUE(contains(both.output, "w1=0")) << both.output << read_file(runs.path() / "w1.log");
  for (const char* arm : {"block", "rd"})
    for (int seed : {1, 2})
      EXPECT_TRUE(fs::exists(out / "runs" / arm / ("seed-" + std::to_string(seed)) / "result.json")) << arm << seed;
  const CliResult summary = run_cli(experiment);  // everything done: the summary
  EXPECT_EQ(summary.exit_code, 0) << summary.output;
  EXPECT_TRUE(contains(summary.output, "summary: ")) << summary.output;
}

// Issue #47: Ctrl-C during an experiment is announced once, by the experiment (its training child,
// in a process group of its own, stops without saying so again); the exit says it was stopped.
TEST_F(CliSafety, AStopInAnExperimentIsAnnouncedOnce) {
  TempDir runs("attnres_safety_exp_stop");
  const fs::path out = runs.path() / "exp";
  const std::string log = runs.str("exp.log");
  const pid_t parent = start_cli("experiment " + kTiny + " --set train.tokens=10000000 --arms block,rd --seeds 1 --data " +
                                     data() + " --out " + out.string(), log);
  ASSERT_GT(parent, 0);
  // The first run's training process holds its directory once its stop handlers are installed.
  const std::string run_lock = (out / "runs" / "block" / "seed-1" / ".lock").string();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  long child = 0;
  while ((child = attnres::lock_holder(run_lock)) <= 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GT(child, 0) << read_file(log);
  ASSERT_NE(child, static_cast<long>(parent));
  ::kill(parent, SIGINT);
  int status = 0;
  ::waitpid(parent, &status, 0);
  const std::string output = read_file(log);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 130) << output;
  std::size_t announced = 0;
  for (std::size_t at = output.find("stopping after this step"); at != std::string::npos;
       at = output.find("stopping after this step", at + 1))
    ++announced;
  EXPECT_EQ(announced, 1u) << output;
}

// Finding 3: --out must be new, empty or attnres' own kind of directory.
TEST_F(CliSafety, OutMustBeEmptyOrOfItsKind) {
  TempDir runs("attnres_safety_out");
  const std::vector<std::string> before = entries(corpus());
  expect_user_error("train " + kTiny + " --data " + data() + " --out " + corpus(),
                    {"--out '" + corpus() + "' is not empty and is not an attnres run directory", "doc0.txt"});
  expect_user_error("experiment " + kTiny + " --seeds 1 --data " + data() + " --out " + corpus(),
                    {"--out '" + corpus() + "' is not empty and is not an attnres experiment directory", "doc0.txt"});
  EXPECT_EQ(entries(corpus()), before) << "nothing written into the corpus";
  // A run is not an experiment's directory, nor an experiment a run's.
  const std::string run = runs.str("run");
  ASSERT_EQ(run_cli("train " + kTiny + " --data " + data() + " --out " + run + " --stop-at-step 1").exit_code, 0);
  expect_user_error("experiment " + kTiny + " --seeds 1 --data " + data() + " --out " + run,
                    {"not an attnres experiment directory", "config.toml"});
  const std::string exp = runs.str("exp");
  fs::create_directories(runs.path() / "exp" / "runs");
  expect_user_error("train " + kTiny + " --data " + data() + " --out " + exp, {"not an attnres run directory", "runs/"});
  // Hidden files (a .gitkeep, a stale lock) do not count.
  fs::create_directories(runs.path() / "hidden");
  std::ofstream(runs.path() / "hidden" / ".gitkeep") << "";
  EXPECT_EQ(run_cli("train " + kTiny + " --data " + data() + " --out " + runs.str("hidden") + " --stop-at-step 1")
                .exit_code,
            0);
}

// Finding 3: filesystem errors of --out are user errors that say what failed, for experiment as
// for train; a train that fails leaves no --out it created behind.
TEST_F(CliSafety, OutErrorsArePlainAndFailuresLeaveNothing) {
  TempDir runs("attnres_safety_out_errors");
  expect_user_error("experiment " + kTiny + " --seeds 1 --data " + data() + " --out /proc/attnres-x",
                    {"cannot create the experiment directory '/proc/attnres-x'"});
  const std::string file = runs.str("a_file");
  std::ofstream(file) << "x";
  expect_user_error("experiment " + kTiny + " --seeds 1 --data " + data() + " --out " + file, {file, "not a directory"});
  expect_user_error("experiment " + kTiny + " --seeds 1 --data " + data() + " --out " + file + "/exp",
                    {"cannot create the experiment directory", file + "/exp"});
  // The device is checked after the directory is made: the directory (and its new parent) go again.
  expect_user_error("train " + kTiny + " --device tpu --data " + data() + " --out " + runs.str("new/run"),
                    {"--device"});
  EXPECT_FALSE(fs::exists(runs.path() / "new"));
  // A directory that existed stays, as it was.
  fs::create_directories(runs.path() / "mine");
  expect_user_error("train " + kTiny + " --device tpu --data " + data() + " --out " + runs.str("mine"), {"--device"});
  EXPECT_TRUE(fs::is_directory(runs.path() / "mine"));
  EXPECT_TRUE(entries(runs.path() / "mine").empty());
  // The same for an experiment that fails before its first run.
  expect_user_error("experiment " + kTiny + " --seeds 1,1 --data " + data() + " --out " + runs.str("new/exp"),
                    {"listed twice"});
  EXPECT_FALSE(fs::exists(runs.path() / "new"));
}

// Finding 2: a run records its data; --resume on other data (the same tokenizer and split sizes,
// other tokens) is refused naming both identities, and a checkpoint of an older attnres, which
// recorded none, still resumes, with a note.
TEST_F(CliSafety, ResumeOnOtherDataIsRefused) {
  TempDir dir("attnres_safety_other_data");
  prepare_lettered(dir.path(), "a", "abcdefgh");
  prepare_lettered(dir.path(), "b", "stuvwxyz");
  const nlohmann::json a = attnres::data::dataset_identity(dir.str("a"));
  const nlohmann::json b = attnres::data::dataset_identity(dir.str("b"));
  ASSERT_EQ(a.at("train_tokens"), b.at("train_tokens"));
  ASSERT_EQ(a.at("tokenizer_hash"), b.at("tokenizer_hash"));
  ASSERT_NE(a.at("content_hash"), b.at("content_hash"));

  const std::string run = dir.str("run");
  const std::string train = "train " + kTiny + " --out " + run + " --data ";
  ASSERT_EQ(run_cli(train + dir.str("a") + " --stop-at-step 4").exit_code, 0);
  const std::string checkpoint = newest_checkpoint(run).string();
  const std::string before = read_file(checkpoint);
  expect_user_error(train + dir.str("b") + " --resume",
                    {"'" + checkpoint + "' was trained on other data than '" + dir.str("b") + "'",
                     "content_hash = " + a.at("content_hash").dump() + " (checkpoint) vs " +
                         b.at("content_hash").dump() + " (--data)"});
  EXPECT_EQ(read_file(checkpoint), before);
  const CliResult same = run_cli(train + dir.str("a") + " --resume --stop-at-step 5");
  ASSERT_EQ(same.exit_code, 0) << same.output;
  EXPECT_FALSE(contains(same.output, "note:")) << same.output;

  // As written before checkpoints recorded their data: no "dataset" in the state.
  for (const attnres::CheckpointFile& c : attnres::list_checkpoints(run)) {
    attnres::SafetensorsFile f = attnres::read_safetensors(c.path);
    nlohmann::json state = nlohmann::json::parse(f.metadata.at("state"));
    ASSERT_EQ(state.erase("dataset"), 1u);
    f.metadata["state"] = state.dump();
    std::vector<attnres::TensorRef> refs;
    for (const auto& [name, t] : f.tensors) refs.push_back({name, t.dtype, t.shape, t.bytes.data()});
    attnres::write_safetensors(c.path, f.metadata, refs);
  }
  const std::string newest = newest_checkpoint(run).string();
  const CliResult old = run_cli(train + dir.str("a") + " --resume");
  ASSERT_EQ(old.exit_code, 0) << old.output;
  EXPECT_TRUE(contains(old.output, "note: '" + newest + "' records no dataset identity")) << old.output;
}

// Issue #47: --resume with nothing to resume (a mistyped --out, a run stopped before its first
// checkpoint) is an error naming the directory and what is missing, not a new run from step 1.
TEST_F(CliSafety, ResumeWithNothingToResumeIsAnError) {
  TempDir dir("attnres_safety_resume_nothing");
  const std::string missing = dir.str("mistyped");
  const std::string train = "train " + kTiny + " --data " + data() + " --resume --out ";
  expect_user_error(train + missing, {"--resume: '" + missing + "' does not exist"});
  EXPECT_FALSE(fs::exists(missing)) << "nothing created";
  const std::string empty = dir.str("empty");
  fs::create_directories(empty);
  expect_user_error(train + empty, {"--resume: '" + empty + "' holds no checkpoint (checkpoint-STEP.safetensors)"});
  EXPECT_TRUE(entries(empty).empty()) << "nothing written";
}

// Issue #47: a directory given where a file is read (and the reverse) is named as such, by every
// reader (util/paths.hpp): --config of a directory trained the tiny preset, sp:DIR was "does not
// exist", --data of the manifest itself was "no manifest.json".
TEST_F(CliSafety, ADirectoryForAFileAndTheReverseAreNamed) {
  TempDir dir("attnres_safety_path_kinds");
  const std::string manifest = data() + "/manifest.json";
  expect_user_error("train " + kTiny.substr(kTiny.find("--set")) + " --config " + corpus() + " --data " + data() +
                        " --out " + dir.str("run"),
                    {"--config '" + corpus() + "' is a directory, not a file"});
  EXPECT_FALSE(fs::exists(dir.str("run")));
  expect_user_error("train " + kTiny + " --data " + manifest + " --out " + dir.str("run"),
                    {"prepared dataset '" + manifest + "' is a file, not a directory",
                     "give the directory holding manifest.json"});
  expect_user_error("train " + kTiny + " --data " + dir.str("nodata") + " --out " + dir.str("run"),
                    {"prepared dataset '" + dir.str("nodata") + "' does not exist (make it with 'attnres prepare --out " +
                     dir.str("nodata") + "')"});
  expect_user_error("prepare --input " + corpus() + " --tokenizer sp:" + data() + " --out " + dir.str("p"),
                    {"SentencePiece model '" + data() + "' is a directory, not a file",
                     "sp:" + data() + "/tokenizer.model"});
  expect_user_error("tokenizer info --tokenizer gpt2:" + manifest,
                    {"GPT-2 tokenizer directory '" + manifest + "' is a file, not a directory"});
  expect_user_error("experiment --protocol " + data() + " --out " + dir.str("exp"),
                    {"'" + data() + "' is a directory, not a file"});
}

// Finding 2: the same identity in a protocol experiment's experiment.json: one recorded by an older
// attnres (without content_hash) still matches; other data of the same sizes does not.
TEST_F(CliSafety, ProtocolExperimentsCompareTheDataByContent) {
  TempDir dir("attnres_safety_protocol_data");
  prepare_lettered(dir.path(), "a", "abcdefgh");
  prepare_lettered(dir.path(), "b", "stuvwxyz");
  // The protocol names one data directory; its contents are replaced below.
  fs::rename(dir.path() / "a", dir.path() / "data");
  const std::string protocol = dir.str("p.toml");
  std::ofstream(protocol) << "[experiment]\nname = \"p\"\ndata = \"" << dir.str("data")
                          << "\"\nseeds = [1]\narms = [\"block\", \"rd\"]\n\n[model]\nd_model = 32\nn_layers = 2\n"
                             "n_heads = 2\nmlp_hidden = 64\nn_blocks = 2\n\n[train]\nseq_len = 32\nbatch_size = 4\n"
                             "tokens = 512\neval_tokens = 256\nthreads = 1\n";
  const std::string out = dir.str("exp");
  const std::string experiment = "experiment --protocol " + protocol + " --out " + out;
  ASSERT_EQ(run_cli(experiment).exit_code, 0);
  const fs::path spec_path = fs::path(out) / "experiment.json";
  const std::string written = read_file(spec_path);
  nlohmann::json spec = nlohmann::json::parse(written);
  ASSERT_TRUE(spec.at("dataset").contains("content_hash")) << spec.dump(1);
  spec["dataset"].erase("content_hash");
  std::ofstream(spec_path) << spec.dump(2);
  const CliResult again = run_cli(experiment);
  EXPECT_EQ(again.exit_code, 0) << again.output;
  std::ofstream(spec_path) << written;
  fs::rename(dir.path() / "data", dir.path() / "a");
  fs::rename(dir.path() / "b", dir.path() / "data");
  expect_user_error(experiment, {"differs in dataset.content_hash = ", "(experiment.json) vs"});
}

// Issue #47: a protocol study copied elsewhere, with its data copied to another path (its protocol
// pointing there), resumes: the data is compared by identity, the path being a label
// (docs/experiments.md, "Resuming anywhere"); other data at that path is still refused.
TEST_F(CliSafety, ACopiedStudyResumesOnACopyOfItsDataElsewhere) {
  TempDir dir("attnres_safety_copied_study");
  prepare_lettered(dir.path(), "data", "abcdefgh");
  const auto protocol_for = [&](const std::string& name, const std::string& data) {
    const std::string path = dir.str(name);
    std::ofstream(path) << "[experiment]\nname = \"p\"\ndata = \"" << data
                        << "\"\nseeds = [1]\narms = [\"block\", \"rd\"]\n\n[model]\nd_model = 32\nn_layers = 2\n"
                           "n_heads = 2\nmlp_hidden = 64\nn_blocks = 2\n\n[train]\nseq_len = 32\nbatch_size = 4\n"
                           "tokens = 512\neval_tokens = 256\nthreads = 1\n";
    return path;
  };
  const std::string exp = dir.str("exp");
  ASSERT_EQ(run_cli("experiment --protocol " + protocol_for("p.toml", dir.str("data")) + " --out " + exp).exit_code, 0);
  // The copy: the experiment directory with one run still to train, the data at another path.
  fs::create_directories(dir.path() / "elsewhere");
  fs::copy(exp, dir.path() / "elsewhere" / "exp", fs::copy_options::recursive);
  fs::copy(dir.path() / "data", dir.path() / "elsewhere" / "data", fs::copy_options::recursive);
  fs::remove_all(dir.path() / "elsewhere" / "exp" / "runs" / "rd" / "seed-1");
  fs::remove_all(dir.path() / "data");  // the original is gone: the copy alone is read
  const std::string copied = protocol_for("elsewhere/p.toml", dir.str("elsewhere/data"));
  const std::string resume = "experiment --protocol " + copied + " --out " + dir.str("elsewhere/exp");
  const CliResult r = run_cli(resume);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir.path() / "elsewhere" / "exp" / "runs" / "rd" / "seed-1" / "result.json")) << r.output;
  // Other data at the copy's path is refused, by identity.
  fs::remove_all(dir.path() / "elsewhere" / "data");
  prepare_lettered(dir.path() / "elsewhere", "data", "stuvwxyz");
  expect_user_error(resume, {"differs in dataset.content_hash = "});
}

// Finding 4: the keys every run of an experiment sets itself are refused in a --config file as
// they are with --set, naming the key and the file; one arm alone is refused.
TEST_F(CliSafety, ExperimentRulesAreTheSameByEveryRoute) {
  TempDir runs("attnres_safety_routes");
  const std::string config = runs.str("c.toml");
  std::ofstream(config) << "[model]\nd_model = 32\nn_layers = 2\nn_heads = 2\nmlp_hidden = 64\nn_blocks = 2\n"
                           "residual = \"prenorm\"\n\n[train]\nseq_len = 32\nbatch_size = 4\ntokens = 512\n"
                           "eval_tokens = 256\nthreads = 1\n";
  const std::string base = "experiment --arms block,rd --seeds 1 --data " + data() + " --out ";
  expect_user_error(base + runs.str("a") + " --config " + config,
                    {config + ":7: model.residual", "'" + config + "'", "--arms"});
  std::ofstream(config) << "[model]\nd_model = 32\n\n[train]\nseed = 9\n";
  expect_user_error(base + runs.str("b") + " --config " + config, {config + ":5: train.seed", "--seeds"});
  // The same keys by --set (refused before), and keys no run sets, from either route, are fine.
  expect_user_error(base + runs.str("c") + " " + kTiny + " --set model.residual=rd", {"--set model.residual=rd"});
  std::ofstream(config) << "[model]\nd_model = 32\nn_layers = 2\nn_heads = 2\nmlp_hidden = 64\nn_blocks = 2\n\n"
                           "[train]\nseq_len = 32\nbatch_size = 4\ntokens = 512\neval_tokens = 256\nthreads = 1\n";
  const CliResult ok = run_cli(base + runs.str("d") + " --config " + config);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  for (const char* name : {"a", "b", "c"}) EXPECT_FALSE(fs::exists(runs.path() / name)) << name;

  // Nothing to compare: one arm.
  expect_user_error("experiment " + kTiny + " --arms block --seeds 1,2 --data " + data() + " --out " + runs.str("e"),
                    {"--arms 'block' names one arm, 'block'", "baseline and at least one other arm"});
  EXPECT_FALSE(fs::exists(runs.path() / "e"));
  const std::string protocol = runs.str("one.toml");
  std::ofstream(protocol) << "[experiment]\nname = \"one\"\ndata = \"" << data()
                          << "\"\nseeds = [1]\narms = [\"rd\"]\n";
  expect_user_error("experiment --protocol " + protocol + " --out " + runs.str("f"),
                    {protocol + ": [experiment] arms names one arm, 'rd'"});
  EXPECT_FALSE(fs::exists(runs.path() / "f"));
}

// Finding 5: eval --text reads what prepare reads: gzip and JSONL are decoded (the same document
// scores the same in each form), a directory is searched, and any other file is refused.
TEST_F(CliSafety, EvalTextReadsWhatPrepareReads) {
  TempDir dir("attnres_safety_eval_text");
  const std::string run = dir.str("run");
  ASSERT_EQ(run_cli("train " + kTiny + " --data " + data() + " --out " + run).exit_code, 0);
  const std::string text = read_file(fs::path(corpus()) / "doc3.txt");
  fs::create_directories(dir.path() / "docs");
  const fs::path plain = dir.path() / "docs" / "doc.txt";
  std::ofstream(plain) << text;
  ASSERT_EQ(run_shell("gzip -c " + plain.string() + " > " + dir.str("doc.txt.gz")).exit_code, 0);
  std::ofstream(dir.path() / "doc.jsonl") << nlohmann::json{{"id", 1}, {"text", text}}.dump() << "\n";
  ASSERT_EQ(run_shell("gzip -c " + dir.str("doc.jsonl") + " > " + dir.str("doc.jsonl.gz")).exit_code, 0);
  const std::string eval = "eval --checkpoint " + run + " --json --text ";
  const CliResult reference = run_cli(eval + plain.string());
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  EXPECT_EQ(nlohmann::json::parse(reference.output)["bytes"], static_cast<double>(text.size()));
  for (const std::string& form : {dir.str("doc.txt.gz"), dir.str("doc.jsonl"), dir.str("doc.jsonl.gz"), dir.str("docs")}) {
    const CliResult r = run_cli(eval + form);
    EXPECT_EQ(r.exit_code, 0) << form << "\n" << r.output;
    EXPECT_EQ(r.output, reference.output) << form;
  }
  // Each JSONL line is a document, as in prepare: two lines of the text score it twice.
  std::ofstream(dir.path() / "two.jsonl") << nlohmann::json{{"text", text}}.dump() << "\n"
                                          << nlohmann::json{{"text", text}}.dump() << "\n";
  const CliResult two = run_cli(eval + dir.str("two.jsonl"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(nlohmann::json::parse(two.output)["tokens"].get<long long>(),
            2 * nlohmann::json::parse(reference.output)["tokens"].get<long long>());
  // Anything prepare would not read is refused, naming it.
  fs::copy_file(dir.path() / "doc.txt.gz", dir.path() / "doc.bin");
  expect_user_error(eval + dir.str("doc.bin"), {"unsupported input '" + dir.str("doc.bin") + "'"});
  std::ofstream(dir.path() / "bad.jsonl") << "{\"text\": 3}\n";
  expect_user_error(eval + dir.str("bad.jsonl"), {dir.str("bad.jsonl") + ":1", "\"text\""});
  fs::create_directories(dir.path() / "nothing");
  expect_user_error(eval + dir.str("nothing"), {"no .jsonl, .jsonl.gz, .txt or .txt.gz files under"});
}

// Finding 6: a corpus that is one text file under 256 KiB is cut into pieces for the split too, so
// it gets val and test splits, and the warning's advice (larger fractions) works; the split of a
// corpus that split before is what it was.
TEST(CliSafetyPrepare, ASmallSingleTextGetsEverySplit) {
  TempDir dir("attnres_safety_small_text");
  const std::string text = dir.str("one.txt");
  {
    std::ofstream out(text);  // 8,400 bytes, one document
    for (int i = 0; i < 200; ++i) out << "one long document of the depth attention. ";
  }
  const auto splits = [&](const std::string& name) {
    return nlohmann::json::parse(read_file(dir.path() / name / "manifest.json"));
  };
  const CliResult r = run_cli("prepare --input " + text + " --tokenizer bytes --quiet --out " + dir.str("data"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json m = splits("data");
  for (const char* split : {"train", "val", "test"})
    EXPECT_GT(m["splits"][split]["tokens"].get<long long>(), 0) << split << "\n" << r.output;
  EXPECT_EQ(m["split"]["cut_documents"], 1);
  EXPECT_EQ(m["split"]["single_text_piece_bytes"], 132);  // ceil(8400 / 64)
  EXPECT_TRUE(contains(m["split"]["rule"].get<std::string>(), "one text file")) << m["split"].dump(1);
  // 1% of the text is less than a window of the tiny preset: the advice of the warning works.
  EXPECT_TRUE(contains(r.output, "larger --val-fraction/--test-fraction")) << r.output;
  const CliResult larger = run_cli("prepare --input " + text +
                                   " --tokenizer bytes --quiet --val-fraction 0.1 --test-fraction 0.1 --out " +
                                   dir.str("larger"));
  ASSERT_EQ(larger.exit_code, 0) << larger.output;
  EXPECT_FALSE(contains(larger.output, "warning")) << larger.output;
  for (const char* split : {"val", "test"})
    EXPECT_GE(splits("larger")["splits"][split]["tokens"].get<long long>(), 600) << split;
  // A tokenizer trained on it (prepare without --tokenizer) sees the training pieces only, and
  // a model trains and is tested on it.
  const CliResult sp = run_cli("prepare --input " + text +
                               " --vocab-size 300 --quiet --val-fraction 0.1 --test-fraction 0.1 --out " + dir.str("sp"));
  ASSERT_EQ(sp.exit_code, 0) << sp.output;
  const CliResult trained = run_cli("train " + kTiny + " --data " + dir.str("larger") + " --out " + dir.str("run"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_EQ(run_cli("eval --checkpoint " + dir.str("run") + " --data " + dir.str("larger") + " --split test").exit_code, 0);

  // Two text files, or one over 256 KiB: split as before, with the manifest as before.
  fs::create_directories(dir.path() / "two");
  fs::copy_file(text, dir.path() / "two" / "a.txt");
  std::ofstream(dir.path() / "two" / "b.txt") << "a second document.";
  ASSERT_EQ(run_cli("prepare --input " + dir.str("two") + " --tokenizer bytes --quiet --out " + dir.str("multi")).exit_code, 0);
  EXPECT_EQ(splits("multi")["split"]["cut_documents"], 0);
  EXPECT_FALSE(splits("multi")["split"].contains("single_text_piece_bytes"));
  const std::string long_text = dir.str("long.txt");
  {
    std::ofstream out(long_text);
    for (int i = 0; i < 8000; ++i) out << "one long document of the depth attention. ";
  }
  ASSERT_EQ(run_cli("prepare --input " + long_text + " --tokenizer bytes --quiet --out " + dir.str("long")).exit_code, 0);
  const nlohmann::json l = splits("long");
  EXPECT_EQ(l["split"]["cut_documents"], 1);
  EXPECT_FALSE(l["split"].contains("single_text_piece_bytes"));
  EXPECT_FALSE(contains(l["split"]["rule"].get<std::string>(), "one text file"));
}
