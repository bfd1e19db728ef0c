#include "train/train_step.hpp"

#include <chrono>
#include <cmath>
#include <span>
#include <utility>

#include "util/error.hpp"
#include "util/machine.hpp"

namespace attnres {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

Geometry make_geometry(const TrainConfig& config, const dist::Communicator& comm) {
  Geometry g;
  g.micro_batches = config.micro_batches > 0 ? config.micro_batches : comm.world();
  require(g.micro_batches % comm.world() == 0, "train.micro_batches (", g.micro_batches,
          ") must be a multiple of the number of processes (", comm.world(), ")");
  require(config.batch_size % g.micro_batches == 0, "train.batch_size (", config.batch_size,
          ") must be a multiple of the number of micro-batches (", g.micro_batches,
          config.micro_batches > 0 ? ", train.micro_batches)" : ", one per process)");
  g.local_micro = g.micro_batches / comm.world();
  g.micro_batch = config.batch_size / g.micro_batches;
  return g;
}

TrainStep::TrainStep(const TrainConfig& config, const Geometry& geometry, TrainBackend& backend,
                     data::BatchLoader& loader, dist::Communicator& comm, std::string run_dir, std::string checkpoints)
    : config_(config),
      geo_(geometry),
      backend_(backend),
      loader_(loader),
      comm_(comm),
      run_dir_(std::move(run_dir)),
      checkpoints_(std::move(checkpoints)),
      schedule_(config.schedule()),
      batch_(static_cast<std::size_t>(geometry.local_micro * geometry.micro_batch) *
             static_cast<std::size_t>(config.seq_len + 1)),
      loss_sum_(1, static_cast<std::size_t>(geometry.local_micro)) {}

StepOutcome TrainStep::run(std::int64_t step) {
  StepOutcome out;
  const auto t_step = std::chrono::steady_clock::now();
  const double cpu_start = process_cpu_seconds();
  loader_.next(batch_);
  loss_sum_.reset();
  const std::size_t len = static_cast<std::size_t>(geo_.micro_batch) * static_cast<std::size_t>(config_.seq_len + 1);
  for (int m = 0; m < geo_.local_micro; ++m) {
    double micro_loss = backend_.accumulate(std::span<const std::int32_t>(batch_).subspan(m * len, len),
                                            geo_.micro_batch, config_.seq_len);
    loss_sum_.add(std::span<double>(&micro_loss, 1));
  }
  double loss = 0;
  loss_sum_.result(std::span<double>(&loss, 1));
  const auto t_reduce = std::chrono::steady_clock::now();
  backend_.finish_gradient(comm_, geo_.micro_batches);
  out.loss = comm_.sum(loss) / geo_.micro_batches;  // micro-batch losses are means; the step's is their mean
  out.reduce_seconds = seconds_since(t_reduce);
  require(std::isfinite(out.loss), "the training loss became ", out.loss, " at step ", step, " of '", run_dir_,
          "'; stopping. The last good checkpoints (step <= ", step, ") are '", checkpoints_,
          "'; lower train.lr or raise train.warmup_fraction");
  out.lr = schedule_.at(step);
  out.grad_norm = backend_.update(out.lr, config_.grad_clip);
  out.seconds = seconds_since(t_step);
  out.cpu_seconds = process_cpu_seconds() - cpu_start;
  return out;
}

}  // namespace attnres
