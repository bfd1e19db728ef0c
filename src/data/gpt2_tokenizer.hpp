// GPT-2's byte-level BPE (encoder.json + vocab.bpe), reimplemented without a regex engine:
// the pre-tokenisation pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// is matched by hand over Unicode classes (unicode.hpp), and merges are looked up in a flat
// hash table keyed by the pair of ids, with a cache of recently encoded pieces.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/piece_cache.hpp"
#include "data/tokenizer.hpp"

namespace attnres::data {

// Splits `text` as the GPT-2 pattern does and appends the pieces (views into `text`) in order.
// Ill-formed UTF-8 bytes count as "other" characters, so every byte lands in some piece.
void gpt2_pretokenize(std::string_view text, std::vector<std::string_view>& pieces);

// GPT-2's reversible map from bytes to printable code points, in which encoder.json and
// vocab.bpe spell tokens: printable Latin-1 bytes map to themselves, the rest to 256, 257, ...
std::array<char32_t, 256> gpt2_byte_to_codepoint();

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // `dir` holds encoder.json and vocab.bpe; `spec` is what spec() returns.
  Gpt2Tokenizer(const std::string& dir, std::string spec);

  std::vector<std::int32_t> encode(std::string_view text) const override;
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) const override;
  std::string decode(std::span<const std::int32_t> ids) const override;
  int vocab_size() const override { return static_cast<int>(id_bytes_.size()); }
  std::int32_t eot_id() const override { return eot_id_; }
  const std::string& spec() const override { return spec_; }
  std::string content_hash() const override { return content_hash_; }
  std::string legacy_content_hash() const override { return legacy_content_hash_; }

  // The merges of one piece without the cache: by GPT-2's own algorithm (merge every occurrence
  // of the lowest-ranked pair, repeat), and by the O(n log n) heap form used for long pieces.
  // Public for the tests that check the two agree.
  void bpe_reference(std::string_view piece, std::vector<std::int32_t>& out) const;
  void bpe_heap(std::string_view piece, std::vector<std::int32_t>& out) const;

 private:
  struct Merge {
    std::int32_t rank;
    std::int32_t merged;
  };
  // Open-addressing table from (left id, right id) to its merge; immutable after loading.
  class PairTable {
   public:
    void reserve(std::size_t n);
    void insert(std::int32_t left, std::int32_t right, Merge merge);
    const Merge* find(std::int32_t left, std::int32_t right) const {
      const std::uint64_t key = pack(left, right);
      for (std::uint64_t slot = (key * 0x9E3779B97F4A7C15ULL) >> shift_;; slot = (slot + 1) & mask_) {
        if (keys_[slot] == key) return &values_[slot];
        if (keys_[slot] == kEmpty) return nullptr;
      }
    }

   private:
    static constexpr std::uint64_t kEmpty = ~0ULL;
    static std::uint64_t pack(std::int32_t a, std::int32_t b) {
      return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
    }
    std::vector<std::uint64_t> keys_;
    std::vector<Merge> values_;
    std::uint64_t mask_ = 0;
    int shift_ = 64;
  };

  static constexpr std::size_t kHeapMinPiece = 48;  // shorter pieces use bpe_reference

  void bpe(std::string_view piece, std::vector<std::int32_t>& out) const;

  std::string spec_;
  std::string content_hash_, legacy_content_hash_;
  std::array<std::int32_t, 256> byte_id_{};
  std::vector<std::string> id_bytes_;
  PairTable merges_;
  std::int32_t eot_id_ = -1;
  bool heap_exact_ = true;  // false if the merge file's ranks could make bpe_heap differ
  mutable PieceCache cache_;
};

}  // namespace attnres::data
