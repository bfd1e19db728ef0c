// Small elementwise helpers shared by the model's forward and backward.
#pragma once

#include "util/threads.hpp"
#include <cstdint>
#include <cstring>

namespace attnres::kernels {

// dst += src
template <class Real>
inline void add_into(Real* dst, const Real* src, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

template <class Real>
inline void copy(Real* dst, const Real* src, std::int64_t n) {
  std::memcpy(dst, src, sizeof(Real) * static_cast<std::size_t>(n));
}

template <class Real>
inline void zero(Real* dst, std::int64_t n) {
  std::memset(dst, 0, sizeof(Real) * static_cast<std::size_t>(n));
}

}  // namespace attnres::kernels
