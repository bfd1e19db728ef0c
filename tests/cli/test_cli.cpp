// The command line as a newcomer meets it (issue #19): one exit-code scheme, unknown names with a
// suggestion, --version, range checks naming the flag, the same flags across commands, checks
// before work starts, and checkpoints given in any of their forms.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli_util.hpp"
#include "common/tiny_model.hpp"
#include "cli/cli_checks.hpp"
#include "experiment/pool_fixture.hpp"
#include "model/config.hpp"
#include "util/build_info.hpp"
#include "model/family.hpp"

using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

// Synthetic data and one finished tiny run on it, shared by the tests of this file.
class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("attnres_cli_test");
    prepare_synthetic_data(dir_->path());
    const CliResult r = run_cli("train " + kTiny + " --data " + data() + " --out " + run());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->str("data"); }
  static std::string run() { return dir_->str("run"); }
  static TempDir* dir_;
};
TempDir* CliTest::dir_ = nullptr;

}  // namespace

TEST(Cli, UnknownCommandsAreNamedWithTheClosestOne) {
  expect_user_error("trian --data x --out y", {"unknown command 'trian'", "did you mean 'train'?"});
  expect_user_error("frobnicate", {"unknown command 'frobnicate'", "experiment", "prepare"});
  expect_user_error("tokenizer encdoe --tokenizer bytes x", {"unknown command 'encdoe'", "'encode'"});
  const CliResult none = run_cli("");
  EXPECT_EQ(none.exit_code, 1) << none.output;
}

TEST(Cli, UnknownOptionsAreNamedWithTheClosestOne) {
  // Named before the "required option missing" that CLI11 would report first.
  expect_user_error("train --tokns 100", {"unknown option '--tokns' for 'attnres train'", "did you mean '--tokens'?"});
  expect_user_error("eval --checkpoint x --bacth 3", {"'--bacth'", "did you mean '--batch'?"});
  expect_user_error("sample --checkpoint x --prompt hi --zzzzzzzz", {"unknown option '--zzzzzzzz'", "--top-k"});
  expect_user_error("--verison", {"unknown option '--verison'", "'--version'"});
}

TEST(Cli, UnknownNamesInValuesAreNamedWithTheClosestOne) {
  // Config keys and their values, experiment and bench arms, tokenizer specs: one suggestion rule
  // (util/suggest.hpp), as for commands and options.
  expect_user_error("config --preset tiny --set model.d_modl=64",
                    {"--set model.d_modl=64: unknown config key 'model.d_modl'; did you mean 'model.d_model'?"});
  expect_user_error("config --preset tiny --set model.residual=mhcc",
                    {"'model.residual': unknown value 'mhcc'", "did you mean 'mhc'?"});
  expect_user_error("config --preset tiny --set train.decay=cosin", {"did you mean 'cosine'?"});
  expect_user_error("config --preset tiny --set train.zzzzzz=1", {"unknown config key 'train.zzzzzz'"});
  EXPECT_FALSE(contains(run_cli("config --preset tiny --set train.zzzzzz=1").output, "did you mean"));
  expect_user_error("experiment --preset tiny --arms block,rdd --data /nonexistent --out /nonexistent/e",
                    {"unknown arm 'rdd'", "did you mean 'rd'?"});
  expect_user_error("experiment --preset tiny --arms block,rd-tide+vres --data /nonexistent --out /nonexistent/e",
                    {"did you mean 'rd-tied+vres'?"});
  expect_user_error("bench --preset tiny --arms block,hcc --torch off --steps 1", {"did you mean 'hc'?"});
  expect_user_error("tokenizer encode --tokenizer spp:tok.model hi", {"did you mean 'sp:tok.model'?"});
  expect_user_error("tokenizer encode --tokenizer byte hi", {"did you mean 'bytes'?"});
  // A bare path of an existing file: the sp: spec of it.
  TempDir dir("attnres_cli_spec");
  std::ofstream(dir.str("tok.model")) << "x";
  expect_user_error("tokenizer encode --tokenizer " + dir.str("tok.model") + " hi",
                    {"did you mean 'sp:" + dir.str("tok.model") + "'?"});
}

