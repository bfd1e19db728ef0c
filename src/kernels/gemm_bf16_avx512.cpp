#include "kernels/gemm_bf16_avx512.hpp"

#include <algorithm>

#include "kernels/avx512_tiles.hpp"
#include "kernels/scratch.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

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

// Steps [s0, s0 + 16) of every column panel of B stored [k, n] (k-major), reading whole rows.
ATTNRES_AVX512_TARGET void pack_b_steps_fma(const Problem& p, std::int64_t s0, std::int64_t b_elems, float* pb) {
  const std::int64_t npanels = (p.n + kNR - 1) / kNR, ks = std::min<std::int64_t>(16, p.k - s0);
  for (std::int64_t np = 0; np < npanels; ++np) {
    const std::int64_t j0 = np * kNR, cols = std::min<std::int64_t>(kNR, p.n - j0);
    pack_panel_cols<kNR>(p.b + s0 * p.ldb + j0, p.ldb, cols, ks, pb + np * b_elems + s0 * kNR);
  }
}

ATTNRES_AVX512_TARGET void pack_b_fma(const Problem& p, std::int64_t np, float* out) {
  const std::int64_t j0 = np * kNR, cols = std::min<std::int64_t>(kNR, p.n - j0);
  if (p.trans_b) pack_panel_rows<kNR>(p.b + j0 * p.ldb, p.ldb, cols, p.k, out);
  else pack_panel_cols<kNR>(p.b + j0, p.ldb, cols, p.k, out);
}

// ---- dpbf16: panels of bf16 pairs (pack_pairs_rows / pack_pairs_cols, kernels/avx512_tiles.hpp) --

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

// Steps (pairs) [s0, s0 + 16) of every column panel of B stored [k, n], as pack_b_steps_fma.
ATTNRES_DPBF16_TARGET void pack_b_steps_dp(const Problem& p, std::int64_t s0, std::int64_t b_elems, float* pb) {
  const std::int64_t npanels = (p.n + kNR - 1) / kNR, ks = std::min<std::int64_t>(32, p.k - 2 * s0);
  for (std::int64_t np = 0; np < npanels; ++np) {
    const std::int64_t j0 = np * kNR, cols = std::min<std::int64_t>(kNR, p.n - j0);
    pack_pairs_cols<kNR>(p.b + 2 * s0 * p.ldb + j0, p.ldb, cols, ks, pb + np * b_elems + s0 * kNR);
  }
}

ATTNRES_DPBF16_TARGET void pack_b_dp(const Problem& p, std::int64_t np, float* out) {
  const std::int64_t j0 = np * kNR, cols = std::min<std::int64_t>(kNR, p.n - j0);
  if (p.trans_b) pack_pairs_rows<kNR>(p.b + j0 * p.ldb, p.ldb, cols, p.k, out);
  else pack_pairs_cols<kNR>(p.b + j0, p.ldb, cols, p.k, out);
}

// Long k runs in passes of kPassK k: within a pass the row block's slab of A (14 x 512 values,
// 28 KB) stays in L1 across the column panels, and the partial sums wait in `partial` (stored and
// reloaded exactly, so the result does not depend on the passes).
constexpr std::int64_t kPassK = 512;

