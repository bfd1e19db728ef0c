#include "kernels/gemm_bf16.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/avx512_tiles.hpp"
#include "kernels/gemm_bf16_avx512.hpp"
#include "kernels/scratch.hpp"
#include "util/error.hpp"

#if ATTNRES_AVX512_CODE
#define ATTNRES_AMX_CODE 1
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define ATTNRES_AMX_CODE 0
#endif

namespace attnres::kernels {

std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0) return static_cast<std::uint16_t>((u >> 16) & 0x8000u);  // zero, denormal
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // ties to even; overflows to infinity like the hardware
  return static_cast<std::uint16_t>(u >> 16);
}

float round_to_bf16(float x) {
  const std::uint32_t u = std::uint32_t(bf16_bits(x)) << 16;
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

namespace {

// ------------------------------------------------------------------------------------------
// Portable path: round copies of op(A) and op(B) to bf16, multiply them with fp32 sgemm.
// ------------------------------------------------------------------------------------------
void round_copy(const float* src, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* dst) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dst[r * cols + c] = round_to_bf16(src[r * ld + c]);
}

void gemm_fallback(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                   std::int64_t ldc) {
  thread_local Scratch<float> sa, sb;
  // The stored shapes: A is [m, k] or, transposed, [k, m]; B is [k, n] or [n, k].
  const std::int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const std::int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  float* ra = sa.get(static_cast<std::size_t>(std::max<std::int64_t>(1, a_rows * a_cols)));
  float* rb = sb.get(static_cast<std::size_t>(std::max<std::int64_t>(1, b_rows * b_cols)));
  round_copy(a, a_rows, a_cols, lda, ra);
  round_copy(b, b_rows, b_cols, ldb, rb);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, ra,
              static_cast<blasint>(std::max<std::int64_t>(1, a_cols)), rb,
              static_cast<blasint>(std::max<std::int64_t>(1, b_cols)), beta, c, static_cast<blasint>(ldc));
}

#if ATTNRES_AMX_CODE
// ------------------------------------------------------------------------------------------
// AMX path.
//
// Tiles: C 16x16 fp32 (tmm0-3, a 32x32 block), A 16 rows x 32 bf16 (tmm4-5), B 16 k-pairs x 16
// columns in the VNNI layout, each 32-bit element the bf16 pair (B[2p][j], B[2p+1][j]) (tmm6-7).
// op(A) is packed in blocks of 32 rows: [block][k tile][half][16][32]; op(B) in tile columns of
// 16: [column tile][k tile][16][32]. K is padded with zeros to a multiple of 32, M and N to 32.
// Only the functions below carry the AVX-512/AMX target: the rest of the file (and the
// OpenMP regions) is compiled for the baseline, so nothing else runs AVX-512 code.
// ------------------------------------------------------------------------------------------
#define ATTNRES_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

constexpr int kTileElems = 512;  // 16 rows x 64 bytes of bf16

struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

ATTNRES_AMX_TARGET void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // Not _tile_loadconfig: GCC 12's version hands the asm only the first 8 bytes of the config
  // as its memory operand, so the stores of the rest may be dropped as dead.
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

ATTNRES_AMX_TARGET void amx_release() { _tile_release(); }

using avx512::cvt16;
using avx512::cvt32;
using avx512::pairs;
using avx512::transpose16;
using avx512::lanes;

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
  std::int64_t kt;  // k tiles of 32
  std::uint16_t* pa;
  std::uint16_t* pb;
};

// Packing. Operands whose rows run along k (A, B^T) are packed per row block / column tile; those
// stored k-major (A^T, B) per k tile, so every task reads whole rows of the stored matrix.

