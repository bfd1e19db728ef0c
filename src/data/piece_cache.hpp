// A bounded, thread-safe cache from text pieces to their token ids. Tokenizers that encode text
// piece by piece (GPT-2 words, SentencePiece whitespace-delimited chunks) see the same pieces
// over and over; a hit skips the merge loop. Sharded so concurrent encoders rarely contend.
// Clearing a full shard only costs speed: results never depend on what is cached.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/hash.hpp"

namespace attnres::data {

class PieceCache {
 public:
  static constexpr std::size_t kMaxPiece = 128;  // longer pieces rarely repeat: not cached

  // Appends the ids of `piece` to `out`, computing them with encode(piece, out) on a miss.
  template <class Encode>
  void encode(std::string_view piece, std::vector<std::int32_t>& out, Encode&& encode_piece) {
    if (piece.size() > kMaxPiece) {
      encode_piece(piece, out);
      return;
    }
    const std::uint64_t h = hash64(piece);
    Shard& shard = shards_[(h >> 32) % kShards];
    {
      std::lock_guard<std::mutex> lock(shard.mutex);
      const auto it = shard.map.find(Key{piece, h});
      if (it != shard.map.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const std::size_t before = out.size();
    encode_piece(piece, out);
    std::vector<std::int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (shard.map.size() >= kShardEntries) shard.map.clear();
    shard.map.emplace(StoredKey{std::string(piece), h}, std::move(ids));
  }

 private:
  static constexpr std::size_t kShards = 16;
  static constexpr std::size_t kShardEntries = 1 << 14;

  // The hash is computed once per lookup and stored with the key.
  struct Key {
    std::string_view text;
    std::uint64_t hash;
  };
  struct StoredKey {
    std::string text;
    std::uint64_t hash;
  };
  struct KeyHash {
    using is_transparent = void;
    std::size_t operator()(const Key& k) const noexcept { return static_cast<std::size_t>(k.hash); }
    std::size_t operator()(const StoredKey& k) const noexcept { return static_cast<std::size_t>(k.hash); }
  };
  struct KeyEq {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const noexcept {
      return a.hash == b.hash && std::string_view(a.text) == std::string_view(b.text);
    }
  };
  struct Shard {
    std::mutex mutex;
    std::unordered_map<StoredKey, std::vector<std::int32_t>, KeyHash, KeyEq> map;
  };
  std::array<Shard, kShards> shards_;
};

}  // namespace attnres::data
