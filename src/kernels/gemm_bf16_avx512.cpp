#include "kernels/gemm_bf16_avx512.hpp"

#include <algorithm>

#include "kernels/avx512_tiles.hpp"
#include "kernels/scratch.hpp"
#include "util/error.hpp"

#if ATTNRES_AVX512_CODE
#include <cpuid.h>
#endif

namespace attnres::kernels::avx512 {

namespace {

struct Cpu {
  bool avx512 = false, bf16 = false, amd = false;
};

Cpu detect() {
  Cpu cpu;
#if ATTNRES_AVX512_CODE
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(0, 0, &a, &b, &c, &d) != 0)
    cpu.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
  if (__get_cpuid_count(1, 0, &a, &b, &c, &d) == 0) return cpu;
  const bool osxsave = (c & (1u << 27)) != 0, fma = (c & (1u << 12)) != 0;
  if (!osxsave || !fma || __get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return cpu;
  const bool f = (b & (1u << 16)) != 0, dq = (b & (1u << 17)) != 0, bw = (b & (1u << 30)) != 0,
             vl = (b & (1u << 31)) != 0;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const bool zmm_state = (lo & 0xe6u) == 0xe6u;  // SSE, AVX, opmask and ZMM state enabled by the OS
  cpu.avx512 = f && dq && bw && vl && zmm_state;
  if (cpu.avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0) cpu.bf16 = (a & (1u << 5)) != 0;
#endif
  return cpu;
}

const Cpu& cpu() {
  static const Cpu c = detect();
  return c;
}

}  // namespace

bool cpu_has_avx512() { return cpu().avx512; }
bool cpu_has_avx512_bf16() { return cpu().bf16; }
bool cpu_is_amd() { return cpu().amd; }

#if ATTNRES_AVX512_CODE
namespace {

constexpr int kMR = 14, kNV = 2, kNR = 16 * kNV;

#define ATTNRES_DPBF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16")))
#define ATTNRES_DPBF16_INLINE \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16"), always_inline)) inline

struct Problem {
  bool trans_a, trans_b;
  std::int64_t m, n, k;
  float alpha;
  const float* a;
  std::int64_t lda;
  const float* b;
  std::int64_t ldb;
  float beta;
  float* c;
  std::int64_t ldc;
};

// ---- fma: panels of bf16-rounded fp32 values, one k per step ------------------------------

// Row block mb of A stored [m, k] (k contiguous).
ATTNRES_AVX512_TARGET void pack_a_fma(const Problem& p, std::int64_t mb, float* out) {
  const std::int64_t i0 = mb * kMR, rows = std::min<std::int64_t>(kMR, p.m - i0);
  pack_panel_rows<kMR>(p.a + i0 * p.lda, p.lda, rows, p.k, out);
}

// Steps [s0, s0 + 16) of every row block of A stored [k, m] (k-major): each task reads whole rows
// of the stored matrix (a panel at a time would stride through all of it).
ATTNRES_AVX512_TARGET void pack_a_steps_fma(const Problem& p, std::int64_t s0, std::int64_t a_elems, float* pa) {
  const std::int64_t mblocks = (p.m + kMR - 1) / kMR, ks = std::min<std::int64_t>(16, p.k - s0);
  for (std::int64_t mb = 0; mb < mblocks; ++mb) {
    const std::int64_t i0 = mb * kMR, rows = std::min<std::int64_t>(kMR, p.m - i0);
    pack_panel_cols<kMR>(p.a + s0 * p.lda + i0, p.lda, rows, ks, pa + mb * a_elems + s0 * kMR);
  }
}

ATTNRES_AVX512_TARGET void pack_b_fma(const Problem& p, std::int64_t np, float* out) {
  const std::int64_t j0 = np * kNR, cols = std::min<std::int64_t>(kNR, p.n - j0);
  if (p.trans_b) pack_panel_rows<kNR>(p.b + j0 * p.ldb, p.ldb, cols, p.k, out);
  else pack_panel_cols<kNR>(p.b + j0, p.ldb, cols, p.k, out);
}

// ---- dpbf16: panels of bf16 pairs (k = 2s, 2s + 1) in 32-bit words, one pair per step --------

// Row r of the panel is src[r * ld + k] (k contiguous): 32 consecutive k of a row are 16 pairs;
// a 16 x 16 transpose turns 16 rows of pairs into 16 steps of rows.
template <int R>
ATTNRES_DPBF16_INLINE void pack_pairs_rows(const float* src, std::int64_t ld, std::int64_t valid_rows, std::int64_t k,
                                           float* out) {
  const std::int64_t steps = (k + 1) / 2;
  for (int g = 0; g < R; g += 16) {
    const __mmask16 store = lanes(R - g);
    for (std::int64_t s0 = 0; s0 < steps; s0 += 16) {
      __m512i t[16];
      for (int j = 0; j < 16; ++j)
        t[j] = g + j < valid_rows ? cvt32(src + (g + j) * ld + 2 * s0, k - 2 * s0) : _mm512_setzero_si512();
      transpose16(t);
      const std::int64_t sq = std::min<std::int64_t>(16, steps - s0);
      for (std::int64_t q = 0; q < sq; ++q) _mm512_mask_storeu_epi32(out + (s0 + q) * R + g, store, t[q]);
    }
  }
}

// Row r of the panel is src[k * ld + r] (k-major): pair rows k = 2s and 2s + 1.
template <int R>
ATTNRES_DPBF16_INLINE void pack_pairs_cols(const float* src, std::int64_t ld, std::int64_t valid_rows, std::int64_t k,
                                           float* out) {
  const std::int64_t steps = (k + 1) / 2;
  for (std::int64_t s = 0; s < steps; ++s)
    for (int g = 0; g < R; g += 16) {
      const __m256i even = cvt16(src + 2 * s * ld + g, valid_rows - g);
      const __m256i odd = 2 * s + 1 < k ? cvt16(src + (2 * s + 1) * ld + g, valid_rows - g) : _mm256_setzero_si256();
      _mm512_mask_storeu_epi32(out + s * R + g, lanes(R - g), pairs(even, odd));
    }
}

ATTNRES_DPBF16_TARGET void pack_a_dp(const Problem& p, std::int64_t mb, float* out) {
  const std::int64_t i0 = mb * kMR, rows = std::min<std::int64_t>(kMR, p.m - i0);
  pack_pairs_rows<kMR>(p.a + i0 * p.lda, p.lda, rows, p.k, out);
}

// Steps (pairs) [s0, s0 + 16) of every row block of A stored [k, m], as pack_a_steps_fma.
ATTNRES_DPBF16_TARGET void pack_a_steps_dp(const Problem& p, std::int64_t s0, std::int64_t a_elems, float* pa) {
  const std::int64_t mblocks = (p.m + kMR - 1) / kMR, ks = std::min<std::int64_t>(32, p.k - 2 * s0);
  for (std::int64_t mb = 0; mb < mblocks; ++mb) {
    const std::int64_t i0 = mb * kMR, rows = std::min<std::int64_t>(kMR, p.m - i0);
    pack_pairs_cols<kMR>(p.a + 2 * s0 * p.lda + i0, p.lda, rows, ks, pa + mb * a_elems + s0 * kMR);
  }
}

ATTNRES_DPBF16_TARGET void pack_b_dp(const Problem& p, std::int64_t np, float* out) {
  const std::int64_t j0 = np * kNR, cols = std::min<std::int64_t>(kNR, p.n - j0);
  if (p.trans_b) pack_pairs_rows<kNR>(p.b + j0 * p.ldb, p.ldb, cols, p.k, out);
  else pack_pairs_cols<kNR>(p.b + j0, p.ldb, cols, p.k, out);
}

template <int MR, int NV>
ATTNRES_DPBF16_INLINE void dp_tile(const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                                   std::int64_t steps, __m512 (&acc)[MR][NV]) {
  for (std::int64_t s = 0; s < steps; ++s) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_ps(b + s * ldb + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_ps(a[s * lda + i]);  // a move: the pair's bits are kept
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
  }
}

// Long k runs in passes of kPassSteps k: within a pass the row block's slab of A (14 x 512 values,
// 28 KB) stays in L1 across the column panels, and the partial sums wait in `partial` (stored and
// reloaded exactly, so the result does not depend on the passes).
constexpr std::int64_t kPassK = 512;

// The tiles of row block mb against column panels [np0, np1). Compiled with AVX512_BF16 enabled for
// both kinds so that one body serves both microkernels; the fma instance contains no AVX512_BF16
// instruction (it has no bf16 operation for the compiler to emit one for).
template <Dot D>
ATTNRES_DPBF16_TARGET void compute_tiles(const Problem& p, const float* a, const float* pb, std::int64_t mb, std::int64_t np0,
                                         std::int64_t np1) {
  thread_local Scratch<float> partial_sums;
  const std::int64_t steps = D == Dot::fma ? p.k : (p.k + 1) / 2;
  const std::int64_t pass = D == Dot::fma ? kPassK : kPassK / 2;
  const std::int64_t i0 = mb * kMR, rows = std::min<std::int64_t>(kMR, p.m - i0);
  float* partial = steps > pass ? partial_sums.get(static_cast<std::size_t>((np1 - np0) * kMR * kNR)) : nullptr;
  for (std::int64_t s0 = 0; s0 < steps; s0 += pass) {
    const std::int64_t s1 = std::min(steps, s0 + pass);
    for (std::int64_t np = np0; np < np1; ++np) {
      float* part = partial != nullptr ? partial + (np - np0) * kMR * kNR : nullptr;
      __m512 acc[kMR][kNV];
      if (s0 == 0) {
        zero_tile(acc);
      } else {
        for (int i = 0; i < kMR; ++i)
          for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_load_ps(part + i * kNR + 16 * v);
      }
      const float* ta = a + s0 * kMR;
      const float* tb = pb + (np * steps + s0) * kNR;
      if constexpr (D == Dot::fma) fma_tile(ta, kMR, tb, kNR, s1 - s0, acc);
      else dp_tile(ta, kMR, tb, kNR, s1 - s0, acc);
      if (s1 < steps) {
        for (int i = 0; i < kMR; ++i)
          for (int v = 0; v < kNV; ++v) _mm512_store_ps(part + i * kNR + 16 * v, acc[i][v]);
        continue;
      }
      const std::int64_t j0 = np * kNR;
      store_tile(acc, rows, std::min<std::int64_t>(kNR, p.n - j0), p.alpha, p.beta, p.c + i0 * p.ldc + j0, p.ldc);
    }
  }
}

// ---- driver (baseline ISA: the OpenMP regions call the AVX-512 functions above) -------------

void run(Dot dot, const Problem& p) {
  const bool fma = dot == Dot::fma;
  const std::int64_t steps = fma ? p.k : (p.k + 1) / 2;
  const std::int64_t mblocks = (p.m + kMR - 1) / kMR, npanels = (p.n + kNR - 1) / kNR;
  const std::int64_t a_elems = steps * kMR, b_elems = steps * kNR;
  // Column panels per task: a B chunk of at most about 1 MB, kept in L2 across the row blocks.
  const std::int64_t chunk = std::clamp<std::int64_t>((1 << 20) / (b_elems * 4), 1, npanels);
  const std::int64_t nchunks = (npanels + chunk - 1) / chunk, tasks = nchunks * mblocks;
  // A stored [m, k] with one column chunk: each task packs its own row block just before using it
  // (it stays in cache). Otherwise A is packed once, whole.
  const bool a_in_task = !p.trans_a && nchunks == 1;
  thread_local Scratch<float> sa, sb;
  float* pa = a_in_task ? nullptr : sa.get(static_cast<std::size_t>(mblocks * a_elems));
  float* pb = sb.get(static_cast<std::size_t>(npanels * b_elems));
  auto pack_a = fma ? pack_a_fma : pack_a_dp;
  auto pack_a_steps = fma ? pack_a_steps_fma : pack_a_steps_dp;
  auto pack_b = fma ? pack_b_fma : pack_b_dp;
  auto compute = fma ? compute_tiles<Dot::fma> : compute_tiles<Dot::dpbf16>;
  const bool parallel = tasks > 1 && p.m * p.n * p.k >= (1 << 18);
#pragma omp parallel if (parallel)
  {
    if (p.trans_a) {
#pragma omp for schedule(static) nowait
      for (std::int64_t s0 = 0; s0 < steps; s0 += 16) pack_a_steps(p, s0, a_elems, pa);
    } else if (!a_in_task) {
#pragma omp for schedule(static) nowait
      for (std::int64_t mb = 0; mb < mblocks; ++mb) pack_a(p, mb, pa + mb * a_elems);
    }
#pragma omp for schedule(static)
    for (std::int64_t np = 0; np < npanels; ++np) pack_b(p, np, pb + np * b_elems);
    thread_local Scratch<float> panel;
    float* own = a_in_task ? panel.get(static_cast<std::size_t>(a_elems)) : nullptr;
    // Task = (column chunk, row block), chunk-major: consecutive tasks of a thread share B.
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t ch = task / mblocks, mb = task % mblocks;
      if (a_in_task) pack_a(p, mb, own);
      compute(p, a_in_task ? own : pa + mb * a_elems, pb, mb, ch * chunk, std::min(npanels, (ch + 1) * chunk));
    }
  }
}

}  // namespace
#endif  // ATTNRES_AVX512_CODE

void gemm_bf16(Dot dot, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc) {
  require(cpu_has_avx512() && (dot == Dot::fma || cpu_has_avx512_bf16()),
          "gemm_bf16: this CPU lacks the AVX-512 instructions of the requested backend");
#if ATTNRES_AVX512_CODE
  run(dot, Problem{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc});
#else
  (void)dot, (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b,
      (void)ldb, (void)beta, (void)c, (void)ldc;
#endif
}

}  // namespace attnres::kernels::avx512
