// attnres tokenizer train|encode|info.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "data/corpus.hpp"
#include "data/tokenizer.hpp"
#include "data/tokenizer_train.hpp"
#include "data/unicode.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

namespace attnres::cli {
namespace {

struct TrainArgs {
  std::vector<std::string> inputs;
  std::string out;
  data::SpTrainOptions options;
  int threads = 0;
  bool quiet = false;
};

struct EncodeArgs {
  std::string tokenizer;
  std::vector<std::string> files;
  bool count = false;
};

void run_train(TrainArgs& args) {
  if (args.threads > 0) set_num_threads(args.threads);
  const std::vector<data::InputFile> inputs =
      args.inputs.empty() ? data::default_corpus() : data::expand_inputs(args.inputs);
  args.options.progress = !args.quiet;
  data::train_sp_tokenizer(inputs, args.out, args.options);
}

void run_encode(const EncodeArgs& args) {
  const std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(args.tokenizer);
  std::vector<std::int32_t> ids;
  for (const std::string& file : args.files) {
    const std::string text = read_text_file(file);
    const std::size_t bad = data::find_invalid_utf8(text);
    require(bad == std::string::npos, file, ":", data::line_of_offset(text, bad), ": invalid UTF-8 (byte offset ", bad,
            " of the file)");
    ids.clear();
    tokenizer->encode_append(text, ids);
    std::string line;
    if (args.count) {
      line = std::to_string(ids.size());
    } else {
      line.reserve(ids.size() * 6);
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) line.push_back(' ');
        line += std::to_string(ids[i]);
      }
    }
    line.push_back('\n');
    if (std::fwrite(line.data(), 1, line.size(), stdout) != line.size()) fail("cannot write to standard output");
  }
  if (std::fflush(stdout) != 0) fail("cannot write to standard output");
}

void run_info(const std::string& spec) {
  const std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(spec);
  std::printf("spec: %s\nvocab_size: %d\neot_id: %d\nhash: %s\n", tokenizer->spec().c_str(), tokenizer->vocab_size(),
              tokenizer->eot_id(), tokenizer->content_hash().c_str());
}

}  // namespace

void register_tokenizer_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("tokenizer", "Train, inspect and run tokenizers (bytes, gpt2:DIR, sp:FILE)");
  cmd->require_subcommand(1);

  auto train = std::make_shared<TrainArgs>();
  CLI::App* t = cmd->add_subcommand(
      "train",
      "Train a SentencePiece BPE tokenizer (byte fallback, <|endoftext|> piece) on the training split of the\n"
      "inputs, using the same split rule and fractions as prepare. Deterministic.");
  t->add_option("--input", train->inputs, "Input files or directories (default: the python3-doc corpus)");
  t->add_option("--vocab-size", train->options.vocab_size, "Vocabulary size (4k-32k is typical)")
      ->capture_default_str();
  t->add_option("--out", train->out, "Model file to write")->required();
  t->add_option("--val-fraction", train->options.fractions.val, "Validation fraction (as for prepare)")
      ->capture_default_str();
  t->add_option("--test-fraction", train->options.fractions.test, "Test fraction (as for prepare)")
      ->capture_default_str();
  t->add_option("--max-sentences", train->options.max_sentences, "Most training lines (a deterministic sample beyond)")
      ->check(at_least(1))
      ->capture_default_str();
  t->add_option("--threads", train->threads, "Threads (0 = all cores)")->capture_default_str()->check(at_least(0));
  t->add_flag("--quiet", train->quiet, "No progress output");
  t->callback([train] { run_train(*train); });

  auto encode = std::make_shared<EncodeArgs>();
  CLI::App* e = cmd->add_subcommand("encode", "Print the token ids of each FILE (one line per file), or their count");
  e->add_option("--tokenizer", encode->tokenizer, "Tokenizer spec")->required();
  e->add_flag("--count", encode->count, "Print only the number of tokens");
  e->add_option("files", encode->files, "Text files")->required();
  e->callback([encode] { run_encode(*encode); });

  auto spec = std::make_shared<std::string>();
  CLI::App* i = cmd->add_subcommand("info", "Print a tokenizer's spec, vocabulary size, end-of-text id and hash");
  i->add_option("--tokenizer", *spec, "Tokenizer spec")->required();
  i->callback([spec] { run_info(*spec); });
}

}  // namespace attnres::cli
