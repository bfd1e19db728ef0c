// `attnres bench`: full training steps (forward, backward, clipping, AdamW) per arm, each arm
// in its own process, against the PyTorch eager implementation of the same model
// (bench/torch_model.py), with model FLOP utilisation against the OpenBLAS sgemm rate measured
// in the same run. See docs/performance.md.
#include <CLI/CLI.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cblas.h>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "experiment/runner.hpp"
#include "experiment/stats.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_bf16.hpp"
#include "model/model.hpp"
#include "model/param_layout.hpp"
#include "optim/adamw.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"
#include "util/threads.hpp"

extern char** environ;

namespace attnres::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kDefaultVocab = 8192;
constexpr double kTargetSpeedup = 3.0;   // attnres tokens/s over torch's, block and rd on `small`
constexpr double kTargetRdBlock = 1.02;  // rd over block: step time and peak memory
constexpr const char* kDefaultPython = "/usr/bin/python3";
constexpr const char* kTorchScript = "bench/torch_model.py";

struct BenchArgs {
  std::string preset, config;
  std::vector<std::string> settings;
  std::string arms = "block,rd";
  std::string seqs;  // comma-separated; empty: the config's seq_len
  int batch = 0;     // 0: tokens_per_step / seq
  std::int64_t tokens_per_step = 0;  // 0: the config's batch_size * seq_len
  int vocab = kDefaultVocab;
  int steps = 6;
  int warmup = 1;
  int rounds = 1;
  int threads = 0;
  std::uint64_t seed = 1;
  std::string torch = "auto";
  std::string python = kDefaultPython;
  std::string torch_script;
  bool json_out = false;
  std::string json_file;
  bool gemm_only = false;
  std::string precision;  // attnres' Linear GEMMs: fp32 | bf16; empty: the config's train.precision
  bool paired = true;  // also time every arm against the first one in one process, alternately
  // Hidden: run one measurement in this process and print it as one JSON line.
  bool worker = false;
  std::string model_json;
  std::string paired_json;  // with --worker: the second arm of a paired measurement
};

// ------------------------------------------------------------------------------------------
// Model FLOPs of one training step, per token (the single place that counts them).
//
// Convention (forward + backward = 3 x forward, every multiply-add = 2 FLOPs):
//   dense       6 * n_layers * (4 d^2 + 3 d F)       Q, K, V, O and the SwiGLU matrices
//   lm_head     6 * V * d                            logits and both of their gradients
//   attention   6 * n_layers * d * (T + 1)           causal: query t meets t+1 keys, mean (T+1)/2;
//                                                    QK^T and PV each 2 d per key, x3 for training
//   depth_reads 6 * sum over reads of n_s * d * (1 + Z + M)  per source: its RMS (2 d), a logit dot
//                                                    (2 d) for each of the Z routes with a query, a
//                                                    mix (2 d) for each of the M outputs; x3
// Not counted: embedding lookup, norms, RoPE, SwiGLU's pointwise part, softmaxes, AdamW.
// ------------------------------------------------------------------------------------------
struct FlopCount {
  double dense = 0, lm_head = 0, attention = 0, depth_reads = 0;
  double total() const { return dense + lm_head + attention + depth_reads; }
};

FlopCount training_flops_per_token(const ModelConfig& c, int seq) {
  FlopCount f;
  const double d = c.d_model, F = c.mlp_hidden, L = c.n_layers, V = c.vocab_size;
  f.dense = 6 * L * (4 * d * d + 3 * d * F);
  f.lm_head = 6 * V * d;
  f.attention = 6 * L * d * (double(seq) + 1);
  for (const ReadPlan& p : make_read_plans(c)) {
    const int with_query = p.n_routes - (p.uniform_value ? 1 : 0);
    const int outputs = p.average ? 1 : p.n_routes;
    f.depth_reads += 6 * double(p.sources.size()) * d * (1 + with_query + outputs);
  }
  return f;
}

// ------------------------------------------------------------------------------------------
// Small helpers.
// ------------------------------------------------------------------------------------------
std::vector<int> parse_seqs(const std::string& text) {
  std::vector<int> seqs;
  for (const auto& s : split_list(text)) {
    std::size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(used == s.size() && value >= 1, "--seq: '", s, "' is not a positive integer");
    seqs.push_back(value);
  }
  return seqs;
}

double median(const std::vector<double>& v) { return v.empty() ? 0 : experiment::median_interval(v).median; }

// A value of /proc/self/status in bytes (VmRSS: now; VmHWM: peak of this process image, which,
// unlike getrusage's ru_maxrss, does not inherit the parent's footprint across fork + exec).
std::int64_t proc_status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return std::atoll(line.c_str() + prefix.size()) * 1024;
  return 0;
}

double cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  return "unknown";
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string openblas_core() {
  const char* core = openblas_get_corename();
  return core != nullptr ? core : "unknown";
}

std::string getenv_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// Runs argv[0] (a path) with argv, stdout captured, stderr and the environment inherited.
struct ChildOutput {
  int status = -1;
  std::string out;
};

ChildOutput run_child(const std::vector<std::string>& argv) {
  int fds[2];
  require(::pipe(fds) == 0, "bench: cannot create a pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    fail("bench: cannot start '", argv[0], "'");
  }
  ChildOutput r;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) r.out.append(buf, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return r;
}

