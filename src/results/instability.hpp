// The instability of a training run, from its per-step training losses and gradient norms: loss
// spikes by a stated robust rule, the fraction of steps whose gradient was clipped, and the largest
// gradient norm. One pure function of the curve, used by the trainer (train_result.json, its
// closing message), carried by the runner into result.json, and available to the analysis of runs
// recorded before it (their result.json has a curve without gradient norms: run_instability).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "results/strict_json.hpp"

namespace attnres::results {

struct LossPoint;  // results/train_result.hpp
struct RunResult;  // results/run_result.hpp

// The spike rule. Step t is a spike when it has at least W steps before it and
//   loss_t > median(loss_{t-W} .. loss_{t-1}) + k * 1.4826 * MAD(loss_{t-W} .. loss_{t-1}),
// MAD being the median absolute deviation of those W losses from their median (1.4826 * MAD
// estimates the standard deviation of normal noise, so k is a robust z-score). A median of an even
// count is the mean of the two middle values. Consecutive spike steps are one spike event; a
// spike's height is loss_t minus that median, in nats.
inline constexpr int kSpikeWindow = 50;        // W
inline constexpr double kSpikeK = 6;           // k
inline constexpr double kMadToSigma = 1.4826;  // the normal distribution's sigma / MAD
// A spike event of at least this many consecutive steps is sustained. Every run of one seed reads
// the same batches, so a single hard batch makes every arm's loss jump at the same step (in the
// committed CPU study, step 297 of seed 3 in every arm: robust z 5.2 to 6.8); a model that has gone
// unstable stays above its recent losses for more than one step.
inline constexpr int kSustainedSpikeSteps = 2;
// The unstable flag's rule, as the training log and the docs print it.
inline constexpr const char* kUnstableRule =
    "unstable = at least one sustained loss spike: two or more consecutive steps whose training loss "
    "exceeds the median of the 50 steps before each by more than 6 x 1.4826 x their median absolute "
    "deviation (a single such step is counted as a spike but is a hard batch, shared by every arm of the seed)";

// JSON: the object "instability" of train_result.json and result.json (docs/experiments.md). Every
// key is always written; a number that is not available is null.
struct Instability {
  int spike_window = kSpikeWindow;  // W of the rule this was computed with
  double spike_k = kSpikeK;         // k
  std::int64_t tested_steps = 0;    // steps with W steps before them: those the rule can flag
  std::int64_t spike_events = 0;    // runs of consecutive spike steps
  std::int64_t sustained_spike_events = 0;  // those of at least kSustainedSpikeSteps steps
  std::int64_t spike_steps = 0;     // spike steps
  std::optional<std::int64_t> largest_spike_step;  // the highest spike's step (1-based); none without spikes
  double largest_spike_nats = kNotAvailable;       // its height above the window's median
  // Steps whose gradient norm (before clipping) is known: all of a run trained by this build; none
  // of a curve recorded before gradient norms were, nor the steps before a resume from such a
  // checkpoint.
  std::int64_t grad_norm_steps = 0;
  // Of the steps whose norm is known, the share with norm > the clipping threshold; 0 when clipping
  // is off (threshold 0); not available when no norm is known or the threshold is unknown.
  double clipped_fraction = kNotAvailable;
  double max_grad_norm = kNotAvailable;            // the largest known norm
  std::optional<std::int64_t> max_grad_norm_step;  // its step (the first of equal ones)
  bool unstable = false;                           // kUnstableRule: sustained_spike_events >= 1
};

// `curve`: one point per step, from step 1 (train_result.json's and result.json's curve); every
// train_loss finite (an Error otherwise), a grad_norm that is not finite counts as unknown.
// `grad_clip`: the run's train.grad_clip (0: off), kNotAvailable when unknown. Allocates the two
// windows' buffers (2W numbers) once.
Instability compute_instability(std::span<const LossPoint> curve, double grad_clip);

// A run's instability: the one its result.json records, else (a file written before it was
// recorded) computed from its curve, whose clipping threshold is unknown here; none without a curve.
std::optional<Instability> run_instability(const RunResult& run);

// Reading checks the ranges and the consistency of the counts, the optional values given exactly
// when they exist, and `unstable` against the rule.
nlohmann::json to_json(const Instability& s);
void from_json(JsonObject& in, Instability& s);

}  // namespace attnres::results
