// The experiment directory as a command's --out (util/dir_lock.hpp): which processes may write it
// at the same time (docs/reliability.md, "One writer per directory").
#pragma once

#include "util/dir_lock.hpp"

namespace attnres::experiment {

// Worker K of N (a single process: 0 of 1; an MPI rank: its rank of the job's size) holds
// DIR/.lock-worker-K-of-N, so the N workers of one experiment share its directory while a second
// process for the same share is refused, pointed at --worker. A directory of this kind holds
// experiment.json or runs/. (Each run's own directory is held by the `attnres train` training it:
// train/checkpoint.hpp, run_directory_kind.)
OutputKind experiment_directory_kind(int worker, int workers);

}  // namespace attnres::experiment