// The last line of a worker's stdout that parses as a JSON object.
json parse_worker_output(const ChildOutput& c, const std::string& what) {
  require(c.status == 0, "bench: the ", what, " worker failed (exit status ", c.status, "; its stderr is above)");
  std::stringstream in(c.out);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty() && line.front() == '{') last = line;
  require(!last.empty(), "bench: the ", what, " worker printed no result");
  try {
    return json::parse(last);
  } catch (const json::exception& e) {
    fail("bench: the ", what, " worker printed malformed JSON: ", e.what());
  }
}

// bench/torch_model.py: --torch-script, else beside the source tree the binary was built in
// (the build directory is inside the tree or beside it), else under the working directory.
std::string find_torch_script(const std::string& given) {
  if (!given.empty()) {
    require(fs::is_regular_file(given), "--torch-script: '", given, "' does not exist");
    return given;
  }
  std::error_code ec;
  fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (int up = 0; !ec && up < 6 && !dir.empty(); ++up, dir = dir.parent_path()) {
    if (fs::is_regular_file(dir / kTorchScript)) return (dir / kTorchScript).string();
    if (dir == dir.parent_path()) break;
  }
  if (fs::is_regular_file(kTorchScript)) return fs::absolute(kTorchScript).string();
  return "";
}

// ------------------------------------------------------------------------------------------
// GEMM reference rate: best of a few cblas_sgemm calls, row-major C = A B^T like a Linear.
// ------------------------------------------------------------------------------------------
double sgemm_gflops(std::int64_t m, std::int64_t n, std::int64_t k, int reps) {
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k)),
      c(static_cast<std::size_t>(m * n));
  Rng rng(7, "bench gemm");
  for (auto& x : a) x = static_cast<float>(rng.uniform() - 0.5);
  for (auto& x : b) x = static_cast<float>(rng.uniform() - 0.5);
  double best = 1e300;
  for (int r = 0; r <= reps; ++r) {  // the first call warms up and is not counted
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m), static_cast<blasint>(n),
                static_cast<blasint>(k), 1.0f, a.data(), static_cast<blasint>(k), b.data(),
                static_cast<blasint>(k), 0.0f, c.data(), static_cast<blasint>(n));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
  }
  return 2.0 * double(m) * double(n) * double(k) / best / 1e9;
}

struct GemmRates {
  double square = 0;  // 1024 x 1024 x 1024
  double model = 0;   // the model's largest trunk GEMM: [B*T, d] x [d, mlp_hidden]
  std::string model_shape;
};

GemmRates measure_gemm(const ModelConfig& c, std::int64_t tokens) {
  GemmRates g;
  g.square = sgemm_gflops(1024, 1024, 1024, 5);
  g.model = sgemm_gflops(tokens, c.mlp_hidden, c.d_model, 3);
  g.model_shape = std::to_string(tokens) + "x" + std::to_string(c.mlp_hidden) + "x" + std::to_string(c.d_model);
  return g;
}

// The model's Linear GEMMs one by one, fp32 (OpenBLAS sgemm, kernels::gemm) against bf16
// (kernels::gemm_bf16): best of `reps` calls after one warm-up, C = op(A) op(B) + beta C as the model
// calls them (beta 1 for the weight gradient).
struct ShapeRate {
  std::string layer, pass;
  std::int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
  double fp32 = 0, bf16 = 0;
};

double gemm_rate(bool bf16, const ShapeRate& s, int reps) {
  const std::int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  std::vector<float> a(static_cast<std::size_t>(s.m * s.k)), b(static_cast<std::size_t>(s.k * s.n)),
      c(static_cast<std::size_t>(s.m * s.n), 0.0f);
  Rng rng(7, "bench gemm shapes");
  for (auto& x : a) x = static_cast<float>(rng.uniform() - 0.5);
  for (auto& x : b) x = static_cast<float>(rng.uniform() - 0.5);
  const float beta = s.pass == "dW" ? 1.0f : 0.0f;
  double best = 1e300;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (bf16) kernels::gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, beta, c.data(), s.n);
    else kernels::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, beta, c.data(), s.n);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, sec);
  }
  return 2.0 * double(s.m) * double(s.n) * double(s.k) / best / 1e9;
}

std::vector<ShapeRate> measure_linear_shapes(const ModelConfig& c, std::int64_t tokens, int reps) {
  struct Layer {
    const char* name;
    std::int64_t in, out, rows;
  };
  const std::int64_t d = c.d_model, F = c.mlp_hidden, V = c.vocab_size;
  // The LM head runs in chunks of 256 rows (kernels/cross_entropy.cpp, model.cpp's kCrossEntropyRows).
  const Layer layers[] = {{"q/k/v/o", d, d, tokens}, {"mlp gate/up", d, F, tokens}, {"mlp down", F, d, tokens},
                          {"lm head", d, V, std::min<std::int64_t>(tokens, 256)}};
  std::vector<ShapeRate> out;
  for (const Layer& l : layers) {
    // forward y = x W^T; dX = dY W; dW += dY^T X (kernels/gemm.cpp).
    out.push_back({l.name, "forward", l.rows, l.out, l.in, false, true});
    out.push_back({l.name, "dX", l.rows, l.in, l.out, false, false});
    out.push_back({l.name, "dW", l.out, l.in, l.rows, true, false});
  }
  for (auto& s : out) {
    s.fp32 = gemm_rate(false, s, reps);
    s.bf16 = gemm_rate(true, s, reps);
  }
  return out;
}

