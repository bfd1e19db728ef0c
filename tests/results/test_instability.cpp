// The instability of a run's curve (results/instability.hpp): its spike rule against an independent
// brute-force computation of the stated rule on hand-made curves, the clipped fraction and the
// largest gradient norm, the runs recorded before it, and the "instability" object's strict reading.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "results/instability.hpp"
#include "results/run_result.hpp"
#include "results/train_result.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::results {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The rule as docs/training.md states it, written out here rather than taken from the constants.
constexpr int kW = 50;
constexpr double kK = 6;

// Median by a full sort: the middle value, or the mean of the two middle ones.
double sorted_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct BruteForce {
  std::int64_t tested = 0, events = 0, spike_steps = 0, sustained = 0;  // sustained: events of >= 2 steps
  std::vector<std::int64_t> spikes;  // their steps
  std::int64_t largest_step = 0;     // 0: none
  double largest_nats = 0;
};

// Every step with W before it, tested one at a time; events counted as starts of spike runs.
BruteForce brute_force(const std::vector<double>& loss) {
  BruteForce b;
  for (std::size_t t = kW; t < loss.size(); ++t) {
    ++b.tested;
    const std::vector<double> window(loss.begin() + static_cast<std::ptrdiff_t>(t - kW),
                                     loss.begin() + static_cast<std::ptrdiff_t>(t));
    const double median = sorted_median(window);
    std::vector<double> deviation;
    for (double x : window) deviation.push_back(std::abs(x - median));
    const double mad = sorted_median(deviation);
    if (!(loss[t] > median + kK * 1.4826 * mad)) continue;
    const auto step = static_cast<std::int64_t>(t) + 1;
    if (b.spikes.empty() || b.spikes.back() != step - 1) ++b.events;
    // The second step of a run of spike steps makes its event sustained.
    else if (b.spikes.size() < 2 || b.spikes[b.spikes.size() - 2] != step - 2) ++b.sustained;
    b.spikes.push_back(step);
    ++b.spike_steps;
    if (b.largest_step == 0 || loss[t] - median > b.largest_nats) {
      b.largest_step = step;
      b.largest_nats = loss[t] - median;
    }
  }
  return b;
}

std::vector<LossPoint> curve_of(const std::vector<double>& loss, const std::vector<double>& norms = {}) {
  std::vector<LossPoint> c;
  for (std::size_t i = 0; i < loss.size(); ++i)
    c.push_back({static_cast<std::int64_t>(i + 1) * 1024, loss[i], i < norms.size() ? norms[i] : kNotAvailable});
  return c;
}

// A nearly flat, slowly falling training curve (1 millinat per step) with uniform noise of
// +-amplitude: bounded noise, so no step lies 6 robust standard deviations above its window's median.
// (On a steep stretch of a curve the window's own fall widens its MAD; AgreesWithTheBruteForce...
// below has one.)
std::vector<double> noisy_curve(std::size_t steps, double amplitude, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> loss;
  for (std::size_t i = 0; i < steps; ++i)
    loss.push_back(5.0 - 0.001 * double(i) +
                   amplitude * (2.0 * static_cast<double>(rng() >> 11) / 9007199254740992.0 - 1.0));
  return loss;
}

// compute_instability's spike fields equal the brute force's.
void expect_spikes_as_brute_force(const std::vector<double>& loss) {
  const Instability s = compute_instability(curve_of(loss), 1.0);
  const BruteForce b = brute_force(loss);
  EXPECT_EQ(s.tested_steps, b.tested);
  EXPECT_EQ(s.spike_events, b.events);
  EXPECT_EQ(s.spike_steps, b.spike_steps);
  EXPECT_EQ(s.sustained_spike_events, b.sustained);
  EXPECT_EQ(s.unstable, b.sustained >= 1);
  if (b.largest_step == 0) {
    EXPECT_FALSE(s.largest_spike_step.has_value());
    EXPECT_TRUE(std::isnan(s.largest_spike_nats));
  } else {
    EXPECT_EQ(s.largest_spike_step, b.largest_step);
    EXPECT_EQ(s.largest_spike_nats, b.largest_nats);
  }
  EXPECT_EQ(s.spike_window, kW);
  EXPECT_EQ(s.spike_k, kK);
}

