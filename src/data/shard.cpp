#include "data/shard.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::data {
namespace {

constexpr std::size_t kBufferTokens = 1 << 20;

void put_le(unsigned char* p, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

std::uint64_t get_le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

void encode_shard_header(const ShardHeader& h, unsigned char out[kShardHeaderBytes]) {
  std::memset(out, 0, kShardHeaderBytes);
  std::memcpy(out, kShardMagic, 8);
  put_le(out + 8, h.version, 4);
  put_le(out + 12, h.token_bytes, 4);
  put_le(out + 16, h.vocab_size, 8);
  put_le(out + 24, h.num_tokens, 8);
  put_le(out + 32, h.checksum, 8);
  put_le(out + 40, kShardHeaderBytes, 4);
}

ShardHeader decode_shard_header(const unsigned char* bytes, std::size_t size, const std::string& path) {
  require(size >= kShardHeaderBytes, path, ": ", size, " bytes, too short for a shard header (truncated shard?)");
  require(std::memcmp(bytes, kShardMagic, 8) == 0, path, ": not an attnres token shard (bad magic)");
  ShardHeader h;
  h.version = static_cast<std::uint32_t>(get_le(bytes + 8, 4));
  require(h.version == kShardVersion, path, ": shard format version ", h.version, " is not supported (expected ",
          kShardVersion, ")");
  h.token_bytes = static_cast<std::uint32_t>(get_le(bytes + 12, 4));
  require(h.token_bytes == 2 || h.token_bytes == 4, path, ": token width ", h.token_bytes, " bytes is not 2 or 4");
  h.vocab_size = get_le(bytes + 16, 8);
  h.num_tokens = get_le(bytes + 24, 8);
  h.checksum = get_le(bytes + 32, 8);
  require(get_le(bytes + 40, 4) == kShardHeaderBytes, path, ": unexpected header size");
  return h;
}

std::string shard_file_name(const std::string& split, std::size_t index) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "-%05zu.bin", index);
  return split + buf;
}

bool is_shard_file_name(const std::string& name) {
  for (const char* split : {"train-", "val-", "test-"}) {
    if (!name.starts_with(split) || !name.ends_with(".bin")) continue;
    const std::string digits = name.substr(std::strlen(split), name.size() - std::strlen(split) - 4);
    if (!digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return true;
  }
  return false;
}

ShardWriter::ShardWriter(std::string dir, std::string split, int vocab_size, std::int64_t max_tokens)
    : dir_(std::move(dir)),
      split_(std::move(split)),
      vocab_size_(vocab_size),
      max_tokens_(max_tokens),
      token_bytes_(token_bytes_for_vocab(vocab_size)) {
  require(max_tokens_ > 0, "shard size must be positive, got ", max_tokens_);
  buffer_.resize(kBufferTokens * token_bytes_);
}

ShardWriter::~ShardWriter() {
  if (file_) {
    std::fclose(file_);
    std::remove(temp_path_.c_str());
  }
}

void ShardWriter::open_shard() {
  const std::string name = shard_file_name(split_, shards_.size());
  final_path_ = (std::filesystem::path(dir_) / name).string();
  temp_path_ = temporary_path(final_path_);
  file_ = std::fopen(temp_path_.c_str(), "wb");
  if (!file_) fail("cannot write '", final_path_, "': cannot create its temporary '", temp_path_, "': ", std::strerror(errno));
  // A zeroed header until the shard is complete: an interrupted file has no valid magic.
  const unsigned char zeros[kShardHeaderBytes] = {};
  write_bytes(file_, zeros, sizeof zeros, final_path_);
  shard_tokens_ = 0;
  hasher_ = Hasher64();
}

void ShardWriter::flush_buffer() {
  if (buffered_ == 0) return;
  const std::size_t bytes = buffered_ * token_bytes_;
  hasher_.update(buffer_.data(), bytes);
  write_bytes(file_, buffer_.data(), bytes, final_path_);
  buffered_ = 0;
}

void ShardWriter::close_shard() {
  flush_buffer();
  ShardHeader h;
  h.token_bytes = token_bytes_;
  h.vocab_size = static_cast<std::uint64_t>(vocab_size_);
  h.num_tokens = shard_tokens_;
  h.checksum = hasher_.digest();
  unsigned char header[kShardHeaderBytes];
  encode_shard_header(h, header);
  if (std::fseek(file_, 0, SEEK_SET) != 0) fail("cannot write '", final_path_, "': seek failed: ", std::strerror(errno));
  write_bytes(file_, header, sizeof header, final_path_);
  std::FILE* file = file_;
  file_ = nullptr;
  commit_file(file, temp_path_, final_path_);
  shards_.push_back({std::filesystem::path(final_path_).filename().string(), shard_tokens_,
                     kShardHeaderBytes + shard_tokens_ * token_bytes_, h.checksum});
}

void ShardWriter::append(std::span<const std::int32_t> tokens) {
  std::size_t i = 0;
  while (i < tokens.size()) {
    if (!file_) open_shard();
    const std::size_t room = static_cast<std::size_t>(max_tokens_ - static_cast<std::int64_t>(shard_tokens_));
    const std::size_t take = std::min({room, tokens.size() - i, kBufferTokens - buffered_});
    unsigned char* out = buffer_.data() + buffered_ * token_bytes_;
    for (std::size_t k = 0; k < take; ++k) {
      const std::int32_t id = tokens[i + k];
      require(id >= 0 && id < vocab_size_, "token id ", id, " is outside the vocabulary (", vocab_size_, ")");
      const auto v = static_cast<std::uint32_t>(id);
      out[0] = static_cast<unsigned char>(v);
      out[1] = static_cast<unsigned char>(v >> 8);
      if (token_bytes_ == 4) {
        out[2] = static_cast<unsigned char>(v >> 16);
        out[3] = static_cast<unsigned char>(v >> 24);
      }
      out += token_bytes_;
    }
    buffered_ += take;
    shard_tokens_ += take;
    i += take;
    if (buffered_ == kBufferTokens) flush_buffer();
    if (static_cast<std::int64_t>(shard_tokens_) == max_tokens_) close_shard();
  }
}

std::vector<ShardInfo> ShardWriter::finish() {
  if (file_) close_shard();
  return shards_;
}

}  // namespace attnres::data