// One pass, steps [s0, s1) of `steps`, of the tiles of row block mb against column panels
// [np0, np1); partial holds their partial sums (np1 - np0 tiles; read unless s0 == 0, written
// unless s1 == steps, when C is). Compiled with AVX512_BF16 enabled for both kinds so that one
// body serves both microkernels; the fma instance contains no AVX512_BF16 instruction (it has no
// bf16 operation for the compiler to emit one for).
template <Dot D>
ATTNRES_DPBF16_TARGET void compute_pass(const Problem& p, const float* a, const float* pb, std::int64_t steps,
                                        std::int64_t s0, std::int64_t s1, std::int64_t mb, std::int64_t np0,
                                        std::int64_t np1, float* partial) {
  const std::int64_t i0 = mb * kMR, rows = std::min<std::int64_t>(kMR, p.m - i0);
  for (std::int64_t np = np0; np < np1; ++np) {
    float* part = partial + (np - np0) * kMR * kNR;
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

// ---- driver (baseline ISA: the OpenMP regions call the AVX-512 functions above) -------------

// packed_b: op(B) already packed by pack_b (null: packed here).
void run(Dot dot, const Problem& p, const float* packed_b) {
  const bool fma = dot == Dot::fma;
  const std::int64_t steps = fma ? p.k : (p.k + 1) / 2, pass = fma ? kPassK : kPassK / 2;
  const std::int64_t mblocks = (p.m + kMR - 1) / kMR, npanels = (p.n + kNR - 1) / kNR;
  const std::int64_t a_elems = steps * kMR, b_elems = steps * kNR, tile = kMR * kNR;
  // Long k with a B too large for L2 (the weight gradients, k = tokens): passes outermost, each
  // pass's slab of every panel of B (512 k x n) stays in L2 while all row blocks stream through
  // it, and every tile's partial sums wait in a buffer the size of C. Otherwise the passes run
  // inside each task.
  const bool pass_outer = steps > pass && npanels * b_elems * 4 > (3 << 19);
  // Column panels per task: a B chunk (its slab of one pass) of at most about 1 MB, kept in L2
  // across the row blocks.
  const std::int64_t chunk =
      pass_outer ? npanels : std::clamp<std::int64_t>((1 << 20) / (std::min(steps, pass) * kNR * 4), 1, npanels);
  const std::int64_t nchunks = (npanels + chunk - 1) / chunk, tasks = nchunks * mblocks;
  // A stored [m, k] with one column chunk: each task packs its own row block just before using it
  // (it stays in cache). Otherwise A is packed once, whole.
  const bool a_in_task = !p.trans_a && nchunks == 1 && !pass_outer;
  thread_local Scratch<float> sa, sb, sp;
  float* pa = a_in_task ? nullptr : sa.get(static_cast<std::size_t>(mblocks * a_elems));
  float* pb = packed_b != nullptr ? const_cast<float*>(packed_b) : sb.get(static_cast<std::size_t>(npanels * b_elems));
  float* shared_partial = pass_outer ? sp.get(static_cast<std::size_t>(mblocks * npanels * tile)) : nullptr;
  auto pack_a = fma ? pack_a_fma : pack_a_dp;
  auto pack_a_steps = fma ? pack_a_steps_fma : pack_a_steps_dp;
  auto pack_b = fma ? pack_b_fma : pack_b_dp;
  auto pack_b_steps = fma ? pack_b_steps_fma : pack_b_steps_dp;
  auto compute = fma ? compute_pass<Dot::fma> : compute_pass<Dot::dpbf16>;
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
    if (packed_b == nullptr && !p.trans_b) {
#pragma omp for schedule(static)
      for (std::int64_t s0 = 0; s0 < steps; s0 += 16) pack_b_steps(p, s0, b_elems, pb);
    } else if (packed_b == nullptr) {
#pragma omp for schedule(static)
      for (std::int64_t np = 0; np < npanels; ++np) pack_b(p, np, pb + np * b_elems);
    } else {
#pragma omp barrier
    }
    if (pass_outer) {
      // Within a pass the smaller operand's slab stays in L2 and the larger one streams through
      // once: row blocks outer when B's slab is the smaller (m > n), column panels outer otherwise.
      // The barrier after each pass orders the passes of every tile.
      for (std::int64_t s0 = 0; s0 < steps; s0 += pass) {
        const std::int64_t s1 = std::min(steps, s0 + pass);
        if (p.m > p.n) {
#pragma omp for schedule(static)
          for (std::int64_t mb = 0; mb < mblocks; ++mb)
            compute(p, pa + mb * a_elems, pb, steps, s0, s1, mb, 0, npanels, shared_partial + mb * npanels * tile);
        } else {
#pragma omp for schedule(static)
          for (std::int64_t np = 0; np < npanels; ++np)
            for (std::int64_t mb = 0; mb < mblocks; ++mb)
              compute(p, pa + mb * a_elems, pb, steps, s0, s1, mb, np, np + 1,
                      shared_partial + (mb * npanels + np) * tile);
        }
      }
    } else {
      thread_local Scratch<float> panel, partial;
      float* own = a_in_task ? panel.get(static_cast<std::size_t>(a_elems)) : nullptr;
      float* part = partial.get(static_cast<std::size_t>(chunk * tile));
      // Task = (column chunk, row block), chunk-major: consecutive tasks of a thread share B.
#pragma omp for schedule(static)
      for (std::int64_t task = 0; task < tasks; ++task) {
        const std::int64_t ch = task / mblocks, mb = task % mblocks;
        const std::int64_t np0 = ch * chunk, np1 = std::min(npanels, np0 + chunk);
        if (a_in_task) pack_a(p, mb, own);
        const float* a = a_in_task ? own : pa + mb * a_elems;
        for (std::int64_t s0 = 0; s0 < steps; s0 += pass)
          compute(p, a, pb, steps, s0, std::min(steps, s0 + pass), mb, np0, np1, part);
      }
    }
  }
}

}  // namespace
#endif  // ATTNRES_AVX512_CODE

