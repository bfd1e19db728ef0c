// The fp32 Linear GEMMs of float models on the project's own kernel (AVX2 or AVX-512 tiles), in place of
// OpenBLAS' sgemm: the study-size shapes (width 64-128), whose short reductions (k = 64) leave
// OpenBLAS spending a fifth of its time packing both operands and zeroing C before its kernel
// adds into it. Here op(B) is packed (a Linear's weight, once per call; a weight gradient's
// activations panel by panel into L1), op(A) is read in place (unless it is k-major with rows far
// apart), and C is written once per k pass, its lines prefetched for writing.
//
// Summation order (the backend's contract, bit for bit): k is cut into passes of 256 (k = 0-255,
// 256-511, ...); per pass, each element of C gets one chain of fused multiply-adds in k order
// from 0, t = fma(a[k], b[k], t), and the pass's chain is added to C: c = c + t (c starts as C's
// old value when accumulating, else the first pass stores t; with alpha, c = fma(alpha, t, c)
// and alpha * t). One thread sums each element. The
// result does not depend on the thread count, on the row and column blocking, or on the shape of
// the call (a row computed alone equals the same row computed within a batch). OpenBLAS' Haswell
// kernel sums the same products in another order (chains of at most 320 terms, some split into
// even and odd k), so the two backends differ in the last bits; tests/kernels/test_gemm_f32.cpp
// checks this order bit for bit and its error against float64 beside OpenBLAS' (as accurate).
//
// The order does not depend on the vector width either: the kernel has two tile sets, 6 rows x 16
// columns on 8-lane AVX2 and 12 rows x 32 columns on 16-lane AVX-512, each element still one fma
// chain per pass, so the two give the same bits (tests/kernels/test_gemm_f32.cpp runs every case
// on both; tests/model/test_fp32_golden.cpp holds them to the same training hashes).
//
// Backends, chosen once per process (fp32_gemm_backend()):
//   avx512    this kernel on AVX-512 tiles: CPUs with AVX-512 F/BW/VL/DQ (Skylake-SP and later,
//             Zen 4 and later). Measured on an AMD EPYC Zen 5 VM (bench/gemm_f32_bench.cpp, hot
//             caches): 1.04-1.18x OpenBLAS' own AVX-512 (Cooperlake) sgemm at the d64 study
//             shapes, 0.91-1.12x at d128, 0.72-0.98x on attention's small block products, 1.7-2.1x
//             OpenBLAS' Haswell kernels; a training step runs as fast as on OpenBLAS' AVX-512
//             kernels (docs/performance.md), with the AVX2 tiles' bits; SwiGLU and the fp32
//             softmax exponentials then also run on 16 lanes (fp32_wide_lanes() in
//             kernels/fast_math.hpp, the same bits);
//   avx2      this kernel on AVX2 tiles: CPUs with AVX2 and FMA, without AVX-512, where OpenBLAS'
//             sgemm kernels are 256 bits wide or narrower (AMD Zen 2/3, Zen 4 VMs that hide
//             AVX-512, Intel Haswell to Comet Lake: 1.03-1.25x OpenBLAS' Haswell kernels on Zen 4);
//   openblas  cblas_sgemm: CPUs without AVX2, an OpenBLAS core with AVX-512 kernels on a CPU that
//             lacks one of the AVX-512 subsets above, and on request.
// ATTNRES_FP32_GEMM=avx512|avx2|openblas forces one (an error where the CPU lacks its instructions).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/scratch.hpp"

namespace attnres::kernels {

// k per pass of the summation order above.
inline constexpr std::int64_t kFp32GemmPass = 256;

enum class Fp32Gemm {
  automatic,  // fp32_gemm_backend()
  openblas,
  avx2,    // the own kernel on 8-lane AVX2 + FMA tiles
  avx512,  // the own kernel on 16-lane AVX-512 tiles: the same sums as avx2, bit for bit
};
const char* to_string(Fp32Gemm backend);  // "automatic", "openblas", "avx2", "avx512"
Fp32Gemm parse_fp32_gemm(const std::string& text);
bool fp32_gemm_available(Fp32Gemm backend);

// The backend `automatic` runs: ATTNRES_FP32_GEMM when set, else avx512 on CPUs with AVX-512
// F/BW/VL/DQ, else avx2 on CPUs with AVX2 and FMA where OpenBLAS runs no AVX-512 kernels (its
// core, openblas_get_corename()), else openblas.
Fp32Gemm fp32_gemm_backend();

// Whether fp32 GEMMs run gemm_f32 below (the backend is avx2 or avx512) rather than OpenBLAS.
inline bool own_fp32_gemm() { return fp32_gemm_backend() != Fp32Gemm::openblas; }

// Whether OpenBLAS runs AVX-512 sgemm kernels in this process (its core: SkylakeX, Cooperlake or
// SapphireRapids; an unknown name on an AVX-512 CPU counts as one).
bool openblas_runs_avx512();

// For tests and benchmarks: makes `automatic` mean `backend` from now on (automatic: back to the
// process's choice). Not thread-safe; call it between steps.
void set_fp32_gemm_backend(Fp32Gemm backend);

// C[m,n] = op(A) op(B) (+ C when accumulate), row-major, op = transpose when the flag is set, in
// the summation order above, on the AVX-512 tiles when the backend is avx512, else on the AVX2
// tiles; `fp32_gemm_available(Fp32Gemm::avx2)` must hold.
void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
              std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c, std::int64_t ldc);

// C = alpha op(A) op(B) (+ C when accumulate): each pass's chain t enters C as c = fma(alpha, t, c),
// the first pass without accumulate as c = alpha * t (alpha 1: the call above, bit for bit).
void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
              const float* a, std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c,
              std::int64_t ldc);

// A block of a packed op(B): rows [k0, k0 + k), columns [n0, n0 + n), k0 a multiple of
// kFp32GemmPass (a pass of the summation order) and n0 of 16 (a panel).
struct Fp32Block {
  std::int64_t k0 = 0, k = 0, n0 = 0, n = 0;
};

// op(B) packed once for several products that share it (the LM head's weight across its row
// chunks); the results are those of gemm_f32 with the same B, bit for bit. B must stay unchanged
// while the packing is in use.
class Fp32PackedB {
 public:
  // op(B) is k x n: B stored [n, k] (trans_b) or [k, n].
  void pack(bool trans_b, std::int64_t n, std::int64_t k, const float* b, std::int64_t ldb);
  std::int64_t n() const { return n_; }
  std::int64_t k() const { return k_; }

 private:
  friend void gemm_f32_packed(std::int64_t, float, const float*, std::int64_t, const Fp32PackedB&, const Fp32Block&,
                              bool, float*, std::int64_t);
  std::int64_t n_ = 0, k_ = 0;
  const float* panels_ = nullptr;
  Scratch<float> storage_;
};

// C[m, b.n()] = alpha A op(B) (+ C when accumulate), A stored [m, b.k()] (not transposed).
void gemm_f32_packed(std::int64_t m, float alpha, const float* a, std::int64_t lda, const Fp32PackedB& b,
                     bool accumulate, float* c, std::int64_t ldc);

// C[m, blk.n] = alpha A op(B)[blk] (+ C when accumulate), A stored [m, blk.k]: bit for bit gemm_f32
// on that block of op(B). Attention packs a head's K and V once and multiplies each query block by
// the keys it sees.
void gemm_f32_packed(std::int64_t m, float alpha, const float* a, std::int64_t lda, const Fp32PackedB& b,
                     const Fp32Block& blk, bool accumulate, float* c, std::int64_t ldc);

}  // namespace attnres::kernels
