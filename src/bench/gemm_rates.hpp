// GEMM rate probes: the OpenBLAS sgemm reference against which `attnres bench` states model FLOP
// utilisation, and the model's Linear GEMMs one by one in fp32 and bf16 (`bench --gemm-only`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace attnres::bench {

// Best of `reps` cblas_sgemm calls after one warm-up, row-major C = A B^T like a Linear, in GFLOP/s.
double sgemm_gflops(std::int64_t m, std::int64_t n, std::int64_t k, int reps);

struct GemmRates {
  double square = 0;  // 1024 x 1024 x 1024
  double model = 0;   // the model's largest trunk GEMM: [B*T, d] x [d, mlp_hidden]
  std::string model_shape;
};

// The sgemm reference for a model stepping `tokens` (B*T) tokens at a time.
GemmRates measure_sgemm_reference(const ModelConfig& config, std::int64_t tokens);

// One Linear GEMM of the model, C = op(A) op(B) + beta C as the model calls it (beta 1 for the
// weight gradient), timed in fp32 (kernels::gemm) and bf16 (kernels::gemm_bf16).
struct ShapeRate {
  std::string layer, pass;
  std::int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
  double fp32 = 0, bf16 = 0;  // GFLOP/s, best of `reps` calls after one warm-up
};

std::vector<ShapeRate> measure_linear_shapes(const ModelConfig& config, std::int64_t tokens, int reps);

// Which bf16 GEMM this machine runs: "AMX" or the fallback.
std::string bf16_backend();

}  // namespace attnres::bench
