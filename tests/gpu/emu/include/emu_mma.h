#pragma once
#include <type_traits>
#include <cstdio>
#include <cstdlib>
#include "emu_device.hpp"
namespace nvcuda::wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = rows * cols;
  float x[rows * cols];
};
inline void emu_check(const void* p, unsigned ldm, unsigned elem) {
  if ((reinterpret_cast<std::uintptr_t>(p) & 31) != 0 || (ldm * elem) % 16 != 0) {
    std::fprintf(stderr, "WMMA constraint violated: ptr %p ldm %u\n", p, ldm);
    std::abort();
  }
}
inline float emu_val(float v) { return v; }
inline float emu_val(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class Use, int M, int N, int K, class T, class Layout, class P>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const P* p, unsigned ldm) {
  using F = fragment<Use, M, N, K, T, Layout>;
  emu_check(p, ldm, sizeof(P));
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] = emu_val(std::is_same_v<Layout, col_major> ? p[c * ldm + r] : p[r * ldm + c]);
}
template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t l) {
  emu_check(p, ldm, 4);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) f.x[r * N + c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t l) {
  emu_check(p, ldm, 4);
  if (emu::ctx.lane != 0) return;  // one writer (the hardware writes each element once)
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * N + c];
}
template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, float v) {
  for (auto& x : f.x) x = v;
}
template <int M, int N, int K, class T, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  float out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = c.x[i * N + j];
      for (int k = 0; k < K; ++k) s += a.x[i * K + k] * b.x[k * N + j];
      out[i * N + j] = s;
    }
  std::memcpy(d.x, out, sizeof(out));
}
}  // namespace nvcuda::wmma
