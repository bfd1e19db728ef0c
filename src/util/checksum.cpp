#include "util/checksum.hpp"

// Header-only (no libxxhash to link, so the bare-GPU bundle carries just the header).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdio>

namespace attnres {

std::uint64_t checksum64(const void* data, std::size_t size) { return XXH3_64bits(data, size); }

std::string checksum_hex(std::uint64_t digest) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(digest));
  return buf;
}

}  // namespace attnres
