#include "kernels/gemm_bf16.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "util/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define ATTNRES_AMX_CODE 1
#include <cpuid.h>
// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_* operands) when they are
// inlined into target("avx512f") functions: a false positive (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
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
// Grow-only scratch, 64-byte aligned (tile rows are 64 bytes).
// ------------------------------------------------------------------------------------------
template <class T>
class Scratch {
 public:
  T* get(std::size_t n) {
    if (n > cap_) {
      const std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
      ptr_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
      require(ptr_ != nullptr, "gemm_bf16: out of memory (", bytes, " bytes of scratch)");
      cap_ = n;
    }
    return ptr_.get();
  }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> ptr_;
  std::size_t cap_ = 0;
};

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

ATTNRES_AMX_TARGET inline __mmask16 mask16(std::int64_t valid) {
  return valid >= 16 ? __mmask16(0xffff) : valid <= 0 ? __mmask16(0) : __mmask16((1u << valid) - 1u);
}

// 16 floats (the first `valid`, the rest zero) -> 16 bf16.
ATTNRES_AMX_TARGET inline __m256i cvt16(const float* p, std::int64_t valid) {
  return (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask16(valid), p));
}

// 32 floats (the first `valid`, the rest zero) -> 32 bf16, in order.
ATTNRES_AMX_TARGET inline __m512i cvt32(const float* p, std::int64_t valid) {
  const __m512 lo = _mm512_maskz_loadu_ps(mask16(valid), p);
  const __m512 hi = _mm512_maskz_loadu_ps(mask16(valid - 16), p + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// Element i of the result: the pair (even[i], odd[i]), even in the low half.
ATTNRES_AMX_TARGET inline __m512i pairs(__m256i even, __m256i odd) {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(even), _mm512_slli_epi32(_mm512_cvtepu16_epi32(odd), 16));
}

// In-register transpose of a 16x16 matrix of 32-bit elements (r[i] = row i).
ATTNRES_AMX_TARGET inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c.
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);       // lanes 0, 2 of rows 0-3 and 4-7
    t[4 + c] = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);   // lanes 1, 3
    t[8 + c] = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
    r[4 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xdd);
  }
}

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
      const __mmask16 mlo = mask16(nj), mhi = mask16(nj - 16);
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

void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc, Bf16Backend backend) {
  if (m <= 0 || n <= 0) return;
  bool amx = false;
  switch (backend) {
    case Bf16Backend::automatic: amx = amx_bf16_available(); break;
    case Bf16Backend::amx:
      require(amx_bf16_available(), "gemm_bf16: AMX-BF16 is not available on this CPU or OS");
      amx = true;
      break;
    case Bf16Backend::fallback: break;
  }
  if (k <= 0) {  // no products: C = beta * C (C not read when beta == 0)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
#if ATTNRES_AMX_CODE
  if (amx) {
    gemm_amx(Problem{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, 0, nullptr, nullptr});
    return;
  }
#endif
  (void)amx;
  gemm_fallback(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace attnres::kernels
