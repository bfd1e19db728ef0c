// The one precision setting of the project (train.precision): the CPU's Linear GEMMs
// (kernels/gemm.hpp) and the CUDA backend's GEMM operands (cuda/cuda_model.hpp) read it.
#pragma once

#include <array>
#include <string>

namespace attnres::kernels {

// fp32: every GEMM in fp32. bf16: GEMM operands rounded to bf16, fp32 accumulation and output
// (kernels/gemm_bf16.hpp: AMX when the CPU has it; cuBLASLt on a GPU); float only. Master
// weights, gradients and everything outside the GEMMs stay fp32 (docs/cuda.md says which
// tensors the GPU stores in bf16).
enum class MatmulPrecision { fp32, bf16 };
inline constexpr std::array kMatmulPrecisions = {MatmulPrecision::fp32, MatmulPrecision::bf16};
const char* to_string(MatmulPrecision p);
MatmulPrecision parse_matmul_precision(const std::string& text);  // "fp32" | "bf16"

}  // namespace attnres::kernels
