// Deterministic reductions: per-chunk partial sums are added in chunk order.
#pragma once

#include "util/threads.hpp"
#include <cstdint>

namespace attnres::kernels {

// out[k] += sum over c of partial[c*width + k], c ascending.
template <class Real>
inline void sum_chunks_into(Real* out, const Real* partial, std::int64_t chunks, std::int64_t width) {
#pragma omp parallel for schedule(static) if (chunks * width >= kParallelMin)
  for (std::int64_t k = 0; k < width; ++k) {
    Real s = 0;
    for (std::int64_t c = 0; c < chunks; ++c) s += partial[c * width + k];
    out[k] += s;
  }
}

}  // namespace attnres::kernels
