#include "data/hash.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "util/error.hpp"

namespace attnres::data {
namespace {

constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr std::uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;

inline std::uint64_t load_le64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

inline std::uint64_t round64(std::uint64_t lane, std::uint64_t word) {
  return std::rotl(lane + word * kP2, 31) * kP1;
}

inline void stripe(std::uint64_t* lanes, const unsigned char* p) {
  lanes[0] = round64(lanes[0], load_le64(p));
  lanes[1] = round64(lanes[1], load_le64(p + 8));
  lanes[2] = round64(lanes[2], load_le64(p + 16));
  lanes[3] = round64(lanes[3], load_le64(p + 24));
}

}  // namespace

Hasher64::Hasher64(std::uint64_t seed) {
  for (int i = 0; i < 4; ++i) lanes_[i] = seed + static_cast<std::uint64_t>(i + 1) * kP1;
}

void Hasher64::update(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (buffered_ != 0) {
    const std::size_t take = std::min(size, sizeof buffer_ - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    size -= take;
    if (buffered_ < sizeof buffer_) return;
    stripe(lanes_, buffer_);
    buffered_ = 0;
  }
  while (size >= 32) {
    stripe(lanes_, p);
    p += 32;
    size -= 32;
  }
  if (size != 0) {
    std::memcpy(buffer_, p, size);
    buffered_ = size;
  }
}

std::uint64_t Hasher64::digest() const {
  std::uint64_t lanes[4] = {lanes_[0], lanes_[1], lanes_[2], lanes_[3]};
  if (buffered_ != 0) {
    // The last partial stripe is zero-padded; the total length below tells "ab" from "ab\0".
    unsigned char last[32] = {};
    std::memcpy(last, buffer_, buffered_);
    stripe(lanes, last);
  }
  std::uint64_t h = std::rotl(lanes[0], 1) + std::rotl(lanes[1], 7) + std::rotl(lanes[2], 12) +
                    std::rotl(lanes[3], 18);
  h ^= total_;
  // splitmix64's finaliser: every input bit affects every output bit.
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL;
  return h ^ (h >> 31);
}

std::uint64_t hash64(const void* data, std::size_t size, std::uint64_t seed) {
  Hasher64 hasher(seed);
  hasher.update(data, size);
  return hasher.digest();
}

std::string hex64(std::uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i) {
    out[static_cast<std::size_t>(i)] = kDigits[value & 15];
    value >>= 4;
  }
  return out;
}

std::uint64_t hash_file(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) fail("cannot read '", path, "': ", std::strerror(errno));
  Hasher64 hasher;
  std::vector<unsigned char> block(1 << 20);
  for (;;) {
    const std::size_t got = std::fread(block.data(), 1, block.size(), file.get());
    hasher.update(block.data(), got);
    if (got < block.size()) {
      if (std::ferror(file.get())) fail("cannot read '", path, "': ", std::strerror(errno));
      break;
    }
  }
  return hasher.digest();
}

}  // namespace attnres::data
