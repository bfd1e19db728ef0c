// The fp32 Linear GEMMs of float models on the project's own AVX2 + FMA kernel, in place of
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
// Backends, chosen once per process (fp32_gemm_backend()):
//   avx2      this kernel: CPUs with AVX2 and FMA where OpenBLAS' sgemm kernels are 256 bits wide
//             or narrower (AMD Zen 2/3, Zen 4 VMs that hide AVX-512, Intel Haswell to Comet Lake,
//             and AVX-512 CPUs whose OpenBLAS core is an older one, as OPENBLAS_CORETYPE=Haswell
//             forces: 1.03-1.25x OpenBLAS' Haswell kernels on Zen 4);
//   openblas  cblas_sgemm: where OpenBLAS runs AVX-512 kernels (core SkylakeX, Cooperlake or
//             SapphireRapids: on Zen 4 1.6-2.0x this kernel), on CPUs without AVX2, and on request.
// ATTNRES_FP32_GEMM=avx2|openblas forces one (avx2: an error where the CPU lacks AVX2 or FMA).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/scratch.hpp"

namespace attnres::kernels {

enum class Fp32Gemm {
  automatic,  // fp32_gemm_backend()
  openblas,
  avx2,
};
const char* to_string(Fp32Gemm backend);  // "automatic", "openblas", "avx2"
Fp32Gemm parse_fp32_gemm(const std::string& text);
bool fp32_gemm_available(Fp32Gemm backend);

// The backend `automatic` runs: ATTNRES_FP32_GEMM when set, else avx2 on CPUs with AVX2 and FMA
// where OpenBLAS runs no AVX-512 kernels (its core, openblas_get_corename()), else openblas.
Fp32Gemm fp32_gemm_backend();

// Whether OpenBLAS runs AVX-512 sgemm kernels in this process (its core: SkylakeX, Cooperlake or
// SapphireRapids; an unknown name on an AVX-512 CPU counts as one).
bool openblas_runs_avx512();

// For tests and benchmarks: makes `automatic` mean `backend` from now on (automatic: back to the
// process's choice). Not thread-safe; call it between steps.
void set_fp32_gemm_backend(Fp32Gemm backend);

// C[m,n] = op(A) op(B) (+ C when accumulate), row-major, op = transpose when the flag is set, in
// the summation order above. The avx2 kernel; `fp32_gemm_available(Fp32Gemm::avx2)` must hold.
void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
              std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c, std::int64_t ldc);

// C = alpha op(A) op(B) (+ C when accumulate): each pass's chain t enters C as c = fma(alpha, t, c),
// the first pass without accumulate as c = alpha * t (alpha 1: the call above, bit for bit).
void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
              const float* a, std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c,
              std::int64_t ldc);

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
  friend void gemm_f32_packed(std::int64_t, float, const float*, std::int64_t, const Fp32PackedB&, bool, float*,
                              std::int64_t);
  std::int64_t n_ = 0, k_ = 0;
  const float* panels_ = nullptr;
  Scratch<float> storage_;
};

// C[m, b.n()] = alpha A op(B) (+ C when accumulate), A stored [m, b.k()] (not transposed).
void gemm_f32_packed(std::int64_t m, float alpha, const float* a, std::int64_t lda, const Fp32PackedB& b,
                     bool accumulate, float* c, std::int64_t ldc);

}  // namespace attnres::kernels
