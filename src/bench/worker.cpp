#include "bench/worker.hpp"

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "util/machine.hpp"
#include "dist/communicator.hpp"
#include "train/backend.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"
#include "util/threads.hpp"

namespace attnres::bench {

namespace {

using nlohmann::json;

constexpr double kLearningRate = 1e-3;
constexpr double kGradClip = 1.0;

// One model with its optimizer on a training backend: the unit every worker times.
class TimedTrainer {
 public:
  TimedTrainer(const ModelConfig& model, const WorkerOptions& o, kernels::MatmulPrecision precision)
      : batch_(o.batch), seq_(o.seq) {
    TrainConfig config;  // AdamW's defaults, as before the bench stepped through a backend
    config.model = model;
    config.batch_size = o.batch;
    config.seq_len = o.seq;
    config.precision = precision;
    backend_ = make_train_backend(o.device, config, o.batch, 1, comm_);
    backend_->init_params(o.seed, 0);
  }

  // One full training step on `tokens` [batch, seq+1]; appends its times when `record`.
  void step(std::span<const std::int32_t> tokens, bool record) {
    const double c0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    const double loss = backend_->accumulate(tokens, batch_, seq_);
    const auto t1 = std::chrono::steady_clock::now();
    backend_->finish_gradient(comm_, 1);
    backend_->update(kLearningRate, kGradClip);
    const auto t2 = std::chrono::steady_clock::now();
    const double c1 = process_cpu_seconds();
    if (steps_++ == 0) loss_first = loss;
    loss_last = loss;
    if (!record) return;
    fb_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    opt_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    step_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
    cpu_ms.push_back((c1 - c0) * 1e3);
  }

  std::int64_t params() const { return backend_->layout().total(); }

  std::vector<double> step_ms, cpu_ms, fb_ms, opt_ms;
  double loss_first = 0, loss_last = 0;

 private:
  int batch_, seq_;
  dist::Communicator comm_;  // a single process
  std::unique_ptr<TrainBackend> backend_;
  std::int64_t steps_ = 0;
};

void random_tokens(Rng& rng, int vocab, std::vector<std::int32_t>& tokens) {
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
}

std::vector<std::int32_t> token_buffer(const WorkerOptions& o) {
  return std::vector<std::int32_t>(static_cast<std::size_t>(o.batch) * static_cast<std::size_t>(o.seq + 1));
}

json time_arm(const ModelConfig& config, const WorkerOptions& o, kernels::MatmulPrecision precision) {
  const std::int64_t rss_start = proc_status_bytes("VmRSS");
  set_num_threads(o.threads);
  TimedTrainer trainer(config, o, precision);
  std::vector<std::int32_t> tokens = token_buffer(o);
  Rng rng(o.seed, "bench tokens");
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    random_tokens(rng, config.vocab_size, tokens);
    trainer.step(tokens, step >= o.warmup);
  }
  return json{{"impl", "attnres"},
              {"openblas_core", openblas_core()},
              {"precision", kernels::to_string(precision)},
              {"threads", num_threads()},
              {"batch", o.batch},
              {"seq", o.seq},
              {"warmup", o.warmup},
              {"step_ms", trainer.step_ms},
              {"cpu_ms", trainer.cpu_ms},
              {"forward_backward_ms", trainer.fb_ms},
              {"clip_adamw_ms", trainer.opt_ms},
              {"loss_first", trainer.loss_first},
              {"loss_last", trainer.loss_last},
              {"params", trainer.params()},
              {"peak_rss_bytes", peak_rss_bytes()},
              {"start_rss_bytes", rss_start}};
}

json time_pair(const ModelConfig& a, const ModelConfig& b, const WorkerOptions& o,
               kernels::MatmulPrecision precision_a, kernels::MatmulPrecision precision_b) {
  set_num_threads(o.threads);
  TimedTrainer ta(a, o, precision_a), tb(b, o, precision_b);
  std::vector<std::int32_t> tokens = token_buffer(o);
  Rng rng(o.seed, "bench tokens");
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    random_tokens(rng, a.vocab_size, tokens);
    const bool record = step >= o.warmup;
    if (step % 2 == 0) {
      ta.step(tokens, record);
      tb.step(tokens, record);
    } else {
      tb.step(tokens, record);
      ta.step(tokens, record);
    }
  }
  std::vector<double> ratios;
  for (std::size_t i = 0; i < ta.step_ms.size(); ++i) ratios.push_back(tb.step_ms[i] / ta.step_ms[i]);
  return json{{"impl", "attnres"},
              {"paired", true},
              {"threads", num_threads()},
              {"batch", o.batch},
              {"seq", o.seq},
              {"step_ms_a", ta.step_ms},
              {"step_ms_b", tb.step_ms},
              {"ratio_b_over_a", ratios}};
}

ModelConfig config_of(const std::string& text, const char* flag) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(flag, ": ", e.what());
  }
  return model_config_from_json(j, flag);
}

}  // namespace

void run_worker(const WorkerOptions& o) {
  const ModelConfig config = config_of(o.model_json, "--model-json");
  require(o.batch >= 1 && o.seq >= 1, "--worker needs --batch and one --seq");
  require(o.steps >= 1 && o.warmup >= 0, "--steps must be at least 1 and --warmup non-negative");
  const kernels::MatmulPrecision precision =
      o.precision.empty() ? kernels::MatmulPrecision::fp32 : kernels::parse_matmul_precision(o.precision);
  const kernels::MatmulPrecision paired_precision =
      o.paired_precision.empty() ? precision : kernels::parse_matmul_precision(o.paired_precision);
  const json r = o.paired_json.empty()
                     ? time_arm(config, o, precision)
                     : time_pair(config, config_of(o.paired_json, "--paired-json"), o, precision, paired_precision);
  std::printf("%s\n", r.dump().c_str());
  std::fflush(stdout);
}

}  // namespace attnres::bench
