#include "results/instability.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "results/run_result.hpp"
#include "results/train_result.hpp"
#include "util/error.hpp"

namespace attnres::results {

using nlohmann::json;

namespace {

// The median of `v` (non-empty; reordered): its middle value, or the mean of its two middle ones.
double median_of(std::span<double> v) {
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + upper) / 2;
}

// A count: an integer >= 0.
std::int64_t count(const JsonValue& v) {
  const std::int64_t n = v.integer();
  if (n < 0) v.bad("must not be negative");
  return n;
}

// A value that exists exactly when `exists` (`what` says when), null otherwise.
void check_given(const JsonValue& v, bool given, bool exists, const char* what) {
  if (given && !exists) v.bad(concat("must be null when ", what, " is 0"));
  if (!given && exists) v.bad(concat("must be given when ", what, " is above 0"));
}

}  // namespace

Instability compute_instability(std::span<const LossPoint> curve, double grad_clip) {
  require(std::isnan(grad_clip) || grad_clip >= 0, "compute_instability: the clipping threshold ", grad_clip,
          " is negative");
  Instability s;
  const auto window_size = static_cast<std::size_t>(kSpikeWindow);
  std::vector<double> window(window_size), deviation(window_size);
  int run = 0;  // consecutive spike steps up to the step before
  std::int64_t clipped = 0;
  for (std::size_t i = 0; i < curve.size(); ++i) {
    const auto step = static_cast<std::int64_t>(i) + 1;
    const double loss = curve[i].train_loss;
    require(std::isfinite(loss), "the training loss of step ", step, " is ", loss,
            ": a finished run's losses are finite");
    bool spike = false;
    if (i >= window_size) {
      ++s.tested_steps;
      for (std::size_t j = 0; j < window_size; ++j) window[j] = curve[i - window_size + j].train_loss;
      const double median = median_of(window);
      for (std::size_t j = 0; j < window_size; ++j)
        deviation[j] = std::abs(curve[i - window_size + j].train_loss - median);
      const double mad = median_of(deviation);
      spike = loss > median + kSpikeK * kMadToSigma * mad;
      if (spike) {
        ++s.spike_steps;
        if (run == 0) ++s.spike_events;
        if (run + 1 == kSustainedSpikeSteps) ++s.sustained_spike_events;
        const double height = loss - median;
        if (!s.largest_spike_step || height > s.largest_spike_nats) {
          s.largest_spike_step = step;
          s.largest_spike_nats = height;
        }
      }
    }
    run = spike ? run + 1 : 0;
    const double norm = curve[i].grad_norm;
    if (!std::isfinite(norm)) continue;  // unknown
    ++s.grad_norm_steps;
    if (!s.max_grad_norm_step || norm > s.max_grad_norm) {
      s.max_grad_norm = norm;
      s.max_grad_norm_step = step;
    }
    if (grad_clip > 0 && norm > grad_clip) ++clipped;
  }
  if (grad_clip == 0) s.clipped_fraction = 0;  // clipping off: no step was clipped, known or not
  else if (!std::isnan(grad_clip) && s.grad_norm_steps > 0)
    s.clipped_fraction = static_cast<double>(clipped) / static_cast<double>(s.grad_norm_steps);
  s.unstable = s.sustained_spike_events >= 1;
  return s;
}

std::optional<Instability> run_instability(const RunResult& run) {
  if (run.instability) return run.instability;
  if (run.curve.empty()) return std::nullopt;
  return compute_instability(run.curve, kNotAvailable);
}

json to_json(const Instability& s) {
  const auto step_or_null = [](const std::optional<std::int64_t>& step) { return step ? json(*step) : json(nullptr); };
  return {{"spike_window", s.spike_window},
          {"spike_k", s.spike_k},
          {"tested_steps", s.tested_steps},
          {"spike_events", s.spike_events},
          {"spike_steps", s.spike_steps},
          {"sustained_spike_events", s.sustained_spike_events},
          {"largest_spike_step", step_or_null(s.largest_spike_step)},
          {"largest_spike_nats", number_or_null(s.largest_spike_nats)},
          {"grad_norm_steps", s.grad_norm_steps},
          {"clipped_fraction", number_or_null(s.clipped_fraction)},
          {"max_grad_norm", number_or_null(s.max_grad_norm)},
          {"max_grad_norm_step", step_or_null(s.max_grad_norm_step)},
          {"unstable", s.unstable}};
}