// A tile (half, t) of row block mb from A stored [m, k]: tile row i = 32 consecutive k of row m0 + i.
ATTNRES_AMX_TARGET void pack_a_rows(const Problem& p, std::int64_t mb, std::uint16_t* out) {
  for (int half = 0; half < 2; ++half)
    for (int i = 0; i < 16; ++i) {
      const std::int64_t row = mb * 32 + half * 16 + i;
      for (std::int64_t t = 0; t < p.kt; ++t) {
        __m512i v = _mm512_setzero_si512();
        if (row < p.m) v = cvt32(p.a + row * p.lda + t * 32, p.k - t * 32);
        _mm512_store_si512(out + (t * 2 + half) * kTileElems + i * 32, v);
      }
    }
}

// k tile t of every row block from A stored [k, m]: pair rows k, k+1 over 16 columns m, transpose.
ATTNRES_AMX_TARGET void pack_a_ktile(const Problem& p, std::int64_t t) {
  const std::int64_t mblocks = (p.m + 31) / 32;
  for (std::int64_t g = 0; g < 2 * mblocks; ++g) {  // 16-column group = (row block, half)
    const std::int64_t m0 = g * 16, mv = p.m - m0;
    __m512i r[16];
    for (int q = 0; q < 16; ++q) {
      const std::int64_t k0 = t * 32 + 2 * q;
      const __m256i even = k0 < p.k ? cvt16(p.a + k0 * p.lda + m0, mv) : _mm256_setzero_si256();
      const __m256i odd = k0 + 1 < p.k ? cvt16(p.a + (k0 + 1) * p.lda + m0, mv) : _mm256_setzero_si256();
      r[q] = pairs(even, odd);
    }
    transpose16(r);
    std::uint16_t* tile = p.pa + ((g / 2 * p.kt + t) * 2 + g % 2) * kTileElems;
    for (int i = 0; i < 16; ++i) _mm512_store_si512(tile + i * 32, r[i]);
  }
}

// Column tile nt of B stored [n, k], every k tile: 32 consecutive k of a row are already 16
// pairs; transpose them into the VNNI layout.
ATTNRES_AMX_TARGET void pack_b_rows(const Problem& p, std::int64_t nt) {
  const std::int64_t n0 = nt * 16, nv = p.n - n0;
  for (std::int64_t t = 0; t < p.kt; ++t) {
    __m512i r[16];
    for (int j = 0; j < 16; ++j)
      r[j] = j < nv ? cvt32(p.b + (n0 + j) * p.ldb + t * 32, p.k - t * 32) : _mm512_setzero_si512();
    transpose16(r);
    std::uint16_t* tile = p.pb + (nt * p.kt + t) * kTileElems;
    for (int q = 0; q < 16; ++q) _mm512_store_si512(tile + q * 32, r[q]);
  }
}

// k tile t of every column tile from B stored [k, n]: tile row q pairs rows k, k+1.
ATTNRES_AMX_TARGET void pack_b_ktile(const Problem& p, std::int64_t t) {
  const std::int64_t ntiles = (p.n + 31) / 32 * 2;
  for (std::int64_t nt = 0; nt < ntiles; ++nt) {
    const std::int64_t n0 = nt * 16, nv = p.n - n0;
    std::uint16_t* tile = p.pb + (nt * p.kt + t) * kTileElems;
    for (int q = 0; q < 16; ++q) {
      const std::int64_t k0 = t * 32 + 2 * q;
      const __m256i even = k0 < p.k ? cvt16(p.b + k0 * p.ldb + n0, nv) : _mm256_setzero_si256();
      const __m256i odd = k0 + 1 < p.k ? cvt16(p.b + (k0 + 1) * p.ldb + n0, nv) : _mm256_setzero_si256();
      _mm512_store_si512(tile + q * 32, pairs(even, odd));
    }
  }
}

// C blocks of row block mb and column pairs [np0, np1): 2x2 tiles summed over every k tile in
// order, then C = alpha * sum + beta * C on the valid part. Long k runs in passes of kPassTiles
// k tiles: within a pass the 16 KB of A stay in L1 across the column pairs, and the partial sums
// wait in `partial` (stored and reloaded exactly, so the result does not depend on the passes).
constexpr std::int64_t kPassTiles = 8;