std::string bf16_backend() { return kernels::amx_bf16_available() ? "AMX" : "fallback (bf16-rounded sgemm)"; }

// ------------------------------------------------------------------------------------------
// The workers.
// ------------------------------------------------------------------------------------------
// One model with its optimizer, stepped on random tokens: the unit every worker times.
class TimedTrainer {
 public:
  TimedTrainer(const ModelConfig& config, int batch, int seq, std::uint64_t seed, kernels::MatmulPrecision precision)
      : config_(config), batch_(batch), seq_(seq), model_(config, batch, seq, true), opt_(model_.layout(), AdamWConfig{}) {
    init_params<float>(model_.layout(), seed, model_.params());
    model_.set_matmul_precision(precision);
  }

  // One full training step on `tokens` [batch, seq+1]; appends its times when `record`.
  void step(std::span<const std::int32_t> tokens, bool record) {
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    const double loss = model_.forward_backward(tokens, batch_, seq_);
    const auto t1 = std::chrono::steady_clock::now();
    clip_grad_norm<float>(model_.grads(), 1.0);
    opt_.step(model_.params(), model_.grads(), 1e-3);
    const auto t2 = std::chrono::steady_clock::now();
    const double c1 = cpu_seconds();
    if (steps_++ == 0) loss_first = loss;
    loss_last = loss;
    if (!record) return;
    fb_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    opt_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    step_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
    cpu_ms.push_back((c1 - c0) * 1e3);
  }

  std::int64_t params() const { return model_.layout().total(); }

  std::vector<double> step_ms, cpu_ms, fb_ms, opt_ms;
  double loss_first = 0, loss_last = 0;

 private:
  ModelConfig config_;
  int batch_, seq_;
  Model<float> model_;
  AdamW<float> opt_;
  std::int64_t steps_ = 0;
};

void random_tokens(Rng& rng, int vocab, std::vector<std::int32_t>& tokens) {
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
}

// One arm, one shape, alone in this process (so its peak memory is its own).
json run_worker(const ModelConfig& config, int batch, int seq, int steps, int warmup, int threads,
                std::uint64_t seed, kernels::MatmulPrecision precision) {
  const std::int64_t rss_start = proc_status_bytes("VmRSS");
  set_num_threads(threads);
  TimedTrainer trainer(config, batch, seq, seed, precision);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq + 1));
  Rng rng(seed, "bench tokens");
  for (int step = 0; step < warmup + steps; ++step) {
    random_tokens(rng, config.vocab_size, tokens);
    trainer.step(tokens, step >= warmup);
  }
  return json{{"impl", "attnres"},
              {"openblas_core", openblas_core()},
              {"precision", kernels::to_string(precision)},
              {"threads", num_threads()},
              {"batch", batch},
              {"seq", seq},
              {"warmup", warmup},
              {"step_ms", trainer.step_ms},
              {"cpu_ms", trainer.cpu_ms},
              {"forward_backward_ms", trainer.fb_ms},
              {"clip_adamw_ms", trainer.opt_ms},
              {"loss_first", trainer.loss_first},
              {"loss_last", trainer.loss_last},
              {"params", trainer.params()},
              {"peak_rss_bytes", proc_status_bytes("VmHWM")},
              {"start_rss_bytes", rss_start}};
}

// Two arms in one process, stepped alternately on the same tokens (A B, then B A, ...), so that
// both see the same machine from one moment to the next: the per-step ratio B/A is far steadier
// on a shared machine than the ratio of two separate runs. (Memory is not measured here.)
json run_paired_worker(const ModelConfig& a, const ModelConfig& b, int batch, int seq, int steps, int warmup,
                       int threads, std::uint64_t seed, kernels::MatmulPrecision precision) {
  set_num_threads(threads);
  TimedTrainer ta(a, batch, seq, seed, precision), tb(b, batch, seq, seed, precision);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq + 1));
  Rng rng(seed, "bench tokens");
  for (int step = 0; step < warmup + steps; ++step) {
    random_tokens(rng, a.vocab_size, tokens);
    const bool record = step >= warmup;
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
              {"batch", batch},
              {"seq", seq},
              {"step_ms_a", ta.step_ms},
              {"step_ms_b", tb.step_ms},
              {"ratio_b_over_a", ratios}};
}

// ------------------------------------------------------------------------------------------
// The parent: spawn the workers, pool their step times, report.
// ------------------------------------------------------------------------------------------
struct Cell {  // one (implementation, arm, seq) measurement, pooled over rounds
  std::string impl, arm;
  int seq = 0, batch = 0;
  std::vector<double> step_ms, cpu_ms, fb_ms, opt_ms;
  std::int64_t peak_rss = 0, start_rss = 0, params = 0;
  double loss_first = 0;
  std::string core;
  int threads = 0;

  double median_ms() const { return median(step_ms); }
  // Median over steps of CPU time / wall time: about `threads` when the run had its cores to
  // itself, lower when other processes took them (a contended measurement).
  double cores_used() const {
    std::vector<double> r;
    for (std::size_t i = 0; i < step_ms.size() && i < cpu_ms.size(); ++i) r.push_back(cpu_ms[i] / step_ms[i]);
    return median(r);
  }
  double tokens_per_sec() const { return double(batch) * seq / (median_ms() / 1e3); }
};

