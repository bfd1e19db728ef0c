// Shared by the reliability tests: a tiny training run, the fault shim (fault_shim.c) in front
// of the attnres executable, and checks that a run directory holds whole, verified files.
#pragma once

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_util.hpp"
#include "model/safetensors.hpp"

extern char** environ;

namespace attnres::testing {

// 8 steps of 4 x 32 tokens, a checkpoint every 2.
inline const std::string kTinyRun =
    "--preset tiny --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.mlp_hidden=64 "
    "--set model.n_blocks=2 --set train.seq_len=32 --set train.batch_size=4 --set train.tokens=1024 "
    "--set train.eval_tokens=256 --set train.checkpoint_every=2 --set train.threads=1 --set model.residual=rd";

// Synthetic data (tests/common/cli_util.hpp) and one undisturbed run of kTinyRun on it, made
// once per test binary and shared by the tests that compare against it.
class TinyRun {
 public:
  static const TinyRun& get() {
    static const TinyRun r;
    return r;
  }
  std::string corpus() const { return dir_.str("corpus"); }
  std::string train(const std::filesystem::path& out) const {
    return "train " + kTinyRun + " --data " + data + " --out " + out.string();
  }

 private:
  TinyRun() : data(prepare_synthetic_data(dir_.path())), run(dir_.path() / "reference") {
    const CliResult r = run_cli(train(run));
    if (r.exit_code != 0) throw std::runtime_error("the reference run failed:\n" + r.output);
  }
  TempDir dir_{"attnres_reliability"};  // first: the members below live in it

 public:
  const std::string data;              // the prepared data directory
  const std::filesystem::path run;     // the undisturbed run directory
};

// Environment assignments that put the fault shim in front of a command. ASan insists on being
// the first library loaded; the shim holds no instrumented code, so that check is switched off.
inline std::string fault_env(const std::string& rule) {
  return "ATTNRES_FAULT='" + rule + "' LD_PRELOAD=" + ATTNRES_FAULT_SHIM +
         " ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0\" ";
}

inline CliResult run_cli_with(const std::string& env, const std::string& args) {
  return run_shell(env + ATTNRES_BINARY + " " + args);
}

// Files whose name starts with '.' (the writers' temporaries) directly in `dir`.
inline std::vector<std::string> hidden_files(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().starts_with(".")) out.push_back(e.path().filename().string());
  return out;
}

// The step the newest checkpoint of a run was written at; fails the test if it does not verify.
inline std::int64_t checkpoint_step(const std::filesystem::path& run) {
  const std::string path = newest_checkpoint(run).string();
  const SafetensorsFile f = read_safetensors(path);
  EXPECT_TRUE(f.checksummed) << path;
  return nlohmann::json::parse(f.metadata.at("state")).at("step").get<std::int64_t>();
}

// Both weights files hold the same tensors, bit for bit.
inline void expect_same_weights(const std::filesystem::path& a, const std::filesystem::path& b) {
  const SafetensorsFile x = read_safetensors(a.string());
  const SafetensorsFile y = read_safetensors(b.string());
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (const auto& [name, t] : x.tensors) EXPECT_EQ(t.bytes, y.tensors.at(name).bytes) << a << " vs " << b << ": " << name;
}

// metrics.jsonl without its timings: what must be identical between a resumed and an
// undisturbed run (losses, learning rates, gradient norms, validation NLLs, one line per step).
inline std::vector<nlohmann::json> metrics_without_timing(const std::filesystem::path& metrics) {
  std::vector<nlohmann::json> out;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    j.erase("tokens_per_sec");
    out.push_back(std::move(j));
  }
  return out;
}

// A started attnres process (stdout and stderr to `log`), for tests that signal it.
class Process {
 public:
  Process(const std::string& args, const std::vector<std::string>& env, const std::string& log) {
    std::vector<std::string> argv_s = {ATTNRES_BINARY};
    std::istringstream in(args);
    for (std::string a; in >> a;) argv_s.push_back(a);
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s(env);
    for (char** e = environ; *e != nullptr; ++e) env_s.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pid_, ATTNRES_BINARY, &fa, nullptr, argv.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Process() {
    if (pid_ > 0 && !done_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  bool started() const { return pid_ > 0; }
  void signal(int sig) const { ::kill(pid_, sig); }
  // The exit code (128 + signal when killed by one).
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    done_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // Waits at most `limit`; -1 if the process is still running then.
  int wait_for(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        done_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
};

}  // namespace attnres::testing