TEST(Instability, TheRuleIsTheStatedOne) {
  EXPECT_EQ(kSpikeWindow, kW);
  EXPECT_EQ(kSpikeK, kK);
  EXPECT_EQ(kMadToSigma, 1.4826);
  // The printed rule names the same numbers.
  const std::string rule = kUnstableRule;
  EXPECT_EQ(kSustainedSpikeSteps, 2);
  EXPECT_NE(rule.find("two or more consecutive steps"), std::string::npos) << rule;
  EXPECT_NE(rule.find(concat("the ", kSpikeWindow, " steps before each")), std::string::npos) << rule;
  EXPECT_NE(rule.find(concat(kSpikeK, " x ", kMadToSigma, " x their median absolute deviation")), std::string::npos)
      << rule;
}

TEST(Instability, AFlatNoisyCurveHasNoSpikes) {
  const std::vector<double> loss = noisy_curve(400, 0.05, 1);
  expect_spikes_as_brute_force(loss);
  const Instability s = compute_instability(curve_of(loss), 1.0);
  EXPECT_EQ(s.tested_steps, 350);
  EXPECT_EQ(s.spike_events, 0);
  EXPECT_FALSE(s.unstable);
  EXPECT_FALSE(s.largest_spike_step.has_value());
}

TEST(Instability, APlantedSpikeIsFoundWithItsHeight) {
  std::vector<double> loss = noisy_curve(400, 0.05, 2);
  loss[119] += 1.0;  // step 120
  expect_spikes_as_brute_force(loss);
  const Instability s = compute_instability(curve_of(loss), 1.0);
  EXPECT_EQ(s.spike_events, 1);
  EXPECT_EQ(s.spike_steps, 1);
  // One step: a hard batch, not an unstable model (kSustainedSpikeSteps).
  EXPECT_EQ(s.sustained_spike_events, 0);
  EXPECT_FALSE(s.unstable);
  EXPECT_EQ(s.largest_spike_step, 120);
  // One nat above a window whose median lies within the noise (and the trend) of the step's own level.
  EXPECT_NEAR(s.largest_spike_nats, 1.0, 0.2);
}

TEST(Instability, ConsecutiveSpikeStepsAreOneEvent) {
  std::vector<double> loss = noisy_curve(400, 0.05, 3);
  loss[119] += 1.0;  // steps 120 and 121: one event
  loss[120] += 1.5;
  expect_spikes_as_brute_force(loss);
  Instability s = compute_instability(curve_of(loss), 1.0);
  EXPECT_EQ(s.spike_events, 1);
  EXPECT_EQ(s.spike_steps, 2);
  EXPECT_EQ(s.sustained_spike_events, 1);  // two steps: sustained, the run is unstable
  EXPECT_TRUE(s.unstable);
  EXPECT_EQ(s.largest_spike_step, 121);

  loss[199] += 0.8;  // step 200: a second event, lower
  expect_spikes_as_brute_force(loss);
  s = compute_instability(curve_of(loss), 1.0);
  EXPECT_EQ(s.spike_events, 2);
  EXPECT_EQ(s.spike_steps, 3);
  EXPECT_EQ(s.largest_spike_step, 121);
}

TEST(Instability, OnlyStepsWithAWholeWindowBeforeThemAreTested) {
  std::vector<double> loss = noisy_curve(50, 0.05, 4);
  loss.back() += 10;  // step 50 has 49 steps before it: not tested
  Instability s = compute_instability(curve_of(loss), 1.0);
  EXPECT_EQ(s.tested_steps, 0);
  EXPECT_EQ(s.spike_events, 0);
  EXPECT_FALSE(s.unstable);
  loss.push_back(loss.front() + 10);  // step 51 has 50
  expect_spikes_as_brute_force(loss);
  s = compute_instability(curve_of(loss), 1.0);
  EXPECT_EQ(s.tested_steps, 1);
  EXPECT_EQ(s.spike_events, 1);
  EXPECT_EQ(s.largest_spike_step, 51);
  EXPECT_EQ(compute_instability({}, 1.0).tested_steps, 0);
}

