#include "util/threads.hpp"
#include "kernels/embedding.hpp"

#include <algorithm>
#include <cstring>

namespace attnres::kernels {

template <class Real>
void embedding_forward(Real* out, const std::int32_t* tokens, const Real* table, std::int64_t n, int d) {
#pragma omp parallel for schedule(static) if (n * d >= kParallelMin)
  for (std::int64_t t = 0; t < n; ++t)
    std::memcpy(out + t * d, table + static_cast<std::int64_t>(tokens[t]) * d, sizeof(Real) * d);
}

template <class Real>
void embedding_backward(Real* dtable, const std::int32_t* tokens, const Real* dout, std::int64_t n, int d) {
  constexpr int kColumns = 32;
  const int blocks = (d + kColumns - 1) / kColumns;
#pragma omp parallel for schedule(static) if (n * d >= kParallelMin)
  for (int b = 0; b < blocks; ++b) {
    const int k0 = b * kColumns, k1 = std::min(d, k0 + kColumns);
    for (std::int64_t t = 0; t < n; ++t) {
      Real* row = dtable + static_cast<std::int64_t>(tokens[t]) * d;
      const Real* g = dout + t * d;
      for (int k = k0; k < k1; ++k) row[k] += g[k];
    }
  }
}

template void embedding_forward<float>(float*, const std::int32_t*, const float*, std::int64_t, int);
template void embedding_forward<double>(double*, const std::int32_t*, const double*, std::int64_t, int);
template void embedding_backward<float>(float*, const std::int32_t*, const float*, std::int64_t, int);
template void embedding_backward<double>(double*, const std::int32_t*, const double*, std::int64_t, int);

}  // namespace attnres::kernels