struct Measurement {
  std::vector<Cell> cells;
  const Cell* find(const std::string& impl, const std::string& arm, int seq) const {
    for (const auto& c : cells)
      if (c.impl == impl && c.arm == arm && c.seq == seq) return &c;
    return nullptr;
  }
  Cell& get(const std::string& impl, const std::string& arm, int seq, int batch) {
    for (auto& c : cells)
      if (c.impl == impl && c.arm == arm && c.seq == seq) return c;
    cells.push_back(Cell{impl, arm, seq, batch, {}, {}, {}, {}, 0, 0, 0, 0, "", 0});
    return cells.back();
  }
};

void absorb(Cell& cell, const json& r) {
  auto append = [](std::vector<double>& to, const json& j, const char* key) {
    if (j.contains(key))
      for (double x : j.at(key).get<std::vector<double>>()) to.push_back(x);
  };
  append(cell.step_ms, r, "step_ms");
  append(cell.cpu_ms, r, "cpu_ms");
  append(cell.fb_ms, r, "forward_backward_ms");
  append(cell.opt_ms, r, "clip_adamw_ms");
  cell.peak_rss = std::max(cell.peak_rss, r.at("peak_rss_bytes").get<std::int64_t>());
  cell.start_rss = r.value("start_rss_bytes", std::int64_t(0));
  cell.params = r.value("params", std::int64_t(0));
  cell.loss_first = r.value("loss_first", 0.0);
  cell.core = r.value("openblas_core", std::string("unknown"));
  cell.threads = r.value("threads", 0);
}

ModelConfig arm_config(const TrainConfig& base, const std::string& arm, int seq) {
  ModelConfig m = experiment::apply_arm(base.model, arm);
  m.max_seq_len = std::max(m.max_seq_len, seq);
  m.validate();
  return m;
}

