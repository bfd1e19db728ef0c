// experiment.json: the protocol of a paired experiment, DIR/experiment.json. The experiment runner
// writes it when an experiment starts and, on every rerun, refuses a directory whose spec differs
// from the one asked for; the summary reads it and repeats its Protocol in summary.json.
// Format: docs/experiments.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "results/strict_json.hpp"

namespace attnres::results {

// What is compared: the arms, seeds and budget.
struct Protocol {
  std::vector<std::string> arms;  // in display order, no repeats; contains the baseline
  std::string baseline;
  std::vector<std::int64_t> seeds;       // no repeats
  std::int64_t tokens = 0;               // training budget per run
  std::vector<std::int64_t> milestones;  // strictly increasing token counts of validation evaluations
  std::string preset;                    // "" when absent

  bool operator==(const Protocol&) const = default;
};

struct ExperimentSpec : Protocol {
  int version = 1;
  std::string data;                                  // the data directory; "" when absent
  nlohmann::json model = nlohmann::json::object();   // the baseline arm's model config, passed through
  nlohmann::json train = nlohmann::json::object();   // training settings, passed through

  bool operator==(const ExperimentSpec&) const = default;
};

// Protocol's keys are experiment.json's top level, with version, data, model and train beside them,
// and summary.json's "experiment". Reading checks them as a set: a non-empty arm list of valid
// names (they become directory names and HTML ids), a baseline among them, positive budget and
// increasing milestones.
nlohmann::json to_json(const Protocol& p);
void from_json(JsonObject& in, Protocol& p);

nlohmann::json to_json(const ExperimentSpec& s);
void from_json(JsonObject& in, ExperimentSpec& s);

// DIR/experiment.json
std::string experiment_spec_path(const std::string& dir);
void write_experiment_spec(const std::string& path, const ExperimentSpec& s);  // atomically
// "<path>: not found (is this an experiment directory?)" when it does not exist.
ExperimentSpec read_experiment_spec(const std::string& path);

}  // namespace attnres::results
