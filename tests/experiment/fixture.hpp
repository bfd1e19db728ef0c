// A synthetic paired experiment directory with hand-computable statistics, in the runner's layout.
//
// Arms block (baseline), rd, rd-tied, prenorm (and mudd, when asked for); seeds 1, 2, 3; milestones
// 1000 … 8000 tokens. Per seed s, arm − block NLL differences are the same at every milestone and on
// the test split:
//   rd      −0.02 − 0.01·(s − 1)   (seed 3 has no result.json: a missing run)
//   rd-tied  0 exactly             (bit-identical to block)
//   prenorm +0.05 + 0.01·s
//   mudd    −0.01                  (three layers, with Q, K and V routes: see make_result)
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace attnres::experiment::testing {

inline constexpr std::int64_t kMilestones[] = {1000, 2000, 4000, 8000};

inline double base_nll(std::int64_t tokens, int seed) { return 6.0 - 0.3 * std::log2(tokens / 1000.0) + 0.01 * seed; }

inline double arm_offset(const std::string& arm, int seed) {
  if (arm == "mudd") return -0.01;
  if (arm == "rd") return -0.02 - 0.01 * (seed - 1);
  if (arm == "prenorm") return 0.05 + 0.01 * seed;
  return 0;
}

inline void write_json(const std::filesystem::path& path, const nlohmann::json& j) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << j.dump(2);
}

inline nlohmann::json make_result(const std::string& arm, int seed) {
  using nlohmann::json;
  json j = {{"arm", arm}, {"seed", seed}};
  j["params"] = arm == "rd" ? 1064 : arm == "prenorm" ? 990 : 1000;
  json ms = json::array();
  for (auto m : kMilestones) ms.push_back({{"tokens", m}, {"val_nll", base_nll(m, seed) + arm_offset(arm, seed)}});
  j["milestones"] = ms;
  j["test_nll"] = 5.2 + 0.01 * seed + arm_offset(arm, seed);
  j["tokens_per_sec"] = arm == "rd" ? 900.0 : 1000.0;
  j["peak_rss_bytes"] = arm == "rd" ? 220 << 20 : 200 << 20;
  j["step_time_ms"] = arm == "rd" ? 11.0 : 10.0;
  json curve = json::array();
  for (int i = 1; i <= 64; ++i) curve.push_back({{"tokens", i * 125}, {"train_loss", 5.5 + 3.0 / i + arm_offset(arm, seed)}});
  j["curve"] = curve;
  if (arm == "mudd") {
    // Blocks 0 (the embedding alone), 1 and 2; the Q, K and V ways' distributions. Means over seeds
    // 1–3: block 1 k_mean (0.2, 0.8), JS Q~V 0.1 and K~V 0.2; block 2 JS 0.2 and 0.3.
    const double s = 0.1 * seed;
    json l0 = {{"layer", 0}, {"sources", 1}, {"qk_mean", {1.0}}, {"k_mean", {1.0}}, {"v_mean", {1.0}},
               {"js_nats", 0.0}, {"js_k_nats", 0.0}};
    json l1 = {{"layer", 1}, {"sources", 2}, {"qk_mean", {0.5, 0.5}}, {"k_mean", {s, 1 - s}}, {"v_mean", {0.8, 0.2}},
               {"js_nats", 0.5 * s}, {"js_k_nats", s}};
    json l2 = {{"layer", 2}, {"sources", 3}, {"qk_mean", {0.2, 0.3, 0.5}}, {"k_mean", {0.6, 0.2, 0.2}},
               {"v_mean", {0.1, 0.1, 0.8}}, {"js_nats", 0.2}, {"js_k_nats", 0.3}};
    j["routing"] = {{"layers", {l0, l1, l2}}};
  } else if (arm != "prenorm") {
    // Layer 0 reads the embedding alone; layer 1 reads the embedding and one block.
    const double a = seed == 1 ? 0.2 : 0.4;  // seed mean over 1, 2: 0.3
    json l0 = {{"layer", 0}, {"sources", 1}, {"qk_mean", {1.0}}};
    json l1 = {{"layer", 1}, {"sources", 2}, {"qk_mean", {a, 1 - a}}};
    if (arm == "rd") {
      l0["v_mean"] = {1.0};
      l0["js_nats"] = 0.0;
      l1["v_mean"] = {0.8, 0.2};
      l1["js_nats"] = seed == 1 ? 0.1 : 0.2;
    }
    j["routing"] = {{"layers", {l0, l1}}};
  }
  return j;
}

// Writes the experiment under a fresh temporary directory, removed with the object.
class SyntheticExperiment {
 public:
  explicit SyntheticExperiment(bool with_mudd = false) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("attnres-exp-" + std::to_string(::getpid()) + "-" + info->test_suite_name() + "-" + info->name());
    std::filesystem::remove_all(dir_);
    using nlohmann::json;
    std::vector<std::string> arms = {"block", "rd", "rd-tied", "prenorm"};
    if (with_mudd) arms.push_back("mudd");
    json spec = {{"version", 1},
                 {"arms", arms},
                 {"baseline", "block"},
                 {"seeds", {1, 2, 3}},
                 {"tokens", 8000},
                 {"milestones", kMilestones},
                 {"preset", "tiny"},
                 {"model", {{"d_model", 64}, {"n_layers", 2}}},
                 {"train", {{"lr", 0.003}}}};
    write_json(dir_ / "experiment.json", spec);
    for (const std::string& arm : arms)
      for (int seed : {1, 2, 3})
        if (!(arm == "rd" && seed == 3)) write_json(result_path(arm, seed), make_result(arm, seed));
  }
  ~SyntheticExperiment() { std::filesystem::remove_all(dir_); }
  SyntheticExperiment(const SyntheticExperiment&) = delete;
  SyntheticExperiment& operator=(const SyntheticExperiment&) = delete;

  std::string dir() const { return dir_.string(); }
  std::filesystem::path result_path(const std::string& arm, int seed) const {
    return dir_ / "runs" / arm / ("seed-" + std::to_string(seed)) / "result.json";
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace attnres::experiment::testing
