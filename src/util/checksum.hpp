// The payload checksum of files attnres writes for others to read (safetensors weights and
// checkpoints): XXH3-64 from Debian's libxxhash, a well-known, documented, non-cryptographic
// hash (tens of GB/s: a 500 MB checkpoint costs a few tens of milliseconds). It detects
// corruption (a flipped bit, a truncated or zeroed block), not tampering. Other tools can
// check it, e.g. Python's `xxhash.xxh3_64_hexdigest(payload)`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attnres {

inline constexpr std::string_view kChecksumAlgorithm = "xxh3-64";

std::uint64_t checksum64(const void* data, std::size_t size);
inline std::uint64_t checksum64(std::string_view bytes) { return checksum64(bytes.data(), bytes.size()); }

// 16 lower-case hex digits (the form written in metadata; xxhash's canonical big-endian form).
std::string checksum_hex(std::uint64_t digest);

}  // namespace attnres
