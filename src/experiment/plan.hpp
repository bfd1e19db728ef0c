// The plan of a paired experiment: every run it trains, each with its configuration and result
// file, in a fixed order (seed, then the main arms, then each group's), and the experiment.json
// that fixes them. Pure: it reads the data directory's identity and checks its splits, writes
// nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "experiment/options.hpp"
#include "results/experiment_spec.hpp"
#include "train/train_config.hpp"

namespace attnres::experiment {

struct PlannedRun {
  std::string group;  // "" for the main arms
  std::string arm;
  std::uint64_t seed = 0;
  int seed_index = 0;  // the seed's position in the experiment's seed list (looks count seeds)
  TrainConfig config;
  std::string result_path, label;
};

struct ExperimentPlan {
  TrainConfig base;             // the options' base with the data's vocabulary
  results::ExperimentSpec spec;  // what experiment.json holds
  std::vector<PlannedRun> runs;  // seed-major: a stopped study has whole seeds
};

// Valid arm names (model/arms.hpp), none listed twice, and a twin only of the baseline (the first);
// errors begin with `what` ("the main arms", "group 'x'").
void check_arms(const ModelConfig& model, const std::vector<std::string>& arms, const std::string& what);

// Checks the options (arm names, twins, seeds, groups, sequential seeds) and plans the runs; every
// split a run reads is checked to hold a window. Errors name the option or protocol key.
// `data_prepared` false (`experiment --dry-run` of a protocol whose data is not made yet): the data
// is not read; the vocabulary is the options' model.vocab_size and the dataset identity is left empty.
ExperimentPlan make_plan(const ExperimentOptions& options, bool data_prepared = true);

// A run's evaluations as a share of its training compute: every milestone and the test split score
// eval_tokens (a forward pass, about a third of a training step's work per token).
double evaluation_overhead(const TrainConfig& config);

// The configuration of one run: the base with the group's settings and budget (group null: the
// main arms), the arm's residual mode, the seed for initialisation and data order, and for a twin
// arm its initial weights' perturbation.
TrainConfig run_config(const TrainConfig& base, const GroupOptions* group, const std::string& arm, std::uint64_t seed,
                       double twin_perturbation = kDefaultTwinPerturbation);
// The keys run_config sets for every run (arm and seed), so a setting of them would be ignored.
const std::vector<std::string>& per_run_keys();

// True when training `group` for its budget would reproduce the first steps of training `main`
// exactly (the same configuration apart from budget, milestones and checkpoint interval, and the
// same learning rate at every step up to the group's last), and `main` evaluates at the group's
// last step: then the group's baseline runs need not be trained; the main ones are read at the
// milestones both have.
bool same_run_prefix(const TrainConfig& main, const TrainConfig& group);

}  // namespace attnres::experiment
