// Running the attnres executable from tests.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "train/checkpoint.hpp"
#include "util/rng.hpp"

namespace attnres::testing {

struct CliResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, capturing stdout and stderr together.
inline CliResult run_shell(const std::string& command) {
  CliResult r;
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline CliResult run_cli(const std::string& args) { return run_shell(std::string(ATTNRES_BINARY) + " " + args); }

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The newest checkpoint of a run directory (train/checkpoint.hpp); empty when it holds none.
inline std::filesystem::path newest_checkpoint(const std::filesystem::path& run) {
  const std::vector<CheckpointFile> all = list_checkpoints(run.string());
  return all.empty() ? std::filesystem::path() : std::filesystem::path(all.front().path);
}
inline bool has_checkpoint(const std::filesystem::path& run) { return !newest_checkpoint(run).empty(); }

// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  std::string str(const std::string& child = "") const { return (path_ / child).string(); }

 private:
  std::filesystem::path path_;
};

// Synthetic documents (made here: no third-party text) prepared with the bytes tokenizer into
// `dir`/data; returns that path. Large enough for tiny models' train, val and test windows.
inline std::string prepare_synthetic_data(const std::filesystem::path& dir) {
  const std::filesystem::path corpus = dir / "corpus";
  std::filesystem::create_directories(corpus);
  Rng rng(42);
  const char* words[] = {"depth", "attention", "residual", "block", "query", "value", "key",  "layer",
                         "token", "softmax",   "norm",     "the",   "a",     "of",    "and", "route"};
  for (int d = 0; d < 60; ++d) {
    std::ofstream out(corpus / ("doc" + std::to_string(d) + ".txt"));
    for (int w = 0; w < 400; ++w) out << words[rng.below(16)] << (w % 12 == 11 ? ".\n" : " ");
  }
  const std::string data = (dir / "data").string();
  const CliResult r = run_cli("prepare --input " + corpus.string() + " --tokenizer bytes --val-fraction 0.15 "
                              "--test-fraction 0.15 --out " + data);
  if (r.exit_code != 0) throw std::runtime_error("preparing synthetic data failed:\n" + r.output);
  return data;
}

}  // namespace attnres::testing
