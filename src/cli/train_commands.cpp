// `attnres train` and `attnres eval`.
#include <CLI/CLI.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.hpp"
#include "data/corpus.hpp"
#include "data/loader.hpp"
#include "data/tokenizer.hpp"
#include "model/safetensors.hpp"
#include "train/checkpoint.hpp"
#include "train/evaluate.hpp"
#include "train/inference.hpp"
#include "train/train_config.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"
#include "util/atomic_file.hpp"
#include "util/process.hpp"
#include "util/rng.hpp"
#include "util/status_line.hpp"
#include "util/threads.hpp"

namespace attnres::cli {

namespace {

// The first SIGINT/SIGTERM only sets a flag: the training loop finishes its step, saves a
// checkpoint and returns. A second one ends the process at once (exit 128 + signal): files are
// written through temporaries (util/atomic_file), so a checkpoint being written is simply not
// renamed into place and the previous one stays whole. Only async-signal-safe calls here.
std::atomic<bool> g_stop_requested{false};
std::atomic<int> g_stop_signal{0};  // the first signal, for the exit status (128 + it)
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

void say(const char* text, std::size_t size) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, size);
  (void)ignored;
}

extern "C" void request_stop(int signal) {
  if (g_stop_requested.exchange(true)) {
    static constexpr char kNow[] = "\nattnres: second signal: stopping now (the last saved checkpoint is kept)\n";
    say(kNow, sizeof kNow - 1);
    signal_running_child(signal);  // a training child in its own process group stops now too
    ::_exit(128 + signal);
  }
  g_stop_signal.store(signal);
  static constexpr char kSoon[] = "\nattnres: stopping after this step and saving a checkpoint; signal again to stop now\n";
  say(kSoon, sizeof kSoon - 1);
}

}  // namespace

const std::atomic<bool>* install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = request_stop;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a write in progress continues instead of failing with EINTR
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  return &g_stop_requested;
}

int stop_signal() { return g_stop_signal.load(); }