TEST(Cli, VersionNamesTheBuild) {
  const CliResult r = run_cli("--version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"attnres ", "compiler: ", "blas: ", "cuda: ", "mpi: "})
    EXPECT_TRUE(contains(r.output, part)) << part << "\n" << r.output;
  // The version and the commit, captured when the binary was built (util/build_info.hpp).
  EXPECT_TRUE(contains(r.output, "attnres " + attnres::build_info().version + " (commit ")) << r.output;
  EXPECT_FALSE(contains(r.output, "(commit unknown")) << "no commit captured:\n" << r.output;
}

TEST(Cli, ExitCodes) {
  EXPECT_EQ(run_cli("--help").exit_code, 0);
  EXPECT_EQ(run_cli("train --help").exit_code, 0);
  // CLI11's own parse errors (a missing required option, a bad value) are user errors: 1.
  // In attnres's form (issue #47: CLI11's sentences were printed raw): the command, the flag.
  expect_user_error("train --data x", {"attnres train: error: --out: required", "Run 'attnres train --help'"});
  expect_user_error("eval --checkpoint x --batch many", {"attnres eval: error: --batch: must be a number"});
  expect_user_error("eval --checkpoint x --data y --split tset",
                    {"attnres eval: error: --split: 'tset' is not one of train,val,test; did you mean 'test'?"});
  expect_user_error("experiment --protocol p.toml --arms block,rd --out x",
                    {"attnres experiment: error: --protocol: cannot be given with --arms"});
  expect_user_error("tokenizer info --tokenizer bytes extra", {"attnres tokenizer info: error: unexpected argument(s): extra"});
  expect_user_error("eval --checkpoint /nonexistent/model.safetensors --text /dev/null", {"/nonexistent"});
}

TEST(Cli, HelpListsEveryResidualMode) {
  const CliResult r = run_cli("--help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> names;
  for (const attnres::ResidualMode mode : attnres::residual_mode_values()) names.push_back(attnres::to_string(mode));
  // As one list (the key's choices), hc and mhc included.
  EXPECT_TRUE(contains(r.output, "(model.residual): " + attnres::join_choices(names))) << r.output;
  EXPECT_TRUE(contains(r.output, "model.value_residual")) << r.output;
}

// The gr_* keys apply to residual = gr only: another mode refuses them before any work, naming the key
// and both modes (docs/delta-gated-spec.md §4).
TEST(Cli, GatedResidualKeysAreRefusedUnderOtherModes) {
  expect_user_error("config --preset tiny --set model.residual=block --set model.gr_n=3",
                    {"'gr_n'", "residual 'gr'", "residual mode 'block'"});
  expect_user_error("config --preset tiny --set model.residual=gr --set model.gr_n=9", {"model.gr_n"});
  EXPECT_EQ(run_cli("config --preset tiny --set model.residual=gr --set model.gr_n=3 --set model.gr_rank=5").exit_code, 0);
}

TEST(Cli, NumericFlagsAreRangeCheckedNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"eval --checkpoint x --text y --batch 0", "--batch"},
      {"eval --checkpoint x --text y --seq 0", "--seq"},
      {"eval --checkpoint x --text y --max-tokens -1", "--max-tokens"},
      {"eval --checkpoint x --text y --threads -2", "--threads"},
      {"sample --checkpoint x --prompt hi --top-k -3", "--top-k"},
      {"sample --checkpoint x --prompt hi --max-tokens 0", "--max-tokens"},
      {"sample --checkpoint x --prompt hi --temperature -1", "--temperature"},
      {"train --preset tiny --data x --out y --stop-at-step -3", "--stop-at-step"},
      {"train --preset tiny --data x --out y --tokens 0", "--tokens"},
      {"train --preset tiny --data x --out y --threads -1", "--threads"},
      {"prepare --input x --out y --threads -1", "--threads"},
      {"experiment --preset tiny --data x --out y --tokens -100", "--tokens"},
      {"bench --preset tiny --steps 0", "--steps"},
  };
  for (const auto& [args, flag] : cases) expect_user_error(args, {flag, "must be at least"});
  // The message is short (CLI11's PositiveNumber printed a 300-digit bound).
  const CliResult r = run_cli("eval --checkpoint x --text y --batch 0");
  EXPECT_LT(r.output.size(), 200u) << r.output;
}

