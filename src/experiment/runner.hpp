// The paired multi-seed experiment (spec §8): every arm trained with every seed, identical
// initial shared weights and data order per seed, evaluated at the same milestones.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.hpp"
#include "train/train_config.hpp"

namespace attnres::experiment {

// An arm name (arm_names(): prenorm, full, block, rd, rd-tied, rd-average, rd-frozen, denseformer
// (1 x 1), denseformer-4x5, hc (dynamic), hc-static, mhc (the hc_* / mhc_* keys from the config),
// mudd (qkvr, dynamic), mudd-static, mudd-r (DDFormer; the other mudd_* keys from the config); any
// of them with "+vres": value_residual on) applied to a model.
ModelConfig apply_arm(ModelConfig model, const std::string& arm);
const std::vector<std::string>& arm_names();
// The arm names for help texts and messages.
std::string arm_names_text();

// A further comparison beside the main arms, trained with the same seeds (from a protocol file):
// controls at an earlier budget, or a probe with some settings changed (e.g. another depth).
struct GroupOptions {
  std::string name;                   // its runs go to OUT/runs/<name>/<arm>/seed-<seed>/
  std::string kind;                   // "controls" or "probe"
  std::vector<std::string> arms;      // the first is the baseline
  std::vector<std::string> settings;  // key=value over the main configuration (as --set)
  std::int64_t tokens = 0;            // budget per run; 0: the main budget
};

struct ExperimentOptions {
  TrainConfig base;                 // the arms change only model.residual / model.value_route
  std::string preset;               // recorded in experiment.json
  std::vector<std::string> arms;    // the first is the baseline
  std::vector<std::uint64_t> seeds;
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

// The configuration of one run: the base with the group's settings and budget (group null: the
// main arms), the arm's residual mode, and the seed for initialisation and data order.
TrainConfig run_config(const TrainConfig& base, const GroupOptions* group, const std::string& arm, std::uint64_t seed);
// The keys run_config sets for every run (arm and seed), so a setting of them would be ignored.
const std::vector<std::string>& per_run_keys();

// True when training `group` for its budget would reproduce the first steps of training `main`
// exactly (the same configuration apart from budget, milestones and checkpoint interval, and the
// same learning rate at every step up to the group's last), and `main` evaluates at the group's
// last step: then the group's baseline runs need not be trained; the main ones are read at the
// milestones both have.
bool same_run_prefix(const TrainConfig& main, const TrainConfig& group);

// Runs (or resumes) this worker's share of the runs; finished runs are skipped. Returns true
// when every run of the experiment has a result (with a communicator: on every rank, after all
// ranks are done). Each run trains in a child process (single-process, threads shared among the
// ranks on a machine).
bool run_experiment(const ExperimentOptions& options);

}  // namespace attnres::experiment
