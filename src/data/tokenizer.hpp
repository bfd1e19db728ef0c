// Tokenizers behind one interface, named by a spec string:
//   "bytes"       UTF-8 bytes 0-255, end-of-text 256 (vocabulary 257)
//   "gpt2:DIR"    GPT-2 byte-level BPE from DIR/encoder.json and DIR/vocab.bpe
//   "sp:FILE"     a SentencePiece model (see sp_tokenizer.hpp for training one)
// Every implementation is safe to call concurrently from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace attnres::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;  // no end-of-text added
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual std::int32_t eot_id() const = 0;
  virtual const std::string& spec() const = 0;      // e.g. "bytes", "gpt2:/path", "sp:/path/model"
  // What identifies the tokenizer wherever its files are (manifests, checkpoints): XXH3-64
  // (util/checksum.hpp) of its files, 16 hex digits (docs/data.md, "Content hash").
  virtual std::string content_hash() const = 0;
  // The same with hash64 (data/hash.hpp), as manifests of format version 1 recorded it.
  virtual std::string legacy_content_hash() const = 0;

  // Appends the ids of `text` to `out` (what encode() returns); lets callers reuse a buffer.
  virtual void encode_append(std::string_view text, std::vector<std::int32_t>& out) const;
};

// Paths inside the spec are made absolute, so spec() means the same from any directory.
// Throws attnres::Error on a bad spec or a missing/malformed file.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

// A spec's paths relative to `dir` ("sp:/d/x/tok.model" from /d: "sp:x/tok.model"), as a
// prepared directory names its tokenizer so that it can be moved with it; "bytes" as is.
std::string spec_relative_to(const std::string& spec, const std::string& dir);
// The inverse: a spec whose relative path is taken from `dir`, made absolute.
std::string spec_resolved_from(const std::string& spec, const std::string& dir);

// The literal text decode() gives for the end-of-text id.
inline constexpr std::string_view kEndOfText = "<|endoftext|>";

}  // namespace attnres::data
