// SIGINT and SIGTERM while a checkpoint is being written: the first signal lets the write finish
// and stops cleanly after it (exit 128 + signal: interrupted, resumable); a second one ends the
// process at once (exit 128 + signal) with the previous checkpoint whole. Either way --resume ends with the weights of an undisturbed run.
#include "reliability/reliability_util.hpp"
#include "util/rng.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

std::string train(const fs::path& run) { return TinyRun::get().train(run); }
fs::path reference() { return TinyRun::get().run / "model.safetensors"; }

}  // namespace

TEST(Signals, OneSignalDuringACheckpointWriteFinishesItAndStops) {
  for (const auto& [sig, code] : {std::pair{std::string("SIGINT"), 130}, std::pair{std::string("SIGTERM"), 143}}) {
    TempDir runs("attnres_one_signal");
    const fs::path run = runs.path() / "run";
    // Raised from inside the first write to the second checkpoint (step 4).
    const CliResult r =
        run_cli_with(fault_env("op=write,path=checkpoint-,nth=2,signal=" + sig + ",count=1"), train(run));
    EXPECT_EQ(r.exit_code, code) << r.output;
    EXPECT_NE(r.output.find("stopped at step 4"), std::string::npos) << r.output;
    EXPECT_EQ(checkpoint_step(run), 4);
    EXPECT_EQ(hidden_files(run), std::vector<std::string>{});
    const CliResult resumed = run_cli(train(run) + " --resume");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    expect_same_weights(reference(), run / "model.safetensors");
    EXPECT_EQ(metrics_without_timing(reference().parent_path() / "metrics.jsonl"),
              metrics_without_timing(run / "metrics.jsonl"));
  }
}

TEST(Signals, ASecondSignalEndsTheProcessAtOnceAndKeepsThePreviousCheckpoint) {
  for (const auto& [sig, code] : {std::pair{std::string("SIGINT"), 130}, std::pair{std::string("SIGTERM"), 143}}) {
    TempDir runs("attnres_two_signals");
    const fs::path run = runs.path() / "run";
    const CliResult r =
        run_cli_with(fault_env("op=write,path=checkpoint-,nth=2,signal=" + sig + ",count=2"), train(run));
    EXPECT_EQ(r.exit_code, code) << r.output;
    EXPECT_NE(r.output.find("second signal"), std::string::npos) << r.output;
    EXPECT_EQ(checkpoint_step(run), 2);  // the write of step 4 never replaced it
    const CliResult resumed = run_cli(train(run) + " --resume");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_EQ(hidden_files(run), std::vector<std::string>{}) << "the killed write's temporary was not cleaned up";
    expect_same_weights(reference(), run / "model.safetensors");
    EXPECT_EQ(metrics_without_timing(reference().parent_path() / "metrics.jsonl"),
              metrics_without_timing(run / "metrics.jsonl"));
  }
}

