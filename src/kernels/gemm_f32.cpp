#include "kernels/gemm_f32.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/avx512_tiles.hpp"
#include "kernels/scratch.hpp"
#include "util/error.hpp"
#include "util/machine.hpp"
#include "util/tasks.hpp"
#include "util/threads.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define ATTNRES_AVX2_CODE 1
#include <immintrin.h>
#else
#define ATTNRES_AVX2_CODE 0
#endif

namespace attnres::kernels {

namespace {

bool cpu_has_avx2_fma() {
#if ATTNRES_AVX2_CODE
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool cpu_has_avx512f() {
#if ATTNRES_AVX2_CODE
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// What the AVX-512 tile's target names (ATTNRES_AVX512_TARGET), and a compiler that builds it.
bool cpu_has_avx512_tile() {
#if ATTNRES_AVX2_CODE && ATTNRES_AVX512_CODE
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

Fp32Gemm choose_backend() {
  if (const char* env = std::getenv("ATTNRES_FP32_GEMM"); env != nullptr && env[0] != '\0') {
    const Fp32Gemm b = parse_fp32_gemm(env);
    require(fp32_gemm_available(b), "ATTNRES_FP32_GEMM=", env, ": not available on this CPU");
    if (b != Fp32Gemm::automatic) return b;
  }
  if (cpu_has_avx512_tile()) return Fp32Gemm::avx512;
  return cpu_has_avx2_fma() && !openblas_runs_avx512() ? Fp32Gemm::avx2 : Fp32Gemm::openblas;
}

Fp32Gemm g_override = Fp32Gemm::automatic;

}  // namespace

const char* to_string(Fp32Gemm backend) {
  switch (backend) {
    case Fp32Gemm::automatic: return "automatic";
    case Fp32Gemm::openblas: return "openblas";
    case Fp32Gemm::avx2: return "avx2";
    case Fp32Gemm::avx512: return "avx512";
  }
  return "?";
}

Fp32Gemm parse_fp32_gemm(const std::string& text) {
  for (Fp32Gemm b : {Fp32Gemm::automatic, Fp32Gemm::openblas, Fp32Gemm::avx2, Fp32Gemm::avx512})
    if (text == to_string(b)) return b;
  fail("unknown fp32 GEMM backend '", text, "' (expected automatic, openblas, avx2 or avx512)");
}

// OpenBLAS' core decides, not the CPU's flags: OPENBLAS_CORETYPE may force an AVX2 or older core
// on an AVX-512 CPU (the CLI forces Haswell where OpenBLAS 0.3.21 does not know the CPU), and
// there this kernel is the faster one. The names are OpenBLAS 0.3.21's; a name not listed counts
// as AVX-512 on an AVX-512 CPU (a newer OpenBLAS naming a newer core).
bool openblas_runs_avx512() {
  const std::string core = openblas_core();
  for (const char* c : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == c) return true;
  for (const char* c : {"Haswell", "Zen", "Sandybridge", "Nehalem", "Core2", "Penryn", "Dunnington", "Prescott",
                        "Atom", "Nano", "Barcelona", "Bobcat", "Bulldozer", "Piledriver", "Steamroller",
                        "Excavator", "Opteron", "Opteron_SSE3", "Athlon", "Katmai", "Coppermine", "Northwood",
                        "Banias"})
    if (core == c) return false;
  return cpu_has_avx512f();
}

bool fp32_gemm_available(Fp32Gemm backend) {
  switch (backend) {
    case Fp32Gemm::automatic:
    case Fp32Gemm::openblas: return true;
    case Fp32Gemm::avx2: {
      static const bool ok = cpu_has_avx2_fma();
      return ok;
    }
    case Fp32Gemm::avx512: {
      static const bool ok = cpu_has_avx512_tile();
      return ok;
    }
  }
  return false;
}

Fp32Gemm fp32_gemm_backend() {
  static const Fp32Gemm chosen = choose_backend();
  return g_override != Fp32Gemm::automatic ? g_override : chosen;
}

void set_fp32_gemm_backend(Fp32Gemm backend) {
  require(fp32_gemm_available(backend), "fp32 GEMM backend ", to_string(backend), " is not available on this CPU");
  g_override = backend;
}

#if ATTNRES_AVX2_CODE

#define ATTNRES_AVX2_TARGET __attribute__((target("avx2,fma")))
#define ATTNRES_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

namespace {

constexpr int kNr = 16;           // columns of a packed panel of op(B): two 8-lane vectors, one 16-lane
constexpr std::int64_t kKc = kFp32GemmPass;  // k per pass: a B panel of 16 KB stays in L1 across a row block
constexpr std::int64_t kMc = 96;   // rows per task, at most (16 or 8 tiles): an A block of <= 96 KB stays in L2
constexpr std::int64_t kNc = 256;  // columns per task (16 panels)

// The register tile holds MR rows of two 8-lane accumulators as named variables (GCC spilled an
// array of accumulators to the stack on every k step); the macros below expand per row.
#define ATTNRES_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

// One MR x 16 tile of C over one k pass (kc values of k): t = fma(a(i, k), b(k, j), t) in k order
// from 0, then c = fma(alpha, t, c) (load_c; alpha 1: exactly c + t) or c = alpha * t.
// a(i, k) = a[i * lda + k] (A stored [m, k]) or
// a[k * lda + i] (trans_a: [k, m]); b(k, j) = b[k * bs + j]. Columns >= valid are neither read
// from C nor written.
template <int MR, bool TA>
ATTNRES_AVX2_TARGET void tile(std::int64_t kc, const float* a, std::int64_t lda, const float* b, std::int64_t bs,
                              float* c, std::int64_t ldc, int valid, bool load_c, float alpha) {
  // C's lines are fetched (for writing) while the k loop runs: outputs are mostly cold, and a
  // read-for-ownership per line would otherwise stall the stores at the end.
  for (int i = 0; i < MR; ++i) {
    __builtin_prefetch(c + i * ldc, 1, 3);
    __builtin_prefetch(c + i * ldc + kNr - 1, 1, 3);
  }
  __m256 r0a, r0b, r1a, r1b, r2a, r2b, r3a, r3b, r4a, r4b, r5a, r5b;
  r0a = r0b = r1a = r1b = r2a = r2b = r3a = r3b = r4a = r4b = r5a = r5b = _mm256_setzero_ps();
#define ATTNRES_FMA(i)                                                  \
  if constexpr (MR > i) {                                               \
    const __m256 x = _mm256_broadcast_ss(TA ? a + i : a + i * lda + k); \
    r##i##a = _mm256_fmadd_ps(x, b0, r##i##a);                          \
    r##i##b = _mm256_fmadd_ps(x, b1, r##i##b);                          \
  }
  if constexpr (TA) {
    for (std::int64_t k = 0; k < kc; ++k) {
      const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
      ATTNRES_ROWS(ATTNRES_FMA)
      a += lda;
      b += bs;
    }
  } else {
    for (std::int64_t k = 0; k < kc; ++k) {
      const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
      ATTNRES_ROWS(ATTNRES_FMA)
      b += bs;
    }
  }
#undef ATTNRES_FMA
  const __m256 al = _mm256_set1_ps(alpha);
  if (valid >= kNr) {
#define ATTNRES_STORE(i)                                                                   \
  if constexpr (MR > i) {                                                                  \
    if (load_c) {                                                                          \
      r##i##a = _mm256_fmadd_ps(al, r##i##a, _mm256_loadu_ps(c + i * ldc));                \
      r##i##b = _mm256_fmadd_ps(al, r##i##b, _mm256_loadu_ps(c + i * ldc + 8));            \
    } else if (alpha != 1.0f) {                                                            \
      r##i##a = _mm256_mul_ps(al, r##i##a);                                                \
      r##i##b = _mm256_mul_ps(al, r##i##b);                                                \
    }                                                                                      \
    _mm256_storeu_ps(c + i * ldc, r##i##a);                                                \
    _mm256_storeu_ps(c + i * ldc + 8, r##i##b);                                            \
  }
    ATTNRES_ROWS(ATTNRES_STORE)
#undef ATTNRES_STORE
    return;
  }
  // A partial tile: through an aligned copy, element by element (the same sums).
  alignas(32) float t[6 * kNr];
#define ATTNRES_SPILL(i)                          \
  if constexpr (MR > i) {                         \
    _mm256_store_ps(t + i * kNr, r##i##a);        \
    _mm256_store_ps(t + i * kNr + 8, r##i##b);    \
  }
  ATTNRES_ROWS(ATTNRES_SPILL)
#undef ATTNRES_SPILL
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < valid; ++j)
      c[i * ldc + j] = load_c ? std::fma(alpha, t[i * kNr + j], c[i * ldc + j]) : alpha * t[i * kNr + j];
}
#undef ATTNRES_ROWS

// The AVX2 tiles: 6 rows x one panel (16 columns).
struct Avx2Tiles {
  static constexpr int kRows = 6;
  static constexpr int kPanels = 1;
  template <bool TA>
  ATTNRES_AVX2_TARGET static void run(int rows, std::int64_t kc, const float* a, std::int64_t lda, const float* b0,
                                      const float*, float* c, std::int64_t ldc, int valid, bool load_c, float alpha) {
    switch (rows) {
      case 6: tile<6, TA>(kc, a, lda, b0, kNr, c, ldc, valid, load_c, alpha); break;
      case 5: tile<5, TA>(kc, a, lda, b0, kNr, c, ldc, valid, load_c, alpha); break;
      case 4: tile<4, TA>(kc, a, lda, b0, kNr, c, ldc, valid, load_c, alpha); break;
      case 3: tile<3, TA>(kc, a, lda, b0, kNr, c, ldc, valid, load_c, alpha); break;
      case 2: tile<2, TA>(kc, a, lda, b0, kNr, c, ldc, valid, load_c, alpha); break;
      default: tile<1, TA>(kc, a, lda, b0, kNr, c, ldc, valid, load_c, alpha); break;
    }
  }
};

#if ATTNRES_AVX512_CODE
// The AVX-512 tile: MR rows x NP panels (16 or 32 columns), one 16-lane accumulator per row and
// panel, the same sums as the AVX2 tile (each element's chain is the same fma sequence; only more
// elements are in flight): t = fma(a(i, k), b(k, j), t) in k order from 0, then c = fma(alpha, t, c)
// or alpha * t. b0 and b1 are the two panels' rows for this k pass ([k][16] each); columns >= valid
// are masked off in C.
#define ATTNRES_ROWS12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
template <int MR, int NP, bool TA>
ATTNRES_AVX512_TARGET void tile512(std::int64_t kc, const float* a, std::int64_t lda, const float* b0,
                                   const float* b1, float* c, std::int64_t ldc, int valid, bool load_c,
                                   float alpha) {
  for (int i = 0; i < MR; ++i) {
    __builtin_prefetch(c + i * ldc, 1, 3);
    if constexpr (NP == 2) __builtin_prefetch(c + i * ldc + 2 * kNr - 1, 1, 3);
  }
  __m512 r0a, r0b, r1a, r1b, r2a, r2b, r3a, r3b, r4a, r4b, r5a, r5b, r6a, r6b, r7a, r7b, r8a, r8b, r9a, r9b, r10a,
      r10b, r11a, r11b;
  r0a = r0b = r1a = r1b = r2a = r2b = r3a = r3b = r4a = r4b = r5a = r5b = r6a = r6b = r7a = r7b = r8a = r8b = r9a =
      r9b = r10a = r10b = r11a = r11b = _mm512_setzero_ps();
#define ATTNRES_FMA(i)                                                   \
  if constexpr (MR > i) {                                                \
    const __m512 x = _mm512_set1_ps(TA ? a[i] : a[i * lda + k]);         \
    r##i##a = _mm512_fmadd_ps(x, v0, r##i##a);                           \
    if constexpr (NP == 2) r##i##b = _mm512_fmadd_ps(x, v1, r##i##b);    \
  }
  for (std::int64_t k = 0; k < kc; ++k) {
    const __m512 v0 = _mm512_loadu_ps(b0 + k * kNr);
    const __m512 v1 = NP == 2 ? _mm512_loadu_ps(b1 + k * kNr) : v0;
    ATTNRES_ROWS12(ATTNRES_FMA)
    if constexpr (TA) a += lda;
  }
#undef ATTNRES_FMA
  const __m512 al = _mm512_set1_ps(alpha);
  const __mmask16 m0 = valid >= kNr ? __mmask16(0xffff) : __mmask16((1u << valid) - 1);
  const __mmask16 m1 =
      valid >= 2 * kNr ? __mmask16(0xffff) : valid <= kNr ? __mmask16(0) : __mmask16((1u << (valid - kNr)) - 1);
#define ATTNRES_STORE(i)                                                                          \
  if constexpr (MR > i) {                                                                         \
    float* ci = c + i * ldc;                                                                      \
    if (load_c) {                                                                                 \
      r##i##a = _mm512_fmadd_ps(al, r##i##a, _mm512_maskz_loadu_ps(m0, ci));                      \
      if constexpr (NP == 2) r##i##b = _mm512_fmadd_ps(al, r##i##b, _mm512_maskz_loadu_ps(m1, ci + kNr)); \
    } else if (alpha != 1.0f) {                                                                   \
      r##i##a = _mm512_mul_ps(al, r##i##a);                                                       \
      if constexpr (NP == 2) r##i##b = _mm512_mul_ps(al, r##i##b);                                \
    }                                                                                             \
    _mm512_mask_storeu_ps(ci, m0, r##i##a);                                                       \
    if constexpr (NP == 2) _mm512_mask_storeu_ps(ci + kNr, m1, r##i##b);                          \
  }
  ATTNRES_ROWS12(ATTNRES_STORE)
#undef ATTNRES_STORE
}
#undef ATTNRES_ROWS12

template <int NP, bool TA>
ATTNRES_AVX512_TARGET void tile512_rows(int rows, std::int64_t kc, const float* a, std::int64_t lda, const float* b0,
                                        const float* b1, float* c, std::int64_t ldc, int valid, bool load_c,
                                        float alpha) {
  switch (rows) {
#define ATTNRES_CASE(r) \
  case r: tile512<r, NP, TA>(kc, a, lda, b0, b1, c, ldc, valid, load_c, alpha); break;
    ATTNRES_CASE(12) ATTNRES_CASE(11) ATTNRES_CASE(10) ATTNRES_CASE(9) ATTNRES_CASE(8) ATTNRES_CASE(7)
    ATTNRES_CASE(6) ATTNRES_CASE(5) ATTNRES_CASE(4) ATTNRES_CASE(3) ATTNRES_CASE(2)
#undef ATTNRES_CASE
    default: tile512<1, NP, TA>(kc, a, lda, b0, b1, c, ldc, valid, load_c, alpha); break;
  }
}

// The AVX-512 tiles: 12 rows x two panels (32 columns; one panel for an odd last one).
struct Avx512Tiles {
  static constexpr int kRows = 12;
  static constexpr int kPanels = 2;
  template <bool TA>
  static void run(int rows, std::int64_t kc, const float* a, std::int64_t lda, const float* b0, const float* b1,
                  float* c, std::int64_t ldc, int valid, bool load_c, float alpha) {
    if (b1 != nullptr)
      tile512_rows<2, TA>(rows, kc, a, lda, b0, b1, c, ldc, valid, load_c, alpha);
    else
      tile512_rows<1, TA>(rows, kc, a, lda, b0, b0, c, ldc, valid, load_c, alpha);
  }
};
#endif  // ATTNRES_AVX512_CODE

// Panel p of op(B) (columns 16p .. 16p+15, zero beyond n) as [k][16], from B stored [n, k]
// (trans_b) or [k, n]; k rows from b (which points at the first of them).
ATTNRES_AVX2_TARGET void pack_panel(bool trans_b, std::int64_t n, std::int64_t k, const float* b, std::int64_t ldb,
                                    std::int64_t p, float* out) {
  const std::int64_t j0 = p * kNr;
  const int cols = static_cast<int>(std::min<std::int64_t>(kNr, n - j0));
  if (!trans_b) {
    if (cols == kNr) {
      for (std::int64_t kk = 0; kk < k; ++kk) {
        const float* src = b + kk * ldb + j0;
        _mm256_store_ps(out + kk * kNr, _mm256_loadu_ps(src));
        _mm256_store_ps(out + kk * kNr + 8, _mm256_loadu_ps(src + 8));
      }
      return;
    }
    for (std::int64_t kk = 0; kk < k; ++kk) {
      const float* src = b + kk * ldb + j0;
      float* dst = out + kk * kNr;
      for (int j = 0; j < cols; ++j) dst[j] = src[j];
      for (int j = cols; j < kNr; ++j) dst[j] = 0.0f;
    }
    return;
  }
  std::int64_t kk = 0;
  if (cols == kNr) {
    // 8 x 8 transposes: rows j0.. of B (k contiguous) to rows kk.. of the panel.
    for (; kk + 8 <= k; kk += 8) {
      for (int h = 0; h < 2; ++h) {
        __m256 r[8];
        for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(b + (j0 + h * 8 + j) * ldb + kk);
        const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
        const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
        const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
        const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
        const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
        const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
        const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
        const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
        float* dst = out + kk * kNr + h * 8;
        _mm256_storeu_ps(dst + 0 * kNr, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_storeu_ps(dst + 1 * kNr, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_storeu_ps(dst + 2 * kNr, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_storeu_ps(dst + 3 * kNr, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_storeu_ps(dst + 4 * kNr, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_storeu_ps(dst + 5 * kNr, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_storeu_ps(dst + 6 * kNr, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_storeu_ps(dst + 7 * kNr, _mm256_permute2f128_ps(u3, u7, 0x31));
      }
    }
  }
  for (; kk < k; ++kk) {
    float* dst = out + kk * kNr;
    for (int j = 0; j < cols; ++j) dst[j] = b[(j0 + j) * ldb + kk];
    for (int j = cols; j < kNr; ++j) dst[j] = 0.0f;
  }
}

struct Problem {
  bool trans_a, trans_b;
  std::int64_t m, n, k;
  const float* a;
  std::int64_t lda;
  const float* b;
  std::int64_t ldb;
  const float* packed_b;  // all panels of op(B), [panel][packed_k][16]; null: packed per task and k pass
  std::int64_t packed_k;  // rows of each packed panel (> k where the product uses a block of a packed op(B))
  bool pack_a;            // op(A) k-major with rows far apart: copied per task and k pass
  bool accumulate;
  float alpha;
  float* c;
  std::int64_t ldc;
};

// Rows [i0, i1) of op(A) = A^T (A stored [k, m]), k in [k0, k0 + kc), copied row by row of A
// into [q][kApack]: a(i0 + r, k0 + q) at [q * kApack + r]. The copy's row length (7 cache lines)
// spreads the block over every L1 set, where A's own rows (lda a multiple of 256 floats, say)
// would all fall into a few.
constexpr std::int64_t kApack = kMc + 16;

ATTNRES_AVX2_TARGET void pack_a_block(const Problem& pr, std::int64_t i0, std::int64_t i1, std::int64_t k0,
                                      std::int64_t kc, float* out) {
  const std::int64_t rows = i1 - i0, vec = rows / 8 * 8;
  for (std::int64_t q = 0; q < kc; ++q) {
    const float* src = pr.a + (k0 + q) * pr.lda + i0;
    float* dst = out + q * kApack;
    std::int64_t r = 0;
    for (; r < vec; r += 8) _mm256_storeu_ps(dst + r, _mm256_loadu_ps(src + r));
    for (; r < rows; ++r) dst[r] = src[r];
  }
}

// The rows [i0, i1) and panels [p0, p1) of C, k pass by k pass, Tiles::kPanels panels at a time.
template <class Tiles>
void run_block(const Problem& pr, std::int64_t i0, std::int64_t i1, std::int64_t p0, std::int64_t p1) {
  constexpr int np = Tiles::kPanels;
  thread_local Scratch<float> apack, bpack;
  float* ablock = pr.pack_a ? apack.get(static_cast<std::size_t>(kApack * kKc)) : nullptr;
  float* bpanels = pr.packed_b == nullptr ? bpack.get(static_cast<std::size_t>(np * kKc * kNr)) : nullptr;
  for (std::int64_t k0 = 0; k0 < pr.k; k0 += kKc) {
    const std::int64_t kc = std::min(kKc, pr.k - k0);
    const bool load_c = pr.accumulate || k0 > 0;
    if (pr.pack_a) pack_a_block(pr, i0, i1, k0, kc, ablock);
    for (std::int64_t p = p0; p < p1; p += np) {
      const int count = static_cast<int>(std::min<std::int64_t>(np, p1 - p));  // panels in this tile
      const float* bp[2] = {nullptr, nullptr};
      for (int q = 0; q < count; ++q) {
        if (pr.packed_b != nullptr) {
          bp[q] = pr.packed_b + ((p + q) * pr.packed_k + k0) * kNr;
        } else {
          pack_panel(pr.trans_b, pr.n, kc, pr.trans_b ? pr.b + k0 : pr.b + k0 * pr.ldb, pr.ldb, p + q,
                     bpanels + q * kKc * kNr);
          bp[q] = bpanels + q * kKc * kNr;
        }
      }
      const int valid = static_cast<int>(std::min<std::int64_t>(count * kNr, pr.n - p * kNr));
      // The block's rows in tiles of near-equal height (64 rows: 11, 11, 11, 11, 10, 10 rather than
      // five of 12 and one of 4, whose 8 accumulators cannot hide the FMA latency).
      const std::int64_t rows_total = i1 - i0, tiles = (rows_total + Tiles::kRows - 1) / Tiles::kRows;
      for (std::int64_t t = 0; t < tiles; ++t) {
        const std::int64_t i = i0 + rows_total * t / tiles;
        const int rows = static_cast<int>(i0 + rows_total * (t + 1) / tiles - i);
        float* c = pr.c + i * pr.ldc + p * kNr;
        if (pr.pack_a)
          Tiles::template run<true>(rows, kc, ablock + (i - i0), kApack, bp[0], bp[1], c, pr.ldc, valid, load_c,
                                    pr.alpha);
        else if (pr.trans_a)
          Tiles::template run<true>(rows, kc, pr.a + k0 * pr.lda + i, pr.lda, bp[0], bp[1], c, pr.ldc, valid, load_c,
                                    pr.alpha);
        else
          Tiles::template run<false>(rows, kc, pr.a + i * pr.lda + k0, pr.lda, bp[0], bp[1], c, pr.ldc, valid,
                                     load_c, pr.alpha);
      }
    }
  }
}

}  // namespace

void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
              std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c, std::int64_t ldc) {
  gemm_f32(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, accumulate, c, ldc);
}

namespace {

// Rows of at most kMc per block, as even as whole tiles allow (m = 128: 66 + 62, not 96 + 32).
std::int64_t row_blocks(std::int64_t m) { return (m + kMc - 1) / kMc; }

// The tasks (row block, panel block) of one problem, each summed by one thread.
template <class Tiles>
void run_tasks_with(const Problem& pr) {
  const std::int64_t panels = (pr.n + kNr - 1) / kNr;
  const std::int64_t mblocks = row_blocks(pr.m);
  const std::int64_t mc = ((pr.m + mblocks - 1) / mblocks + Tiles::kRows - 1) / Tiles::kRows * Tiles::kRows;
  const std::int64_t pblocks = (panels + kNc / kNr - 1) / (kNc / kNr);
  const std::int64_t tasks = mblocks * pblocks;
  for_each_task(tasks, tasks > 1 && pr.m * pr.n * pr.k >= (std::int64_t(1) << 18), [&](std::int64_t t) {
    const std::int64_t mb = t % mblocks, pb = t / mblocks;
    const std::int64_t i0 = mb * mc, i1 = std::min(pr.m, i0 + mc);
    const std::int64_t p0 = pb * (kNc / kNr), p1 = std::min(panels, p0 + kNc / kNr);
    run_block<Tiles>(pr, i0, i1, p0, p1);
  });
}

// The AVX-512 tiles when the backend is avx512, else the AVX2 tiles: the same sums either way.
void run_tasks(const Problem& pr) {
#if ATTNRES_AVX512_CODE
  if (fp32_gemm_backend() == Fp32Gemm::avx512) return run_tasks_with<Avx512Tiles>(pr);
#endif
  run_tasks_with<Avx2Tiles>(pr);
}

bool k_zero(std::int64_t m, std::int64_t n, bool accumulate, float* c, std::int64_t ldc) {
  if (!accumulate)
    for (std::int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
  return true;
}

// Every panel of op(B) into out ([panel][k][16]).
void pack_all(bool trans_b, std::int64_t n, std::int64_t k, const float* b, std::int64_t ldb, float* out) {
  const std::int64_t panels = (n + kNr - 1) / kNr;
  for_each_task(panels, panels > 1 && n * k >= kParallelMin,
                [&](std::int64_t p) { pack_panel(trans_b, n, k, b, ldb, p, out + p * k * kNr); });
}

}  // namespace

void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
              const float* a, std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c,
              std::int64_t ldc) {
  require(fp32_gemm_available(Fp32Gemm::avx2), "gemm_f32: the CPU lacks AVX2 or FMA");
  if (m <= 0 || n <= 0) return;
  if (k <= 0 && k_zero(m, n, accumulate, c, ldc)) return;
  // op(B) is packed whole, once per call, when many row blocks reuse it (a Linear's forward and
  // input gradient: B is the weight) or when it is one pass long (attention's dK and dV: each row
  // block would pack the same panels again). For a weight gradient (A^T B, both stored k-major,
  // m small, k long) each task packs the panel of the current k pass into L1 instead: no extra
  // pass over the activations in memory. op(A) is read in place, except a k-major A with rows 512 floats or
  // more apart (the LM head's gradient), whose row blocks are copied per k pass: read in place,
  // its rows fall into a few cache sets (measured, bench/gemm_f32_bench.cpp: packing every A
  // cost more than it saved).
  const bool whole_b = !trans_a || row_blocks(m) > 4 || k <= kKc;
  Problem pr{trans_a, trans_b, m, n, k, a, lda, b, ldb, nullptr, k, trans_a && lda >= 512, accumulate, alpha, c, ldc};
  thread_local Scratch<float> pack;
  if (whole_b) {
    float* out = pack.get(static_cast<std::size_t>((n + kNr - 1) / kNr * k * kNr));
    pack_all(trans_b, n, k, b, ldb, out);
    pr.packed_b = out;
  }
  run_tasks(pr);
}

void Fp32PackedB::pack(bool trans_b, std::int64_t n, std::int64_t k, const float* b, std::int64_t ldb) {
  require(fp32_gemm_available(Fp32Gemm::avx2), "gemm_f32: the CPU lacks AVX2 or FMA");
  n_ = n;
  k_ = k;
  float* out = storage_.get(static_cast<std::size_t>(std::max<std::int64_t>(1, (n + kNr - 1) / kNr * k * kNr)));
  panels_ = out;
  if (n > 0 && k > 0) pack_all(trans_b, n, k, b, ldb, out);
}

void gemm_f32_packed(std::int64_t m, float alpha, const float* a, std::int64_t lda, const Fp32PackedB& b,
                     const Fp32Block& blk, bool accumulate, float* c, std::int64_t ldc) {
  require(blk.k0 >= 0 && blk.n0 >= 0 && blk.k >= 0 && blk.n >= 0 && blk.k0 % kKc == 0 && blk.n0 % kNr == 0 &&
              blk.k0 + blk.k <= b.k() && blk.n0 + blk.n <= b.n(),
          "gemm_f32_packed: rows ", blk.k0, " + ", blk.k, ", columns ", blk.n0, " + ", blk.n,
          " are not a block of the packed ", b.k(), " x ", b.n(), " (rows from a multiple of ", kKc,
          ", columns from a multiple of ", kNr, ")");
  if (m <= 0 || blk.n <= 0) return;
  if (blk.k <= 0 && k_zero(m, blk.n, accumulate, c, ldc)) return;
  const float* panels = b.panels_ + (blk.n0 / kNr * b.k() + blk.k0) * kNr;
  Problem pr{false, false, m, blk.n, blk.k, a, lda, nullptr, 0, panels, b.k(), false, accumulate, alpha, c, ldc};
  run_tasks(pr);
}

#else

void gemm_f32(bool, bool, std::int64_t, std::int64_t, std::int64_t, const float*, std::int64_t, const float*,
              std::int64_t, bool, float*, std::int64_t) {
  fail("gemm_f32: this build has no AVX2 code");
}

void gemm_f32(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t, const float*,
              std::int64_t, bool, float*, std::int64_t) {
  fail("gemm_f32: this build has no AVX2 code");
}

void Fp32PackedB::pack(bool, std::int64_t, std::int64_t, const float*, std::int64_t) {
  fail("gemm_f32: this build has no AVX2 code");
}

void gemm_f32_packed(std::int64_t, float, const float*, std::int64_t, const Fp32PackedB&, const Fp32Block&, bool,
                     float*, std::int64_t) {
  fail("gemm_f32: this build has no AVX2 code");
}

#endif  // ATTNRES_AVX2_CODE

void gemm_f32_packed(std::int64_t m, float alpha, const float* a, std::int64_t lda, const Fp32PackedB& b,
                     bool accumulate, float* c, std::int64_t ldc) {
  gemm_f32_packed(m, alpha, a, lda, b, Fp32Block{.k = b.k(), .n = b.n()}, accumulate, c, ldc);
}

}  // namespace attnres::kernels
