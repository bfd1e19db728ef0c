// A protocol file: one reviewable TOML file that fixes a whole paired study — data, model and
// training settings, seeds, the main arms with their budget and milestones, controls at their own
// (earlier) budget, and probes with some settings changed — for `attnres experiment --protocol`.
// The format is in docs/experiments.md ("Protocol files"); studies/ has the shipped ones.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "experiment/runner.hpp"
#include "results/strict_json.hpp"

namespace attnres::experiment {

// How to make the protocol's data directory when it is missing ([experiment.prepare]): the corpus
// and an sp tokenizer trained on its training split, as `attnres prepare` does.
struct PrepareSpec {
  std::vector<std::string> inputs;
  int vocab_size = 4096;
  double val_fraction = 0.01;
  double test_fraction = 0.01;
};

struct ProtocolFile {
  std::string path;
  ExperimentOptions options;  // base config, arms, seeds, groups, data; out_dir/worker/device left unset
  std::optional<PrepareSpec> prepare;
  double effect = results::kNotAvailable;  // the power analysis' user effect, when the file gives one
};

// Reads and checks a protocol file. Errors name the file, the line and the key.
ProtocolFile read_protocol(const std::string& path);

// Prepares the protocol's data directory when it has no manifest and the protocol says how
// (progress on stderr); otherwise does nothing.
void prepare_protocol_data(const ProtocolFile& protocol, bool progress);

}  // namespace attnres::experiment
