// Small experiment directories for `attnres report --pool` (experiment/pool.hpp): a study whose main
// arms are block and rd (or prenorm, block and rd: block not the main baseline), with an optional
// probe group of its own, each with chosen per-seed differences rd − block.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experiment/fixture.hpp"

namespace attnres::experiment::testing {

struct PoolStudyDesign {
  std::vector<double> deltas;  // rd − block per seed 1, 2, ...
  int d_model = 64, n_layers = 4;
  double lr = 0.004;
  std::int64_t tokens = 2000;
};

// block's NLL at the last milestone for seed s; rd's is this plus the design's delta.
inline double pool_block_nll(int seed) { return 6.0 + 0.013 * seed; }

inline nlohmann::json pool_run(const std::string& arm, int seed, std::int64_t tokens, double last_nll) {
  return {{"version", 1},
          {"arm", arm},
          {"seed", seed},
          {"params", 1000},
          {"milestones", {{{"tokens", tokens / 2}, {"val_nll", last_nll + 0.5}}, {{"tokens", tokens}, {"val_nll", last_nll}}}},
          {"test_nll", last_nll - 0.1},
          {"tokens_per_sec", 1000.0},
          {"peak_rss_bytes", 1 << 20},
          {"step_time_ms", 10.0}};
}

inline nlohmann::json pool_train(const PoolStudyDesign& d) {
  return {{"config_toml", "[model]\nd_model = " + std::to_string(d.d_model) + "\nn_layers = " + std::to_string(d.n_layers) +
                              "\n\n[train]\nlr = " + std::to_string(d.lr) + "\nprecision = \"fp32\"\n"}};
}

// Writes DIR/experiment.json (version 2) and the runs: the main design (arms block, rd; with
// `prenorm_baseline` the main baseline is prenorm and block an arm), and a probe "depth-2" when
// `probe` has deltas. Seeds 1 … the main design's delta count.
inline void write_pool_study(const std::filesystem::path& dir, const PoolStudyDesign& main,
                             const PoolStudyDesign* probe = nullptr, bool prenorm_baseline = false) {
  using nlohmann::json;
  std::filesystem::remove_all(dir);
  json seeds = json::array();
  for (std::size_t s = 1; s <= main.deltas.size(); ++s) seeds.push_back(s);
  std::vector<std::string> arms = prenorm_baseline ? std::vector<std::string>{"prenorm", "block", "rd"}
                                                   : std::vector<std::string>{"block", "rd"};
  json groups = json::array();
  if (probe != nullptr)
    groups.push_back({{"name", "depth-2"},
                      {"kind", "probe"},
                      {"arms", {"block", "rd"}},
                      {"baseline", "block"},
                      {"baseline_from_main", false},
                      {"tokens", probe->tokens},
                      {"milestones", {probe->tokens / 2, probe->tokens}},
                      {"settings", {"model.n_layers=" + std::to_string(probe->n_layers)}},
                      {"model", {{"d_model", probe->d_model}, {"n_layers", probe->n_layers}}},
                      {"train", pool_train(*probe)}});
  const json spec = {{"version", 2},
                     {"name", dir.filename().string()},
                     {"arms", arms},
                     {"baseline", arms.front()},
                     {"seeds", seeds},
                     {"tokens", main.tokens},
                     {"milestones", {main.tokens / 2, main.tokens}},
                     {"preset", "tiny"},
                     {"model", {{"d_model", main.d_model}, {"n_layers", main.n_layers}}},
                     {"train", pool_train(main)},
                     {"dataset", json::object()},
                     {"groups", groups}};
  write_json(dir / "experiment.json", spec);
  for (std::size_t i = 0; i < main.deltas.size(); ++i) {
    const int seed = static_cast<int>(i) + 1;
    const auto run = [&](const std::string& group, const std::string& arm, const PoolStudyDesign& d, double nll) {
      const std::filesystem::path base = group.empty() ? dir / "runs" : dir / "runs" / group;
      write_json(base / arm / ("seed-" + std::to_string(seed)) / "result.json", pool_run(arm, seed, d.tokens, nll));
    };
    run("", "block", main, pool_block_nll(seed));
    run("", "rd", main, pool_block_nll(seed) + main.deltas[i]);
    if (prenorm_baseline) run("", "prenorm", main, pool_block_nll(seed) + 0.05);
    if (probe != nullptr && i < probe->deltas.size()) {
      run("depth-2", "block", *probe, pool_block_nll(seed) + 0.2);
      run("depth-2", "rd", *probe, pool_block_nll(seed) + 0.2 + probe->deltas[i]);
    }
  }
}

}  // namespace attnres::experiment::testing
