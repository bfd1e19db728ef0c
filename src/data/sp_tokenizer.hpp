// SentencePiece tokenizers (libsentencepiece): loading "sp:FILE" models and training new ones.
// Models we train are lossless on UTF-8 text: identity normalisation, no whitespace folding or
// dummy prefix, byte fallback for characters outside the vocabulary, and <|endoftext|> as a
// control piece, so the literal string in a document is ordinary text (as for gpt2).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/piece_cache.hpp"
#include "data/tokenizer.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace attnres::data {

class SpTokenizer final : public Tokenizer {
 public:
  // Throws attnres::Error if `file` is unreadable, not a model, or has no <|endoftext|> piece.
  SpTokenizer(const std::string& file, std::string spec);
  ~SpTokenizer() override;

  std::vector<std::int32_t> encode(std::string_view text) const override;
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) const override;
  std::string decode(std::span<const std::int32_t> ids) const override;
  int vocab_size() const override { return vocab_size_; }
  std::int32_t eot_id() const override { return eot_id_; }
  const std::string& spec() const override { return spec_; }
  std::string content_hash() const override { return content_hash_; }
  std::string legacy_content_hash() const override { return legacy_content_hash_; }

  // SentencePiece on the whole text, without the chunking and cache of encode(); for tests.
  void encode_whole(std::string_view text, std::vector<std::int32_t>& out) const;
  bool chunks_lines() const { return split_lines_; }
  bool chunks_words() const { return split_words_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  // SentencePiece BPE never merges across a point no vocabulary piece spans, so text may be cut
  // there, encoded chunk by chunk and cached with identical results. Decided per model at load:
  // lines when no piece holds '\n', words (before a space that follows a non-space) when no
  // piece has a non-space followed by a space, and only for lossless models (identity-like
  // normalisation, no dummy prefix, no whitespace folding), which every model we train is.
  void decide_chunking();
  static constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  bool split_lines_ = false;
  bool split_words_ = false;
  mutable PieceCache cache_;
  std::string spec_;
  std::string content_hash_, legacy_content_hash_;
  int vocab_size_ = 0;
  std::int32_t eot_id_ = -1;
};

inline constexpr int kMinSpVocab = 300;  // unk, end-of-text, 256 byte pieces and a few merges

// Trains a BPE model on `sentences` (in the given order; the result is a pure function of them)
// and returns the serialized model. Throws attnres::Error when SentencePiece refuses.
std::string train_sentencepiece(std::span<const std::string> sentences, int vocab_size);

}  // namespace attnres::data