ATTNRES_AMX_TARGET void compute_blocks(const Problem& p, const std::uint16_t* a, std::int64_t mb, std::int64_t np0,
                                       std::int64_t np1) {
  thread_local Scratch<float> partial_sums;
  alignas(64) float acc[32 * 32];
  const std::int64_t i0 = mb * 32, mi = std::min<std::int64_t>(32, p.m - i0);
  const __m512 alpha = _mm512_set1_ps(p.alpha), beta = _mm512_set1_ps(p.beta);
  float* partial = p.kt > kPassTiles ? partial_sums.get(static_cast<std::size_t>((np1 - np0) * 32 * 32)) : nullptr;
  __asm__ volatile("" ::: "memory");  // the packed panels are complete before the tiles load
  for (std::int64_t t0 = 0; t0 < p.kt; t0 += kPassTiles) {
    const std::int64_t t1 = std::min(p.kt, t0 + kPassTiles);
    for (std::int64_t np = np0; np < np1; ++np) {
      const std::uint16_t* b0 = p.pb + (2 * np) * p.kt * kTileElems;
      const std::uint16_t* b1 = b0 + p.kt * kTileElems;
      float* part = partial != nullptr ? partial + (np - np0) * 32 * 32 : acc;
      if (t0 == 0) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      } else {
        _tile_loadd(0, part, 128);
        _tile_loadd(1, part + 16, 128);
        _tile_loadd(2, part + 16 * 32, 128);
        _tile_loadd(3, part + 16 * 32 + 16, 128);
      }
      for (std::int64_t t = t0; t < t1; ++t) {
        _tile_loadd(4, a + t * 2 * kTileElems, 64);
        _tile_loadd(5, a + (t * 2 + 1) * kTileElems, 64);
        _tile_loadd(6, b0 + t * kTileElems, 64);
        _tile_loadd(7, b1 + t * kTileElems, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, part, 128);
      _tile_stored(1, part + 16, 128);
      _tile_stored(2, part + 16 * 32, 128);
      _tile_stored(3, part + 16 * 32 + 16, 128);
      if (t1 < p.kt) continue;
      const std::int64_t j0 = np * 32, nj = std::min<std::int64_t>(32, p.n - j0);
      const __mmask16 mlo = lanes(nj), mhi = lanes(nj - 16);
      for (std::int64_t i = 0; i < mi; ++i) {
        float* crow = p.c + (i0 + i) * p.ldc + j0;
        __m512 lo = _mm512_mul_ps(alpha, _mm512_load_ps(part + i * 32));
        __m512 hi = _mm512_mul_ps(alpha, _mm512_load_ps(part + i * 32 + 16));
        if (p.beta != 0.0f) {
          lo = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mlo, crow), lo);
          hi = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mhi, crow + 16), hi);
        }
        _mm512_mask_storeu_ps(crow, mlo, lo);
        if (mhi != 0) _mm512_mask_storeu_ps(crow + 16, mhi, hi);
      }
    }
  }
}

bool detect_amx() {
  if (const char* off = std::getenv("ATTNRES_NO_AMX"); off != nullptr && off[0] != '\0' && std::strcmp(off, "0") != 0)
    return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(1, 0, &a, &b, &c, &d) == 0 || (c & (1u << 27)) == 0) return false;  // OSXSAVE
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const bool avx512 = (b & (1u << 16)) != 0 && (b & (1u << 30)) != 0 && (b & (1u << 31)) != 0;  // F, BW, VL
  const bool amx = (d & (1u << 22)) != 0 && (d & (1u << 24)) != 0;                              // BF16, TILE
  if (!avx512 || !amx) return false;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0 || (a & (1u << 5)) == 0) return false;  // AVX512_BF16
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0xe6u) != 0xe6u) return false;  // SSE, AVX, opmask and ZMM state enabled by the OS
#if defined(__linux__)
  // Linux enables the tile data state per process on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return ::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

