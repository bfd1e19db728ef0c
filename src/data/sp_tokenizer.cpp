#include "data/sp_tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <unordered_map>

#include "data/hash.hpp"
#include "util/atomic_file.hpp"
#include "util/checksum.hpp"
#include "util/error.hpp"
#include "util/paths.hpp"
#include "util/text.hpp"

namespace attnres::data {
namespace {

class VectorIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(std::span<const std::string> sentences) : sentences_(sentences) {}
  bool done() const override { return index_ >= sentences_.size(); }
  void Next() override { ++index_; }
  const std::string& value() const override { return sentences_[index_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::span<const std::string> sentences_;
  std::size_t index_ = 0;
};

}  // namespace

SpTokenizer::SpTokenizer(const std::string& file, std::string spec)
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()), spec_(std::move(spec)) {
  require_path_kind(file, PathKind::kFile, "SentencePiece model",
                    std::filesystem::is_directory(file)
                        ? concat("give the model file, e.g. ",
                                 shell_quote("sp:" + (std::filesystem::path(file) / "tokenizer.model").string()))
                        : std::string());
  // Load from the bytes we hash, so the hash describes exactly the model in use.
  const std::string bytes = read_text_file(file);
  content_hash_ = checksum_hex(checksum64(bytes));
  legacy_content_hash_ = hex64(hash64(bytes));
  const auto status = processor_->LoadFromSerializedProto(bytes);
  require(status.ok(), "cannot load SentencePiece model '", file, "': ", status.ToString());
  vocab_size_ = processor_->GetPieceSize();
  eot_id_ = processor_->PieceToId(std::string(kEndOfText));
  require(eot_id_ >= 0 && eot_id_ < vocab_size_ && processor_->IdToPiece(eot_id_) == kEndOfText,
          "SentencePiece model '", file, "' has no '", kEndOfText,
          "' piece (train one with 'attnres tokenizer train')");
  decide_chunking();
}

void SpTokenizer::decide_chunking() {
  // The normaliser must act character by character: probe for a dummy prefix, whitespace folding
  // and compatibility folding (NFKC maps the ligature to "fi").
  auto round_trips = [&](std::string_view s) {
    std::vector<std::int32_t> ids;
    encode_whole(s, ids);
    return processor_->DecodeIds(std::vector<int>(ids.begin(), ids.end())) == s;
  };
  const std::vector<std::string> pieces = processor_->EncodeAsPieces("x");
  const bool lossless = !pieces.empty() && !pieces[0].starts_with(kSpaceMark) && round_trips("  a  b  ") &&
                        round_trips("\xEF\xAC\x81") && round_trips("a\n b\t\n");
  if (!lossless) return;
  bool newline_in_piece = false, space_inside_piece = false;
  for (int id = 0; id < vocab_size_; ++id) {
    if (processor_->IsControl(id) || processor_->IsUnknown(id) || processor_->IsByte(id)) continue;
    const std::string piece = processor_->IdToPiece(id);
    if (piece.find('\n') != std::string::npos) newline_in_piece = true;
    // A space mark after anything but space marks lets a piece span "x| y".
    std::size_t lead = 0;
    while (piece.compare(lead, kSpaceMark.size(), kSpaceMark) == 0) lead += kSpaceMark.size();
    if (piece.find(kSpaceMark, lead) != std::string::npos) space_inside_piece = true;
  }
  split_lines_ = !newline_in_piece;
  split_words_ = !space_inside_piece;
}

SpTokenizer::~SpTokenizer() = default;

void SpTokenizer::encode_whole(std::string_view text, std::vector<std::int32_t>& out) const {
  const std::vector<int> ids = processor_->EncodeAsIds(absl::string_view(text.data(), text.size()));
  out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<std::int32_t> SpTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  encode_append(text, out);
  return out;
}

void SpTokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) const {
  if (!split_lines_ && !split_words_) {
    encode_whole(text, out);
    return;
  }
  auto whole = [this](std::string_view chunk, std::vector<std::int32_t>& o) { encode_whole(chunk, o); };
  const std::size_t n = text.size();
  std::size_t start = 0;
  for (std::size_t i = 1; i <= n; ++i) {
    bool cut = i == n;
    if (!cut && split_lines_) cut = text[i] == '\n' || text[i - 1] == '\n';
    // Before a space that follows neither a space nor a literal U+2581 (also a space mark).
    if (!cut && split_words_ && text[i] == ' ' && text[i - 1] != ' ')
      cut = !(i >= 3 && text.substr(i - 3, 3) == kSpaceMark);
    if (cut) {
      cache_.encode(text.substr(start, i - start), out, whole);
      start = i;
    }
  }
}

