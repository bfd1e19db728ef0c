// What a training run reports as it goes: one JSON object per step and per evaluation in
// metrics.jsonl (rank 0), and the status line and messages on stderr (rank 0, with progress on).
#pragma once

#include <cstdint>
#include <string>

#include "train/evaluate.hpp"
#include "util/status_line.hpp"

namespace attnres {

class TrainLog {
 public:
  // root: this rank writes metrics.jsonl; progress: it also shows the status line and messages,
  // each prefixed with "label: " when a label is given.
  TrainLog(std::string metrics_path, bool root, bool progress, const std::string& label);

  void message(const std::string& text);
  // One optimizer step done (`step` steps in all, of total_steps), at tokens_per_sec so far.
  void step(std::int64_t step, std::int64_t total_steps, std::int64_t tokens_per_step, double loss, double lr,
            double grad_norm, double tokens_per_sec);
  void evaluation(std::int64_t step, std::int64_t tokens, const EvalResult& eval);

 private:
  void append_metrics(const std::string& line) const;

  std::string metrics_path_;
  bool root_;
  StatusLine status_;
  std::string prefix_;
};

}  // namespace attnres
