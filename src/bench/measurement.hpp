// The statistics of `attnres bench`: step times of one (implementation, arm, seq) pooled over
// rounds, and the summary of a paired run (median of per-step ratios with its interval).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/train_config.hpp"

namespace attnres::bench {

// The median of v (0 when empty).
double median(const std::vector<double>& v);

// The model of `arm` over the base config, sized for sequences of `seq` tokens; validated.
ModelConfig arm_config(const TrainConfig& base, const std::string& arm, int seq);

struct Cell {  // one (implementation, arm, seq) measurement, pooled over rounds
  std::string impl, arm;
  int seq = 0, batch = 0;
  std::vector<double> step_ms, cpu_ms, fb_ms, opt_ms;
  std::int64_t peak_rss = 0, start_rss = 0, params = 0;
  double loss_first = 0;
  std::string core;
  std::string precision;  // the matmul precision the worker ran: fp32 | bf16
  int threads = 0;

  double median_ms() const { return median(step_ms); }
  // Median over steps of CPU time / wall time: about `threads` when the run had its cores to
  // itself, lower when other processes took them (a contended measurement).
  double cores_used() const;
  double tokens_per_sec() const { return double(batch) * seq / (median_ms() / 1e3); }

  // Adds one worker's result (a JSON line of bench/worker.hpp or bench/torch_model.py): its step
  // times are appended; peak memory is the largest seen.
  void absorb(const nlohmann::json& worker_result);
};

struct Measurement {
  std::vector<Cell> cells;  // in the order first measured
  const Cell* find(const std::string& impl, const std::string& arm, int seq) const;
  Cell& get(const std::string& impl, const std::string& arm, int seq, int batch);  // adds it if new
};

// The JSON summary of a paired worker's result (arm b against arm a): the median per-step ratio
// b/a with its distribution-free 95% interval, range, both medians and all ratios.
nlohmann::json paired_summary(const nlohmann::json& worker_result, const std::string& a, const std::string& b,
                              int seq, int batch);

// Per pair (a, b, seq) measured in more than one process (--rounds): each process's ratio, their
// median and range, in the order first measured. The spread between processes is the noise a
// single process's interval leaves out.
nlohmann::json paired_across_processes(const nlohmann::json& paired);

}  // namespace attnres::bench
