// GEMM rate probes: the reference rates against which `attnres bench` states model FLOP
// utilisation (fp32: the OpenBLAS sgemm rate; bf16: the best bf16 GEMM of attnres and torch), and
// the model's Linear GEMMs one by one in fp32 and bf16 (`bench --gemm-only`).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace attnres::bench {

// Best of `reps` cblas_sgemm calls after one warm-up, row-major C = A B^T like a Linear, in GFLOP/s.
double sgemm_gflops(std::int64_t m, std::int64_t n, std::int64_t k, int reps);

// "MxNxK"
std::string shape_text(std::int64_t m, std::int64_t n, std::int64_t k);

struct GemmRates {
  double square = 0;  // 1024 x 1024 x 1024
  double model = 0;   // the model's largest trunk GEMM: [B*T, d] x [d, mlp_hidden]
  std::string model_shape;
};

// The sgemm reference for a model stepping `tokens` (B*T) tokens at a time.
GemmRates measure_sgemm_reference(const ModelConfig& config, std::int64_t tokens);

// One measured GEMM rate: which implementation ran which call on which shape.
struct GemmRate {
  std::string impl;  // "attnres" or "torch"
  std::string op;    // the call, e.g. "kernels::gemm_bf16 (AMX)", "torch.matmul bf16"
  std::int64_t m = 0, n = 0, k = 0;
  double gflops = 0;
  std::string shape() const;  // "MxNxK"
};

// The rate model FLOP utilisation is stated against, for the steps of one precision. fp32: the
// sgemm 1024^3 rate; bf16: the best of its candidates (attnres' bf16 GEMM and torch's bf16 matmul,
// on 2048^3 and the model's largest trunk shape), so that MFU is against the fastest bf16 GEMM this
// machine was seen to run in this benchmark, whoever ran it.
struct RateReference {
  std::string precision;             // "fp32" | "bf16"
  std::vector<GemmRate> candidates;  // every rate measured for it
  std::size_t chosen = 0;            // the candidate used
  std::string note;                  // e.g. why torch's rate is missing
  const GemmRate& rate() const { return candidates.at(chosen); }
};

// The fp32 reference: the sgemm 1024^3 rate of `sgemm`.
RateReference fp32_rate_reference(const GemmRates& sgemm);

// The reference over `candidates` (not empty): the one with the most GFLOP/s, the first on a tie.
RateReference best_rate_reference(const std::string& precision, std::vector<GemmRate> candidates, std::string note);

// Keeps in `into`, per (impl, op, shape), the better of its rate and the one in `again` (the same
// rates measured after the runs); rates only in `again` are added.
void keep_better(std::vector<GemmRate>& into, const std::vector<GemmRate>& again);

// The shapes (m, n, k) of the bf16 reference: cube^3 (2048^3 unless a test asks for a smaller one)
// and the model's largest trunk GEMM, the forward of the MLP's gate/up Linear [B*T, d] x [d, mlp_hidden].
constexpr std::int64_t kBf16ReferenceCube = 2048;
// On a GPU (`bench --device cuda`): cuBLASLt on 8192^3, the cube of tests/gpu/check.sh (d).
constexpr std::int64_t kGpuBf16ReferenceCube = 8192;
std::vector<std::array<std::int64_t, 3>> bf16_reference_shapes(const ModelConfig& config, std::int64_t tokens,
                                                               std::int64_t cube = kBf16ReferenceCube);

// attnres' bf16 GEMM (kernels::gemm_bf16 as dispatch picks it here) on `shapes` as a Linear's
// forward C = A B^T, best of `reps` calls after one warm-up.
std::vector<GemmRate> measure_bf16_rates(const std::vector<std::array<std::int64_t, 3>>& shapes, int reps);

// One Linear GEMM of the model, C = op(A) op(B) + beta C as the model calls it (beta 1 for the
// weight gradient), timed in fp32 (on the Linear layers' fp32 backend: kernels::gemm_f32 or
// OpenBLAS' kernels::gemm) and bf16 (kernels::gemm_bf16).
struct ShapeRate {
  std::string layer, pass;
  std::int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
  double fp32 = 0, bf16 = 0;  // GFLOP/s, best of `reps` calls after one warm-up
};

std::vector<ShapeRate> measure_linear_shapes(const ModelConfig& config, std::int64_t tokens, int reps);

// Which bf16 GEMM backend this machine runs (kernels::bf16_backend(): "amx", "avx512-fma", ...).
std::string bf16_backend();

// Which fp32 GEMM backend the Linear layers run (kernels::fp32_gemm_backend(): "avx2", "openblas").
std::string fp32_gemm_backend();

}  // namespace attnres::bench
