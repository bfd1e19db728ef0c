// The paired multi-seed experiment (spec §8): every arm trained with every seed, identical
// initial shared weights and data order per seed, evaluated at the same milestones. The runs and
// experiment.json come from experiment/plan.hpp; this runs them, in looks when the seeds are
// sequential.
#pragma once

#include <atomic>

#include "experiment/options.hpp"
#include "results/summary.hpp"

namespace attnres::experiment {

// Runs (or resumes) this worker's share of the runs; finished runs are skipped. An experiment
// directory may grow: more seeds, or more arms in the main list or a group, with every recorded
// run unchanged (the reused runs are named). With sequential seeds, the seeds are run look by look:
// after each look every worker waits for the look's runs (its own and the others'), the primary
// comparison is decided, and the experiment stops once it is resolved or futile, or at max_seeds.
// Returns true when the experiment is complete: every run has a result, or the sequential rule has
// stopped it (with a communicator: on every rank, after all ranks are done). Each run trains in a
// child process (single-process, threads shared among the ranks on a machine).
bool run_experiment(const ExperimentOptions& options);

// Whether the sequential rule stops the experiment after the runner's look at `seeds` seeds: the
// summary has decided (resolved, futile, or not resolved at max_seeds) at a look of at most
// `seeds` seeds. A decision at a later look (a resumed experiment whose later seeds have results)
// stops it only at that look, once every run of its seeds, the groups' included, has finished.
bool sequential_decided_at(const results::SequentialSummary& summary, int seeds);

// `experiment --dry-run`: every run the command would train, in order, each done, to train, in a
// later look, or not needed (a sequential study that stopped), after the real command's checks of
// the recorded experiment.json (a different experiment is refused) and its sequential decision; then
// the cost of what is left, from the throughput of the finished runs here or else
// `planned_tokens_per_core_second` (0: none), and the time with this many workers. An unprepared data
// directory is costed from the protocol alone. Writes nothing.
std::string dry_run(const ExperimentOptions& options, double planned_tokens_per_core_second);

// Trains `config` into `dir` in a child process, as every run of an experiment trains: the config
// written to DIR/run.toml, resumed when DIR holds checkpoints, `threads` (0: the child's default)
// and `device` as given. Returns the child's exit status (0: finished; 128 + N: stopped by signal
// N, resumable). With `stop` (this process' stop flag), a stop request reaches the child however
// this process got it (util/process.hpp).
int train_child(const TrainConfig& config, const std::string& data_dir, const std::string& dir, const std::string& label,
                const std::atomic<bool>* stop, int threads = 0, const std::string& device = "cpu");

}  // namespace attnres::experiment
