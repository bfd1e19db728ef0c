// Shared by the protocol, study and noise-floor suites (test_protocol.cpp, test_noise_floor.cpp):
// a tiny model and budget for protocol files, writing and reading them back.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/cli_util.hpp"
#include "experiment/protocol.hpp"
#include "util/error.hpp"

namespace attnres::testing {

// A protocol's [model] and [train]: a tiny model, 16 steps of 4 x 32 tokens, one thread
// (bit-reproducible), evaluated at `milestones` (a TOML array).
inline std::string tiny_model_train(const std::string& milestones) {
  return R"(
[model]
d_model = 32
n_layers = 2
n_heads = 2
mlp_hidden = 64
n_blocks = 2

[train]
seq_len = 32
batch_size = 4
tokens = 2048
eval_tokens = 512
checkpoint_every = 8
threads = 1
milestones = )" + milestones + "\n";
}

inline std::string write_file(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.str(name);
  std::ofstream(path) << text;
  return path;
}

// The error read_protocol gives for the file, or "(no error)".
inline std::string protocol_error(const std::string& path) {
  try {
    experiment::read_protocol(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline nlohmann::json read_json(const std::filesystem::path& p) { return nlohmann::json::parse(read_file(p)); }

}  // namespace attnres::testing