void from_json(JsonObject& in, Instability& s) {
  const JsonValue window = in.get("spike_window");
  const std::int64_t w = window.integer();
  if (w < 1 || w > 1'000'000'000) window.bad("must be an integer from 1 to 1000000000");
  s.spike_window = static_cast<int>(w);
  const JsonValue k = in.get("spike_k");
  s.spike_k = k.number();
  if (s.spike_k <= 0) k.bad("must be positive");

  s.tested_steps = count(in.get("tested_steps"));
  const JsonValue events = in.get("spike_events");
  s.spike_events = count(events);
  const JsonValue steps = in.get("spike_steps");
  s.spike_steps = count(steps);
  if (s.spike_steps > s.tested_steps) steps.bad(concat("is larger than 'tested_steps' (", s.tested_steps, ")"));
  if (s.spike_events > s.spike_steps) events.bad(concat("is larger than 'spike_steps' (", s.spike_steps, ")"));
  if (s.spike_events == 0 && s.spike_steps > 0) events.bad("is 0 while 'spike_steps' is not");
  const JsonValue sustained = in.get("sustained_spike_events");
  s.sustained_spike_events = count(sustained);
  if (s.sustained_spike_events > s.spike_events)
    sustained.bad(concat("is larger than 'spike_events' (", s.spike_events, ")"));
  const bool spikes = s.spike_steps > 0;
  const JsonValue spike_step = in.get("largest_spike_step");
  check_given(spike_step, !spike_step.is_null(), spikes, "'spike_steps'");
  if (spikes) {
    s.largest_spike_step = spike_step.integer();
    if (*s.largest_spike_step <= s.spike_window)
      spike_step.bad(concat("must be larger than 'spike_window' (", s.spike_window, "): a spike has that many steps before it"));
  }
  const JsonValue height = in.get("largest_spike_nats");
  check_given(height, !height.is_null(), spikes, "'spike_steps'");
  if (spikes) {
    s.largest_spike_nats = height.number();
    if (s.largest_spike_nats <= 0) height.bad("must be positive: a spike lies above its window's median");
  }

  s.grad_norm_steps = count(in.get("grad_norm_steps"));
  const bool norms = s.grad_norm_steps > 0;
  const JsonValue fraction = in.get("clipped_fraction");
  s.clipped_fraction = fraction.number_or_null();
  if (!fraction.is_null() && (s.clipped_fraction < 0 || s.clipped_fraction > 1)) fraction.bad("must lie in [0, 1]");
  if (!fraction.is_null() && !norms && s.clipped_fraction != 0)
    fraction.bad("must be 0 (clipping off) or null when 'grad_norm_steps' is 0");
  const JsonValue max_norm = in.get("max_grad_norm");
  check_given(max_norm, !max_norm.is_null(), norms, "'grad_norm_steps'");
  if (norms) s.max_grad_norm = max_norm.non_negative();
  const JsonValue max_step = in.get("max_grad_norm_step");
  check_given(max_step, !max_step.is_null(), norms, "'grad_norm_steps'");
  if (norms) {
    s.max_grad_norm_step = max_step.integer();
    if (*s.max_grad_norm_step < 1) max_step.bad("must be at least 1");
  }

  const JsonValue unstable = in.get("unstable");
  s.unstable = unstable.boolean();
  if (s.unstable != (s.sustained_spike_events >= 1))
    unstable.bad(concat("is ", s.unstable ? "true" : "false", " with ", s.sustained_spike_events,
                        " sustained spike events; the rule: ", kUnstableRule));
}

}  // namespace attnres::results
