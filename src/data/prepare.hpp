// `attnres prepare`: corpus -> tokenized shards + manifest.json (format in docs/data.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/corpus.hpp"
#include "data/tokenizer.hpp"

namespace attnres::data {

inline constexpr std::int64_t kDefaultShardTokens = 100'000'000;
// 2: long documents cut into pieces for the split (corpus.hpp), the tokenizer named relative to
// the directory with its XXH3 content hash. Version 1 directories are still read.
inline constexpr int kManifestVersion = 2;
inline constexpr const char* kManifestName = "manifest.json";

// DIR/manifest.json of a prepared dataset directory `dir`; fails naming `dir` when it does not
// exist, is a file (e.g. the manifest itself) or holds no manifest (not prepared, or unfinished).
std::string manifest_path(const std::string& dir);

struct PrepareOptions {
  std::vector<InputFile> inputs;
  std::string out_dir;
  SplitFractions fractions;
  std::int64_t shard_tokens = kDefaultShardTokens;
  bool progress = true;
  std::size_t batch_bytes = 8 << 20;  // text parsed and tokenized per parallel round
};

struct PrepareSummary {
  std::uint64_t documents[kNumSplits] = {};  // a cut document counts once per segment (corpus.hpp)
  std::uint64_t tokens[kNumSplits] = {};
  std::uint64_t skipped_empty = 0;
  std::uint64_t cut_documents = 0;  // input documents cut into pieces (corpus.hpp)
  // A corpus of one text file of at most kLongDocumentBytes, cut into pieces of at most this many
  // bytes (split_piece_bytes); 0 otherwise.
  std::size_t single_text_piece_bytes = 0;
  std::uint64_t raw_bytes = 0;   // read from the input files (compressed, for .gz ones)
  std::uint64_t text_bytes = 0;  // of text, after decompression
  double seconds = 0;
};

// Creates `dir` if needed and removes what an earlier prepare left there: the manifest first (so
// the directory stops looking prepared), then shards and temporaries. Other files are kept.
void begin_output_dir(const std::string& dir);

// Reads every input in order, splits documents, encodes each as [eot, tokens...] and appends it
// to its split's shards in input order, using all OpenMP threads; the output bytes do not depend
// on the thread count. The previous manifest in out_dir is removed first and the new one written
// last, so a failed or interrupted run never leaves a directory that looks prepared.
PrepareSummary prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer);

}  // namespace attnres::data
