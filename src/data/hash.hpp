// A small 64-bit content hash used for shard checksums, source-file and tokenizer hashes and the
// train/val/test split. It is our own function (documented in docs/data.md, "Checksums"), chosen
// for speed (four independent 64-bit lanes over 32-byte stripes) over cryptographic strength:
// it detects corruption, not tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace attnres::data {

// Streaming form: update() any number of times, then digest(). Equal input bytes give equal
// digests however they are split across update() calls.
class Hasher64 {
 public:
  explicit Hasher64(std::uint64_t seed = 0);
  void update(const void* data, std::size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  std::uint64_t digest() const;  // does not change the state; more bytes may follow

 private:
  std::uint64_t lanes_[4];
  unsigned char buffer_[32];
  std::size_t buffered_ = 0;
  std::uint64_t total_ = 0;
};

std::uint64_t hash64(const void* data, std::size_t size, std::uint64_t seed = 0);
inline std::uint64_t hash64(std::string_view bytes, std::uint64_t seed = 0) {
  return hash64(bytes.data(), bytes.size(), seed);
}

// 16 lower-case hex digits, the form used in manifests.
std::string hex64(std::uint64_t value);

// Hashes a whole file (raw bytes); throws attnres::Error naming the file if it cannot be read.
std::uint64_t hash_file(const std::string& path);

}  // namespace attnres::data
