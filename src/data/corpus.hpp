// Corpus inputs: finding input files, reading them record by record (JSONL lines or whole
// text files, optionally gzip-compressed), parsing records into documents, and the
// deterministic train/val/test split.
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace attnres::data {

enum class InputFormat : std::uint8_t { kJsonl, kText };

struct InputFile {
  std::string path;
  InputFormat format = InputFormat::kJsonl;
  bool gzip = false;
  std::string text_field = "text";  // the JSONL field holding a document's text (prepare --text-field)
};

// Files are taken as given (they must end in .jsonl, .jsonl.gz, .txt or .txt.gz); directories
// are searched recursively for such files, sorted by path, skipping entries whose name starts
// with '.'. A file reached twice is read once. Throws attnres::Error for a missing path, an
// unsupported file or a directory without inputs.
std::vector<InputFile> expand_inputs(std::span<const std::string> paths);

// The offline default corpus: the reStructuredText sources of the Python documentation from
// Debian's python3-doc (/usr/share/doc/python3*/html/_sources/**/*.rst.txt). The glob matches
// several symlinked aliases of one tree; they are resolved and the tree with the
// lexicographically last real path is used. Throws attnres::Error if python3-doc is missing.
std::vector<InputFile> default_corpus();

enum class Split : std::uint8_t { kTrain = 0, kVal = 1, kTest = 2 };
inline constexpr int kNumSplits = 3;
const char* split_name(Split split);

// Default fractions: 1% validation, 1% test (see docs/data.md).
struct SplitFractions {
  double val = 0.01;
  double test = 0.01;
  // The corpus is one text file: its one document is cut into pieces whatever its length
  // (split_piece_bytes). Set by split_for_corpus, not by hand.
  bool single_text = false;
  void validate() const;  // each in [0, 1), sum < 1; throws attnres::Error
};

// u = (hash64(key) >> 11) * 2^-53; test if u < test, val if u < test + val, else train.
// `key` is the document's `id` (a JSON string as is, any other JSON value serialised
// compactly) or, without an id, its text.
Split assign_split(std::string_view key, const SplitFractions& fractions);
// The rule above and the one for long documents, for manifests; with `single_text_piece_bytes`
// (a corpus that is one text file of at most kLongDocumentBytes, cut into pieces of that size)
// also the rule that cut it.
std::string split_rule_text(std::size_t single_text_piece_bytes = 0);

// A document longer than kLongDocumentBytes (one text file, say) is cut into pieces of at most
// kPieceBytes, each ending after its last newline (else space, else whole UTF-8 character) in its
// second half. Piece i is keyed hex64(hash64(key)) + "#" + i and ranked by u of that key; the
// round(test_fraction * N) lowest of the N pieces go to test and the next round(val_fraction * N)
// to val (each at least one when its fraction is positive, and at least one piece stays in
// train), the rest to train. Shorter documents, so every document of ordinary corpora, take the
// rule of assign_split as a whole, except the document of a corpus that is one text file: it is
// cut the same way into kMinPieces pieces or more of ceil(bytes / kMinPieces) bytes at most (but
// at least kMinPieceBytes), so a single short text has val and test splits too.
inline constexpr std::size_t kLongDocumentBytes = 256 << 10;
inline constexpr std::size_t kPieceBytes = 4 << 10;
inline constexpr std::size_t kMinPieces = kLongDocumentBytes / kPieceBytes;  // 64
inline constexpr std::size_t kMinPieceBytes = 64;

// The most bytes of a piece of a document of `bytes` (the rule above); 0: not cut.
std::size_t split_piece_bytes(std::size_t bytes, const SplitFractions& fractions);

// `fractions` for a corpus read from `inputs`: single_text when that is one text file (.txt or
// .txt.gz). prepare and tokenizer training both split through it, so they agree.
SplitFractions split_for_corpus(SplitFractions fractions, std::span<const InputFile> inputs);

// Bytes [begin, end) of a document's text and their split. A cut document's consecutive pieces
// of one split form one segment.
struct Segment {
  Split split = Split::kTrain;
  std::size_t begin = 0, end = 0;
  bool operator==(const Segment&) const = default;
};

// The document's segments in text order (one for a short document).
std::vector<Segment> split_document(std::string_view text, std::string_view key, const SplitFractions& fractions);

// One record of an input file: a JSONL line or a whole text file.
struct RawRecord {
  std::uint32_t source = 0;  // index into the reader's inputs
  std::uint64_t line = 0;    // 1-based line of a JSONL record; 1 for a text file
  std::string data;
};

struct SourceStats {
  std::uint64_t bytes = 0;      // raw (compressed) size
  std::uint64_t hash = 0;       // hash64 of the raw bytes
  std::uint64_t records = 0;    // JSONL lines or 1 for a text file (blank lines excluded)
  bool finished = false;
};

// Reads the inputs in order. Blank JSONL lines are ignored; a file that yields no record at
// all is an error ("empty input"). Throws attnres::Error naming the file on read, gzip and
// emptiness errors.
class CorpusReader {
 public:
  explicit CorpusReader(std::vector<InputFile> inputs);
  ~CorpusReader();
  CorpusReader(const CorpusReader&) = delete;
  CorpusReader& operator=(const CorpusReader&) = delete;

  // Replaces `batch` with the next records, at least one and about `max_bytes` of text in all;
  // returns false (and an empty batch) at the end of the corpus.
  bool next_batch(std::vector<RawRecord>& batch, std::size_t max_bytes);

  const std::vector<InputFile>& inputs() const { return inputs_; }
  const std::vector<SourceStats>& stats() const { return stats_; }
  std::uint64_t raw_bytes_read() const { return raw_bytes_read_; }    // as stored (compressed for .gz)
  std::uint64_t text_bytes_read() const { return text_bytes_read_; }  // after decompression

 private:
  class Stream;
  bool open_next_file();
  bool next_record(RawRecord& record);

  std::vector<InputFile> inputs_;
  std::vector<SourceStats> stats_;
  std::size_t current_ = 0;
  std::unique_ptr<Stream> stream_;
  std::string pending_;             // decompressed bytes not yet cut into records
  std::size_t pending_pos_ = 0;
  std::uint64_t line_ = 0;
  bool stream_done_ = false;
  std::uint64_t raw_bytes_read_ = 0;
  std::uint64_t text_bytes_read_ = 0;
  std::exception_ptr deferred_error_;  // a read error met after some records of a batch
};

struct Document {
  std::string text;
  std::vector<Segment> segments;  // split_document(text, key): where each part of it goes
  bool empty = false;             // text empty or only whitespace: skipped and counted
  std::string_view segment_text(const Segment& s) const {
    return std::string_view(text).substr(s.begin, s.end - s.begin);
  }
};

// Validates and parses one record: invalid UTF-8, malformed JSON, a non-object line, a missing
// or non-string `text` are errors naming "file:line". Consumes record.data.
Document parse_record(RawRecord& record, const InputFile& input, const SplitFractions& fractions);

}  // namespace attnres::data
