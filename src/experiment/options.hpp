// What a paired experiment is asked to do: the base configuration, arms, seeds, groups (controls,
// probes), the noise floor's twins and sequential seeds, and where and how it runs. From the
// command line (`attnres experiment --arms ...`) or a protocol file (experiment/protocol.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/communicator.hpp"
#include "model/arms.hpp"
#include "results/experiment_spec.hpp"
#include "train/train_config.hpp"

namespace attnres::experiment {

// A further comparison beside the main arms, trained with the same seeds (from a protocol file):
// controls at an earlier budget, or a probe with some settings changed (e.g. another depth).
struct GroupOptions {
  std::string name;                   // its runs go to OUT/runs/<name>/<arm>/seed-<seed>/
  std::string kind;                   // "controls" or "probe"
  std::vector<std::string> arms;      // the first is the baseline
  std::vector<std::string> settings;  // key=value over the main configuration (as --set)
  std::int64_t tokens = 0;            // budget per run; 0: the main budget
  double budget = 0;                  // the fraction of the main budget `tokens` came from (0: none)
  int seed_count = 0;                 // runs on the experiment's first seed_count seeds; 0: all
};

struct ExperimentOptions {
  TrainConfig base;                 // the arms change only model.residual / model.value_route
  std::string preset;               // recorded in experiment.json
  std::vector<std::string> arms;    // the first is the baseline
  std::vector<std::uint64_t> seeds;
  // train.init_perturbation of the twin arms ("<baseline>~"): [experiment.noise] perturbation.
  double twin_perturbation = kDefaultTwinPerturbation;
  // Twins of the main arms run on the first twin_seeds seeds only ([experiment.noise] seeds; 0: all).
  int twin_seeds = 0;
  // The noise-floor test's equivalence margin in nats ([experiment.noise] margin; 0: effect / 3).
  double floor_margin = 0;
  // What counts as a failed run ([experiment.failure]); none: no run is counted as failed.
  std::optional<results::FailureRule> failure;
  // Sequential seeds ([experiment.sequential]): run the seeds in looks, stop when the answer is in.
  std::optional<results::SequentialSpec> sequential;
  // From a protocol file (experiment/protocol.hpp): its name and description, and its groups.
  // With a name, experiment.json is version 2 and records `data` as given (not made absolute)
  // with the dataset's identity, so the directory can be resumed on another machine.
  std::string name;
  std::string description;
  std::vector<GroupOptions> groups;
  std::string data_dir;
  std::string out_dir;
  int worker = 0;   // this process runs runs with index % workers == worker
  int workers = 1;
  // An MPI job (mpirun -np K attnres experiment): rank r is worker r of K, rank 0 writes the
  // experiment's own files, and every rank returns once all runs are done. Null: one process.
  dist::Communicator* comm = nullptr;
  // Where each run trains (train --device); "cuda" under MPI becomes the rank's local GPU. Test
  // NLL and routing diagnostics are computed on the CPU from the saved weights.
  std::string device = "cpu";
  std::int64_t diagnostic_tokens = 1 << 14;  // validation tokens for routing diagnostics
  const std::atomic<bool>* stop = nullptr;
  bool progress = true;
};

}  // namespace attnres::experiment
