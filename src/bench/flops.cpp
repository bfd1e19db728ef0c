#include "bench/flops.hpp"

#include "model/arms.hpp"

namespace attnres::bench {

FlopCount training_flops_per_token(const ModelConfig& c, int seq) {
  FlopCount f;
  const double d = c.d_model, F = c.mlp_hidden, L = c.n_layers, V = c.vocab_size;
  f.dense = 6 * L * (4 * d * d + 3 * d * F);
  f.lm_head = 6 * V * d;
  f.attention = 6 * L * d * (double(seq) + 1);
  f.depth_reads = residual_family(c).residual_flops(c);
  return f;
}

}  // namespace attnres::bench