TEST_F(CliTest, TrainTakesTokensAndThreads) {
  TempDir runs("attnres_cli_flags");
  const CliResult r = run_cli("train " + kTiny + " --tokens 512 --threads 2 --data " + data() + " --out " +
                              runs.str("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string config = read_file(runs.path() / "run" / "config.toml");
  EXPECT_TRUE(contains(config, "tokens = 512")) << config;
  EXPECT_TRUE(contains(config, "threads = 2")) << config;
  EXPECT_TRUE(contains(r.output, "finished 4 steps")) << r.output;
}

// Training refuses a gr_* key under another mode before it writes anything.
TEST_F(CliTest, TrainRefusesGatedResidualKeysUnderOtherModes) {
  const std::string out = run() + "-hc-gr";
  expect_user_error("train " + kTiny + " --set model.residual=hc --set model.gr_decay_norm=true --data " + data() +
                        " --out " + out,
                    {"'gr_decay_norm'", "residual 'gr'", "residual mode 'hc'"});
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(CliTest, CheckpointsInAnyForm) {
  const std::string weights = run() + "/model.safetensors";
  const std::string text = dir_->str("doc.txt");
  std::ofstream(text) << "the depth attention of the residual block. the query and the key.\n";
  const CliResult reference = run_cli("eval --checkpoint " + weights + " --text " + text + " --json");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  // The newest checkpoint holds the same step's weights as model.safetensors.
  for (const std::string& form : {run(), newest_checkpoint(run()).string()}) {
    const CliResult r = run_cli("eval --checkpoint " + form + " --text " + text + " --json");
    EXPECT_EQ(r.exit_code, 0) << form << "\n" << r.output;
    EXPECT_EQ(r.output, reference.output) << form;
    const CliResult s = run_cli("sample --checkpoint " + form + " --prompt the --max-tokens 5");
    EXPECT_EQ(s.exit_code, 0) << form << "\n" << s.output;
    EXPECT_EQ(run_cli("info " + form).exit_code, 0) << form;
  }
  const CliResult positional = run_cli("info " + weights);
  const CliResult flag = run_cli("info --checkpoint " + weights);
  EXPECT_EQ(positional.exit_code, 0) << positional.output;
  EXPECT_EQ(flag.output, positional.output);
  EXPECT_TRUE(contains(flag.output, "parameters: ")) << flag.output;
  expect_user_error("eval --checkpoint " + data() + " --text " + text, {data(), "without model.safetensors"});
}

TEST_F(CliTest, EvalHonoursMaxTokensOnText) {
  const std::string text = dir_->str("long.txt");
  {
    std::ofstream out(text);
    for (int i = 0; i < 50; ++i) out << "the depth attention of the residual block routes the value. ";
  }
  const CliResult r = run_cli("eval --checkpoint " + run() + " --text " + text + " --max-tokens 100 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["tokens"].get<long long>(), 100);
  EXPECT_EQ(j["bytes"].get<double>(), 100.0);  // bytes tokenizer: one byte per token
  // Counts are written as integers (issue #47: "bytes":100.0).
  EXPECT_TRUE(j["bytes"].is_number_integer()) << r.output;
  EXPECT_TRUE(contains(r.output, "\"bytes\":100,")) << r.output;
}

TEST_F(CliTest, ResumingAFinishedRunChangesNothing) {
  const fs::path result = fs::path(run()) / "train_result.json";
  const std::string before = read_file(result);
  const std::string metrics = read_file(fs::path(run()) / "metrics.jsonl");
  const CliResult r = run_cli("train " + kTiny + " --data " + data() + " --out " + run() + " --resume");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "already finished")) << r.output;
  EXPECT_EQ(read_file(result), before);
  EXPECT_EQ(read_file(fs::path(run()) / "metrics.jsonl"), metrics);
  // Another configuration is still refused.
  expect_user_error("train " + kTiny + " --set train.lr=1e-4 --data " + data() + " --out " + run() + " --resume",
                    {"different configuration", "train.lr"});
}

TEST_F(CliTest, BadOutputDirectoriesArePlainErrors) {
  TempDir runs("attnres_cli_out");
  const std::string file = runs.str("a_file");
  std::ofstream(file) << "x";
  const std::string train = "train " + kTiny + " --data " + data() + " --out ";
  expect_user_error(train + file, {file, "not a directory"});
  expect_user_error(train + file + "/run", {"cannot create the run directory", file + "/run"});
}

// Built with AddressSanitizer (`make sanitize`, `make hardening`), so is the attnres binary beside it.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

TEST_F(CliTest, AllocationFailuresNameTheSize) {
  // ASan reports a failed throwing operator new as a fatal "out of memory" whatever its options,
  // so the std::bad_alloc this test is about never reaches attnres there.
  if (kAddressSanitizer) GTEST_SKIP() << "AddressSanitizer aborts on a failed operator new instead of throwing";
  // About 10^7 x 32 tokens of activations: far beyond any machine's memory, refused at once.
  expect_user_error("eval --checkpoint " + run() + " --data " + data() + " --batch 10000000 --seq 32",
                    {"not enough memory", "10000000 windows (--batch)", "32 tokens (--seq)"});
}

TEST_F(CliTest, SplitsAreCheckedBeforeStepOne) {
  // A window longer than the whole val split (but not the train split): refused before training.
  const auto manifest = nlohmann::json::parse(read_file(fs::path(data()) / "manifest.json"));
  const long long val = manifest["splits"]["val"]["tokens"].get<long long>();
  ASSERT_GT(manifest["splits"]["train"]["tokens"].get<long long>(), 2 * val);
  TempDir runs("attnres_cli_split");
  const std::string seq = std::to_string(val);
  const CliResult r = run_cli("train " + kTiny + " --set train.seq_len=" + seq + " --set train.batch_size=1 --set train.tokens=" +
                              seq + " --set train.eval_tokens=" + std::to_string(val + 1) + " --data " + data() +
                              " --out " + runs.str("run"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "split 'val'")) << r.output;
  EXPECT_TRUE(contains(r.output, "too few for one window")) << r.output;
  EXPECT_FALSE(has_checkpoint(runs.path() / "run"));
}

TEST_F(CliTest, SilentAdjustmentsAreNoticed) {
  TempDir runs("attnres_cli_notice");
  // 1000 tokens: 7 steps of 128; eval_tokens 300: 9 windows of 32.
  const CliResult r = run_cli("train " + kTiny + " --set train.tokens=1000 --set train.eval_tokens=300 --data " +
                              data() + " --out " + runs.str("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "note: train.tokens 1000 is rounded down to whole steps: 7 x 128 = 896")) << r.output;
  EXPECT_TRUE(contains(r.output, "note: train.eval_tokens 300: each evaluation scores 9 windows of 32 = 288"))
      << r.output;
}

TEST_F(CliTest, ExperimentProtocolErrorsComeBeforeTheFirstRun) {
  TempDir runs("attnres_cli_experiment");
  const std::string base = "experiment " + kTiny + " --arms block,rd --data " + data() + " --out ";
  expect_user_error(base + runs.str("a") + " --seeds 1,1", {"seed 1 is listed twice"});
  expect_user_error(base + runs.str("b") + " --seeds -1", {"--seeds: '-1'"});
  expect_user_error(base + runs.str("c") + " --seeds 1 --tokens 0", {"--tokens"});
  expect_user_error(base + runs.str("d") + " --seeds 1 --set model.residual=prenorm", {"model.residual", "--arms"});
  expect_user_error(base + runs.str("e") + " --seeds 1 --set train.seed=9", {"train.seed", "--seeds"});
  // Issue #47: an empty item in a list (it was skipped: `--seeds 1,,2` ran seeds 1 and 2).
  expect_user_error(base + runs.str("f") + " --seeds 1,,2", {"--seeds '1,,2': empty item 2 (a comma too many)"});
  expect_user_error(base + runs.str("g") + " --seeds 1,2,", {"--seeds '1,2,': empty item 3"});
  expect_user_error("experiment " + kTiny + " --arms block,,rd --seeds 1 --data " + data() + " --out " + runs.str("h"),
                    {"--arms 'block,,rd': empty item 2"});
  for (const char* name : {"a", "b", "c", "d", "e", "f", "g", "h"})
    EXPECT_FALSE(fs::exists(runs.path() / name / "runs")) << name;
}

TEST_F(CliTest, ExperimentChecksEverySplitBeforeTheFirstRun) {
  TempDir runs("attnres_cli_nosplit");
  // The synthetic corpus again, with no test documents.
  const CliResult prepared = run_cli("prepare --input " + dir_->str("corpus") +
                                     " --tokenizer bytes --val-fraction 0.2 --test-fraction 0 --quiet --out " +
                                     runs.str("data"));
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  expect_user_error("experiment " + kTiny + " --arms block,rd --seeds 1 --data " + runs.str("data") + " --out " +
                        runs.str("e"),
                    {"split 'test'", "empty"});
  EXPECT_FALSE(fs::exists(runs.path() / "e" / "runs"));
}

TEST(Cli, PrepareWarnsOfEmptyOrShortSplits) {
  TempDir dir("attnres_cli_one_file");
  const std::string text = dir.str("one.txt");
  // Shorter than one piece (kMinPieceBytes): a lone text is cut into pieces for the split
  // (CliSafety.ASmallSingleTextGetsEverySplit), but this one is a single piece.
  std::ofstream(text) << "one short document of the depth attention.";
  const CliResult r = run_cli("prepare --input " + text + " --tokenizer bytes --quiet --out " + dir.str("data"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // One document lands in one split; the other two are empty and named.
  int warned = 0;
  for (const char* split : {"'train' holds 0", "'val' holds 0", "'test' holds 0"}) warned += contains(r.output, split);
  EXPECT_EQ(warned, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "train and experiment will refuse it")) << r.output;
}

TEST(Cli, OneLongTextFileGivesEverySplit) {
  // One text file over 256 KiB (one document): cut into pieces for the split, so the default 1%
  // fractions give non-empty val and test splits, the same on every run, and a model trains on it.
  TempDir dir("attnres_cli_one_long_file");
  const std::string text = dir.str("one.txt");
  {
    std::ofstream out(text);
    attnres::Rng rng(7);
    const char* words[] = {"depth", "attention", "residual", "block", "query", "value", "key", "layer"};
    for (int w = 0; w < 60000; ++w) out << words[rng.below(8)] << (w % 10 == 9 ? ".\n" : " ");
  }
  ASSERT_GT(fs::file_size(text), 256u << 10);
  const CliResult r = run_cli("prepare --input " + text + " --tokenizer bytes --quiet --out " + dir.str("data"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "warning")) << r.output;
  const auto manifest = nlohmann::json::parse(read_file(dir.path() / "data" / "manifest.json"));
  for (const char* split : {"train", "val", "test"})
    EXPECT_GE(manifest["splits"][split]["tokens"].get<long long>(), 1024) << split << "\n" << manifest.dump(1);
  EXPECT_EQ(manifest["split"]["cut_documents"], 1);
  ASSERT_EQ(run_cli("prepare --input " + text + " --tokenizer bytes --quiet --out " + dir.str("again")).exit_code, 0);
  EXPECT_EQ(read_file(dir.path() / "again" / "manifest.json"), read_file(dir.path() / "data" / "manifest.json"));
  const CliResult trained = run_cli("train " + kTiny + " --data " + dir.str("data") + " --out " + dir.str("run"));
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  const CliResult test = run_cli("eval --checkpoint " + dir.str("run") + " --data " + dir.str("data") + " --split test");
  EXPECT_EQ(test.exit_code, 0) << test.output;
}

TEST_F(CliTest, EvalShowsProgressOnLongTexts) {
  const std::string text = dir_->str("longer.txt");
  {
    std::ofstream out(text);  // 2400 bytes: 75 windows of 32 bytes-tokens
    for (int i = 0; i < 40; ++i) out << "the depth attention of the residual block routes the value. ";
  }
  const CliResult r = run_cli("eval --checkpoint " + run() + " --text " + text + " --seq 32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "eval: " + text + ": 2400 of 2400 tokens (100%)")) << r.output;
  EXPECT_TRUE(contains(r.output, "tokens/s, nll so far ")) << r.output;
  // --quiet, or a short text (here cut by --max-tokens): the result only.
  for (const std::string& extra : {std::string(" --quiet"), std::string(" --max-tokens 100")}) {
    const CliResult q = run_cli("eval --checkpoint " + run() + " --text " + text + " --seq 32" + extra);
    EXPECT_EQ(q.exit_code, 0) << q.output;
    EXPECT_FALSE(contains(q.output, "eval: ")) << extra << "\n" << q.output;
  }
}

TEST(Cli, FailedPrepareLeavesNoOutputBehind) {
  TempDir dir("attnres_cli_failed_prepare");
  const std::string bad = dir.str("bad.jsonl");
  std::ofstream(bad) << "{\"text\": \"a fine first document\"}\n{\"text\": broken\n";
  // A directory prepare creates (with a parent) is removed again, with or without a tokenizer to train.
  for (const std::string& tokenizer : {std::string(" --tokenizer bytes"), std::string(" --vocab-size 300")}) {
    expect_user_error("prepare --input " + bad + tokenizer + " --quiet --out " + dir.str("new/data"),
                      {bad + ":2", "malformed JSON"});
    EXPECT_FALSE(fs::exists(dir.path() / "new")) << tokenizer;
  }
  // An existing directory is kept with what was there before, and nothing of this run.
  fs::create_directories(dir.path() / "mine");
  std::ofstream(dir.path() / "mine" / "notes.txt") << "keep me";
  expect_user_error("prepare --input " + bad + " --quiet --out " + dir.str("mine"), {bad + ":2"});
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path() / "mine")) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"notes.txt"});
}

TEST(Cli, ConfigFileErrorsGiveFileAndLine) {
  TempDir dir("attnres_cli_toml");
  const std::string file = dir.str("c.toml");
  std::ofstream(file) << "[model]\nd_model = 64\n\n[train]\nbatch_size = -3\n";
  // A value out of its range, as a wrong type is, is named with the file and line.
  expect_user_error("config --config " + file, {file + ":5: train.batch_size must be at least 1 (got -3)"});
  std::ofstream(file) << "[model]\nd_model = 64\n\n[train]\nbatch_size = 2.5\n";
  expect_user_error("config --config " + file, {file + ":5: 'train.batch_size' must be an integer"});
  std::ofstream(file) << "[train]\nlr = \"fast\"\n";
  expect_user_error("config --config " + file, {file + ":2: 'train.lr' must be a number"});
  expect_user_error("config --preset tiny --set train.batch_size=0",
                    {"--set train.batch_size=0: train.batch_size must be at least 1 (got 0)"});
}

TEST_F(CliTest, TokenizersAreMatchedByContent) {
  TempDir dir("attnres_cli_tokenizers");
  const std::string corpus = dir_->str("corpus");
  // A prepared directory holding its own tokenizer (prepare trains it), then moved: still usable.
  ASSERT_EQ(run_cli("prepare --input " + corpus + " --vocab-size 300 --val-fraction 0.15 --test-fraction 0.15 "
                    "--quiet --out " + dir.str("data")).exit_code, 0);
  const auto manifest = nlohmann::json::parse(read_file(dir.path() / "data" / "manifest.json"));
  EXPECT_EQ(manifest["tokenizer"]["spec"], "sp:tokenizer.model");
  EXPECT_EQ(manifest["tokenizer"]["hash_algorithm"], "xxh3-64");
  const std::string hash = manifest["tokenizer"]["hash"].get<std::string>();
  const CliResult info = run_cli("tokenizer info --tokenizer sp:" + dir.str("data/tokenizer.model"));
  EXPECT_TRUE(contains(info.output, "hash: " + hash)) << info.output;
  const CliResult trained = run_cli("train " + kTiny + " --data " + dir.str("data") + " --out " + dir.str("run"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  fs::rename(dir.path() / "data", dir.path() / "moved");
  const CliResult moved = run_cli("eval --checkpoint " + dir.str("run") + " --data " + dir.str("moved"));
  EXPECT_EQ(moved.exit_code, 0) << moved.output;

  // The checkpoint names its tokenizer (now moved): a byte-identical copy anywhere is accepted.
  const std::string text = dir_->str("doc.txt");
  std::ofstream(text) << "the depth attention of the residual block. the query and the key.\n";
  const std::string eval = "eval --checkpoint " + dir.str("run") + " --text " + text;
  expect_user_error(eval, {"tokenizer.model", hash, "pass --tokenizer"});
  fs::create_directories(dir.path() / "copy");
  fs::copy_file(dir.path() / "moved" / "tokenizer.model", dir.path() / "copy" / "tok.model");
  EXPECT_EQ(run_cli(eval + " --tokenizer sp:" + dir.str("copy/tok.model")).exit_code, 0);
  EXPECT_EQ(run_cli("sample --checkpoint " + dir.str("run") + " --prompt the --max-tokens 3 --tokenizer sp:" +
                    dir.str("copy/tok.model")).exit_code, 0);

  // A tokenizer retrained at the same path is refused, naming both hashes.
  ASSERT_EQ(run_cli("tokenizer train --input " + corpus + " --vocab-size 320 --quiet --out " +
                    dir.str("moved/tokenizer.model")).exit_code, 0);
  const CliResult other = run_cli("tokenizer info --tokenizer sp:" + dir.str("moved/tokenizer.model"));
  const std::size_t at = other.output.find("hash: ");
  ASSERT_NE(at, std::string::npos) << other.output;
  const std::string other_hash = other.output.substr(at + 6, 16);
  ASSERT_NE(other_hash, hash);
  expect_user_error(eval + " --tokenizer sp:" + dir.str("moved/tokenizer.model"), {hash, other_hash});
  expect_user_error("eval --checkpoint " + dir.str("run") + " --data " + dir.str("moved"), {hash, other_hash});
}

// Data prepared with another tokenizer is named as that, both hashes given, before its vocabulary
// (of another size here) could be blamed: by eval (weights or a checkpoint) and by train --resume.
TEST_F(CliTest, TokenizerMismatchIsNamedBeforeTheVocabulary) {
  TempDir dir("attnres_cli_tokenizer_mismatch");
  ASSERT_EQ(run_cli("prepare --input " + dir_->str("corpus") + " --vocab-size 300 --val-fraction 0.15 "
                    "--test-fraction 0.15 --quiet --out " + dir.str("sp")).exit_code, 0);
  const std::string sp_hash =
      nlohmann::json::parse(read_file(dir.path() / "sp" / "manifest.json"))["tokenizer"]["hash"].get<std::string>();
  const CliResult bytes = run_cli("tokenizer info --tokenizer bytes");
  const std::size_t at = bytes.output.find("hash: ");
  ASSERT_NE(at, std::string::npos) << bytes.output;
  const std::string bytes_hash = bytes.output.substr(at + 6, 16);
  for (const std::string& weights : {run(), newest_checkpoint(run()).string()}) {
    const CliResult r = run_cli("eval --checkpoint " + weights + " --data " + dir.str("sp"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    for (const std::string& part : {"was trained with a tokenizer of hash " + bytes_hash + " (bytes)",
                                    "was prepared with one of hash " + sp_hash})
      EXPECT_TRUE(contains(r.output, part)) << weights << "\nwanted: " << part << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, "vocabulary")) << r.output;
  }
  // A stopped run resumed on the other data: the tokenizer, not model.vocab_size (257 vs 300).
  ASSERT_EQ(run_cli("train " + kTiny + " --data " + data() + " --out " + dir.str("run") + " --stop-at-step 4")
                .exit_code,
            0);
  const CliResult r = run_cli("train " + kTiny + " --data " + dir.str("sp") + " --out " + dir.str("run") + " --resume");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "checkpoint-000004.safetensors' was trained with a tokenizer of hash " + bytes_hash))
      << r.output;
  EXPECT_TRUE(contains(r.output, dir.str("sp") + "' was prepared with one of hash " + sp_hash)) << r.output;
  EXPECT_FALSE(contains(r.output, "vocab_size")) << r.output;
}

// info names what the weights were trained with and how far: the tokenizer (with its content
// hash) and the step, for every form of --checkpoint; "(not recorded)" when the file lacks them.
TEST_F(CliTest, InfoShowsTheTokenizerAndStep) {
  const CliResult bytes = run_cli("tokenizer info --tokenizer bytes");
  const std::size_t at = bytes.output.find("hash: ");
  ASSERT_NE(at, std::string::npos) << bytes.output;
  const std::string tokenizer_line = "\ntokenizer: bytes (content hash " + bytes.output.substr(at + 6, 16) + ")\n";
  const std::vector<attnres::CheckpointFile> kept = attnres::list_checkpoints(run());
  ASSERT_EQ(kept.size(), 2u);
  for (const auto& [form, step] : {std::pair{run(), 8}, std::pair{kept[0].path, 8}, std::pair{kept[1].path, 4}}) {
    const CliResult r = run_cli("info " + form);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, tokenizer_line)) << form << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "\nstep: " + std::to_string(step) + "\n")) << form << "\n" << r.output;
  }
  // Weights without either (as another tool may write them).
  TempDir dir("attnres_cli_info");
  attnres::SafetensorsFile file = attnres::read_safetensors(run() + "/model.safetensors");
  std::vector<attnres::TensorRef> refs;
  for (const auto& [name, t] : file.tensors) refs.push_back({name, t.dtype, t.shape, t.bytes.data()});
  attnres::write_safetensors(dir.str("bare.safetensors"), {{"config", file.metadata.at("config")}}, refs);
  const CliResult bare = run_cli("info " + dir.str("bare.safetensors"));
  EXPECT_EQ(bare.exit_code, 0) << bare.output;
  EXPECT_TRUE(contains(bare.output, "\ntokenizer: (not recorded)\nstep: (not recorded)\n")) << bare.output;
}