// The last checkpoint is durable but the weights file after it is not: a second signal while
// model.safetensors of the final step is written. --resume finds nothing left to train, and must
// still leave the final weights, not those of the checkpoint before (and no temporary).
TEST(Signals, ASecondSignalWhileTheFinalWeightsAreWrittenStillEndsWithThem) {
  TempDir runs("attnres_final_weights");
  const fs::path run = runs.path() / "run";
  // kTinyRun: 8 steps, a checkpoint (and model.safetensors after it) every 2: the 4th is the last.
  const CliResult r =
      run_cli_with(fault_env("op=write,path=model.safetensors,nth=4,signal=SIGINT,count=2"), train(run));
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_NE(r.output.find("second signal"), std::string::npos) << r.output;
  EXPECT_EQ(checkpoint_step(run), 8);
  EXPECT_FALSE(fs::exists(run / "train_result.json"));
  const CliResult resumed = run_cli(train(run) + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(fs::exists(run / "train_result.json"));
  EXPECT_EQ(hidden_files(run), std::vector<std::string>{});
  expect_same_weights(reference(), run / "model.safetensors");
  EXPECT_EQ(metrics_without_timing(reference().parent_path() / "metrics.jsonl"),
            metrics_without_timing(run / "metrics.jsonl"));
}

// Signals from outside at random moments, while slowed-down checkpoint writes take most of the
// time: after every interruption the files verify, a second signal ends the process within a
// second, and the run resumed to the end matches the undisturbed one.
TEST(Signals, RepeatedSignalsDuringWritesNeverLeaveAPartialCheckpoint) {
  TempDir runs("attnres_signal_storm");
  const fs::path run = runs.path() / "run";
  const std::string log = runs.str("log.txt");
  // 32 steps, a checkpoint after each.
  const std::string every_step = " --set train.tokens=4096 --set train.checkpoint_every=1";
  const CliResult undisturbed = run_cli(train(runs.path() / "reference") + every_step);
  ASSERT_EQ(undisturbed.exit_code, 0) << undisturbed.output;
  const std::vector<std::string> slow = {"ATTNRES_FAULT=op=write,path=checkpoint-,nth=0,delay_ms=10",
                                         std::string("LD_PRELOAD=") + ATTNRES_FAULT_SHIM,
                                         "ASAN_OPTIONS=verify_asan_link_order=0"};
  Rng rng(7);
  int interruptions = 0, clean_stops = 0, second_signal_exits = 0;
  for (int attempt = 0; attempt < 40 && !fs::exists(run / "train_result.json"); ++attempt) {
    const bool resume = has_checkpoint(run);
    const std::uintmax_t logged = fs::exists(log) ? fs::file_size(log) : 0;
    Process p(train(run) + every_step + (resume ? " --resume" : ""), slow, log);
    ASSERT_TRUE(p.started());
    // On a loaded machine a process can take longer to start than the pause below: wait for its
    // first line (its signal handlers are installed by then), then signal at a random moment.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline && (!fs::exists(log) || fs::file_size(log) == logged))
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng.below(400)));
    p.signal(attempt % 2 == 0 ? SIGINT : SIGTERM);
    int code = -1;
    if (rng.below(2) == 0) {  // a second signal: must end the process promptly
      std::this_thread::sleep_for(std::chrono::milliseconds(1 + rng.below(20)));
      p.signal(SIGINT);
      code = p.wait_for(std::chrono::milliseconds(1000));
      EXPECT_NE(code, -1) << "the process ignored a second signal for a second";
      if (code == -1) code = p.wait();
    } else {
      code = p.wait();
    }
    // 130/143: a clean stop, a second signal, or a signal before the handlers were installed;
    // 0: the run had finished. Which of them it was is counted from the log below.
    EXPECT_TRUE(code == 0 || code == 130 || code == 143) << code;
    ++interruptions;
    if (has_checkpoint(run)) {  // every kept checkpoint whole and verified, not only the newest
      for (const CheckpointFile& c : list_checkpoints(run.string()))
        EXPECT_TRUE(read_safetensors(c.path).checksummed) << c.path;
      // K = 2, and one more when the process ended between a checkpoint and the pruning after it.
      EXPECT_LE(list_checkpoints(run.string()).size(), 3u);
      EXPECT_TRUE(read_safetensors((run / "model.safetensors").string()).checksummed);
    }
  }
  const std::string output = read_file(log);
  for (std::size_t at = 0; (at = output.find("; checkpoint saved; continue with --resume", at)) != std::string::npos; ++at)
    ++clean_stops;
  for (std::size_t at = 0; (at = output.find("second signal: stopping now", at)) != std::string::npos; ++at)
    ++second_signal_exits;
  std::printf("%d interruptions: %d clean stops, %d exits on a second signal (or before the handlers)\n",
              interruptions, clean_stops, second_signal_exits);
  EXPECT_GE(clean_stops, 1);
  EXPECT_GE(second_signal_exits, 1);
  const bool resume = has_checkpoint(run);
  const CliResult last = run_cli(train(run) + every_step + (resume ? " --resume" : ""));
  ASSERT_TRUE(last.exit_code == 0 || fs::exists(run / "train_result.json")) << last.output << read_file(log);
  EXPECT_EQ(hidden_files(run), std::vector<std::string>{});
  expect_same_weights(runs.path() / "reference" / "model.safetensors", run / "model.safetensors");
  EXPECT_EQ(metrics_without_timing(runs.path() / "reference" / "metrics.jsonl"),
            metrics_without_timing(run / "metrics.jsonl"));
}
