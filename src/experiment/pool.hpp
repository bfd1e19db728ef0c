// `attnres report --pool DIR... --answer ARM`: what every given study says about one comparison.
// Each experiment directory contributes one estimate per design that compares ARM with the
// baseline: its main arms (when both are among them) and each group whose arms include ARM with
// that baseline as the group's. The estimate is the paired ΔNLL (ARM − baseline, validation NLL at
// the design's last milestone, over the seeds finished in both) of the summary
// (analysis/summary.hpp); the designs are pooled by analysis/meta.hpp's random-effects
// meta-analysis. Here, above analysis, because a design's learning rate and precision are read
// from its recorded training configuration (train/train_config.hpp). Docs: docs/experiments.md,
// "Pooling studies".
#pragma once

#include <string>
#include <vector>

#include "results/pool.hpp"

namespace attnres::experiment {

struct PoolOptions {
  std::string arm;       // the compared arm (required)
  std::string baseline;  // "": the main baseline of the first directory
  double effect = 0.030; // the futility effect E, nats > 0 (the paper's by default)
};

// Reads every directory (Errors name the directory: not an experiment, no arm ARM, no design
// comparing ARM with the baseline) and pools. Nothing is written.
results::Pool pool_studies(const std::vector<std::string>& dirs, const PoolOptions& options);

}  // namespace attnres::experiment
