// experiment.json: the protocol of a paired experiment, DIR/experiment.json. The experiment runner
// writes it when an experiment starts and, on every rerun, refuses a directory whose spec differs
// from the one asked for; the summary reads it and repeats its Protocol in summary.json.
// Format: docs/experiments.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
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

// A further comparison run beside the main arms with the same seeds (experiment.json "groups",
// from a protocol file: docs/experiments.md): controls at an earlier budget, or a probe with some
// settings changed (e.g. another depth).
struct GroupSpec {
  std::string name;  // its runs are DIR/runs/<name>/<arm>/seed-<seed>/; not "main", not an arm name
  std::string kind;  // "controls" or "probe"
  std::vector<std::string> arms;  // in display order, no repeats; contains the baseline
  std::string baseline;
  // The baseline is not trained in this group: its runs are those of the main arm of that name, read
  // at this group's milestones (which are main milestones). Only where such runs would equal that
  // arm's main runs' first steps exactly (the same schedule up to this budget); then no test NLL is
  // compared.
  bool baseline_from_main = false;
  std::int64_t tokens = 0;               // training budget per run
  std::vector<std::int64_t> milestones;  // strictly increasing token counts
  std::vector<std::string> settings;     // key=value settings applied over the main configuration
  nlohmann::json model = nlohmann::json::object();  // the group baseline's model config, passed through
  nlohmann::json train = nlohmann::json::object();  // its training settings, passed through
  // The group runs on the experiment's first `seed_count` seeds only (a floor or a control needs a
  // few seeds, not all of them); 0: every seed. Written when > 0.
  int seed_count = 0;

  bool operator==(const GroupSpec&) const = default;
};

// Sequential seeds (docs/experiments.md, "Sequential seeds"): the seeds are run in looks of
// increasing counts; after each look the primary comparison (the primary arm against the baseline,
// validation NLL at the last milestone) is tested with the group-sequential boundaries of the
// spending function, and the study stops when its repeated confidence interval excludes 0
// (resolved), lies inside (-effect, effect) (futile: no effect as large as that), or at max_seeds.
struct SequentialSpec {
  std::vector<int> looks;   // strictly increasing seed counts, the last = max_seeds
  int max_seeds = 0;        // = looks.back(); the seeds list holds at least this many
  double alpha = 0.05;      // two-sided, spent over the looks
  std::string spending = "obrien-fleming";  // or "pocock" (Lan-DeMets)
  double effect = 0;        // the effect of interest in nats (> 0): futility and planning
  std::string primary;      // the compared arm

  bool operator==(const SequentialSpec&) const = default;
};

// What counts as a failed run, declared before the runs ([experiment.failure], docs/experiments.md
// "Failed runs"): more than `clipped_fraction` of its steps clipped, or a stall — its training loss,
// averaged over `stall_steps` consecutive steps, above its reference's by more than `stall_nats`
// (the reference: the baseline's run of the same seed, the same batches; for the baseline and its
// twin, the step-wise median of the baseline's runs over the seeds). The primary analysis keeps every
// seed; failures are counted per arm and a secondary analysis leaves their seeds out.
struct FailureRule {
  double clipped_fraction = 0.08;
  double stall_nats = 0.3;
  int stall_steps = 25;

  bool operator==(const FailureRule&) const = default;
};

struct ExperimentSpec : Protocol {
  int version = 1;  // 2 when written from a protocol file (name, groups, dataset)
  std::string name;         // the protocol's name; "" for an experiment from command-line options
  std::string description;  // "" when absent
  std::string data;                                  // the data directory; "" when absent
  nlohmann::json dataset = nlohmann::json::object();  // what identifies the data: tokenizer hash, split sizes
  nlohmann::json model = nlohmann::json::object();   // the baseline arm's model config, passed through
  nlohmann::json train = nlohmann::json::object();   // training settings, passed through
  std::vector<GroupSpec> groups;                     // further comparisons (version 2 only)
  // The relative perturbation of the twins' initial weights; written when an arm is a twin.
  double twin_perturbation = 0;
  std::optional<SequentialSpec> sequential;  // version 2 only; none: every seed is run
  // Twins of the main arms run on the first `twin_seeds` seeds only; 0: every seed. Written when > 0.
  int twin_seeds = 0;
  // The margin (nats) of the noise-floor test's "inside" (an equivalence test): written when > 0;
  // 0: a third of the effect of interest (the paper's 0.030 when none is given).
  double floor_margin = 0;
  std::optional<FailureRule> failure;  // version 2 only; none: no run is counted as failed

  bool operator==(const ExperimentSpec&) const = default;
  // The seeds (arm, group "" for the main arms) runs with: all, or the first twin_seeds / seed_count.
  std::vector<std::int64_t> seeds_of(const std::string& group, const std::string& arm) const;
  const GroupSpec* find_group(const std::string& name) const;
};

// Protocol's keys are experiment.json's top level, with version, data, model and train beside them,
// and summary.json's "experiment". Reading checks them as a set: a non-empty arm list of valid
// names (they become directory names and HTML ids), a baseline among them, positive budget and
// increasing milestones.
nlohmann::json to_json(const Protocol& p);
void from_json(JsonObject& in, Protocol& p);

nlohmann::json to_json(const GroupSpec& g);
void from_json(JsonObject& in, GroupSpec& g);

nlohmann::json to_json(const SequentialSpec& s);
void from_json(JsonObject& in, SequentialSpec& s);

nlohmann::json to_json(const FailureRule& f);
void from_json(JsonObject& in, FailureRule& f);

nlohmann::json to_json(const ExperimentSpec& s);
void from_json(JsonObject& in, ExperimentSpec& s);

// Arm and group names become directory names and HTML ids: "'x' is not a valid <what> name" unless
// non-empty and free of path separators, quotes, '<', '>', '&' and spaces.
bool valid_name(const std::string& name);

// DIR/experiment.json
std::string experiment_spec_path(const std::string& dir);
void write_experiment_spec(const std::string& path, const ExperimentSpec& s);  // atomically
// "<path>: not found (is this an experiment directory?)" when it does not exist.
ExperimentSpec read_experiment_spec(const std::string& path);

}  // namespace attnres::results