TEST_F(CliTest, ExperimentMismatchNamesTheKey) {
  TempDir runs("attnres_cli_exp_mismatch");
  const std::string base = "experiment " + kTiny + " --arms block,rd --seeds 1 --data " + data() + " --out " +
                           runs.str("e");
  ASSERT_EQ(run_cli(base + " --set train.warmup_fraction=0.1").exit_code, 0);
  expect_user_error(base + " --set train.warmup_fraction=0.2",
                    {"differs in train.warmup_fraction = 0.1 (experiment.json) vs 0.2 (requested)"});
}

TEST_F(CliTest, ExperimentRecordsDenseFormerConnections) {
  TempDir runs("attnres_cli_exp_dwa");
  const std::string out = runs.str("e");
  const CliResult r =
      run_cli("experiment " + kTiny + " --arms prenorm,denseformer --seeds 1 --data " + data() + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(out + "/runs/denseformer/seed-1/result.json");
  const nlohmann::json result = nlohmann::json::parse(in);
  ASSERT_TRUE(result.contains("connections")) << result.dump(1);
  const nlohmann::json& dwa = result["connections"][0];
  EXPECT_EQ(dwa["name"], "dwa");
  const int layers = 2;  // kTinyModel's n_layers
  ASSERT_EQ(static_cast<int>(dwa["rows"].size()), layers);  // 1 x 1: a DWA after every block
  for (int i = 0; i < layers; ++i) {
    EXPECT_EQ(dwa["rows"][i]["target"], i + 1);
    EXPECT_EQ(dwa["rows"][i]["sources"].size(), static_cast<std::size_t>(i + 2));  // X_0 .. X_{i+1}
  }
  std::ifstream prenorm(out + "/runs/prenorm/seed-1/result.json");
  EXPECT_FALSE(nlohmann::json::parse(prenorm).contains("connections"));
  ASSERT_EQ(run_cli("report --experiment " + out).exit_code, 0);
  std::ifstream md(out + "/report.md");
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "Depth connections: denseformer 'dwa'")) << text;
}