std::size_t packed_b_size(Dot dot, std::int64_t n, std::int64_t k) {
  const std::int64_t steps = dot == Dot::fma ? k : (k + 1) / 2;
#if ATTNRES_AVX512_CODE
  return static_cast<std::size_t>((n + kNR - 1) / kNR * steps * kNR);
#else
  (void)n, (void)steps;
  return 0;
#endif
}

void pack_b(Dot dot, bool trans_b, std::int64_t n, std::int64_t k, const float* b, std::int64_t ldb, float* out) {
  require(cpu_has_avx512() && (dot == Dot::fma || cpu_has_avx512_bf16()),
          "gemm_bf16: this CPU lacks the AVX-512 instructions of the requested backend");
#if ATTNRES_AVX512_CODE
  const Problem p{false, trans_b, 1, n, k, 1.0f, nullptr, 0, b, ldb, 0.0f, nullptr, 0};
  const std::int64_t npanels = (n + kNR - 1) / kNR, b_elems = (dot == Dot::fma ? k : (k + 1) / 2) * kNR;
  const std::int64_t steps = b_elems / kNR;
  if (trans_b) {
    auto pack = dot == Dot::fma ? pack_b_fma : pack_b_dp;
#pragma omp parallel for schedule(static) if (npanels > 1 && n * k >= kParallelMin)
    for (std::int64_t np = 0; np < npanels; ++np) pack(p, np, out + np * b_elems);
  } else {
    auto pack_steps = dot == Dot::fma ? pack_b_steps_fma : pack_b_steps_dp;
#pragma omp parallel for schedule(static) if (steps > 16 && n * k >= kParallelMin)
    for (std::int64_t s0 = 0; s0 < steps; s0 += 16) pack_steps(p, s0, b_elems, out);
  }
#else
  (void)trans_b, (void)n, (void)k, (void)b, (void)ldb, (void)out;
#endif
}

void gemm_bf16(Dot dot, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc, const float* packed_b) {
  require(cpu_has_avx512() && (dot == Dot::fma || cpu_has_avx512_bf16()),
          "gemm_bf16: this CPU lacks the AVX-512 instructions of the requested backend");
#if ATTNRES_AVX512_CODE
  run(dot, Problem{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc}, packed_b);
#else
  (void)dot, (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b,
      (void)ldb, (void)beta, (void)c, (void)ldc, (void)packed_b;
#endif
}

}  // namespace attnres::kernels::avx512
