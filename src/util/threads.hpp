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

// Loops with less work than this (in elements touched) run on one thread: forking a team
// costs more than it saves, and on a busy machine every barrier can wait a whole time slice.
inline constexpr std::int64_t kParallelMin = 1 << 15;

inline std::int64_t num_chunks(std::int64_t n, std::int64_t chunk = kReduceChunk) {
  return (n + chunk - 1) / chunk;
}

}  // namespace attnres