// MUDD's connections: the token-mean mixing weights of every DA, per way (experiment/diagnostics.hpp).
TEST_F(CliTest, ExperimentRecordsMuddConnections) {
  TempDir runs("attnres_cli_exp_mudd");
  const std::string out = runs.str("e");
  const CliResult r = run_cli("experiment " + kTiny + " --arms prenorm,mudd --seeds 1 --data " + data() + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(out + "/runs/mudd/seed-1/result.json");
  const nlohmann::json result = nlohmann::json::parse(in);
  ASSERT_TRUE(result.contains("connections")) << result.dump(1);
  const nlohmann::json& c = result["connections"];
  ASSERT_EQ(c.size(), 4u);
  const int layers = 2;  // kTinyModel's n_layers: one 4-way DA, then the last (R alone)
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(c[w]["name"], std::string("mudd.") + "qkvr"[w]);
    ASSERT_EQ(static_cast<int>(c[w]["rows"].size()), w == 3 ? layers : layers - 1);
    EXPECT_EQ(c[w]["rows"][0]["sources"].size(), 2u);  // X_0, X_1
  }
  EXPECT_EQ(c[3]["rows"][1]["target"], layers);  // the last DA feeds the final norm
  // Its routing diagnostic (baselines-spec §6.5): per block, the Q, K and V ways' distributions
  // and the per-token JS of Q~V and K~V; block 0 reads the embedding alone.
  ASSERT_TRUE(result.contains("routing")) << result.dump(1);
  const nlohmann::json& routing = result["routing"]["layers"];
  ASSERT_EQ(static_cast<int>(routing.size()), layers);
  EXPECT_EQ(routing[0]["sources"], 1);
  EXPECT_EQ(routing[0]["js_k_nats"], 0.0);
  EXPECT_EQ(routing[1]["sources"], 2);
  for (const char* key : {"qk_mean", "k_mean", "v_mean"}) EXPECT_EQ(routing[1][key].size(), 2u) << key;
  EXPECT_GE(routing[1]["js_nats"].get<double>(), 0.0);
  EXPECT_GE(routing[1]["js_k_nats"].get<double>(), 0.0);
  ASSERT_EQ(run_cli("report --experiment " + out).exit_code, 0);
  std::ifstream md(out + "/report.md");
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "Depth connections: mudd 'mudd.v'")) << text;
  EXPECT_TRUE(contains(text, "| mudd | K ~ V | 1 |")) << text;
  EXPECT_TRUE(contains(text, "p_c(j) = |dw[c,j]|·‖X_j‖")) << text;
  std::ifstream summary(out + "/summary.json");
  const nlohmann::json s = nlohmann::json::parse(summary);
  ASSERT_EQ(s["routing"].size(), 1u);  // prenorm has none
  EXPECT_EQ(s["routing"][0]["k_route"], true);
  EXPECT_EQ(s["routing"][0]["js_k_mean_all_layers"]["layers"], layers);
}

