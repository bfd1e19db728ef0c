// `attnres eval` and `attnres sample`: the commands that use a trained model's weights.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "data/corpus.hpp"
#include "data/loader.hpp"
#include "data/tokenizer.hpp"
#include "model/safetensors.hpp"
#include "train/checkpoint.hpp"
#include "train/evaluate.hpp"
#include "train/inference.hpp"
#include "train/train_config.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"
#include "util/status_line.hpp"
#include "util/threads.hpp"


namespace attnres::cli {

namespace {

// A --text file that takes at least this many windows shows a progress line.
constexpr std::int64_t kProgressWindows = 64;

struct EvalArgs {
  std::string checkpoint, data, split = "val", tokenizer;
  std::vector<std::string> text;
  std::string text_field = "text";
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
  double nll_sum = 0;
  std::int64_t bytes = 0;  // a count: an integer in --json too
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
    bytes = static_cast<std::int64_t>(tokenizer->decode(ids).size());
  } else {
    const auto tokenizer = weights_tokenizer(file, a.checkpoint, a.tokenizer);
    require(tokenizer->vocab_size() <= config.vocab_size, "tokenizer '", tokenizer->spec(),
            "' does not fit the model's vocabulary");
    // Read as `prepare` reads its inputs: .txt files (one document each), .jsonl (one per line, in
    // "text"), either gzip-compressed, directories of them; anything else is refused, naming it.
    std::vector<data::InputFile> inputs = data::expand_inputs(a.text);
    for (data::InputFile& input : inputs) input.text_field = a.text_field;
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
          bytes += static_cast<std::int64_t>(text.size());
        } else {
          ids.resize(scored + 1);
          bytes += static_cast<std::int64_t>(tokenizer->decode(std::span<const std::int32_t>(ids).subspan(1)).size());
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
  const double bpb = bytes > 0 ? nll_sum / std::log(2.0) / double(bytes) : 0;
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"nll", nll}, {"perplexity", std::exp(nll)}, {"bits_per_byte", bpb},
                                       {"tokens", tokens}, {"bytes", bytes}}
                            .dump()
                            .c_str());
  } else {
    std::printf("nll %.6f nats/token  perplexity %.4f  bits/byte %.4f  (%lld tokens, %lld bytes)\n", nll,
                std::exp(nll), bpb, static_cast<long long>(tokens), static_cast<long long>(bytes));
  }
}

struct SampleArgs {
  std::string checkpoint, prompt, tokenizer;
  int max_tokens = 200, top_k = 0, threads = 0;
  double temperature = 1.0;
  std::uint64_t seed = 1;
  std::string device = "cpu";
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
  const std::unique_ptr<InferenceBackend> model = load_model(a.device, file, a.checkpoint, config, 1, config.max_seq_len);
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

void register_inference_commands(CLI::App& app) {
  auto eargs = std::make_shared<EvalArgs>();
  auto* eval_cmd = app.add_subcommand("eval", "Mean NLL (nats/token), perplexity and bits per byte of a checkpoint");
  eval_cmd->add_option("--checkpoint", eargs->checkpoint, kCheckpointHelp)->required();
  eval_cmd->add_option("--data", eargs->data, "prepared data directory");
  eval_cmd->add_option("--split", eargs->split, "val | test (with --data)")->check(CLI::IsMember({"train", "val", "test"}));
  eval_cmd->add_option("--text", eargs->text,
                       "inputs as 'prepare' reads them: .txt files (one document each), .jsonl (a document per line, "
                       "in \"text\"), either .gz, and directories of them")
      ->take_all();
  eval_cmd->add_option("--text-field", eargs->text_field, "JSONL field holding each document's text (with --text)")
      ->capture_default_str();
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
  add_device_option(sample_cmd, sargs->device);
  sample_cmd->footer(
      "On the CPU each new token costs one position of work (KV cache); with --device cuda each new token\n"
      "recomputes the whole context on the GPU (no KV cache there yet): a full forward pass per token.");
  sample_cmd->callback([sargs] { run_sample(*sargs); });
}

}  // namespace attnres::cli
