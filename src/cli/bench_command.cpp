// `attnres bench`: its flags. The benchmark itself is the library in src/bench (bench/bench.hpp:
// the run; bench/worker.hpp: the hidden worker each measurement runs in). See docs/performance.md.
#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "bench/worker.hpp"
#include "cli/commands.hpp"
#include "util/error.hpp"

namespace attnres::cli {

namespace {

constexpr int kDefaultVocab = 8192;
constexpr const char* kDefaultPython = "/usr/bin/python3";

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
  std::string device = "cpu";
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

void run_bench(const BenchArgs& a) {
  std::string preset_name = a.preset;
  if (preset_name.empty() && a.config.empty()) preset_name = "small";
  bench::Options o;
  o.base = load_train_config(preset_name, a.config, a.settings);
  o.name = preset_name.empty() ? a.config : preset_name;
  o.arms = split_list(a.arms);
  o.seqs = parse_seqs(a.seqs);
  o.batch = a.batch;
  o.tokens_per_step = a.tokens_per_step;
  o.vocab = a.vocab;
  o.steps = a.steps;
  o.warmup = a.warmup;
  o.rounds = a.rounds;
  o.threads = a.threads;
  o.seed = a.seed;
  o.device = a.device;
  o.precision = a.precision;
  o.torch = a.torch;
  o.python = a.python;
  o.torch_script = a.torch_script;
  o.json_out = a.json_out;
  o.json_file = a.json_file;
  o.gemm_only = a.gemm_only;
  o.paired = a.paired;
  bench::run(o);
}

void run_worker(const BenchArgs& a) {
  const std::vector<int> seqs = parse_seqs(a.seqs);
  require(a.batch >= 1 && seqs.size() == 1, "--worker needs --batch and one --seq");
  bench::WorkerOptions o;
  o.model_json = a.model_json;
  o.paired_json = a.paired_json;
  o.device = a.device;
  o.precision = a.precision;
  o.batch = a.batch;
  o.seq = seqs.front();
  o.steps = a.steps;
  o.warmup = a.warmup;
  o.threads = a.threads;
  o.seed = a.seed;
  bench::run_worker(o);
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
  add_device_option(cmd, a->device);
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
  cmd->callback([a] { a->worker ? run_worker(*a) : run_bench(*a); });
}

}  // namespace attnres::cli
