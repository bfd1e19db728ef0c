#include "util/threads.hpp"
#include "kernels/rope.hpp"

#include <cmath>

namespace attnres::kernels {

template <class Real>
void rope_tables(Real* cos, Real* sin, int max_pos, int head_dim, double theta) {
  const int half = head_dim / 2;
  for (int p = 0; p < max_pos; ++p)
    for (int i = 0; i < half; ++i) {
      const double inv_freq = 1.0 / std::pow(theta, 2.0 * i / head_dim);
      const double angle = p * inv_freq;
      cos[p * half + i] = static_cast<Real>(std::cos(angle));
      sin[p * half + i] = static_cast<Real>(std::sin(angle));
    }
}

namespace {
// sign = +1 rotates forward, -1 applies the inverse rotation.
template <class Real>
void rotate(Real* x, std::int64_t rows, int seq_len, int pos0, int n_heads, int head_dim, const Real* cos,
            const Real* sin, Real sign) {
  const int half = head_dim / 2;
  const int d = n_heads * head_dim;
#pragma omp parallel for schedule(static) if (rows * n_heads * head_dim >= kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t pos = pos0 + r % seq_len;
    const Real* c = cos + pos * half;
    const Real* s = sin + pos * half;
    for (int h = 0; h < n_heads; ++h) {
      Real* x1 = x + r * d + h * head_dim;
      Real* x2 = x1 + half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const Real a = x1[i], b = x2[i], si = sign * s[i];
        x1[i] = a * c[i] - b * si;
        x2[i] = b * c[i] + a * si;
      }
    }
  }
}
}  // namespace

template <class Real>
void rope_forward(Real* x, std::int64_t rows, int seq_len, int pos0, int n_heads, int head_dim, const Real* cos,
                  const Real* sin) {
  rotate(x, rows, seq_len, pos0, n_heads, head_dim, cos, sin, Real(1));
}

template <class Real>
void rope_backward(Real* dx, std::int64_t rows, int seq_len, int pos0, int n_heads, int head_dim, const Real* cos,
                   const Real* sin) {
  rotate(dx, rows, seq_len, pos0, n_heads, head_dim, cos, sin, Real(-1));
}

template void rope_tables<float>(float*, float*, int, int, double);
template void rope_tables<double>(double*, double*, int, int, double);
template void rope_forward<float>(float*, std::int64_t, int, int, int, int, const float*, const float*);
template void rope_forward<double>(double*, std::int64_t, int, int, int, int, const double*, const double*);
template void rope_backward<float>(float*, std::int64_t, int, int, int, int, const float*, const float*);
template void rope_backward<double>(double*, std::int64_t, int, int, int, int, const double*, const double*);

}  // namespace attnres::kernels
