// `attnres train` and `attnres eval`.
#include <CLI/CLI.hpp>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "data/loader.hpp"
#include "data/tokenizer.hpp"
#include "model/model.hpp"
#include "model/safetensors.hpp"
#include "train/evaluate.hpp"
#include "train/train_config.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"
#include "util/atomic_file.hpp"
#include "util/threads.hpp"

namespace attnres::cli {

namespace {

// Signals only set a flag; the training loop saves a checkpoint and returns.
std::atomic<bool> g_stop_requested{false};
extern "C" void request_stop(int) { g_stop_requested.store(true); }

}  // namespace

const std::atomic<bool>* install_stop_handlers() {
  std::signal(SIGINT, request_stop);
  std::signal(SIGTERM, request_stop);
  return &g_stop_requested;
}

TrainConfig load_train_config(const std::string& preset_name, const std::string& config_file,
                              const std::vector<std::string>& settings) {
  require(preset_name.empty() != config_file.empty(), "give exactly one of --preset NAME or --config FILE");
  TrainConfig config = preset_name.empty() ? preset("tiny") : preset(preset_name);
  if (!config_file.empty()) apply_toml_file(config, config_file);
  for (const auto& s : settings) apply_setting(config, s, "--set " + s);
  return config;
}

void add_config_options(CLI::App* cmd, std::string& preset_name, std::string& config_file,
                        std::vector<std::string>& settings) {
  cmd->add_option("--preset", preset_name, "tiny | small | S | M (see docs/training.md)");
  cmd->add_option("--config", config_file, "TOML file with [model] and [train] tables (over the tiny preset)");
  cmd->add_option("--set", settings, "override one key, e.g. --set model.residual=rd --set train.lr=1e-3")
      ->take_all();
}

namespace {

struct TrainArgs {
  std::string preset, config, data, out;
  std::vector<std::string> settings;
  std::string label;
  bool resume = false;
};

struct EvalArgs {
  std::string checkpoint, data, split = "val";
  std::vector<std::string> text;
  bool json = false;
  int batch = 8, seq = 0, threads = 0;
  std::int64_t max_tokens = 0;
};

void run_eval(const EvalArgs& a) {
  set_num_threads(a.threads);
  require(a.data.empty() != a.text.empty(), "give either --data DIR (with --split) or --text FILE...");
  const SafetensorsFile file = read_safetensors(a.checkpoint);
  const ModelConfig config = read_weights_config(a.checkpoint);
  const int seq = a.seq > 0 ? a.seq : config.max_seq_len;
  require(seq <= config.max_seq_len, "--seq ", seq, " exceeds the model's max_seq_len ", config.max_seq_len);
  double nll_sum = 0, bytes = 0;
  std::int64_t tokens = 0;
  if (!a.data.empty()) {
    const data::TokenDataset split = data::TokenDataset::open(a.data, a.split);
    auto tok = file.metadata.find("tokenizer");
    require(split.vocab_size() <= config.vocab_size, "'", a.data, "' uses a vocabulary of ", split.vocab_size(),
            " tokens, larger than the model's ", config.vocab_size);
    if (tok != file.metadata.end())
      require(tok->second == split.tokenizer_spec(), "'", a.checkpoint, "' was trained with tokenizer '",
              tok->second, "' but '", a.data, "' was prepared with '", split.tokenizer_spec(), "'");
    Model<float> model(config, a.batch, seq, false);
    load_weights<float>(a.checkpoint, config, model.layout(), model.params());
    const EvalResult r = evaluate_split(model, split, a.batch, seq, a.max_tokens);
    nll_sum = r.nll * double(r.tokens);
    tokens = r.tokens;
    // Bytes of the scored text: decode the scored tokens (end-of-text counts no bytes).
    const auto tokenizer = data::open_dataset_tokenizer(split);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(tokens));
    split.copy_tokens(1, ids);
    std::erase(ids, split.eot_id());
    bytes = double(tokenizer->decode(ids).size());
  } else {
    auto tok = file.metadata.find("tokenizer");
    require(tok != file.metadata.end(), "'", a.checkpoint, "' does not name its tokenizer; evaluate with --data");
    const auto tokenizer = data::make_tokenizer(tok->second);
    Model<float> model(config, 1, seq, false);
    load_weights<float>(a.checkpoint, config, model.layout(), model.params());
    for (const auto& path : a.text) {
      const std::string text = read_text_file(path);
      std::vector<std::int32_t> ids = {tokenizer->eot_id()};
      for (auto id : tokenizer->encode(text)) ids.push_back(id);
      bytes += double(text.size());
      // Windows of seq+1 tokens overlapping by one: every token after the first is scored once.
      for (std::size_t start = 0; start + 1 < ids.size(); start += static_cast<std::size_t>(seq)) {
        const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(seq), ids.size() - 1 - start);
        const double mean = model.forward(std::span<const std::int32_t>(ids.data() + start, n + 1), 1, static_cast<int>(n));
        nll_sum += mean * double(n);
        tokens += static_cast<std::int64_t>(n);
      }
    }
  }
  const double nll = nll_sum / double(tokens);
  const double bpb = bytes > 0 ? nll_sum / std::log(2.0) / bytes : 0;
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"nll", nll}, {"perplexity", std::exp(nll)}, {"bits_per_byte", bpb},
                                       {"tokens", tokens}, {"bytes", bytes}}
                            .dump()
                            .c_str());
  } else {
    std::printf("nll %.6f nats/token  perplexity %.4f  bits/byte %.4f  (%lld tokens, %.0f bytes)\n", nll,
                std::exp(nll), bpb, static_cast<long long>(tokens), bytes);
  }
}

}  // namespace