void gemm_amx(const Problem& base) {
  thread_local Scratch<std::uint16_t> sa, sb;
  Problem p = base;
  p.kt = (p.k + 31) / 32;
  const std::int64_t mblocks = (p.m + 31) / 32, npairs = (p.n + 31) / 32;
  const std::int64_t block_elems = p.kt * 2 * kTileElems;  // one row block (or column pair) of all k
  // Column pairs per task: a B panel of at most about 1 MB, kept in L2 across the row blocks.
  const std::int64_t chunk = std::clamp<std::int64_t>((1 << 20) / (block_elems * 2), 1, npairs);
  const std::int64_t nchunks = (npairs + chunk - 1) / chunk, tasks = nchunks * mblocks;
  // A stored [m, k] with one column chunk: each task packs its own row block just before using
  // it (it stays in cache). Otherwise A is packed once, whole.
  const bool a_in_task = !p.trans_a && nchunks == 1;
  p.pa = a_in_task ? nullptr : sa.get(static_cast<std::size_t>(mblocks * block_elems));
  p.pb = sb.get(static_cast<std::size_t>(npairs * block_elems));
  const bool parallel = tasks > 1 && p.m * p.n * p.k >= (1 << 18);
#pragma omp parallel if (parallel)
  {
    if (p.trans_a) {
#pragma omp for schedule(static) nowait
      for (std::int64_t t = 0; t < p.kt; ++t) pack_a_ktile(p, t);
    } else if (!a_in_task) {
#pragma omp for schedule(static) nowait
      for (std::int64_t mb = 0; mb < mblocks; ++mb) pack_a_rows(p, mb, p.pa + mb * block_elems);
    }
    if (p.trans_b) {
#pragma omp for schedule(static)
      for (std::int64_t nt = 0; nt < 2 * npairs; ++nt) pack_b_rows(p, nt);
    } else {
#pragma omp for schedule(static)
      for (std::int64_t t = 0; t < p.kt; ++t) pack_b_ktile(p, t);
    }
    thread_local Scratch<std::uint16_t> panel;
    std::uint16_t* own = a_in_task ? panel.get(static_cast<std::size_t>(block_elems)) : nullptr;
    amx_configure();
    // Task = (column chunk, row block), chunk-major: consecutive tasks of a thread share B.
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t ch = task / mblocks, mb = task % mblocks;
      if (a_in_task) pack_a_rows(p, mb, own);
      const std::uint16_t* a = a_in_task ? own : p.pa + mb * block_elems;
      compute_blocks(p, a, mb, ch * chunk, std::min(npairs, (ch + 1) * chunk));
    }
    amx_release();
  }
}
#endif  // ATTNRES_AMX_CODE

}  // namespace

bool amx_bf16_available() {
#if ATTNRES_AMX_CODE
  static const bool available = detect_amx();
  return available;
#else
  return false;
#endif
}

bool bf16_backend_available(Bf16Backend backend) {
  switch (backend) {
    case Bf16Backend::automatic: return true;
    case Bf16Backend::amx: return amx_bf16_available();
    case Bf16Backend::avx512_fma: return avx512::cpu_has_avx512();
    case Bf16Backend::avx512_bf16: return avx512::cpu_has_avx512_bf16();
    case Bf16Backend::fallback: return true;
  }
  return false;
}

const char* to_string(Bf16Backend backend) {
  switch (backend) {
    case Bf16Backend::automatic: return "automatic";
    case Bf16Backend::amx: return "amx";
    case Bf16Backend::avx512_fma: return "avx512-fma";
    case Bf16Backend::avx512_bf16: return "avx512-bf16";
    case Bf16Backend::fallback: return "fallback";
  }
  return "?";
}

Bf16Backend parse_bf16_backend(const std::string& text) {
  for (Bf16Backend b : {Bf16Backend::automatic, Bf16Backend::amx, Bf16Backend::avx512_fma, Bf16Backend::avx512_bf16,
                        Bf16Backend::fallback})
    if (text == to_string(b)) return b;
  fail("unknown bf16 GEMM backend '", text, "' (expected automatic, amx, avx512-fma, avx512-bf16 or fallback)");
}