// HC's and mHC's diagnostics: the unfolded connections (per token for dynamic HC and mHC, from the
// weights for static HC) and the Amax gains of the stream mixing (experiment/diagnostics.hpp).
TEST_F(CliTest, ExperimentRecordsStreamDiagnostics) {
  TempDir runs("attnres_cli_exp_streams");
  const std::string out = runs.str("e");
  const CliResult r =
      run_cli("experiment " + kTiny + " --arms hc,hc-static,mhc --seeds 1 --data " + data() + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int sublayers = 4;  // kTinyModel's 2 layers
  for (const std::string arm : {"hc", "hc-static", "mhc"}) {
    SCOPED_TRACE(arm);
    std::ifstream in(out + "/runs/" + arm + "/seed-1/result.json");
    const nlohmann::json result = nlohmann::json::parse(in);
    ASSERT_TRUE(result.contains("connections")) << result.dump(1);
    const nlohmann::json& c = result["connections"];
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0]["name"], arm == "mhc" ? "mhc" : "hc");
    ASSERT_EQ(static_cast<int>(c[0]["rows"].size()), sublayers + 1);  // every sublayer and the readout
    EXPECT_EQ(c[0]["rows"][sublayers]["sources"].size(), static_cast<std::size_t>(sublayers + 1));
    ASSERT_TRUE(result.contains("amax_gain")) << result.dump(1);
    const nlohmann::json& g = result["amax_gain"];
    EXPECT_EQ(g.size(), 6u);
    EXPECT_GE(g["composite_forward_max"].get<double>(), g["composite_forward_mean"].get<double>());
    EXPECT_GE(g["composite_backward_max"].get<double>(), g["composite_backward_mean"].get<double>());
    if (arm == "mhc") {  // Sinkhorn col -> row: every row sum is 1
      EXPECT_NEAR(g["composite_forward_max"].get<double>(), 1.0, 1e-5);
      EXPECT_NEAR(g["layer_forward_max"].get<double>(), 1.0, 1e-5);
    }
  }
  ASSERT_EQ(run_cli("report --experiment " + out).exit_code, 0);
  std::ifstream md(out + "/report.md");
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "Depth connections: hc 'hc'")) << text;
  EXPECT_TRUE(contains(text, "Depth connections: mhc 'mhc'")) << text;
  EXPECT_TRUE(contains(text, "### Amax gain: hc-static (1 seed)")) << text;
  EXPECT_TRUE(contains(text, "### Amax gain: mhc (1 seed)")) << text;
  std::ifstream summary(out + "/summary.json");
  const nlohmann::json j = nlohmann::json::parse(summary);
  ASSERT_EQ(j["amax_gain"].size(), 3u);
  EXPECT_EQ(j["amax_gain"][2]["arm"], "mhc");
}

