#include "kernels/precision.hpp"

#include "util/error.hpp"

namespace attnres::kernels {

const char* to_string(MatmulPrecision p) { return p == MatmulPrecision::bf16 ? "bf16" : "fp32"; }

MatmulPrecision parse_matmul_precision(const std::string& text) {
  for (auto p : kMatmulPrecisions)
    if (text == to_string(p)) return p;
  fail("unknown matmul precision '", text, "' (expected fp32 or bf16)");
}

}  // namespace attnres::kernels
