// Thread control and deterministic parallel loops.
#pragma once

#include <cstdint>

namespace attnres {

// Sets the OpenMP and OpenBLAS thread counts together (0 = all cores).
void set_num_threads(int n);
int num_threads();

// Reductions over tokens are split into chunks of this many tokens, then summed
// in chunk order, so results do not depend on the thread count.
inline constexpr std::int64_t kReduceChunk = 64;

inline std::int64_t num_chunks(std::int64_t n, std::int64_t chunk = kReduceChunk) {
  return (n + chunk - 1) / chunk;
}

}  // namespace attnres