TrainConfig load_train_config(const std::string& preset_name, const std::string& config_file,
                              const std::vector<std::string>& settings) {
  require(preset_name.empty() != config_file.empty(), "give exactly one of --preset NAME or --config FILE");
  TrainConfig config = preset_name.empty() ? preset("tiny") : preset(preset_name);
  if (!config_file.empty()) apply_toml_file(config, config_file);
  for (const auto& s : settings) apply_setting(config, s, "--set " + s);
  return config;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    if (end > begin) out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

void run_as_job(const std::function<void(dist::Communicator&)>& command) {
  dist::Communicator comm = dist::Communicator::from_environment();
  if (!comm.distributed()) {
    command(comm);
    return;
  }
  try {
    command(comm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnres: error on %s: %s\n", comm.describe().c_str(), e.what());
    comm.abort(1);
  }
}

void add_device_option(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device,
                  "cpu, or cuda / cuda:N for an NVIDIA GPU (builds with the CUDA backend; under MPI, 'cuda' "
                  "takes the GPU of the rank's local index). See docs/cuda.md")
      ->capture_default_str();
}

void add_config_options(CLI::App* cmd, std::string& preset_name, std::string& config_file,
                        std::vector<std::string>& settings) {
  cmd->add_option("--preset", preset_name, "tiny | small | S | M (see docs/training.md)");
  cmd->add_option("--config", config_file, "TOML file with [model] and [train] tables (over the tiny preset)");
  // The keys by section, wrapped: "  model: vocab_size d_model ...".
  std::string keys, line, section;
  for (const auto& k : train_config_keys()) {
    if (k.section != section) {
      if (!line.empty()) keys += line + "\n";
      section = k.section;
      line = "  " + section + ":";
    } else if (line.size() + 1 + k.name.size() > 72) {
      keys += line + "\n";
      line = std::string(section.size() + 3, ' ');
    }
    line += " " + k.name;
  }
  cmd->add_option("--set", settings,
                  "override one key (TOML syntax; bare words are strings), e.g.\n"
                  "--set model.residual=rd --set train.lr=1e-3. The keys (types, ranges,\n"
                  "defaults and meaning: 'attnres config --keys'):\n" +
                      keys + line)
      ->take_all();
}

void add_train_key_flags(CLI::App* cmd, TrainKeyFlags& flags) {
  flags.tokens_option = cmd->add_option("--tokens", flags.tokens,
                                        "training tokens per run, rounded down to whole steps of batch_size x "
                                        "seq_len (short for --set train.tokens=N; default: the preset's)")
                            ->check(at_least(1));
  flags.threads_option =
      cmd->add_option("--threads", flags.threads, "threads (short for --set train.threads=N; 0: all cores)")
          ->check(at_least(0));
}

std::vector<std::string> with_train_key_flags(std::vector<std::string> settings, const TrainKeyFlags& flags) {
  if (flags.tokens_option != nullptr && flags.tokens_option->count() > 0)
    settings.push_back(concat("train.tokens=", flags.tokens));
  if (flags.threads_option != nullptr && flags.threads_option->count() > 0)
    settings.push_back(concat("train.threads=", flags.threads));
  return settings;
}

SafetensorsFile read_model_weights(std::string& path) {
  namespace fs = std::filesystem;
  const std::string given = path;
  if (fs::is_directory(path)) {
    path = (fs::path(path) / "model.safetensors").string();
    require(fs::exists(path), "'", given, "' is a directory without model.safetensors (not a training run)");
  }
  SafetensorsFile file = read_safetensors(path);
  if (file.metadata.count("state") == 0) return file;
  // A training checkpoint (weights, AdamW moments, state): its own weights, of its step.
  if (std::optional<SafetensorsFile> weights = checkpoint_as_weights(file, path)) return std::move(*weights);
  // One written before checkpoints named their tokenizer (a run's only checkpoint): its run's
  // weights file holds the same step's weights with the tokenizer's name.
  const std::string weights = (fs::path(path).parent_path() / "model.safetensors").string();
  require(fs::exists(weights), "'", path, "' is a training checkpoint and '", weights,
          "' (its run's weights) is missing; pass the run's model.safetensors");
  path = weights;
  return read_safetensors(path);
}

namespace {

struct TrainArgs {
  std::string preset, config, data, out;
  std::vector<std::string> settings;
  std::string label;
  TrainKeyFlags key_flags;
  bool resume = false;
  std::int64_t stop_at_step = 0;
  std::string device = "cpu";
};

// A --text file that takes at least this many windows shows a progress line.
constexpr std::int64_t kProgressWindows = 64;

struct EvalArgs {
  std::string checkpoint, data, split = "val", tokenizer;
  std::vector<std::string> text;
  bool json = false, quiet = false;
  int batch = 8, seq = 0, threads = 0;
  std::int64_t max_tokens = 0;
  std::string device = "cpu";
};

// Saved weights on a device, for batches of up to `batch` windows of `seq` tokens.
// `file` is the weights file already read from `path` (read once: its digests are checked once).
std::unique_ptr<InferenceBackend> load_model(const std::string& device, const SafetensorsFile& file,
                                             const std::string& path, const ModelConfig& config, int batch,
                                             int seq) {
  std::unique_ptr<InferenceBackend> model;
  try {
    model = make_inference_backend(device, config, batch, seq);
  } catch (const std::bad_alloc&) {
    fail("not enough memory for the activations of ", batch, " windows (--batch) of ", seq,
         " tokens (--seq) of this model (", config.d_model, " wide, ", config.n_layers, " layers, vocabulary ",
         config.vocab_size, "); lower --batch");
  } catch (const std::length_error&) {
    fail("--batch ", batch, " x --seq ", seq, " is too large for this model's buffers; lower --batch");
  }
  model->load_weights(file, path);
  return model;
}

// The tokenizer of a model's weights: `given` (a spec) or the one its metadata names, checked
// against the content hash the weights record: tokenizers are matched by content, so a
// byte-identical copy anywhere is accepted and a tokenizer retrained at the same path refused.
// (Weights written before the hash was recorded are not checked.)
std::unique_ptr<data::Tokenizer> weights_tokenizer(const SafetensorsFile& file, const std::string& path,
                                                   const std::string& given) {
  const auto named = file.metadata.find("tokenizer");
  const auto hash = file.metadata.find("tokenizer_hash");
  const bool have_hash = hash != file.metadata.end();
  std::string spec = given;
  if (spec.empty()) {
    require(named != file.metadata.end(), "'", path, "' does not name its tokenizer; pass --tokenizer SPEC");
    spec = named->second;
  }
  std::unique_ptr<data::Tokenizer> tokenizer;
  try {
    tokenizer = data::make_tokenizer(spec);
  } catch (const Error& e) {
    if (!given.empty() || !have_hash) throw;
    fail(e.what(), ": the tokenizer '", path, "' was trained with (hash ", hash->second,
         ") is not where it was; pass --tokenizer SPEC naming a byte-identical copy");
  }
  if (have_hash)
    require(tokenizer->content_hash() == hash->second, "tokenizer ", tokenizer->spec(), " has hash ",
            tokenizer->content_hash(), " but '", path, "' was trained with a tokenizer of hash ", hash->second,
            given.empty() ? " at that path (changed or retrained since?)" : "",
            "; tokenizers are matched by content: pass --tokenizer SPEC naming a byte-identical copy of it");
  return tokenizer;
}

void run_eval(EvalArgs a) {
  set_num_threads(a.threads);
  require(a.data.empty() != a.text.empty(), "give either --data DIR (with --split) or --text FILE...");
  const SafetensorsFile file = read_model_weights(a.checkpoint);
  const ModelConfig config = weights_config(file, a.checkpoint);
  const int seq = a.seq > 0 ? a.seq : config.max_seq_len;
  require(seq <= config.max_seq_len, "--seq ", seq, " exceeds the model's max_seq_len ", config.max_seq_len);
  double nll_sum = 0, bytes = 0;
  std::int64_t tokens = 0;
  if (!a.data.empty()) {
    require(a.tokenizer.empty(), "--tokenizer goes with --text (with --data, the data's tokenizer is used)");
    const data::TokenDataset split = data::TokenDataset::open(a.data, a.split);
    const auto tokenizer = data::open_dataset_tokenizer(split);
    // By content: the same tokenizer wherever its files are (weights from before hashes were
    // recorded: by the spec they name). Checked before the vocabulary: data of another tokenizer
    // is that, whatever its vocabulary's size.
    const std::string mismatch = tokenizer_mismatch(file.metadata, a.checkpoint, *tokenizer, a.data);
    require(mismatch.empty(), mismatch);
    const auto named = file.metadata.find("tokenizer");
    if (file.metadata.count("tokenizer_hash") == 0 && named != file.metadata.end())
      require(named->second == split.tokenizer_spec(), "'", a.checkpoint, "' was trained with tokenizer '",
              named->second, "' but '", a.data, "' was prepared with '", split.tokenizer_spec(), "'");
    require(split.vocab_size() <= config.vocab_size, "'", a.data, "' uses a vocabulary of ", split.vocab_size(),
            " tokens, larger than the model's ", config.vocab_size);
    const EvalResult r =
        evaluate_split(*load_model(a.device, file, a.checkpoint, config, a.batch, seq), split, a.batch, seq, a.max_tokens);
    nll_sum = r.nll * double(r.tokens);
    tokens = r.tokens;
    // Bytes of the scored text: decode the scored tokens (end-of-text counts no bytes).
    std::vector<std::int32_t> ids(static_cast<std::size_t>(tokens));
    split.copy_tokens(1, ids);
    std::erase(ids, split.eot_id());
    bytes = double(tokenizer->decode(ids).size());
  } else {
    const auto tokenizer = weights_tokenizer(file, a.checkpoint, a.tokenizer);
    require(tokenizer->vocab_size() <= config.vocab_size, "tokenizer '", tokenizer->spec(),
            "' does not fit the model's vocabulary");
    // Read as `prepare` reads its inputs: .txt files (one document each), .jsonl (one per line, in
    // "text"), either gzip-compressed, directories of them; anything else is refused, naming it.
    const std::vector<data::InputFile> inputs = data::expand_inputs(a.text);
    const std::unique_ptr<InferenceBackend> model = load_model(a.device, file, a.checkpoint, config, 1, seq);
    data::CorpusReader reader(inputs);
    std::vector<data::RawRecord> records;
    const data::SplitFractions whole{0, 0};  // every document is scored whole
    bool full = false;                       // --max-tokens reached
    while (!full && reader.next_batch(records, std::size_t(8) << 20)) {
      for (data::RawRecord& record : records) {
        const data::InputFile& input = inputs[record.source];
        const std::string path =
            input.format == data::InputFormat::kJsonl ? concat(input.path, ":", record.line) : input.path;
        const data::Document doc = data::parse_record(record, input, whole);
        if (doc.empty) continue;
        const std::string& text = doc.text;
        std::vector<std::int32_t> ids = {tokenizer->eot_id()};
        for (auto id : tokenizer->encode(text)) ids.push_back(id);
        const std::int64_t tokens_before = tokens;
        // What this document will score, for the progress line of long texts (stderr, as train's).
        std::int64_t to_score = static_cast<std::int64_t>(ids.size()) - 1;
        if (a.max_tokens > 0) to_score = std::min(to_score, a.max_tokens - tokens_before);
        StatusLine status(!a.quiet && to_score >= kProgressWindows * seq);
        const auto started = std::chrono::steady_clock::now();
        // Windows of seq+1 tokens overlapping by one: every token after the first is scored once.
        for (std::size_t start = 0; start + 1 < ids.size(); start += static_cast<std::size_t>(seq)) {
          if (a.max_tokens > 0 && tokens >= a.max_tokens) break;
          std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(seq), ids.size() - 1 - start);
          if (a.max_tokens > 0) n = std::min<std::size_t>(n, static_cast<std::size_t>(a.max_tokens - tokens));
          const double mean =
              model->loss(std::span<const std::int32_t>(ids.data() + start, n + 1), 1, static_cast<int>(n));
          require(std::isfinite(mean), "the loss on '", path, "' (tokens ", start, "..", start + n, ") is ", mean,
                  ": the weights of '", a.checkpoint, "' are not usable");
          nll_sum += mean * double(n);
          tokens += static_cast<std::int64_t>(n);
          const std::int64_t done = tokens - tokens_before;
          const double seconds =
              std::max(1e-9, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
          char nll_so_far[32];
          std::snprintf(nll_so_far, sizeof nll_so_far, "%.4f", nll_sum / double(tokens));
          status.update(concat("eval: ", path, ": ", done, " of ", to_score, " tokens (",
                               std::lround(100.0 * double(done) / double(to_score)), "%), ",
                               std::lround(double(done) / seconds), " tokens/s, nll so far ", nll_so_far),
                        done == to_score);
        }
        // Bytes of the scored text: all of it, or (with --max-tokens) what the scored tokens decode to.
        const auto scored = static_cast<std::size_t>(tokens - tokens_before);
        if (scored + 1 >= ids.size()) {
          bytes += double(text.size());
        } else {
          ids.resize(scored + 1);
          bytes += double(tokenizer->decode(std::span<const std::int32_t>(ids).subspan(1)).size());
        }
        full = a.max_tokens > 0 && tokens >= a.max_tokens;
        if (full) break;
      }
    }
  }
  // An empty or non-finite score is an error, never a printed "nll nan".
  require(tokens > 0, "nothing to score: the --text inputs hold no text");
  const double nll = nll_sum / double(tokens);
  require(std::isfinite(nll), "the NLL of '", a.checkpoint, "' came out ", nll, ": the weights are not usable");
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

struct SampleArgs {
  std::string checkpoint, prompt, tokenizer;
  int max_tokens = 200, top_k = 0, threads = 0;
  double temperature = 1.0;
  std::uint64_t seed = 1;
};

// Draws the next token from logits with temperature and optional top-k. The kept tokens are in a
// defined order (all: by id; top-k: by logit, then id), so the draw is reproducible elsewhere:
// python/attnres/sampling.py repeats it exactly.
std::int32_t sample_token(std::span<const float> logits, double temperature, int top_k, Rng& rng,
                          std::vector<std::pair<float, std::int32_t>>& scratch) {
  scratch.clear();
  for (std::size_t i = 0; i < logits.size(); ++i) scratch.emplace_back(logits[i], static_cast<std::int32_t>(i));
  if (temperature <= 0) return std::max_element(scratch.begin(), scratch.end())->second;
  if (top_k > 0 && static_cast<std::size_t>(top_k) < scratch.size()) {
    std::partial_sort(scratch.begin(), scratch.begin() + top_k, scratch.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    scratch.resize(static_cast<std::size_t>(top_k));
  }
  double mx = -1e300;
  for (const auto& [l, i] : scratch) mx = std::max(mx, double(l));
  double sum = 0;
  for (auto& [l, i] : scratch) sum += std::exp((double(l) - mx) / temperature);
  double u = rng.uniform() * sum;
  for (const auto& [l, i] : scratch) {
    u -= std::exp((double(l) - mx) / temperature);
    if (u <= 0) return i;
  }
  return scratch.back().second;
}

void run_sample(SampleArgs a) {
  set_num_threads(a.threads);
  const SafetensorsFile file = read_model_weights(a.checkpoint);
  const ModelConfig config = weights_config(file, a.checkpoint);
  const auto tokenizer = weights_tokenizer(file, a.checkpoint, a.tokenizer);
  require(tokenizer->vocab_size() <= config.vocab_size, "tokenizer '", tokenizer->spec(),
          "' does not fit the model's vocabulary");
  const std::unique_ptr<InferenceBackend> model = load_model("cpu", file, a.checkpoint, config, 1, config.max_seq_len);
  const std::unique_ptr<Decoder> decoder = model->decoder(1);
  // Training documents start after an end-of-text token, so a prompt does too.
  std::vector<std::int32_t> ids = {tokenizer->eot_id()};
  for (auto id : tokenizer->encode(a.prompt)) ids.push_back(id);
  require(static_cast<int>(ids.size()) < config.max_seq_len, "the prompt is longer than the model's context (",
          config.max_seq_len, " tokens)");
  std::vector<float> logits(static_cast<std::size_t>(config.vocab_size));
  decoder->append(ids, static_cast<int>(ids.size()), logits);
  std::printf("%s", a.prompt.c_str());
  Rng rng(a.seed, "sample");
  std::vector<std::pair<float, std::int32_t>> scratch;
  std::vector<std::int32_t> generated;
  std::string shown;
  for (int i = 0; i < a.max_tokens; ++i) {
    const std::int32_t next = sample_token(std::span<const float>(logits.data(), static_cast<std::size_t>(tokenizer->vocab_size())),
                                           a.temperature, a.top_k, rng, scratch);
    if (next == tokenizer->eot_id()) break;
    generated.push_back(next);
    // Print what decodes so far (byte-level tokens may end mid-character).
    const std::string text = tokenizer->decode(generated);
    std::printf("%s", text.substr(std::min(shown.size(), text.size())).c_str());
    std::fflush(stdout);
    shown = text;
    if (decoder->length() >= config.max_seq_len) {
      std::fprintf(stderr, "\n[the context of %d tokens is full]\n", config.max_seq_len);
      break;
    }
    decoder->append(std::span<const std::int32_t>(&next, 1), 1, logits);
  }
  std::printf("\n");
}

}  // namespace

const char* const kCheckpointHelp =
    "model.safetensors, a run directory (its model.safetensors: the newest weights), or one of its "
    "checkpoint-STEP.safetensors (that step's weights)";

void register_train_commands(CLI::App& app) {
  auto targs = std::make_shared<TrainArgs>();
  auto* train_cmd = app.add_subcommand(
      "train", "Train a model on a prepared data directory (see 'attnres prepare').\n"
               "Writes OUT/config.toml, metrics.jsonl, model.safetensors and checkpoint-STEP.safetensors "
               "(the newest train.keep_checkpoints of them).");
  add_config_options(train_cmd, targs->preset, targs->config, targs->settings);
  train_cmd->add_option("--data", targs->data, "prepared data directory")->required();
  train_cmd->add_option("--out", targs->out, "run directory")->required();
  train_cmd->add_flag("--resume", targs->resume, "continue the run in --out exactly where its checkpoint left it");
  train_cmd->add_option("--label", targs->label, "prefix for progress lines (used by 'attnres experiment')");
  add_device_option(train_cmd, targs->device);
  add_train_key_flags(train_cmd, targs->key_flags);
  train_cmd->add_option("--stop-at-step", targs->stop_at_step,
                        "save a checkpoint and exit after this step (e.g. to fit a job's time slot); "
                        "continue with --resume")
      ->check(at_least(1));
  train_cmd->footer(
      "Data parallel: 'mpirun -np K attnres train ...' (or srun) splits every batch over K processes;\n"
      "rank 0 writes the run directory. See docs/distributed.md.");
  train_cmd->callback([targs] { run_as_job([&](dist::Communicator& comm) {
    const TrainConfig config =
        load_train_config(targs->preset, targs->config, with_train_key_flags(targs->settings, targs->key_flags));
    TrainRunOptions options;
    options.data_dir = targs->data;
    options.out_dir = targs->out;
    options.resume = targs->resume;
    options.label = targs->label;
    options.stop = install_stop_handlers();
    options.stop_at_step = targs->stop_at_step;
    options.device = targs->device;
    options.comm = &comm;
    const TrainResult r = train(config, options);
    if (!r.finished && stop_signal() != 0) throw Interrupted{stop_signal()};
    if (!r.finished || !comm.is_root()) return;
    std::printf("finished %lld steps, %.0f tokens/s, peak memory %.1f MB%s\n", static_cast<long long>(r.steps),
                r.tokens_per_sec, double(r.peak_rss_bytes) / 1e6,
                comm.distributed() ? concat(" per rank, ", std::lround(100 * r.reduce_fraction),
                                            "% of step time in the gradient reduction").c_str()
                                   : "");
    for (const auto& m : r.milestones)
      std::printf("  val NLL %.4f at %lld tokens\n", m.val_nll, static_cast<long long>(m.tokens));
    std::printf("weights: %s\n", r.weights_path.c_str());
  }); });

  auto eargs = std::make_shared<EvalArgs>();
  auto* eval_cmd = app.add_subcommand("eval", "Mean NLL (nats/token), perplexity and bits per byte of a checkpoint");
  eval_cmd->add_option("--checkpoint", eargs->checkpoint, kCheckpointHelp)->required();
  eval_cmd->add_option("--data", eargs->data, "prepared data directory");
  eval_cmd->add_option("--split", eargs->split, "val | test (with --data)")->check(CLI::IsMember({"train", "val", "test"}));
  eval_cmd->add_option("--text", eargs->text,
                       "inputs as 'prepare' reads them: .txt files (one document each), .jsonl (a document per line, "
                       "in \"text\"), either .gz, and directories of them")
      ->take_all();
  eval_cmd->add_option("--tokenizer", eargs->tokenizer,
                       "tokenizer spec for --text (default: the one named in the checkpoint; either way its content "
                       "hash must be the one the checkpoint records)");
  eval_cmd->add_option("--max-tokens", eargs->max_tokens, "score at most this many tokens (0: all)")
      ->check(at_least(0));
  eval_cmd->add_option("--batch", eargs->batch, "windows per forward pass")->capture_default_str()->check(at_least(1));
  eval_cmd->add_option("--seq", eargs->seq, "window length (default: the model's max_seq_len)")->check(at_least(1));
  eval_cmd->add_option("--threads", eargs->threads, "threads (0: all cores)")->check(at_least(0));
  eval_cmd->add_flag("--json", eargs->json, "print one JSON object");
  eval_cmd->add_flag("--quiet", eargs->quiet,
                     "no progress line (shown on stderr for a --text document of 64 windows of --seq or more)");
  add_device_option(eval_cmd, eargs->device);
  eval_cmd->callback([eargs] { run_eval(*eargs); });

  auto sargs = std::make_shared<SampleArgs>();
  auto* sample_cmd = app.add_subcommand(
      "sample", "Generate text from a checkpoint (KV cache: each new token costs one step of work)");
  sample_cmd->add_option("--checkpoint", sargs->checkpoint, kCheckpointHelp)->required();
  sample_cmd->add_option("--prompt", sargs->prompt, "text to continue")->required();
  sample_cmd->add_option("--max-tokens", sargs->max_tokens, "tokens to generate")->capture_default_str()
      ->check(at_least(1));
  sample_cmd->add_option("--temperature", sargs->temperature, "softmax temperature (0: greedy)")->capture_default_str()
      ->check(at_least(0));
  sample_cmd->add_option("--top-k", sargs->top_k, "sample among the k most likely tokens (0: all)")->check(at_least(0));
  sample_cmd->add_option("--seed", sargs->seed, "random seed")->capture_default_str()->check(at_least(0));
  sample_cmd->add_option("--tokenizer", sargs->tokenizer,
                         "tokenizer spec (default: the one named in the checkpoint; either way its content hash must "
                         "be the one the checkpoint records)");
  sample_cmd->add_option("--threads", sargs->threads, "threads (0: all cores)")->check(at_least(0));
  sample_cmd->callback([sargs] { run_sample(*sargs); });
}

}  // namespace attnres::cli
