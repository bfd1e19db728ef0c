// What `attnres bench` reports: the JSON object (--json, --json-file) and the table printed from it.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/gemm_rates.hpp"
#include "bench/measurement.hpp"
#include "train/train_config.hpp"

namespace attnres::bench {

struct Results {
  std::string name;  // the preset, or the config file
  TrainConfig base;  // as measured (--vocab, --precision applied)
  std::string device;
  std::vector<std::string> arms;
  std::vector<int> seqs;
  int steps = 0, warmup = 0, rounds = 0, threads = 0;
  std::string load_start, load_end;
  bool torch_on = false;
  nlohmann::json torch_info;
  std::string torch_precision;  // what torch ran (--torch-precision resolved)
  std::string torch_precision_flag;
  GemmRates gemm;
  RateReference fp32_reference;               // MFU of fp32 steps
  std::optional<RateReference> bf16_reference;  // MFU of bf16 steps: measured when a side runs bf16
  std::vector<ShapeRate> shapes;  // --gemm-only
  Measurement measurement;
  nlohmann::json paired = nlohmann::json::array();  // paired_summary() of each pair
};

// Its schema version, key "version" (docs/performance.md, "The benchmark"): raised when a key
// changes meaning or goes away.
inline constexpr int kBenchResultVersion = 1;
nlohmann::json results_json(const Results& r);
// The human-readable report of results_json(r).
void print_table(const Results& r, const nlohmann::json& out);

}  // namespace attnres::bench
