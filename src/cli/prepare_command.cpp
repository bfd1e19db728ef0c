// attnres prepare: corpus files -> train/val/test token shards + manifest.json.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "data/corpus.hpp"
#include "data/prepare.hpp"
#include "data/tokenizer.hpp"
#include "data/tokenizer_train.hpp"
#include "train/train_config.hpp"
#include "util/dir_lock.hpp"
#include "util/error.hpp"
#include "util/text.hpp"
#include "util/threads.hpp"

namespace attnres::cli {
namespace {

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string tokenizer;
  std::string out;
  data::SplitFractions fractions;
  std::int64_t shard_tokens = data::kDefaultShardTokens;
  int vocab_size = data::kDefaultSpVocab;
  std::int64_t max_sentences = data::kDefaultMaxSentences;
  int threads = 0;
  bool quiet = false;
  std::string text_field = "text";
};

// Undoes what a failed prepare left (prepare_dataset itself removes its shards): the output
// directory, with any parents, when this run created it; else the tokenizer it trained there.
class OutputCleanup {
 public:
  explicit OutputCleanup(const std::string& out) : created_(first_missing_directory(out)) {}
  ~OutputCleanup() {
    if (done_) return;
    std::error_code ec;  // best effort: the error that brought us here is what the user sees
    if (!created_.empty()) std::filesystem::remove_all(created_, ec);
    else if (!trained_.empty()) std::filesystem::remove(trained_, ec);
  }
  OutputCleanup(const OutputCleanup&) = delete;
  OutputCleanup& operator=(const OutputCleanup&) = delete;
  void trained(const std::string& path) { trained_ = path; }
  void succeeded() { done_ = true; }

 private:
  std::filesystem::path created_;  // the topmost directory this run creates; empty if --out existed
  std::string trained_;
  bool done_ = false;
};

void run_prepare(const PrepareArgs& args) {
  if (args.threads > 0) set_num_threads(args.threads);
  // Check what can be checked before the (possibly long) tokenizer training.
  args.fractions.validate();
  require(args.shard_tokens > 0, "--shard-tokens must be positive, got ", args.shard_tokens);
  const bool default_corpus = args.inputs.empty();
  std::vector<data::InputFile> inputs = default_corpus ? data::default_corpus() : data::expand_inputs(args.inputs);
  require(!args.text_field.empty(), "--text-field: give the name of the JSONL field holding the text");
  for (data::InputFile& input : inputs) input.text_field = args.text_field;
  if (default_corpus && !args.quiet) {
    const std::string& first = inputs.front().path;
    const std::size_t root = first.find("/_sources/");
    std::fprintf(stderr, "prepare: no --input: using the Python documentation sources (%zu files under %s)\n",
                 inputs.size(), first.substr(0, root == std::string::npos ? first.size() : root + 9).c_str());
  }

  OutputCleanup cleanup(args.out);
  std::string spec = args.tokenizer;
  if (spec.empty()) {
    // No tokenizer given: train one on this corpus's training split and keep it with the data.
    data::begin_output_dir(args.out);
    const std::string model = (std::filesystem::path(args.out) / "tokenizer.model").string();
    data::SpTrainOptions train;
    train.vocab_size = args.vocab_size;
    train.fractions = args.fractions;
    train.max_sentences = args.max_sentences;
    train.progress = !args.quiet;
    cleanup.trained(model);
    data::train_sp_tokenizer(inputs, model, train);
    spec = "sp:" + model;
  }
  const std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(spec);

  data::PrepareOptions options;
  options.inputs = std::move(inputs);
  options.out_dir = args.out;
  options.fractions = args.fractions;
  options.shard_tokens = args.shard_tokens;
  options.progress = !args.quiet;
  const data::PrepareSummary summary = data::prepare_dataset(options, *tokenizer);
  cleanup.succeeded();
  // Splits are drawn per document (documents over 256 KiB, and a corpus's lone text file, per
  // piece), so a few short documents can leave one empty or too short: said now rather than when
  // `train` or `experiment` refuses it.
  const std::int64_t window = preset("tiny").seq_len + 1;
  const char* const names[] = {"train", "val", "test"};
  for (int s = 0; s < data::kNumSplits; ++s) {
    if (summary.tokens[s] >= static_cast<std::uint64_t>(window)) continue;
    std::fprintf(stderr,
                 "prepare: warning: split '%s' holds %s (%s), %s; splits are drawn per "
                 "document (per piece of up to %zu bytes of documents over %zu bytes, or of a corpus that is one "
                 "text file): give more text or larger --val-fraction/--test-fraction\n",
                 names[s], counted(summary.tokens[s], "token").c_str(), counted(summary.documents[s], "document").c_str(),
                 summary.tokens[s] == 0 ? "so train and experiment will refuse it"
                                        : concat("fewer than one window of the tiny preset (", window, " tokens)").c_str(),
                 data::kPieceBytes, data::kLongDocumentBytes);
  }
}

}  // namespace

void register_prepare_command(CLI::App& app) {
  auto args = std::make_shared<PrepareArgs>();
  CLI::App* cmd = app.add_subcommand(
      "prepare",
      "Tokenize a corpus into train/val/test token shards with a manifest.\n"
      "Inputs: JSONL (text in \"text\", optional \"id\"), .txt files (one document each), directories of them\n"
      "(recursive), and .gz versions. Without --input, the Python documentation sources of Debian's python3-doc\n"
      "are used; without --tokenizer, a SentencePiece BPE model is trained on the training split and saved as\n"
      "OUT/tokenizer.model. See docs/data.md.");
  cmd->add_option("--input", args->inputs, "Input files or directories (default: the python3-doc corpus)");
  auto* tokenizer = cmd->add_option("--tokenizer", args->tokenizer,
                                    "Tokenizer spec: bytes, gpt2:DIR or sp:FILE (default: train sp on the corpus)");
  cmd->add_option("--out", args->out, "Output directory")->required();
  cmd->add_option("--val-fraction", args->fractions.val, "Fraction of documents for validation")
      ->capture_default_str();
  cmd->add_option("--test-fraction", args->fractions.test, "Fraction of documents for test")->capture_default_str();
  cmd->add_option("--shard-tokens", args->shard_tokens, "Most tokens per shard file")->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("--vocab-size", args->vocab_size, "Vocabulary of the trained sp tokenizer (without --tokenizer)")
      ->capture_default_str()
      ->excludes(tokenizer);
  cmd->add_option("--max-sentences", args->max_sentences,
                  "Most training lines for the sp tokenizer (a deterministic sample beyond)")
      ->capture_default_str()
      ->check(at_least(1))
      ->excludes(tokenizer);
  cmd->add_option("--threads", args->threads, "Threads (0 = all cores)")->capture_default_str()->check(at_least(0));
  cmd->add_option("--text-field", args->text_field, "JSONL field holding each document's text")
      ->capture_default_str();
  cmd->add_flag("--quiet", args->quiet, "No progress output");
  cmd->callback([args] { run_prepare(*args); });
}

}  // namespace attnres::cli