void run_bench(const BenchArgs& a) {
  std::string preset_name = a.preset;
  if (preset_name.empty() && a.config.empty()) preset_name = "small";
  TrainConfig base = load_train_config(preset_name, a.config, a.settings);
  if (base.model.vocab_size == 0) base.model.vocab_size = a.vocab;
  if (!a.precision.empty()) base.precision = kernels::parse_matmul_precision(a.precision);
  const std::string precision = kernels::to_string(base.precision);
  require(a.steps >= 1, "--steps must be at least 1");
  require(a.warmup >= 0, "--warmup must be non-negative");
  require(a.rounds >= 1, "--rounds must be at least 1");
  require(a.threads >= 0, "--threads must be non-negative (0: all cores)");
  require(a.torch == "auto" || a.torch == "on" || a.torch == "off", "--torch must be auto, on or off");

  const std::vector<std::string> arms = split_list(a.arms);
  require(!arms.empty() || a.gemm_only, "--arms must name at least one arm");
  for (const auto& arm : arms) experiment::apply_arm(base.model, arm);  // validates the names
  std::vector<int> seqs = parse_seqs(a.seqs);
  if (seqs.empty()) seqs.push_back(base.seq_len);
  const std::int64_t tokens_per_step =
      a.tokens_per_step > 0 ? a.tokens_per_step : std::int64_t(base.batch_size) * base.seq_len;
  auto batch_for = [&](int seq) {
    return a.batch > 0 ? a.batch : static_cast<int>(std::max<std::int64_t>(1, tokens_per_step / seq));
  };
  for (int seq : seqs)
    for (const auto& arm : arms) arm_config(base, arm, seq);  // validate before any work

  set_num_threads(a.threads);
  const int threads = num_threads();
  const std::string load_start = load_average();
  std::fprintf(stderr, "bench: %s, %d threads, OpenBLAS core %s (OPENBLAS_CORETYPE=%s), load average %s\n",
               cpu_model().c_str(), threads, openblas_core().c_str(),
               getenv_or("OPENBLAS_CORETYPE", "unset").c_str(), load_start.c_str());
  std::fprintf(stderr, "bench: attnres matmul precision %s%s\n", precision.c_str(),
               base.precision == kernels::MatmulPrecision::bf16 ? (" (" + bf16_backend() + ")").c_str() : "");

  // The torch side: probe once.
  std::string script;
  json torch_info;
  bool torch_on = false;
  if (a.torch != "off" && !a.gemm_only) {
    script = find_torch_script(a.torch_script);
    std::string why;
    if (script.empty()) why = "bench/torch_model.py not found (give --torch-script)";
    else if (!fs::exists(a.python)) why = a.python + " not found";
    else {
      const ChildOutput probe = run_child({a.python, script, "--probe"});
      try {
        torch_info = parse_worker_output(probe, "torch probe");
        torch_on = true;
      } catch (const Error& e) {
        why = e.what();
      }
    }
    require(torch_on || a.torch == "auto", "--torch on: ", why);
    if (!torch_on) std::fprintf(stderr, "bench: skipping the PyTorch comparison: %s\n", why.c_str());
  }

  std::fprintf(stderr, "bench: measuring the sgemm reference rate...\n");
  const std::int64_t gemm_tokens = std::int64_t(batch_for(seqs.front())) * seqs.front();
  GemmRates gemm = measure_gemm(base.model, gemm_tokens);
  std::fprintf(stderr, "bench: sgemm 1024^3 %.1f GFLOP/s, %s %.1f GFLOP/s\n", gemm.square, gemm.model_shape.c_str(),
               gemm.model);
  std::vector<ShapeRate> shapes;
  if (a.gemm_only) {
    std::fprintf(stderr, "bench: the model's Linear GEMMs, fp32 sgemm and bf16...\n");
    shapes = measure_linear_shapes(base.model, gemm_tokens, 3);
  }

  Measurement m;
  if (!a.gemm_only) {
    // The running binary itself, even if the file was rebuilt or removed since it started.
    const std::string self = "/proc/self/exe";
    for (int round = 0; round < a.rounds; ++round)
      for (int seq : seqs)
        for (std::size_t i = 0; i < arms.size(); ++i) {
          // Odd rounds run the arms in reverse order, so a slow drift in the machine's load
          // favours no arm (A B, B A, ...).
          const std::string& arm = round % 2 == 0 ? arms[i] : arms[arms.size() - 1 - i];
          const int batch = batch_for(seq);
          const std::string model_json = json(arm_config(base, arm, seq)).dump();
          const std::vector<std::string> common = {
              "--batch", std::to_string(batch),   "--seq",     std::to_string(seq),
              "--steps", std::to_string(a.steps), "--warmup",  std::to_string(a.warmup),
              "--threads", std::to_string(threads), "--seed",  std::to_string(a.seed)};
          std::vector<std::string> impls = {"attnres"};
          if (torch_on) impls.push_back("torch");
          for (const auto& impl : impls) {
            std::vector<std::string> argv;
            if (impl == "attnres") argv = {self, "bench", "--worker", "--model-json", model_json, "--precision", precision};
            else argv = {a.python, script, "--model-json", model_json};
            argv.insert(argv.end(), common.begin(), common.end());
            std::fprintf(stderr, "bench: round %d/%d  %-7s %-10s T=%-5d B=%-3d ... ", round + 1, a.rounds, impl.c_str(),
                         arm.c_str(), seq, batch);
            std::fflush(stderr);
            const json r = parse_worker_output(run_child(argv), impl + " " + arm);
            Cell& cell = m.get(impl, arm, seq, batch);
            absorb(cell, r);
            const double ms = median(r.at("step_ms").get<std::vector<double>>());
            std::fprintf(stderr, "%.0f ms/step, %.0f tokens/s, peak %.0f MB\n", ms, double(batch) * seq / (ms / 1e3),
                         double(r.at("peak_rss_bytes").get<std::int64_t>()) / 1e6);
          }
        }
  }
  // Paired: the first arm against each other arm, in one process, alternate steps.
  json paired = json::array();
  if (!a.gemm_only && a.paired && arms.size() >= 2) {
    for (int seq : seqs)
      for (std::size_t i = 1; i < arms.size(); ++i) {
        const int batch = batch_for(seq);
        std::fprintf(stderr, "bench: paired  attnres %s vs %s T=%-5d B=%-3d (one process, alternate steps) ... ",
                     arms[i].c_str(), arms[0].c_str(), seq, batch);
        std::fflush(stderr);
        const std::vector<std::string> argv = {
            "/proc/self/exe", "bench", "--worker", "--model-json", json(arm_config(base, arms[0], seq)).dump(),
            "--paired-json", json(arm_config(base, arms[i], seq)).dump(), "--batch", std::to_string(batch),
            "--seq", std::to_string(seq), "--steps", std::to_string(a.steps), "--warmup", std::to_string(a.warmup),
            "--threads", std::to_string(threads), "--seed", std::to_string(a.seed), "--precision", precision};
        const json r = parse_worker_output(run_child(argv), "paired " + arms[i] + " " + arms[0]);
        const auto ratios = r.at("ratio_b_over_a").get<std::vector<double>>();
        const experiment::MedianInterval ratio = experiment::median_interval(ratios);
        std::fprintf(stderr, "step time ratio %.3f (95%% CI %.3f-%.3f)\n", ratio.median, ratio.low, ratio.high);
        paired.push_back({{"seq", seq},
                          {"batch", batch},
                          {"a", arms[0]},
                          {"b", arms[i]},
                          {"step_time_ratio", ratio.median},
                          {"ratio_ci95_low", ratio.low},
                          {"ratio_ci95_high", ratio.high},
                          {"ratio_min", *std::min_element(ratios.begin(), ratios.end())},
                          {"ratio_max", *std::max_element(ratios.begin(), ratios.end())},
                          {"a_ms_median", median(r.at("step_ms_a").get<std::vector<double>>())},
                          {"b_ms_median", median(r.at("step_ms_b").get<std::vector<double>>())},
                          {"ratios", ratios}});
      }
  }
  const std::string load_end = load_average();
  if (!m.cells.empty()) {  // measured again after the runs: the reference is the better of the two
    const GemmRates again = measure_gemm(base.model, gemm_tokens);
    std::fprintf(stderr, "bench: sgemm again: 1024^3 %.1f GFLOP/s, %s %.1f GFLOP/s\n", again.square,
                 again.model_shape.c_str(), again.model);
    gemm.square = std::max(gemm.square, again.square);
    gemm.model = std::max(gemm.model, again.model);
  }

  // ---- results
  json out;
  out["machine"] = {{"cpu", cpu_model()},
                    {"cores", static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))},
                    {"load_average_start", load_start},
                    {"load_average_end", load_end}};
  out["threads"] = threads;
  out["openblas_core"] = openblas_core();
  out["openblas_coretype_env"] = getenv_or("OPENBLAS_CORETYPE", "");
  out["precision"] = {{"attnres", precision}, {"torch", "fp32"}, {"bf16_backend", bf16_backend()}};
  out["omp_wait_policy_env"] = getenv_or("OMP_WAIT_POLICY", "");
  out["torch"] = torch_on ? torch_info : json(nullptr);
  out["gemm"] = {{"sgemm_1024_gflops", gemm.square}, {"model_shape", gemm.model_shape}, {"model_shape_gflops", gemm.model}};
  if (!shapes.empty()) {
    json js = json::array();
    for (const ShapeRate& s : shapes)
      js.push_back({{"layer", s.layer}, {"pass", s.pass}, {"m", s.m}, {"n", s.n}, {"k", s.k}, {"trans_a", s.ta},
                    {"trans_b", s.tb}, {"fp32_gflops", s.fp32}, {"bf16_gflops", s.bf16}});
    out["gemm"]["linear_shapes"] = js;
  }
  out["config"] = json(base.model);
  out["preset"] = preset_name.empty() ? a.config : preset_name;
  out["steps"] = a.steps;
  out["warmup"] = a.warmup;
  out["rounds"] = a.rounds;
  json runs = json::array();
  for (const Cell& c : m.cells) {
    const FlopCount f = training_flops_per_token(arm_config(base, c.arm, c.seq), c.seq);
    const double tps = c.tokens_per_sec();
    runs.push_back({{"impl", c.impl},
                    {"arm", c.arm},
                    {"seq", c.seq},
                    {"batch", c.batch},
                    {"steps_timed", c.step_ms.size()},
                    {"step_ms_median", c.median_ms()},
                    {"step_ms_min", *std::min_element(c.step_ms.begin(), c.step_ms.end())},
                    {"step_ms", c.step_ms},
                    {"cpu_ms_median", median(c.cpu_ms)},
                    {"cores_used", c.cores_used()},
                    {"forward_backward_ms_median", c.fb_ms.empty() ? json(nullptr) : json(median(c.fb_ms))},
                    {"clip_adamw_ms_median", c.opt_ms.empty() ? json(nullptr) : json(median(c.opt_ms))},
                    {"tokens_per_sec", tps},
                    {"peak_rss_bytes", c.peak_rss},
                    {"start_rss_bytes", c.start_rss},
                    {"params", c.params},
                    {"loss_first", c.loss_first},
                    {"openblas_core", c.core},
                    {"flops_per_token", {{"dense", f.dense}, {"lm_head", f.lm_head}, {"attention", f.attention},
                                         {"depth_reads", f.depth_reads}, {"total", f.total()}}},
                    {"model_gflops", f.total() * tps / 1e9},
                    {"mfu_vs_sgemm_1024", f.total() * tps / 1e9 / gemm.square}});
  }
  out["runs"] = runs;
  json vs_torch = json::array(), rd_block = json::array();
  for (int seq : seqs) {
    for (const auto& arm : arms) {
      const Cell* ours = m.find("attnres", arm, seq);
      const Cell* theirs = m.find("torch", arm, seq);
      if (ours != nullptr && theirs != nullptr)
        vs_torch.push_back({{"arm", arm},
                            {"seq", seq},
                            {"speedup", ours->tokens_per_sec() / theirs->tokens_per_sec()},
                            {"meets_target", ours->tokens_per_sec() / theirs->tokens_per_sec() >= kTargetSpeedup},
                            {"peak_rss_ratio", double(ours->peak_rss) / double(theirs->peak_rss)}});
    }
    for (const std::string impl : {"attnres", "torch"}) {
      const Cell* rd = m.find(impl, "rd", seq);
      const Cell* block = m.find(impl, "block", seq);
      if (rd != nullptr && block != nullptr)
        rd_block.push_back({{"impl", impl},
                            {"seq", seq},
                            {"step_time_ratio", rd->median_ms() / block->median_ms()},
                            {"cpu_time_ratio", median(rd->cpu_ms) / median(block->cpu_ms)},
                            {"peak_rss_ratio", double(rd->peak_rss) / double(block->peak_rss)},
                            {"peak_rss_delta_bytes", rd->peak_rss - block->peak_rss},
                            {"meets_target", rd->median_ms() / block->median_ms() <= kTargetRdBlock &&
                                                 double(rd->peak_rss) / double(block->peak_rss) <= kTargetRdBlock}});
    }
  }
  out["targets"] = {{"speedup_vs_torch_min", kTargetSpeedup}, {"rd_over_block_max", kTargetRdBlock}};
  out["attnres_vs_torch"] = vs_torch;
  out["paired"] = paired;
  out["rd_vs_block"] = rd_block;

  if (!a.json_file.empty()) {
    std::ofstream f(a.json_file);
    f << out.dump(2) << "\n";
    require(f.good(), "--json-file: cannot write '", a.json_file, "'");
  }
  if (a.json_out) {
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  const ModelConfig& mc = base.model;
  std::printf("attnres bench: %s (d=%d, %d layers, %d heads, mlp %d, %d blocks, vocab %d, %s embeddings)\n",
              out["preset"].get<std::string>().c_str(), mc.d_model, mc.n_layers, mc.n_heads, mc.mlp_hidden,
              mc.n_blocks, mc.vocab_size, mc.tie_embeddings ? "tied" : "untied");
  std::printf("machine: %s, %ld cores; %d threads; load average %s at start, %s at end\n", cpu_model().c_str(),
              ::sysconf(_SC_NPROCESSORS_ONLN), threads, load_start.c_str(), load_end.c_str());
  std::printf("OpenBLAS core: %s (OPENBLAS_CORETYPE=%s)", openblas_core().c_str(),
              getenv_or("OPENBLAS_CORETYPE", "unset").c_str());
  if (torch_on)
    std::printf("; torch %s, its OpenBLAS core: %s", torch_info.value("torch_version", "?").c_str(),
                torch_info.value("openblas_core", "?").c_str());
  std::printf("\nmatmul precision: attnres %s%s", precision.c_str(),
              base.precision == kernels::MatmulPrecision::bf16 ? (" (" + bf16_backend() + ")").c_str() : "");
  if (torch_on) std::printf(", torch fp32");
  std::printf("\nOMP_WAIT_POLICY: attnres %s", getenv_or("OMP_WAIT_POLICY", "unset").c_str());
  if (torch_on) std::printf(", torch %s", torch_info.value("omp_wait_policy", "?").c_str());
  std::printf("\nsgemm reference: 1024^3 %.1f GFLOP/s, %s %.1f GFLOP/s (best of a few, before and after the runs)\n", gemm.square,
              gemm.model_shape.c_str(), gemm.model);
  if (!shapes.empty()) {
    std::printf("\nLinear GEMMs of the model (m x n x k, best of 3; bf16: %s):\n", bf16_backend().c_str());
    std::printf("%-12s %-8s %18s %6s %12s %12s %8s\n", "layer", "pass", "m x n x k", "op", "fp32 GFLOP/s",
                "bf16 GFLOP/s", "ratio");
    for (const ShapeRate& s : shapes) {
      const std::string dims = std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
      std::printf("%-12s %-8s %18s %6s %12.1f %12.1f %7.2fx\n", s.layer.c_str(), s.pass.c_str(), dims.c_str(),
                  s.ta ? "AT B" : s.tb ? "A BT" : "A B", s.fp32, s.bf16, s.bf16 / s.fp32);
    }
  }
  if (m.cells.empty()) return;
  std::printf("timing: median over %d steps x %d round(s) after %d warm-up steps, each run in its own process\n\n",
              a.steps, a.rounds, a.warmup);
  std::printf("%-8s %-10s %6s %4s %9s %9s %6s %10s %9s %8s %8s %7s\n", "impl", "arm", "seq", "B", "step ms",
              "min ms", "cores", "tokens/s", "peak MB", "start MB", "GFLOP/s", "MFU");
  for (const auto& r : runs)
    std::printf("%-8s %-10s %6d %4d %9.0f %9.0f %6.2f %10.0f %9.0f %8.0f %8.1f %6.1f%%\n",
                r["impl"].get<std::string>().c_str(), r["arm"].get<std::string>().c_str(), r["seq"].get<int>(),
                r["batch"].get<int>(), r["step_ms_median"].get<double>(), r["step_ms_min"].get<double>(),
                r["cores_used"].get<double>(),
                r["tokens_per_sec"].get<double>(), double(r["peak_rss_bytes"].get<std::int64_t>()) / 1e6,
                double(r["start_rss_bytes"].get<std::int64_t>()) / 1e6, r["model_gflops"].get<double>(),
                100 * r["mfu_vs_sgemm_1024"].get<double>());
  std::printf("(step ms: median wall-clock time per step, min ms: the fastest step; cores: median CPU time / wall\n"
              " time per step, below the thread count when other processes took the cores; tokens/s, GFLOP/s and\n"
              " MFU use the median; peak MB: VmHWM of the worker;\n"
              " start MB: its resident memory before building the model; MFU: model FLOPs/s over the sgemm rate)\n");
  if (!vs_torch.empty()) {
    std::printf("\nattnres vs torch (tokens/s ratio; target >= 3x for block and rd):\n");
    for (const auto& r : vs_torch)
      std::printf("  %-10s T=%-5d %5.2fx   peak memory %.2fx of torch's\n", r["arm"].get<std::string>().c_str(),
                  r["seq"].get<int>(), r["speedup"].get<double>(), r["peak_rss_ratio"].get<double>());
  }
  if (!rd_block.empty()) {
    std::printf("\nrd / block (targets: step time <= 1.02, peak memory <= 1.02):\n");
    for (const auto& r : rd_block)
      std::printf("  %-8s T=%-5d step time %.3f (cpu time %.3f), peak memory %.3f (%+.1f MB)\n",
                  r["impl"].get<std::string>().c_str(), r["seq"].get<int>(), r["step_time_ratio"].get<double>(),
                  r["cpu_time_ratio"].get<double>(), r["peak_rss_ratio"].get<double>(),
                  double(r["peak_rss_delta_bytes"].get<std::int64_t>()) / 1e6);
  }
  if (!paired.empty()) {
    std::printf("\nattnres paired in one process, alternate steps (median of per-step ratios, its distribution-free\n"
                "95%% confidence interval, range; more --steps narrow the interval):\n");
    for (const auto& r : paired)
      std::printf("  %s / %s T=%-5d step time %.3f (95%% CI %.3f-%.3f; range %.3f-%.3f over %zu step pairs)\n",
                  r["b"].get<std::string>().c_str(), r["a"].get<std::string>().c_str(), r["seq"].get<int>(),
                  r["step_time_ratio"].get<double>(), r["ratio_ci95_low"].get<double>(),
                  r["ratio_ci95_high"].get<double>(), r["ratio_min"].get<double>(), r["ratio_max"].get<double>(),
                  r["ratios"].size());
  }
  const Cell* any = m.cells.empty() ? nullptr : &m.cells.front();
  if (any != nullptr) {
    const FlopCount f = training_flops_per_token(arm_config(base, any->arm, any->seq), any->seq);
    std::printf("\nmodel FLOPs per token (%s, T=%d): %.1f M = dense %.1f + LM head %.1f + attention %.1f + depth reads "
                "%.2f (docs/performance.md)\n",
                any->arm.c_str(), any->seq, f.total() / 1e6, f.dense / 1e6, f.lm_head / 1e6, f.attention / 1e6,
                f.depth_reads / 1e6);
  }
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand(
      "bench",
      "Time full training steps (forward, backward, clipping, AdamW) per arm, each arm in its own\n"
      "process, against the PyTorch eager fp32 implementation of the same model (bench/torch_model.py):\n"
      "tokens/s, peak memory, model FLOP utilisation against the sgemm rate measured in the same run,\n"
      "rd/block ratios and, with several --seq, context scaling. Progress goes to stderr.");
  add_config_options(cmd, a->preset, a->config, a->settings);
  cmd->add_option("--arms", a->arms, "comma-separated arms (prenorm, full, block, rd, rd-tied, rd-average, rd-frozen)")
      ->capture_default_str();
  cmd->add_option("--seq", a->seqs, "comma-separated sequence lengths (default: the config's seq_len), e.g. 256,1024,4096");
  cmd->add_option("--batch", a->batch, "sequences per step (default: --tokens-per-step / seq)");
  cmd->add_option("--tokens-per-step", a->tokens_per_step,
                  "tokens per step when --batch is not given (default: the config's batch_size x seq_len)");
  cmd->add_option("--vocab", a->vocab, "vocabulary size when the config takes it from the data (vocab_size 0)")
      ->capture_default_str();
  cmd->add_option("--steps", a->steps, "timed steps per run")->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "untimed steps before them")->capture_default_str();
  cmd->add_option("--rounds", a->rounds, "repeat every run this many times, interleaved; step times are pooled")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "threads for both implementations (0: all cores)");
  cmd->add_option("--seed", a->seed, "initialisation and token seed")->capture_default_str();
  cmd->add_option("--torch", a->torch, "auto | on | off: also time bench/torch_model.py (auto: when torch imports)")
      ->capture_default_str();
  cmd->add_option("--python", a->python, "Python interpreter with torch")->capture_default_str();
  cmd->add_option("--torch-script", a->torch_script, "path of bench/torch_model.py (default: found from the binary)");
  cmd->add_flag("--json", a->json_out, "print one JSON object instead of the table");
  cmd->add_option("--json-file", a->json_file, "also write the JSON object to this file");
  cmd->add_option("--precision", a->precision,
                  "fp32 | bf16: attnres' Linear GEMMs (default: the config's train.precision); torch stays fp32");
  cmd->add_flag("--gemm-only", a->gemm_only,
                "only measure the GEMM rates: the sgemm reference and the model's Linear shapes in fp32 and bf16");
  cmd->add_flag("--paired,!--no-paired", a->paired,
                "also time each arm against the first in one process, alternate steps (default: on)");
  cmd->add_flag("--worker", a->worker, "(internal) run one measurement in this process")->group("");
  cmd->add_option("--model-json", a->model_json, "(internal) the worker's model config")->group("");
  cmd->add_option("--paired-json", a->paired_json, "(internal) a second model config: time both alternately")
      ->group("");
  cmd->callback([a] {
    if (!a->worker) {
      run_bench(*a);
      return;
    }
    auto config_of = [](const std::string& text, const char* flag) {
      json j;
      try {
        j = json::parse(text);
      } catch (const json::exception& e) {
        fail(flag, ": ", e.what());
      }
      return model_config_from_json(j, flag);
    };
    const ModelConfig config = config_of(a->model_json, "--model-json");
    const std::vector<int> seqs = parse_seqs(a->seqs);
    require(a->batch >= 1 && seqs.size() == 1, "--worker needs --batch and one --seq");
    require(a->steps >= 1 && a->warmup >= 0, "--steps must be at least 1 and --warmup non-negative");
    const int seq = seqs.front();
    const kernels::MatmulPrecision precision =
        a->precision.empty() ? kernels::MatmulPrecision::fp32 : kernels::parse_matmul_precision(a->precision);
    const json r = a->paired_json.empty()
                       ? run_worker(config, a->batch, seq, a->steps, a->warmup, a->threads, a->seed, precision)
                       : run_paired_worker(config, config_of(a->paired_json, "--paired-json"), a->batch, seq,
                                           a->steps, a->warmup, a->threads, a->seed, precision);
    std::printf("%s\n", r.dump().c_str());
    std::fflush(stdout);
  });
}

}  // namespace attnres::cli
