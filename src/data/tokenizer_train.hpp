// `attnres tokenizer train`: a SentencePiece BPE model from the training split of a corpus.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/corpus.hpp"

namespace attnres::data {

inline constexpr int kDefaultSpVocab = 4096;
inline constexpr std::int64_t kDefaultMaxSentences = 1'000'000;
inline constexpr std::size_t kMaxSentenceBytes = 16384;  // longer lines are left out of training

struct SpTrainOptions {
  int vocab_size = kDefaultSpVocab;
  SplitFractions fractions;  // must match prepare's so no val/test text is seen in training
  std::int64_t max_sentences = kDefaultMaxSentences;
  bool progress = true;
  std::size_t batch_bytes = 8 << 20;
};

struct SpTrainSummary {
  std::uint64_t documents = 0;       // training-split documents read
  std::uint64_t sentences = 0;       // their non-blank lines up to kMaxSentenceBytes
  std::uint64_t sentences_used = 0;  // after subsampling to max_sentences
  double seconds = 0;
};

// Sentences are the non-blank lines of training-split documents. Beyond max_sentences, the
// lines with the smallest hash64 are kept (a deterministic sample, independent of the thread
// count), in input order. The model is written atomically to `out_file` and then loaded back
// as a check.
SpTrainSummary train_sp_tokenizer(const std::vector<InputFile>& inputs, const std::string& out_file,
                                  const SpTrainOptions& options);

}  // namespace attnres::data
