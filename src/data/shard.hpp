// Token shards: a 64-byte little-endian header, then the tokens as little-endian 16- or 32-bit
// integers. Layout (docs/data.md, "Shard format"):
//   0  magic "ATTNTOKS"        8  u32 format version (1)   12 u32 token width in bytes (2 | 4)
//   16 u64 vocabulary size     24 u64 token count          32 u64 hash64 of the payload bytes
//   40 u32 header size (64)    44 zero padding to 64
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "data/hash.hpp"

namespace attnres::data {

inline constexpr char kShardMagic[8] = {'A', 'T', 'T', 'N', 'T', 'O', 'K', 'S'};
inline constexpr std::uint32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderBytes = 64;

struct ShardHeader {
  std::uint32_t version = kShardVersion;
  std::uint32_t token_bytes = 2;
  std::uint64_t vocab_size = 0;
  std::uint64_t num_tokens = 0;
  std::uint64_t checksum = 0;
};

// 16-bit tokens when every id fits (vocabulary <= 65536), else 32-bit.
inline std::uint32_t token_bytes_for_vocab(std::int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

void encode_shard_header(const ShardHeader& header, unsigned char out[kShardHeaderBytes]);
// Throws attnres::Error naming `path` if the bytes are not a header this version understands.
ShardHeader decode_shard_header(const unsigned char* bytes, std::size_t size, const std::string& path);

struct ShardInfo {
  std::string file;  // name inside the dataset directory
  std::uint64_t tokens = 0;
  std::uint64_t bytes = 0;  // whole file
  std::uint64_t checksum = 0;
};

// Writes one split's tokens as shards "<split>-00000.bin", "<split>-00001.bin", ... of at most
// `max_tokens` tokens. Each shard is written under a hidden temporary name and renamed into
// place only when complete and synced; a writer destroyed before finish() removes its temporary.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string split, int vocab_size, std::int64_t max_tokens);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Throws attnres::Error if an id is outside [0, vocab_size).
  void append(std::span<const std::int32_t> tokens);
  // Completes the last shard; returns every shard written.
  std::vector<ShardInfo> finish();

 private:
  void open_shard();
  void flush_buffer();
  void close_shard();

  std::string dir_, split_;
  std::int64_t vocab_size_;
  std::int64_t max_tokens_;
  std::uint32_t token_bytes_;
  std::FILE* file_ = nullptr;
  std::string temp_path_, final_path_;
  std::uint64_t shard_tokens_ = 0;
  std::vector<unsigned char> buffer_;
  std::size_t buffered_ = 0;
  Hasher64 hasher_;  // of the open shard's payload
  std::vector<ShardInfo> shards_;
};

// "<split>-NNNNN.bin".
std::string shard_file_name(const std::string& split, std::size_t index);
// True for names prepare writes (shards of any split), used to clear stale shards.
bool is_shard_file_name(const std::string& name);

}  // namespace attnres::data