// A curve with heavy-tailed noise, jumps of both signs and plateaus, for which the brute force
// finds several spikes of different lengths.
TEST(Instability, AgreesWithTheBruteForceOnARoughCurve) {
  std::mt19937_64 rng(5);
  std::student_t_distribution<double> noise(2.0);
  std::vector<double> loss;
  double level = 9;
  for (int i = 0; i < 1500; ++i) {
    level = 3.0 + (level - 3.0) * 0.99;  // a steep start
    loss.push_back(level + 0.05 * noise(rng) + (i % 300 > 250 ? 0.5 : 0.0));
  }
  const BruteForce b = brute_force(loss);
  EXPECT_GE(b.events, 3);
  EXPECT_GT(b.spike_steps, b.events);
  expect_spikes_as_brute_force(loss);
  // Equal losses (MAD 0): a loss above the median by any amount is a spike.
  std::vector<double> flat(60, 4.0);
  flat[55] = 4.0 + 1e-9;
  expect_spikes_as_brute_force(flat);
  EXPECT_EQ(compute_instability(curve_of(flat), 1.0).largest_spike_step, 56);
}

TEST(Instability, ClippedFractionAndTheLargestGradientNorm) {
  const std::vector<double> loss(8, 5.0);
  // Step 3's norm equals the threshold: not clipped (norm > threshold); step 7's is unknown.
  const std::vector<double> norms = {0.5, 1.5, 1.0, 2.0, 0.25, 2.0, kNotAvailable, 0.75};
  Instability s = compute_instability(curve_of(loss, norms), 1.0);
  EXPECT_EQ(s.grad_norm_steps, 7);
  EXPECT_EQ(s.clipped_fraction, 3.0 / 7.0);  // steps 2, 4, 6
  EXPECT_EQ(s.max_grad_norm, 2.0);
  EXPECT_EQ(s.max_grad_norm_step, 4);  // the first of the two
  EXPECT_EQ(compute_instability(curve_of(loss, norms), 0.1).clipped_fraction, 1.0);
  EXPECT_EQ(compute_instability(curve_of(loss, norms), 5.0).clipped_fraction, 0.0);
  // Clipping off: nothing clipped, whether or not the norms are known.
  EXPECT_EQ(compute_instability(curve_of(loss, norms), 0.0).clipped_fraction, 0.0);
  EXPECT_EQ(compute_instability(curve_of(loss), 0.0).clipped_fraction, 0.0);
  // A threshold not known: the fraction is not available; the largest norm still is.
  s = compute_instability(curve_of(loss, norms), kNotAvailable);
  EXPECT_TRUE(std::isnan(s.clipped_fraction));
  EXPECT_EQ(s.max_grad_norm, 2.0);
  // No norm known (a curve recorded before them): neither is available.
  s = compute_instability(curve_of(loss), 1.0);
  EXPECT_EQ(s.grad_norm_steps, 0);
  EXPECT_TRUE(std::isnan(s.clipped_fraction));
  EXPECT_TRUE(std::isnan(s.max_grad_norm));
  EXPECT_FALSE(s.max_grad_norm_step.has_value());
  // A finished run's losses are finite.
  std::vector<LossPoint> bad = curve_of(loss, norms);
  bad[3].train_loss = std::nan("");
  EXPECT_THROW(compute_instability(bad, 1.0), Error);
  EXPECT_THROW(compute_instability(curve_of(loss), -1.0), Error);
}

