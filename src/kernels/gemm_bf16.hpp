// A bf16 GEMM with fp32 inputs, outputs and accumulation: the operands are rounded to bf16
// (round to nearest even) while they are packed, the products (exact in fp32) are summed in
// fp32. Backends, chosen once per process (bf16_backend()):
//   amx          AMX-BF16 tiles (TDPBF16PS): Sapphire Rapids and later, when the OS grants them;
//   avx512-bf16  AVX512_BF16's VDPBF16PS on bf16 pairs (AMD Zen 4 / Zen 5, kernels/gemm_bf16_avx512.hpp);
//   avx512-fma   AVX-512F FMAs on the bf16-rounded operands, one exact product per FMA (Intel
//                CPUs without usable AMX, where VDPBF16PS runs at half the FMA rate);
//   fallback     rounded copies of the operands through OpenBLAS' fp32 sgemm.
// All compute the same products and differ only in the fp32 summation order.
//
// Deterministic: on every backend but the fallback each output element is summed by one thread
// in a fixed k order, so results are bit-identical for any thread count.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/scratch.hpp"

namespace attnres::kernels {

enum class Bf16Backend {
  automatic,    // bf16_backend()
  amx,          // each named backend: an error when the CPU or OS lacks it
  avx512_fma,
  avx512_bf16,
  fallback,     // round to bf16, then cblas_sgemm
};
const char* to_string(Bf16Backend backend);  // "automatic", "amx", "avx512-fma", "avx512-bf16", "fallback"
Bf16Backend parse_bf16_backend(const std::string& text);
bool bf16_backend_available(Bf16Backend backend);

// The backend `automatic` runs: ATTNRES_BF16_BACKEND when set (an error if unavailable), else
// AMX, else AVX512_BF16 on AMD, else AVX-512F FMA, else the fallback. (ATTNRES_NO_AMX=1 hides AMX.)
Bf16Backend bf16_backend();

// True when the CPU has AMX-BF16 and AVX512-BF16 and the OS granted the tile state (asked once).
bool amx_bf16_available();

// fp32 -> nearest bf16 (ties to even), returned as fp32. Denormal inputs become (signed) zero
// and NaN stays NaN, which is what the CPU's VCVTNEPS2BF16 does, so both paths round alike.
float round_to_bf16(float x);
std::uint16_t bf16_bits(float x);  // the same rounding, as the 16-bit pattern

// C[m,n] = alpha * op(A) op(B) + beta * C, row-major like kernels::gemm<float>; op(A) and op(B)
// rounded to bf16. beta == 0: C is not read.
void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc, Bf16Backend backend = Bf16Backend::automatic);

// op(B) packed once for several products that share it (the LM head's weight across its row
// chunks), in the layout of the backend that multiplies it; the results are those of gemm_bf16.
// AMX and the fallback keep a pointer to B and pack per product as gemm_bf16 does. B must stay
// unchanged while the packing is in use.
class Bf16PackedB {
 public:
  void pack(bool trans_b, std::int64_t n, std::int64_t k, const float* b, std::int64_t ldb,
            Bf16Backend backend = Bf16Backend::automatic);
  std::int64_t n() const { return n_; }
  std::int64_t k() const { return k_; }

 private:
  friend void gemm_bf16_packed(bool, std::int64_t, float, const float*, std::int64_t, const Bf16PackedB&, float,
                               float*, std::int64_t);
  Bf16Backend backend_ = Bf16Backend::fallback;
  bool trans_b_ = false;
  std::int64_t n_ = 0, k_ = 0, ldb_ = 0;
  const float* b_ = nullptr;
  const float* panels_ = nullptr;  // into storage_ (the AVX-512 backends)
  Scratch<float> storage_;
};

// C[m, b.n()] = alpha * op(A) op(B) + beta * C, op(A) m x b.k().
void gemm_bf16_packed(bool trans_a, std::int64_t m, float alpha, const float* a, std::int64_t lda, const Bf16PackedB& b,
                      float beta, float* c, std::int64_t ldc);

}  // namespace attnres::kernels