std::string SpTokenizer::decode(std::span<const std::int32_t> ids) const {
  // Control pieces decode to nothing in SentencePiece; write end-of-text out as gpt2 does.
  std::string text;
  std::vector<int> run;
  auto flush = [&] {
    if (!run.empty()) text += processor_->DecodeIds(run);
    run.clear();
  };
  for (const std::int32_t id : ids) {
    require(id >= 0 && id < vocab_size_, "token id ", id, " is outside the SentencePiece vocabulary (", vocab_size_, ")");
    if (id == eot_id_) {
      flush();
      text += kEndOfText;
    } else {
      run.push_back(id);
    }
  }
  flush();
  return text;
}

namespace {

// SentencePiece's own error text in attnres' terms: its hints name its own flags
// (--character_coverage, --vocab_size), which attnres does not have.
std::string explain_training_error(const std::string& message, int vocab_size) {
  const auto number_after = [&](const std::string& marker) -> long long {
    const std::size_t at = message.find(marker);
    if (at == std::string::npos) return -1;
    const char* begin = message.c_str() + at + marker.size();
    char* end = nullptr;
    const long long value = std::strtoll(begin, &end, 10);
    return end == begin ? -1 : value;
  };
  // "Vocabulary size is smaller than required_chars. 300 vs 356. Increase vocab_size or ..."
  if (const long long needed = number_after(concat(vocab_size, " vs ")); needed > 0)
    return concat("--vocab-size ", vocab_size, " is too small for this text: its characters alone need ", needed,
                  " pieces; give --vocab-size ", needed, " or more");
  // "Vocabulary size too high (5000). Please set it to a value <= 1234."
  if (const long long most = number_after("value <= "); most > 0)
    return concat("--vocab-size ", vocab_size, " is too large for this text: it supports at most ", most,
                  " pieces; give a smaller --vocab-size or more text");
  // Anything else, without sentences that suggest SentencePiece's own flags.
  std::string kept;
  std::size_t begin = 0;
  while (begin < message.size()) {
    std::size_t end = message.find(". ", begin);
    end = end == std::string::npos ? message.size() : end + 1;
    const std::string sentence = message.substr(begin, end - begin);
    if (sentence.find("--") == std::string::npos) kept += sentence;
    begin = end;
  }
  return "SentencePiece training failed: " + kept;
}

}  // namespace

std::string train_sentencepiece(std::span<const std::string> sentences, int vocab_size) {
  require(vocab_size >= kMinSpVocab, "vocabulary size ", vocab_size, " is too small (at least ", kMinSpVocab, ")");
  require(!sentences.empty(), "no training text for the SentencePiece model");
  std::size_t longest = 0;
  for (const std::string& s : sentences) longest = std::max(longest, s.size());
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", "0.9995"},
      {"normalization_rule_name", "identity"},  // lossless: text in == text out
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},  // indentation runs become pieces
      {"control_symbols", std::string(kEndOfText)},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"max_sentence_length", std::to_string(std::max<std::size_t>(longest, 16))},
      {"input_sentence_size", "0"},  // we pick the sentences; SentencePiece's sampling is seeded by time
      // Recorded in the model file, so fixed to keep the bytes independent of the machine; BPE
      // training gains nothing from more threads anyway (measured: same time with 1 or 2).
      {"num_threads", "1"},
      // Nothing of SentencePiece's own on stderr (its warnings name its flags, not attnres'):
      // failures come back as a status, reported below in attnres' terms.
      {"minloglevel", "3"},
  };
  VectorIterator it(sentences);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  require(status.ok(), explain_training_error(std::string(status.message()), vocab_size));
  return model;
}

}  // namespace attnres::data
