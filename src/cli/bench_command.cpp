// `attnres bench`: its flags. The benchmark itself is the library in src/bench (bench/bench.hpp:
// the run; bench/worker.hpp: the hidden worker each measurement runs in). See docs/performance.md.
#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "bench/worker.hpp"
#include "cli/commands.hpp"
#include "model/arms.hpp"
#include "util/error.hpp"

namespace attnres::cli {

namespace {

struct BenchArgs {
  bench::Options o;  // the flags that map onto the library's options
  std::string preset, config;
  std::vector<std::string> settings;
  std::string arms = "block,rd";
  std::string seqs;  // comma-separated; empty: the config's seq_len
  // Hidden: run one measurement in this process and print it as one JSON line.
  bool worker = false;
  std::string model_json;
  std::string paired_json;  // with --worker: the second arm of a paired measurement
  std::string paired_precision;  // with --worker: that arm's matmul precision (default: --precision)
};

std::vector<int> parse_seqs(const std::string& text) {
  std::vector<int> seqs;
  for (const auto& s : split_list(text, "--seq")) {
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

void run_bench(BenchArgs a) {
  std::string preset_name = a.preset;
  if (preset_name.empty() && a.config.empty()) preset_name = "small";
  a.o.base = load_train_config(preset_name, a.config, a.settings);
  a.o.name = preset_name.empty() ? a.config : preset_name;
  a.o.arms = split_list(a.arms, "--arms");
  a.o.seqs = parse_seqs(a.seqs);
  bench::run(a.o);
}

void run_worker(const BenchArgs& a) {
  const std::vector<int> seqs = parse_seqs(a.seqs);
  require(a.o.batch >= 1 && seqs.size() == 1, "--worker needs --batch and one --seq");
  bench::WorkerOptions w;
  w.model_json = a.model_json;
  w.paired_json = a.paired_json;
  w.paired_precision = a.paired_precision;
  w.device = a.o.device;
  w.precision = a.o.precision;
  w.batch = a.o.batch;
  w.seq = seqs.front();
  w.steps = a.o.steps;
  w.warmup = a.o.warmup;
  w.threads = a.o.threads;
  w.seed = a.o.seed;
  bench::run_worker(w);
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  bench::Options& o = a->o;
  auto* cmd = app.add_subcommand(
      "bench",
      "Time full training steps (forward, backward, clipping, AdamW) per arm, each arm in its own\n"
      "process, against the PyTorch eager implementation of the same model (bench/torch_model.py), by\n"
      "default in the same matmul precision (bf16: torch.autocast; see --torch-precision). Reports\n"
      "tokens/s, peak memory, model FLOP utilisation against a GEMM rate of each run's precision measured\n"
      "in the same run (fp32: OpenBLAS sgemm 1024^3; bf16: the best of attnres' bf16 GEMM and torch's bf16\n"
      "matmul on 2048^3 and the model's largest trunk shape), rd/block ratios and, with several --seq,\n"
      "context scaling. Progress goes to stderr.");
  add_config_options(cmd, a->preset, a->config, a->settings);
  cmd->add_option("--arms", a->arms, "comma-separated arms (" + arm_names_text() + ")")
      ->capture_default_str();
  cmd->add_option("--seq", a->seqs, "comma-separated sequence lengths (default: the config's seq_len), e.g. 256,1024,4096");
  cmd->add_option("--batch", o.batch, "sequences per step (default: --tokens-per-step / seq)")->check(at_least(1));
  cmd->add_option("--tokens-per-step", o.tokens_per_step,
                  "tokens per step when --batch is not given (default: the config's batch_size x seq_len)")
      ->check(at_least(1));
  cmd->add_option("--vocab", o.vocab, "vocabulary size when the config takes it from the data (vocab_size 0)")
      ->capture_default_str()
      ->check(at_least(2));
  cmd->add_option("--steps", o.steps, "timed steps per run")->capture_default_str()->check(at_least(1));
  cmd->add_option("--warmup", o.warmup, "untimed steps before them")->capture_default_str()->check(at_least(0));
  cmd->add_option("--rounds", o.rounds,
                  "repeat every run this many times, interleaved; step times are pooled; each paired run is a "
                  "process per round, and their spread is reported")
      ->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("--threads", o.threads, "threads for both implementations (0: all cores)")->check(at_least(0));
  cmd->add_option("--seed", o.seed, "initialisation and token seed")->capture_default_str();
  add_device_option(cmd, o.device);
  cmd->add_option("--torch", o.torch, "auto | on | off: also time bench/torch_model.py (auto: when torch imports)")
      ->capture_default_str();
  cmd->add_option("--python", o.python, "Python interpreter with torch")->capture_default_str();
  cmd->add_option("--torch-script", o.torch_script, "path of bench/torch_model.py (default: found from the binary)");
  cmd->add_flag("--json", o.json_out, "print one JSON object instead of the table");
  cmd->add_option("--json-file", o.json_file, "also write the JSON object to this file");
  cmd->add_option("--precision", o.precision,
                  "fp32 | bf16: attnres' Linear GEMMs (default: the config's train.precision)");
  cmd->add_option("--torch-precision", o.torch_precision,
                  "auto | fp32 | bf16: torch's precision (bf16: torch.autocast(\"cpu\", dtype=torch.bfloat16) around\n"
                  "forward and loss; auto: the same as attnres); a different one is flagged in the report")
      ->capture_default_str();
  cmd->add_flag("--gemm-only", o.gemm_only,
                "only measure the GEMM rates: the sgemm reference (and attnres' bf16 one in a bf16 run) and the\n"
                "model's Linear shapes in fp32 and bf16");
  cmd->add_flag("--paired,!--no-paired", o.paired,
                "also time each arm against the first in one process, alternate steps (default: on)");
  cmd->add_flag("--worker", a->worker, "(internal) run one measurement in this process")->group("");
  cmd->add_option("--bf16-reference-cube", o.bf16_reference_cube,
                  "(internal, for tests) the edge of the bf16 reference's cube instead of 2048")
      ->group("");
  cmd->add_option("--model-json", a->model_json, "(internal) the worker's model config")->group("");
  cmd->add_option("--paired-json", a->paired_json, "(internal) a second model config: time both alternately")
      ->group("");
  cmd->add_option("--paired-precision", a->paired_precision, "(internal) the second model's matmul precision")
      ->group("");
  cmd->callback([a] { a->worker ? run_worker(*a) : run_bench(*a); });
}

}  // namespace attnres::cli