// Delta AttnRes (docs/delta-gated-spec.md §1.8): the attention reads' routing and the
// routing-collapse statistic in result.json, the summary and the report.
TEST_F(CliTest, ExperimentRecordsDeltaRouting) {
  TempDir runs("attnres_cli_exp_delta");
  const std::string out = runs.str("e");
  const CliResult r = run_cli("experiment " + kTiny + " --arms delta,delta-block --seeds 1 --data " + data() +
                              " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string arm : {"delta", "delta-block"}) {
    SCOPED_TRACE(arm);
    std::ifstream in(out + "/runs/" + arm + "/seed-1/result.json");
    const nlohmann::json result = nlohmann::json::parse(in);
    ASSERT_TRUE(result.contains("routing")) << result.dump(1);
    EXPECT_EQ(result["routing"]["layers"].size(), 1u);  // layer 0's attention read has no sources
    ASSERT_TRUE(result.contains("routing_max_weight")) << result.dump(1);
    const double w = result["routing_max_weight"].get<double>();
    EXPECT_GT(w, 0.0);
    EXPECT_LE(w, 1.0);
  }
  ASSERT_EQ(run_cli("report --experiment " + out).exit_code, 0);
  std::ifstream md(out + "/report.md");
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "delta-block: routing_max_weight ")) << text;
}