// A result.json written before the instability was recorded has it computed from its curve;
// one that records it has its own.
TEST(Instability, RunsRecordedBeforeItHaveItFromTheirCurve) {
  const fs::path dir = fs::path(ATTNRES_SOURCE_DIR) / "tests/results/data";
  const RunResult old = read_run_result((dir / "hc-static-part/result.json").string());
  ASSERT_FALSE(old.instability.has_value());
  ASSERT_EQ(old.curve.size(), 128u);
  const std::optional<Instability> s = run_instability(old);
  ASSERT_TRUE(s.has_value());
  std::vector<double> loss;
  for (const LossPoint& p : old.curve) loss.push_back(p.train_loss);
  const BruteForce b = brute_force(loss);
  EXPECT_EQ(s->tested_steps, 78);
  EXPECT_EQ(s->spike_events, b.events);
  EXPECT_EQ(s->grad_norm_steps, 0);
  EXPECT_TRUE(std::isnan(s->clipped_fraction));  // no norms, and the threshold is not in result.json
  EXPECT_TRUE(std::isnan(s->max_grad_norm));

  RunResult recorded = old;
  recorded.instability = Instability{};
  recorded.instability->spike_events = 7;
  EXPECT_EQ(run_instability(recorded)->spike_events, 7);
  RunResult none = old;
  none.curve.clear();
  EXPECT_FALSE(run_instability(none).has_value());
}