namespace {
Bf16Backend choose_backend() {
  if (const char* env = std::getenv("ATTNRES_BF16_BACKEND"); env != nullptr && env[0] != '\0') {
    const Bf16Backend b = parse_bf16_backend(env);
    require(bf16_backend_available(b), "ATTNRES_BF16_BACKEND=", env, ": not available on this CPU or OS");
    if (b != Bf16Backend::automatic) return b;
  }
  if (amx_bf16_available()) return Bf16Backend::amx;
  // VDPBF16PS runs at half the fp32 FMA rate on Intel cores (docs/performance.md) and at twice
  // it on AMD's Zen 4 and Zen 5 (two products per lane at the FMA's issue rate).
  if (avx512::cpu_has_avx512_bf16() && avx512::cpu_is_amd()) return Bf16Backend::avx512_bf16;
  if (avx512::cpu_has_avx512()) return Bf16Backend::avx512_fma;
  return Bf16Backend::fallback;
}
}  // namespace

Bf16Backend bf16_backend() {
  static const Bf16Backend chosen = choose_backend();
  return chosen;
}

namespace {
avx512::Dot dot_of(Bf16Backend backend) {
  return backend == Bf16Backend::avx512_fma ? avx512::Dot::fma : avx512::Dot::dpbf16;
}
bool is_avx512(Bf16Backend backend) {
  return backend == Bf16Backend::avx512_fma || backend == Bf16Backend::avx512_bf16;
}
}  // namespace

void Bf16PackedB::pack(bool trans_b, std::int64_t n, std::int64_t k, const float* b, std::int64_t ldb,
                       Bf16Backend backend) {
  if (backend == Bf16Backend::automatic) backend = bf16_backend();
  require(bf16_backend_available(backend), "gemm_bf16: the ", to_string(backend),
          " backend is not available on this CPU or OS");
  backend_ = backend;
  trans_b_ = trans_b;
  n_ = n;
  k_ = k;
  b_ = b;
  ldb_ = ldb;
  panels_ = nullptr;
  if (is_avx512(backend) && n > 0 && k > 0) {
    float* out = storage_.get(avx512::packed_b_size(dot_of(backend), n, k));
    avx512::pack_b(dot_of(backend), trans_b, n, k, b, ldb, out);
    panels_ = out;
  }
}

void gemm_bf16_packed(bool trans_a, std::int64_t m, float alpha, const float* a, std::int64_t lda, const Bf16PackedB& b,
                      float beta, float* c, std::int64_t ldc) {
  if (b.panels_ != nullptr && m > 0) {
    avx512::gemm_bf16(dot_of(b.backend_), trans_a, b.trans_b_, m, b.n_, b.k_, alpha, a, lda, b.b_, b.ldb_, beta, c, ldc,
                      b.panels_);
    return;
  }
  gemm_bf16(trans_a, b.trans_b_, m, b.n_, b.k_, alpha, a, lda, b.b_, b.ldb_, beta, c, ldc, b.backend_);
}

void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc, Bf16Backend backend) {
  if (m <= 0 || n <= 0) return;
  if (backend == Bf16Backend::automatic) backend = bf16_backend();
  require(bf16_backend_available(backend), "gemm_bf16: the ", to_string(backend),
          " backend is not available on this CPU or OS");
  if (k <= 0) {  // no products: C = beta * C (C not read when beta == 0)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  switch (backend) {
    case Bf16Backend::amx:
#if ATTNRES_AMX_CODE
      gemm_amx(Problem{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, 0, nullptr, nullptr});
      return;
#else
      break;
#endif
    case Bf16Backend::avx512_fma:
    case Bf16Backend::avx512_bf16:
      avx512::gemm_bf16(dot_of(backend), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    case Bf16Backend::automatic:
    case Bf16Backend::fallback: break;
  }
  gemm_fallback(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace attnres::kernels