// Keys of another mode are refused before any work, naming the key and the mode.
TEST_F(CliTest, DeltaKeysOutsideTheirModesAreRefused) {
  TempDir runs("attnres_cli_delta_keys");
  expect_user_error("train " + kTiny + " --data " + data() + " --out " + runs.str("r") +
                        " --set model.residual=block --set model.delta_gate=sigmoid_scalar",
                    {"'delta_gate'", "'block'"});
  EXPECT_FALSE(fs::exists(runs.str("r") + "/model.safetensors"));
}

TEST(Cli, TokenizerTrainingSpeaksAttnresTerms) {
  TempDir dir("attnres_cli_sp");
  {
    // More distinct characters (CJK) than a 300-piece vocabulary can hold.
    std::ofstream out(dir.path() / "wide.txt");
    for (int line = 0; line < 50; ++line) {
      for (char32_t c = 0x4E00 + 20 * char32_t(line); c < 0x4E00 + 20 * char32_t(line) + 20; ++c) {
        out << static_cast<char>(0xE0 | (c >> 12)) << static_cast<char>(0x80 | ((c >> 6) & 0x3F))
            << static_cast<char>(0x80 | (c & 0x3F));
      }
      out << "\n";
    }
  }
  const CliResult r = run_cli("tokenizer train --input " + dir.str("wide.txt") +
                              " --val-fraction 0 --test-fraction 0 --vocab-size 300 --out " + dir.str("tok.model"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--vocab-size 300 is too small for this text")) << r.output;
  EXPECT_FALSE(contains(r.output, "character_coverage")) << r.output;
  EXPECT_FALSE(contains(r.output, ".cc(")) << "SentencePiece's own log lines:\n" << r.output;
  // A successful run: only attnres' lines, and one document count.
  {
    std::ofstream out(dir.path() / "plain.txt");
    for (int line = 0; line < 400; ++line) out << "the depth attention of residual block " << line << "\n";
  }
  const CliResult ok = run_cli("tokenizer train --input " + dir.str("plain.txt") +
                               " --val-fraction 0 --test-fraction 0 --vocab-size 300 --out " + dir.str("tok.model"));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  std::istringstream lines(ok.output);
  for (std::string line; std::getline(lines, line);) EXPECT_EQ(line.rfind("tokenizer train: ", 0), 0u) << line;
  EXPECT_TRUE(contains(ok.output, " of 400 lines from 1 training document\n")) << ok.output;  // the noun agrees (#47)
}

// `attnres report --pool DIR... --answer ARM` (issue #46): the table, the pooled line and the
// futility statement on the terminal, pool.json / pool.md / pool.html with --out, errors naming the
// directory, and the help text.
TEST(Cli, ReportPoolsStudies) {
  using attnres::experiment::testing::PoolStudyDesign;
  using attnres::experiment::testing::write_pool_study;
  TempDir dir("attnres_cli_pool");
  const PoolStudyDesign probe{{0.01, 0.03, 0.02}, 64, 2, 0.004, 3000};
  write_pool_study(dir.path() / "a", {{-0.01, -0.03, -0.02}}, &probe);
  write_pool_study(dir.path() / "b", {{0.02, 0.04, 0.03, 0.05}, 128, 4, 0.003, 4000}, nullptr, true);
  const std::string a = dir.str("a"), b = dir.str("b"), out = dir.str("out");
  const CliResult r = run_cli("report --pool " + a + " " + b + " --answer rd --effect 0.05 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"rd − block: every design's paired ΔNLL", "depth-2 (probe)", "0.004", "not recorded",
                           "rd − block over 3 designs from 2 studies: pooled ΔNLL", "Futility: ", "0.050 nats"})
    EXPECT_TRUE(contains(r.output, part)) << part << "\n" << r.output;
  for (const char* f : {"pool.json", "pool.md", "pool.html"}) EXPECT_TRUE(fs::exists(fs::path(out) / f)) << f;
  const nlohmann::json pool = nlohmann::json::parse(read_file(fs::path(out) / "pool.json"));
  EXPECT_EQ(pool["designs"].size(), 3u);
  EXPECT_EQ(pool["pooled"]["k"], 3);
  EXPECT_EQ(pool["effect"], 0.05);
  EXPECT_TRUE(contains(read_file(fs::path(out) / "pool.html"), "<polygon"));
  // Nothing is written without --out, and the experiment directories are only read.
  const CliResult one = run_cli("report --pool " + b + " --answer rd");
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_TRUE(contains(one.output, "k = 1, not a meta-analysis")) << one.output;
  EXPECT_EQ(run_cli("report --pool " + b + " --answer rd --quiet").output, "");
  for (const std::string& d : {a, b})
    for (const char* f : {"pool.json", "summary.json", "report.md"}) EXPECT_FALSE(fs::exists(fs::path(d) / f)) << d << f;
  // Errors name the directory.
  expect_user_error("report --pool " + a + " " + b + " --answer mudd", {a + ": no arm 'mudd'"});
  expect_user_error("report --pool " + a + " --answer rd --baseline hc",
                    {a + ": arm 'rd' is never compared with the baseline 'hc'"});
  expect_user_error("report --pool " + a, {"--pool needs --answer ARM"});
  expect_user_error("report --pool " + a + " --experiment " + a + " --answer rd", {"--experiment", "--pool"});
  expect_user_error("report --answer rd", {"report needs --experiment DIR"});
  const CliResult help = run_cli("report --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(contains(help.output, "--pool")) << help.output;
  EXPECT_TRUE(contains(help.output, "Hartung-Knapp")) << help.output;
}