// The "instability" object and the curve's "grad_norm", in train_result.json and result.json:
// written, read back, and checked.
TEST(Instability, SchemaReadsBackAndIsChecked) {
  const fs::path tmp = fs::temp_directory_path() / ("attnres-instability-" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  std::vector<double> loss = noisy_curve(120, 0.05, 6);
  loss[99] += 1.0;
  std::vector<double> norms(loss.size(), 0.5);
  norms[10] = 3.0;
  norms[0] = kNotAvailable;
  TrainResult t;
  t.params = 100;
  t.steps = static_cast<std::int64_t>(loss.size());
  t.curve = curve_of(loss, norms);
  t.instability = compute_instability(t.curve, 1.0);
  const std::string train = (tmp / "train_result.json").string();
  write_train_result(train, t);
  const std::string train_text = read_text_file(train);
  const json written = json::parse(train_text);
  EXPECT_FALSE(written["curve"][0].contains("grad_norm"));  // unknown: left out
  EXPECT_EQ(written["curve"][10]["grad_norm"], 3.0);
  EXPECT_EQ(written["instability"],
            json::parse(R"({"spike_window": 50, "spike_k": 6.0, "tested_steps": 70, "spike_events": 1,
                            "spike_steps": 1, "sustained_spike_events": 0, "largest_spike_step": 100,
                            "largest_spike_nats": )" + json(t.instability->largest_spike_nats).dump() + R"(,
                            "grad_norm_steps": 119, "clipped_fraction": )" + json(1.0 / 119).dump() + R"(,
                            "max_grad_norm": 3.0, "max_grad_norm_step": 11, "unstable": false})"));
  const TrainResult back = read_train_result(train);
  ASSERT_TRUE(back.instability.has_value());
  EXPECT_EQ(to_json(*back.instability), to_json(*t.instability));
  EXPECT_TRUE(std::isnan(back.curve[0].grad_norm));
  EXPECT_EQ(back.curve[10].grad_norm, 3.0);
  write_train_result(train, back);
  EXPECT_EQ(read_text_file(train), train_text);

  RunResult r;
  r.arm = "rd";
  r.seed = 1;
  r.params = 100;
  r.curve = back.curve;
  r.instability = back.instability;
  const std::string result = (tmp / "result.json").string();
  write_run_result(result, r);
  const std::string result_text = read_text_file(result);
  EXPECT_EQ(json::parse(result_text)["instability"], written["instability"]);
  write_run_result(result, read_run_result(result));
  EXPECT_EQ(read_text_file(result), result_text);
  // Without spikes or norms, their values are null.
  r.curve = curve_of(noisy_curve(60, 0.05, 7));
  r.instability = compute_instability(r.curve, 1.0);
  write_run_result(result, r);
  const json quiet = json::parse(read_text_file(result))["instability"];
  for (const char* key : {"largest_spike_step", "largest_spike_nats", "clipped_fraction", "max_grad_norm",
                          "max_grad_norm_step"})
    EXPECT_TRUE(quiet.at(key).is_null()) << key;
  EXPECT_EQ(quiet.at("unstable"), false);
  EXPECT_NO_THROW(read_run_result(result));

  struct Case {
    std::function<void(json&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["unstable"] = true; }, "key 'instability.unstable' is true with 0 sustained spike events; the rule: unstable = "},
      {[](json& j) { j["sustained_spike_events"] = 2; }, "key 'instability.sustained_spike_events' is larger than 'spike_events' (1)"},
      {[](json& j) { j["spike_events"] = 0; }, "key 'instability.spike_events' is 0 while 'spike_steps' is not"},
      {[](json& j) { j["spike_events"] = 2; }, "key 'instability.spike_events' is larger than 'spike_steps' (1)"},
      {[](json& j) { j["spike_steps"] = 71; }, "key 'instability.spike_steps' is larger than 'tested_steps' (70)"},
      {[](json& j) { j["largest_spike_step"] = nullptr; },
       "key 'instability.largest_spike_step' must be given when 'spike_steps' is above 0"},
      {[](json& j) { j["largest_spike_step"] = 50; }, "key 'instability.largest_spike_step' must be larger than 'spike_window' (50)"},
      {[](json& j) { j["largest_spike_nats"] = -0.5; }, "key 'instability.largest_spike_nats' must be positive"},
      {[](json& j) { j["clipped_fraction"] = 1.5; }, "key 'instability.clipped_fraction' must lie in [0, 1]"},
      {[](json& j) { j["max_grad_norm"] = -1.0; }, "key 'instability.max_grad_norm' must not be negative"},
      {[](json& j) { j["max_grad_norm_step"] = nullptr; },
       "key 'instability.max_grad_norm_step' must be given when 'grad_norm_steps' is above 0"},
      {[](json& j) { j["grad_norm_steps"] = 0; }, "key 'instability.clipped_fraction' must be 0 (clipping off) or null"},
      {[](json& j) { j["grad_norm_steps"] = 0, j["clipped_fraction"] = nullptr; },
       "key 'instability.max_grad_norm' must be null when 'grad_norm_steps' is 0"},
      {[](json& j) { j["spike_k"] = 0; }, "key 'instability.spike_k' must be positive"},
      {[](json& j) { j["spike_window"] = 0; }, "key 'instability.spike_window' must be an integer from 1"},
      {[](json& j) { j["tested_steps"] = -1; }, "key 'instability.tested_steps' must not be negative"},
      {[](json& j) { j.erase("grad_norm_steps"); }, "key 'instability.grad_norm_steps' is missing"},
      {[](json& j) { j["unstable"] = 1; }, "key 'instability.unstable' must be true or false"},
      {[](json& j) { j["spike_rule"] = "mad"; }, "key 'instability.spike_rule' is not part of this file's format"},
  };
  for (const std::string& path : {train, result}) {
    const std::string text = path == train ? train_text : result_text;
    for (const auto& c : cases) {
      std::ofstream(path) << [&] {
        json j = json::parse(text);
        c.edit(j["instability"]);
        return j.dump(1);
      }();
      const std::string msg = [&] {
        try {
          path == train ? (void)read_train_result(path) : (void)read_run_result(path);
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string("no error");
      }();
      EXPECT_NE(msg.find(path + ": " + c.want), std::string::npos) << msg;
    }
  }
  // A curve point's norm is a number >= 0, or null (unknown).
  json j = json::parse(train_text);
  j["curve"][2]["grad_norm"] = -1.0;
  std::ofstream(train) << j.dump(1);
  EXPECT_THROW(read_train_result(train), Error);
  j["curve"][2]["grad_norm"] = nullptr;
  std::ofstream(train) << j.dump(1);
  EXPECT_TRUE(std::isnan(read_train_result(train).curve[2].grad_norm));
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace attnres::results