void register_train_commands(CLI::App& app) {
  auto targs = std::make_shared<TrainArgs>();
  auto* train_cmd = app.add_subcommand(
      "train", "Train a model on a prepared data directory (see 'attnres prepare').\n"
               "Writes OUT/config.toml, metrics.jsonl, model.safetensors and checkpoint.safetensors.");
  add_config_options(train_cmd, targs->preset, targs->config, targs->settings);
  train_cmd->add_option("--data", targs->data, "prepared data directory")->required();
  train_cmd->add_option("--out", targs->out, "run directory")->required();
  train_cmd->add_flag("--resume", targs->resume, "continue the run in --out exactly where its checkpoint left it");
  train_cmd->add_option("--label", targs->label, "prefix for progress lines (used by 'attnres experiment')");
  train_cmd->callback([targs] {
    const TrainConfig config = load_train_config(targs->preset, targs->config, targs->settings);
    TrainRunOptions options;
    options.data_dir = targs->data;
    options.out_dir = targs->out;
    options.resume = targs->resume;
    options.label = targs->label;
    options.stop = install_stop_handlers();
    const TrainResult r = train(config, options);
    if (!r.finished) return;
    std::printf("finished %lld steps, %.0f tokens/s, peak memory %.1f MB\n", static_cast<long long>(r.steps),
                r.tokens_per_sec, double(r.peak_rss_bytes) / 1e6);
    for (const auto& m : r.milestones)
      std::printf("  val NLL %.4f at %lld tokens\n", m.val_nll, static_cast<long long>(m.tokens));
    std::printf("weights: %s\n", r.weights_path.c_str());
  });

  auto eargs = std::make_shared<EvalArgs>();
  auto* eval_cmd = app.add_subcommand("eval", "Mean NLL (nats/token), perplexity and bits per byte of a checkpoint");
  eval_cmd->add_option("--checkpoint", eargs->checkpoint, "weights file (model.safetensors)")->required();
  eval_cmd->add_option("--data", eargs->data, "prepared data directory");
  eval_cmd->add_option("--split", eargs->split, "val | test (with --data)")->check(CLI::IsMember({"train", "val", "test"}));
  eval_cmd->add_option("--text", eargs->text, "text files, each one document")->take_all();
  eval_cmd->add_option("--max-tokens", eargs->max_tokens, "score at most this many tokens of the split (0: all)");
  eval_cmd->add_option("--batch", eargs->batch, "windows per forward pass")->check(CLI::PositiveNumber);
  eval_cmd->add_option("--seq", eargs->seq, "window length (default: the model's max_seq_len)");
  eval_cmd->add_option("--threads", eargs->threads, "threads (0: all cores)");
  eval_cmd->add_flag("--json", eargs->json, "print one JSON object");
  eval_cmd->callback([eargs] { run_eval(*eargs); });
}

}  // namespace attnres::cli
