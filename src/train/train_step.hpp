// One optimizer step of a training run, as every rank takes it: this rank's share of the global
// batch from the loader, forward and backward per micro-batch, the gradient summed over
// micro-batches and ranks, the NaN guard, clipping and AdamW at the scheduled learning rate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/loader.hpp"
#include "dist/communicator.hpp"
#include "dist/tree_sum.hpp"
#include "train/backend.hpp"
#include "train/train_config.hpp"

namespace attnres {

// The data-parallel geometry of a run: how the global batch is cut over ranks and micro-batches.
struct Geometry {
  int micro_batches = 1;  // over all ranks
  int local_micro = 1;    // on this rank
  int micro_batch = 1;    // sequences per micro-batch
};

// Checks that train.batch_size and train.micro_batches divide over comm's ranks.
Geometry make_geometry(const TrainConfig& config, const dist::Communicator& comm);

struct StepOutcome {
  double loss = 0;            // mean over the global batch
  double lr = 0;
  double grad_norm = 0;       // before clipping
  double seconds = 0;         // the whole step
  double cpu_seconds = 0;     // this process's CPU time (all its threads) over the step
  double reduce_seconds = 0;  // of which in the gradient reduction across ranks
};

class TrainStep {
 public:
  // `run_dir` and `checkpoints` (their path pattern) name the files in the NaN guard's error.
  TrainStep(const TrainConfig& config, const Geometry& geometry, TrainBackend& backend, data::BatchLoader& loader,
            dist::Communicator& comm, std::string run_dir, std::string checkpoints);

  // Takes step `step` (0-based: the number of steps already taken).
  StepOutcome run(std::int64_t step);

 private:
  const TrainConfig& config_;
  Geometry geo_;
  TrainBackend& backend_;
  data::BatchLoader& loader_;
  dist::Communicator& comm_;
  std::string run_dir_, checkpoints_;
  LrSchedule schedule_;
  std::vector<std::int32_t> batch_;      // this rank's share of a global batch
  dist::PairwiseSum<double> loss_sum_;  // its micro-batches' losses, in tree order
};

}  // namespace attnres
